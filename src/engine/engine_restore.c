/* engine_restore.c: stop services, swap the roots back, start services. */
#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"
#include "lib/failpoint.h"

struct restore_plan {
	const struct ckpt_record *rec; /* a reference */
	bool expired, fresh;
};

static int restore_plan(struct engine *e, const char *id_or_name, const struct restore_req *req,
			struct restore_plan *plan, ckpt_error *err)
{
	char when[40];
	plan->rec = engine_resolve(e, id_or_name);
	if (!plan->rec)
		return err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint with id or name '%s'",
				    id_or_name);
	if (plan->rec->status != CKPT_ACTIVE)
		return err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "checkpoint '%s' is %s, not active",
				    plan->rec->id, ckpt_status_name(plan->rec->status));
	plan->expired = record_expired(plan->rec, now_ms());
	if (!plan->expired || req->force)
		return 0;
	if (req->if_expired && !strcmp(req->if_expired, "fresh")) {
		plan->fresh = true;
		return 0;
	}
	fmt_rfc3339_ms(plan->rec->expires_ms, when, sizeof(when));
	return err_set_kind(
		err, ERR_EXPIRED, EKEYEXPIRED, "checkpoint_expired",
		"checkpoint '%s' expired at %s; pass force: true to restore it anyway, or if_expired: \"fresh\" "
		"to reset to the base",
		plan->rec->id, when);
}

static void restore_touch(struct engine *e, const struct ckpt_record *rec)
{
	ckpt_error err = { 0 };
	struct ckpt_record *d = record_dup(rec);
	if (!d)
		return;
	fmt_rfc3339_ms(now_ms(), d->last_used_at, sizeof(d->last_used_at));
	if (FAILPOINT_AROUND("restore.record.touch", catalog_put(e->catalog, d, &err)) < 0)
		log_warn("cannot record last use of \"%s\": %s", rec->id, err.msg);
	record_unref(d);
}

void restore_report_free(struct restore_report *r)
{
	svc_report_free(&r->services);
	restore_details_free(&r->details);
	verify_diffs_free(&r->verify.differences);
	free(r->verify.error);
	r->verify = (struct verify_report){ 0 };
}

static int restore_swap(struct engine *e, const struct restore_plan *plan, struct restore_details *details,
			struct engine_op *op, ckpt_error *err)
{
	if (plan->fresh)
		return e->backend->reset(e->bst, details, err);
	return e->backend->restore(e->bst, plan->rec->id, plan->rec->backend_data, details, &op->progress, err);
}

/* Stop, swap, start, timing each. The roots are swapped only when every unit
 * that uses them is down (else rep->swapped stays false and r is 0); the
 * units stopped are started again whatever happened. */
static int restore_run(struct engine *e, const struct restore_plan *plan, bool verify, struct engine_op *op,
		       struct restore_report *rep, ckpt_error *err)
{
	struct svc_plan units, restart = { 0 };
	struct whole_run w = { e, plan->rec->id, &units, &restart, false };
	bool whole = e->cfg->whole_root;
	int64_t t0 = mono_ms(), t1, t2;
	int r = services_plan(e->services, e->cfg->roots, e->cfg->n_roots, &units);
	if (r < 0) {
		services_plan_free(&units);
		return err_set(err, -r, NULL, "cannot list the services that use the roots: %s", strerror(-r));
	}
	if (whole) /* its own units stop once the backend knows what changes */
		rep->details.before_change = engine_whole_before, rep->details.before_change_ctx = &w;
	rep->services_available = services_available(e->services);
	size_t planned = units.n;
	engine_svc_journal_save(e, "restore", plan->rec->id, &units); /* a crash now: started at the next start */
	rep->swapped = services_stop(e->services, &units) == 0;
	if (units.n > planned) /* units systemd stopped with them */
		engine_svc_journal_save(e, "restore", plan->rec->id, &units);
	t1 = mono_ms();
	if (rep->swapped)
		r = restore_swap(e, plan, &rep->details, op, err);
	if (r < 0 && rep->details.held) /* a unit whose files change did not stop: nothing changed */
		rep->swapped = false, r = 0;
	if (r == 0 && rep->swapped && verify) { /* verify_ms, not a phase */
		engine_verify(e, plan->fresh ? NULL : plan->rec->id, plan->rec->backend_data, &rep->verify);
		t0 += rep->verify.verify_ms, t1 += rep->verify.verify_ms;
	}
	t2 = mono_ms();
	bool done = r == 0 && rep->swapped;
	if (done && whole)
		engine_whole_reload(&w, &rep->details);
	services_start(e->services, &units); /* also after a failed swap */
	services_report(&units, &rep->services);
	if (done && whole)
		engine_whole_services(&w, rep);
	/* A whole root half restored: the next start finishes it, and owes its services step. */
	if ((units.n > 0 || whole) && !(whole && r < 0))
		engine_svc_journal_clear(e);
	services_plan_free(&units);
	services_plan_free(&restart);
	if (!rep->services_available)
		rep->services_reason = services_unavailable_reason(e->services);
	rep->stop_ms = t1 - t0, rep->swap_ms = t2 - t1, rep->start_ms = mono_ms() - t2;
	rep->duration_ms = mono_ms() - t0;
	snprintf(rep->checkpoint_id, sizeof(rep->checkpoint_id), "%s", plan->rec->id);
	rep->restored_from_checkpoint = !plan->fresh;
	rep->ttl_expired = plan->expired;
	return r;
}

