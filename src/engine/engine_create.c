/* engine_create.c: create, synchronous or in a worker thread, with limits. */
#include <pthread.h>

#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"
#include "lib/failpoint.h"

#define TTL_MAX_SECS (10LL * 365 * 24 * 3600)
#define LABELS_MAX 64

static int create_validate(const struct create_req *req, ckpt_error *err)
{
	const char *k;
	json_t *v;

	if (!name_valid(req->name))
		return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_field",
				    "name must be 1 to 128 printable characters");
	if (req->has_ttl && (req->ttl_secs < 0 || req->ttl_secs > TTL_MAX_SECS))
		return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_field", "ttl_secs must be between 0 and %lld",
				    TTL_MAX_SECS);
	if (!req->labels)
		return 0;
	if (!json_is_object(req->labels) || json_object_size(req->labels) > LABELS_MAX)
		return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_field",
				    "labels must be an object of at most %d strings", LABELS_MAX);
	json_object_foreach (req->labels, k, v) {
		if (!name_valid(k) || !json_is_string(v) || strlen(json_string_value(v)) > 1024)
			return err_set_kind(
				err, ERR_INVALID, EINVAL, "invalid_field",
				"labels: keys are 1 to 128 printable characters, values strings of at most 1024 bytes");
	}
	return 0;
}

/* Checkpoints that count against max_checkpoints, and the bytes they hold. */
static void engine_usage(struct engine *e, size_t *count, uint64_t *bytes)
{
	struct catalog_stats st;
	catalog_stats(e->catalog, &st);
	*count = 0, *bytes = 0;
	for (int s = 0; s < CKPT_STATUS_N; s++) {
		if (s == CKPT_FAILED)
			continue;
		*count += st.count[s];
		*bytes += st.bytes[s];
	}
	*bytes += atomic_load(&e->oci_bytes); /* layers and trees kept for push and pull */
}

struct ckpt_record *create_record(struct engine *e, const struct create_req *req, const char *id)
{
	int64_t now = now_ms();
	int64_t ttl = req->has_ttl ? req->ttl_secs : e->cfg->default_ttl_secs;
	if (ttl > TTL_MAX_SECS) /* a configured default is not checked like a request's */
		ttl = TTL_MAX_SECS;
	int64_t exp = ttl > 0 ? now + ttl * 1000 : 0;
	struct ckpt_record *r = record_new(id, req->name, CKPT_CREATING);

	if (!r)
		return NULL;
	record_set_backend(r, e->backend->name);
	fmt_rfc3339_ms(now, r->created_at, sizeof(r->created_at));
	if (exp)
		fmt_rfc3339_ms(exp, r->expires_at, sizeof(r->expires_at));
	r->ttl_secs = ttl;
	r->created_ms = now;
	r->expires_ms = exp;
	if (req->labels)
		json_object_update(r->labels, req->labels);
	for (size_t i = 0; i < e->cfg->n_roots; i++)
		json_array_append_new(r->roots, json_string(e->cfg->roots[i]));
	if (req->idem && (r->extra.idem = malloc(sizeof(*r->extra.idem))))
		*r->extra.idem = *req->idem;
	if (!r->backend || (req->idem && !r->extra.idem)) {
		record_unref(r);
		return NULL;
	}
	return r;
}

/* Check the limits and publish the record in state "creating" in one step, so
 * two racing creates cannot both take the last place. */
