/* engine_restore.c: stop services, swap the roots back, start services. */
#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"

struct restore_plan {
	json_t *rec; /* owned */
	bool expired, fresh;
};

static int restore_plan(struct engine *e, const char *id_or_name, const struct restore_req *req,
			struct restore_plan *plan, ckpt_error *err)
{
	char when[40];
	plan->rec = engine_resolve(e, id_or_name);
	if (!plan->rec)
		return err_set(err, ENOENT, "not_found", "no checkpoint with id or name '%s'", id_or_name);
	const char *status = json_string_value(json_object_get(plan->rec, "status"));
	if (strcmp(status, "active"))
		return err_set(err, EBUSY, "conflict", "checkpoint '%s' is %s, not active", record_id(plan->rec),
			       status);
	plan->expired = record_expired(plan->rec, now_ms());
	if (!plan->expired || req->force)
		return 0;
	if (req->if_expired && !strcmp(req->if_expired, "fresh")) {
		plan->fresh = true;
		return 0;
	}
	fmt_rfc3339_ms(record_int(plan->rec, "_expires_ms"), when, sizeof(when));
	return err_set(err, EKEYEXPIRED, "checkpoint_expired",
		       "checkpoint '%s' expired at %s; pass force: true to restore it anyway, or if_expired: \"fresh\" "
		       "to reset to the base",
		       record_id(plan->rec), when);
}

static void restore_touch(struct engine *e, json_t *rec)
{
	char when[40];
	ckpt_error err = { 0 };
	json_object_set_new(rec, "last_used_at", json_string(fmt_rfc3339_ms(now_ms(), when, sizeof(when))));
	if (catalog_put(e->catalog, rec, &err) < 0)
		log_warn("cannot record last use of \"%s\": %s", record_id(rec), err.msg);
}

/* ok: the roots were swapped and every unit running before runs again (or
 * is still activating within its own start timeout). */
static json_t *restore_report(struct engine *e, const struct restore_plan *plan, const struct svc_plan *units,
			      bool swapped, json_t *extra, const int64_t t[4])
{
	struct svc_report rep;
	bool avail = services_available(e->services);
	svc_report_init(&rep);
	services_report(units, &rep);
	json_t *out = json_pack("{s:b, s:b, s:s, s:I, s:O, s:O, s:O, s:O, s:{s:I, s:I, s:I}, s:s, s:b, s:b}", "ok",
				swapped && json_array_size(rep.failed) == 0, "swapped", swapped, "checkpoint_id",
				record_id(plan->rec), "restore_duration_ms", (json_int_t)(t[3] - t[0]),
				"started_services", rep.started, "stopped_services", rep.stopped, "failed_services",
				rep.failed, "failures", rep.failures, "phases", "stop_ms", (json_int_t)(t[1] - t[0]),
				"swap_ms", (json_int_t)(t[2] - t[1]), "start_ms", (json_int_t)(t[3] - t[2]), "services",
				avail ? "ok" : "unavailable", "restored_from_checkpoint", !plan->fresh, "ttl_expired",
				plan->expired);
	if (json_array_size(rep.activating))
		json_object_set(out, "activating_services", rep.activating);
	if (!avail && services_unavailable_reason(e->services))
		json_object_set_new(out, "services_reason", json_string(services_unavailable_reason(e->services)));
	json_object_update(out, extra);
	svc_report_free(&rep);
	return out;
}

static int restore_swap(struct engine *e, const struct restore_plan *plan, json_t *extra, struct engine_op *op,
			ckpt_error *err)
{
	if (plan->fresh)
		return e->backend->reset(e->bst, extra, err);
	return e->backend->restore(e->bst, record_id(plan->rec), json_object_get(plan->rec, "_backend"), extra,
				   &op->progress, err);
}

/* Stop, swap, start. The roots are swapped only when every unit that uses
 * them is down; the units stopped are started again whatever happened. */
static int restore_bracket(struct engine *e, const struct restore_plan *plan, struct engine_op *op, json_t *extra,
			   json_t **ret_report, ckpt_error *err)
{
	struct svc_plan units;
	int64_t t[4];
	int r;

	t[0] = mono_ms();
	if ((r = services_plan(e->services, e->cfg->roots, e->cfg->n_roots, &units)) < 0) {
		services_plan_free(&units);
		return err_set(err, -r, NULL, "cannot list the services that use the roots: %s", strerror(-r));
	}
	bool swapped = services_stop(e->services, &units) == 0;
	t[1] = mono_ms();
	if (swapped)
		r = restore_swap(e, plan, extra, op, err);
	t[2] = mono_ms();
	services_start(e->services, &units); /* also after a failed swap */
	t[3] = mono_ms();
	if (r == 0)
		*ret_report = restore_report(e, plan, &units, swapped, extra, t);
	services_plan_free(&units);
	return r < 0 ? r : swapped ? 0 : 1;
}

int engine_restore(struct engine *e, const char *id_or_name, const struct restore_req *req, json_t **ret_report,
		   ckpt_error *err)
{
	struct restore_plan plan = { 0 };
	struct engine_op *op = NULL;
	json_t *extra = json_object();
	int64_t t0 = 0;
	int r;

	/* Answer a conflict at once rather than queueing behind the create. */
	if ((r = restore_plan(e, id_or_name, req, &plan, err)) < 0) {
		json_decref(extra);
		json_decref(plan.rec);
		return r;
	}
	json_decref(TAKE_PTR(plan.rec));
	pthread_mutex_lock(&e->op_lock);
	t0 = mono_ms();
	if ((r = restore_plan(e, id_or_name, req, &plan, err)) < 0)
		goto out;
	engine_set_status(e, "restoring", record_id(plan.rec));
	if (!(op = engine_op_begin(e, record_id(plan.rec)))) {
		r = -ENOMEM;
		goto out;
	}
	r = restore_bracket(e, &plan, op, extra, ret_report, err);
	if (r == 0 && !plan.fresh)
		restore_touch(e, plan.rec);
out:
	engine_set_status(e, NULL, NULL);
	pthread_mutex_unlock(&e->op_lock);
	engine_op_end(e, op);
	int64_t ms = mono_ms() - t0;
	if (r == 0) {
		log_event(LOG_INFO_, &(struct log_fields){ "restore", record_id(plan.rec), NULL, ms },
			  "restored \"%s\" in %lld ms", record_id(plan.rec), (long long)ms);
		engine_kick_maintenance(e);
	} else if (r > 0) {
		log_event(LOG_WARN_, &(struct log_fields){ "restore", record_id(plan.rec), NULL, ms },
			  "restore of \"%s\" not done: a unit that uses the roots could not be stopped",
			  record_id(plan.rec));
	} else if (plan.rec) {
		log_event(LOG_WARN_, &(struct log_fields){ "restore", record_id(plan.rec), NULL, -1 },
			  "restore of \"%s\" failed: %s", record_id(plan.rec), err ? err->msg : "");
	}
	metrics_op(&e->metrics, OP_RESTORE, r == 0, r == 0 ? (double)ms / 1000.0 : 0);
	json_decref(extra);
	json_decref(plan.rec);
	return r > 0 ? 0 : r;
}