int engine_restore(struct engine *e, const char *id_or_name, const struct restore_req *req,
		   struct restore_report *ret_report, ckpt_error *err)
{
	struct restore_plan plan = { 0 };
	struct restore_report rep = { 0 };
	struct engine_op *op = NULL;
	int r;

	svc_report_init(&rep.services);
	/* Answer a conflict at once rather than queueing behind the create. */
	if ((r = restore_plan(e, id_or_name, req, &plan, err)) < 0) {
		metrics_op(&e->metrics, OP_RESTORE, false, 0); /* refused (404, 409, 410): a failure, as for delete */
		restore_report_free(&rep);
		record_unref(plan.rec);
		return r;
	}
	record_unref(TAKE_PTR(plan.rec));
	int64_t queued = mono_ms();
	pthread_mutex_lock(&e->op_lock);
	rep.queue_ms = mono_ms() - queued;
	if ((r = engine_check_managed(e, err)) < 0 || (r = restore_plan(e, id_or_name, req, &plan, err)) < 0)
		goto out;
	engine_set_status(e, "restoring", plan.rec->id);
	if (!(op = engine_op_begin(e, plan.rec->id))) {
		r = err_set(err, ENOMEM, NULL, "out of memory");
		goto out;
	}
	r = restore_run(e, &plan, req->verify, op, &rep, err);
	rep.duration_ms += rep.queue_ms; /* what the client waited */
	if (r == 0 && rep.swapped && !plan.fresh)
		restore_touch(e, plan.rec);
out:
	r = engine_err_classify(err, ENGINE_CTX_RESTORE, r);
	engine_set_status(e, NULL, NULL);
	pthread_mutex_unlock(&e->op_lock);
	engine_op_end(e, op);
	if (r == 0 && !rep.swapped) {
		log_event(LOG_WARN_, &(struct log_fields){ "restore", plan.rec->id, NULL, rep.duration_ms },
			  "restore of \"%s\" not done: a unit that uses the roots could not be stopped", plan.rec->id);
		*ret_report = rep;
	} else if (r == 0) {
		log_event(LOG_INFO_, &(struct log_fields){ "restore", plan.rec->id, NULL, rep.duration_ms },
			  "restored \"%s\" in %lld ms", plan.rec->id, (long long)rep.duration_ms);
		engine_kick_maintenance(e);
		*ret_report = rep;
	} else {
		if (plan.rec)
			log_event(LOG_WARN_, &(struct log_fields){ "restore", plan.rec->id, NULL, -1 },
				  "restore of \"%s\" failed: %s", plan.rec->id, err ? err->msg : "");
		restore_report_free(&rep);
	}
	bool done = r == 0 && rep.swapped;
	metrics_op(&e->metrics, OP_RESTORE, done, done ? (double)rep.duration_ms / 1000.0 : 0);
	record_unref(plan.rec);
	return r;
}