int create_admit(struct engine *e, const struct ckpt_record *rec, ckpt_error *err)
{
	size_t count;
	uint64_t bytes;
	int r = 0;

	pthread_mutex_lock(&e->state_lock);
	engine_usage(e, &count, &bytes);
	if ((int64_t)count >= e->cfg->max_checkpoints)
		r = err_set_kind(err, ERR_LIMIT, EDQUOT, "checkpoint_limit",
				 "checkpoint limit reached (max_checkpoints %lld); delete some first",
				 (long long)e->cfg->max_checkpoints);
	else if (e->cfg->max_state_bytes > 0 && bytes >= (uint64_t)e->cfg->max_state_bytes)
		r = err_set_kind(
			err, ERR_NO_SPACE, ENOSPC, "insufficient_storage",
			"checkpoints and the registry cache hold %llu bytes, at the max_state_bytes limit %lld",
			(unsigned long long)bytes, (long long)e->cfg->max_state_bytes);
	else
		r = catalog_put_volatile(e->catalog, rec);
	pthread_mutex_unlock(&e->state_lock);
	return r;
}

static int create_over_budget(struct engine *e, ckpt_error *err)
{
	size_t count;
	uint64_t bytes;
	if (e->cfg->max_state_bytes <= 0)
		return 0;
	engine_usage(e, &count, &bytes);
	if (bytes <= (uint64_t)e->cfg->max_state_bytes)
		return 0;
	return err_set_kind(err, ERR_NO_SPACE, ENOSPC, "insufficient_storage",
			    "the checkpoint would bring state (checkpoints and registry cache) to %llu bytes, over "
			    "max_state_bytes %lld",
			    (unsigned long long)bytes, (long long)e->cfg->max_state_bytes);
}

/* The backend's create after the thaw (its capture done). Where it can, it
 * leaves the syncfs of its new layers on the catalog's file system to the
 * record's write (*deferred: create_record_write), one barrier for both. */
static int create_finish(struct engine *e, const char *id, struct engine_op *op, json_t **data, uint64_t *size,
			 bool *deferred, ckpt_error *err)
{
	const struct backend_capture_ops *c = e->backend->capture;
	if (!c->create_defer)
		return e->backend->create(e->bst, id, data, size, &op->progress, err);
	return c->create_defer(e->bst, id, catalog_dev(e->catalog), data, size, &op->progress, deferred, err);
}

/* The backend's copy inside a freeze of the units that use the roots, after
 * a first pass without the freeze (precopy) so the frozen one copies only
 * what changed meanwhile, and made durable after the thaw where the backend
 * can split the two (capture); what the freeze did goes into rep, and how
 * long the units were frozen (the frozen pass, whether or not a unit was)
 * into freeze_ms. */
static int create_frozen(struct engine *e, const char *id, struct engine_op *op, json_t **data, uint64_t *size,
			 struct svc_report *rep, int64_t *freeze_ms, bool *deferred, ckpt_error *err)
{
	struct svc_plan plan;
	ckpt_error perr = { 0 };
	if (services_plan(e->services, e->cfg->roots, e->cfg->n_roots, &plan) < 0)
		log_warn("services: cannot list the units to freeze");
	if (e->backend->precopy(e->bst, plan.n > 0, &op->progress, &perr) < 0)
		log_warn("create: first pass before the freeze failed, copying all while frozen: %s", perr.msg);
	int64_t t0 = mono_ms();
	bool split = e->backend->capture != NULL;
	engine_svc_journal_save(e, "create", id, &plan); /* a crash while frozen: thawed at the next start */
	services_freeze(e->services, &plan);
	int r = split ? e->backend->capture->capture(e->bst, &op->progress, err)
		      : e->backend->create(e->bst, id, data, size, &op->progress, err);
	services_thaw(e->services, &plan);
	if (plan.n > 0)
		engine_svc_journal_clear(e);
	*freeze_ms = mono_ms() - t0;
	/* the copy is taken: recording and syncing it need no freeze */
	if (r == 0 && split)
		r = create_finish(e, id, op, data, size, deferred, err);
	services_report(&plan, rep);
	services_plan_free(&plan);
	return r;
}

/* The record keeps what the freeze did, as the catalog writes it:
 * frozen_services [unit] and freeze_failures {unit: reason}. */
