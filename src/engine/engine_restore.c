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

static json_t *restore_report(struct engine *e, const struct restore_plan *plan, struct svc_report *rep, json_t *extra,
			      const int64_t t[4])
{
	bool avail = services_available(e->services);
	json_t *out =
		json_pack("{s:b, s:s, s:I, s:O, s:O, s:O, s:O, s:{s:I, s:I, s:I}, s:s, s:b, s:b}", "ok",
			  json_array_size(rep->failed) == 0, "checkpoint_id", record_id(plan->rec),
			  "restore_duration_ms", (json_int_t)(t[3] - t[0]), "started_services", rep->started,
			  "stopped_services", rep->stopped, "failed_services", rep->failed, "failures", rep->failures,
			  "phases", "stop_ms", (json_int_t)(t[1] - t[0]), "swap_ms", (json_int_t)(t[2] - t[1]),
			  "start_ms", (json_int_t)(t[3] - t[2]), "services", avail ? "ok" : "unavailable",
			  "restored_from_checkpoint", !plan->fresh, "ttl_expired", plan->expired);
	if (!avail && services_unavailable_reason(e->services))
		json_object_set_new(out, "services_reason", json_string(services_unavailable_reason(e->services)));
	json_object_update(out, extra);
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

int engine_restore(struct engine *e, const char *id_or_name, const struct restore_req *req, json_t **ret_report,
		   ckpt_error *err)
{
	struct restore_plan plan = { 0 };
	struct svc_report rep;
	struct engine_op *op = NULL;
	json_t *extra = json_object();
	int64_t t[4];
	int r;

	svc_report_init(&rep);
	/* Answer a conflict at once rather than queueing behind the create. */
	if ((r = restore_plan(e, id_or_name, req, &plan, err)) < 0) {
		metrics_op(&e->metrics, OP_RESTORE, false, 0); /* refused (404, 409, 410): a failure, as for delete */
		json_decref(extra);
		svc_report_free(&rep);
		json_decref(plan.rec);
		return r;
	}
	json_decref(TAKE_PTR(plan.rec));
	pthread_mutex_lock(&e->op_lock);
	t[0] = mono_ms();
	if ((r = restore_plan(e, id_or_name, req, &plan, err)) < 0)
		goto out;
	engine_set_status(e, "restoring", record_id(plan.rec));
	if (!(op = engine_op_begin(e, record_id(plan.rec)))) {
		r = -ENOMEM;
		goto out;
	}
	bool avail = services_available(e->services);
	if (avail)
		services_stop(e->services, &rep);
	t[1] = mono_ms();
	r = restore_swap(e, &plan, extra, op, err);
	t[2] = mono_ms();
	if (avail) /* also after a failed swap: bring the services back either way */
		services_start(e->services, &rep);
	t[3] = mono_ms();
	if (r == 0 && !plan.fresh)
		restore_touch(e, plan.rec);
	if (r == 0)
		*ret_report = restore_report(e, &plan, &rep, extra, t);
out:
	engine_set_status(e, NULL, NULL);
	pthread_mutex_unlock(&e->op_lock);
	engine_op_end(e, op);
	if (r == 0) {
		log_info("restored \"%s\" in %lld ms", record_id(plan.rec), (long long)(t[3] - t[0]));
		engine_kick_maintenance(e);
	} else if (plan.rec) {
		log_warn("restore of \"%s\" failed: %s", record_id(plan.rec), err ? err->msg : "");
	}
	metrics_op(&e->metrics, OP_RESTORE, r == 0, r == 0 ? (double)(t[3] - t[0]) / 1000.0 : 0);
	svc_report_free(&rep);
	json_decref(extra);
	json_decref(plan.rec);
	return r;
}