static void create_note_freeze(struct ckpt_record *rec, struct svc_report *rep)
{
	services_strv_clear(&rec->frozen_services);
	rec->frozen_services = rep->frozen;
	rep->frozen = (struct strv){ 0 };
	if (!rep->n_failures)
		return;
	for (size_t i = 0; i < rec->n_freeze_failures; i++)
		free(rec->freeze_failures[i].unit), free(rec->freeze_failures[i].reason);
	free(rec->freeze_failures);
	rec->freeze_failures = TAKE_PTR(rep->failures);
	rec->n_freeze_failures = rep->n_failures;
	rep->n_failures = 0;
}

/* The record, durable, then in memory. In memory its duration_ms also
 * counts the time since taken (when the file's figure was taken), so the
 * answer counts the record's sync; the file, written before, cannot.
 * deferred: the backend left its new layers unsynced on the catalog's
 * file system; the record's temp file is written, one syncfs makes it and
 * them durable, then it is renamed into place and the catalog's directory
 * synced (catalog_write). A crash before that syncfs ends leaves no record,
 * and the start removes the layers nothing names; a record that exists
 * names only durable layers. That syncfs stands for the layers' own and
 * the temp file's fsync: one barrier less. */
static int create_record_write(struct engine *e, struct ckpt_record *rec, bool deferred, int64_t taken, ckpt_error *err)
{
	int r = catalog_write(e->catalog, rec, deferred, err);
	if (r < 0)
		return r;
	rec->duration_ms += mono_ms() - taken;
	return catalog_put_volatile(e->catalog, rec);
}

/* queue_ms: how long the create waited for the operation lock, counted in
 * its duration as restore does. */
static int create_capture(struct engine *e, struct ckpt_record *rec, struct engine_op *op, int64_t queue_ms,
			  ckpt_error *err)
{
	const char *id = rec->id;
	struct svc_report rep;
	json_t *data = NULL;
	uint64_t size = 0;
	int64_t t0 = mono_ms(), freeze_ms = 0;
	bool deferred = false;
	int r;

	svc_report_init(&rep);
	r = create_frozen(e, id, op, &data, &size, &rep, &freeze_ms, &deferred, err);
	if (r < 0) {
		svc_report_free(&rep);
		return r;
	}
	json_decref(rec->backend_data);
	rec->backend_data = data ? data : json_object();
	rec->size_bytes = (int64_t)size;
	int64_t t1 = mono_ms();
	rec->duration_ms = t1 - t0 + queue_ms;
	rec->extra.has_freeze_ms = rec->extra.has_queue_ms = true;
	rec->extra.freeze_ms = freeze_ms;
	rec->extra.queue_ms = queue_ms;
	create_note_freeze(rec, &rep);
	svc_report_free(&rep);
	/* The size counts toward the budget check; the record says "active" only
	 * once it is durable, so no client sees a checkpoint a crash could lose. */
	catalog_put_volatile(e->catalog, rec);
	if ((r = create_over_budget(e, err)) == 0) {
		rec->status = CKPT_ACTIVE;
		r = FAILPOINT_AROUND("create.record.write", create_record_write(e, rec, deferred, t1, err));
	}
	if (r < 0) {
		rec->status = CKPT_CREATING;
		e->backend->remove(e->bst, id, rec->backend_data, NULL);
	}
	return r;
}

/* Runs with the record already published as "creating", and op (its
 * progress) registered, or NULL: registered here. On failure the record goes
 * (sync) or stays in memory as "failed" with the error (async). */
static int create_run(struct engine *e, struct ckpt_record *rec, struct engine_op *op, bool keep_failed,
		      ckpt_error *err)
{
	const char *id = rec->id;
	int64_t t0 = mono_ms();
	int r;

	if (!op)
		op = engine_op_begin(e, id);

	pthread_mutex_lock(&e->op_lock);
	engine_set_status(e, "creating", id);
	r = op ? engine_check_managed(e, err) : -ENOMEM;
	if (r == 0)
		r = create_capture(e, rec, op, mono_ms() - t0, err);
	r = engine_err_classify(err, ENGINE_CTX_CREATE, r);
	engine_set_status(e, NULL, NULL);
	pthread_mutex_unlock(&e->op_lock);
	engine_op_end(e, op);
	metrics_op(&e->metrics, OP_CREATE, r == 0, (double)(mono_ms() - t0) / 1000.0);
	if (r == 0) {
		int64_t ms = mono_ms() - t0;
		log_event(LOG_INFO_, &(struct log_fields){ "create", id, NULL, ms },
			  "created checkpoint \"%s\" (\"%s\") in %lld ms", id, rec->name, (long long)ms);
		engine_kick_maintenance(e); /* e.g. compact a tar chain grown too long */
		return 0;
	}
	log_event(LOG_WARN_, &(struct log_fields){ "create", id, NULL, mono_ms() - t0 }, "create of \"%s\" failed: %s",
		  id, err ? err->msg : "");
	if (keep_failed) {
		rec->status = CKPT_FAILED;
		free(rec->error.code);
		free(rec->error.detail);
		rec->error.code = strdup(err->kind && err->code ? err->code : "internal");
		rec->error.detail = strdup(err->msg);
		catalog_put_volatile(e->catalog, rec);
	} else {
		catalog_remove(e->catalog, id, NULL);
	}
	return r;
}

struct async_create {
	struct engine *e;
	struct ckpt_record *rec;
	struct engine_op *op; /* registered before the 202: a replay sees its progress */
};

static void *create_async_main(void *arg)
{
	struct async_create *a = arg;
	ckpt_error err = { 0 };
	create_run(a->e, a->rec, a->op, true, &err);
	record_unref(a->rec);
	pthread_mutex_lock(&a->e->state_lock);
	a->e->pending_async--;
	pthread_cond_broadcast(&a->e->sweep_cond);
	pthread_mutex_unlock(&a->e->state_lock);
	free(a);
	return NULL;
}

static int create_start_async(struct engine *e, const struct ckpt_record *rec, ckpt_error *err)
{
	struct async_create *a = malloc(sizeof(*a));
	pthread_t t;
	pthread_attr_t attr;

	if (!a)
		return -ENOMEM;
	a->e = e;
	a->rec = record_dup(rec); /* the worker mutates its own copy */
	a->op = a->rec ? engine_op_begin(e, rec->id) : NULL;
	if (!a->op) {
		record_unref(a->rec);
		free(a);
		return -ENOMEM;
	}
	pthread_mutex_lock(&e->state_lock);
	e->pending_async++;
	pthread_mutex_unlock(&e->state_lock);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int r = pthread_create(&t, &attr, create_async_main, a);
	pthread_attr_destroy(&attr);
	if (r != 0) {
		pthread_mutex_lock(&e->state_lock);
		e->pending_async--;
		pthread_mutex_unlock(&e->state_lock);
		engine_op_end(e, a->op);
		record_unref(a->rec);
		free(a);
		return err_set(err, r, NULL, "cannot start the create worker");
	}
	return 0;
}

int engine_create(struct engine *e, const struct create_req *req, struct ckpt_view *ret, ckpt_error *err)
{
	char id[32];
	int r;

	if ((r = create_validate(req, err)) < 0)
		return r;
	if ((r = id_generate(id, sizeof(id))) < 0)
		return err_set(err, -r, NULL, "cannot generate an id");
	struct ckpt_record *rec = create_record(e, req, id);
	if (!rec)
		return -ENOMEM;
	if ((r = create_admit(e, rec, err)) < 0)
		goto out;
	if (req->async) {
		if ((r = create_start_async(e, rec, err)) < 0)
			catalog_remove(e->catalog, id, NULL);
		else /* with its progress, registered before the worker runs */
			engine_view(e, rec, ret);
		goto out;
	}
	if ((r = create_run(e, rec, NULL, false, err)) == 0)
		engine_view(e, rec, ret);
out:
	record_unref(rec);
	return r;
}
