/* engine.c: the order of steps for create, restore and delete, and the one
 * lock that serializes them. Reads (list, get, health) never take that lock. */
#include "engine/engine.h"

#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "engine/catalog.h"
#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"

static int engine_choose_backend(struct engine *e, const struct engine_deps *deps, ckpt_error *err)
{
	ckpt_error perr = { 0 };
	const struct config *cfg = e->cfg;

	if (deps && deps->backend) {
		e->backend = deps->backend;
		snprintf(e->backend_reason, sizeof(e->backend_reason), "backend given by the caller");
		return 0;
	}
	if (cfg->backend == BACKEND_TAR) {
		e->backend = &backend_tar_ops;
		snprintf(e->backend_reason, sizeof(e->backend_reason), "tar backend chosen by configuration");
		return 0;
	}
	if (backend_overlay_ops.probe && backend_overlay_ops.probe(&e->bctx, &perr) == 0) {
		e->backend = &backend_overlay_ops;
		snprintf(e->backend_reason, sizeof(e->backend_reason), "%s",
			 cfg->backend == BACKEND_OVERLAY ? "overlay backend chosen by configuration"
							 : "auto: overlayfs mounts work here");
		return 0;
	}
	if (cfg->backend == BACKEND_OVERLAY)
		return err_set(err, perr.errnum, NULL, "overlay backend unusable here: %s", perr.msg);
	e->backend = &backend_tar_ops;
	snprintf(e->backend_reason, sizeof(e->backend_reason), "auto: overlayfs unusable (%.400s), using tar",
		 perr.msg);
	return 0;
}

/* <state>/ckptd.json pins the roots and the backend the state was made for:
 * checkpoints of other roots or another backend cannot be restored. */
static int engine_check_identity(struct engine *e, ckpt_error *err)
{
	_cleanup_free_ char *buf = NULL;
	json_t *roots = json_array();
	for (size_t i = 0; roots && i < e->cfg->n_roots; i++)
		if (json_array_append_new(roots, json_string(e->cfg->roots[i])) < 0)
			json_decref(TAKE_PTR(roots));
	json_auto_t *want = roots ? json_pack("{s:o, s:s}", "roots", roots, "backend", e->backend->name) : NULL;
	if (!want)
		return err_set(err, ENOMEM, NULL, "state identity: out of memory");
	int r = read_file_at(e->state_fd, "ckptd.json", 65536, &buf, NULL);
	if (r == -ENOENT) {
		_cleanup_free_ char *text = json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS);
		r = text ? write_file_atomic(e->state_fd, "ckptd.json", text, strlen(text), 0600) : -ENOMEM;
		return r < 0 ? err_set(err, -r, NULL, "cannot write state identity: %s", strerror(-r)) : 0;
	}
	if (r < 0)
		return err_set(err, -r, NULL, "cannot read %s/ckptd.json: %s", e->cfg->state_dir, strerror(-r));
	json_auto_t *have = json_loads(buf, 0, NULL);
	bool same = have && json_equal(json_object_get(have, "roots"), json_object_get(want, "roots")) &&
		json_equal(json_object_get(have, "backend"), json_object_get(want, "backend"));
	_cleanup_free_ char *had = have ? json_dumps(have, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	if (!same)
		return err_set(err, EEXIST, NULL,
			       "state dir '%s' belongs to another setup (%s); use the same roots and backend, or "
			       "another state dir",
			       e->cfg->state_dir, had ? had : "unreadable");
	return 0;
}

static int engine_lock_state(struct engine *e, ckpt_error *err)
{
	e->lock_fd = openat(e->state_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (e->lock_fd < 0)
		return err_set(err, errno, NULL, "cannot open state lock: %m");
	if (flock(e->lock_fd, LOCK_EX | LOCK_NB) < 0)
		return err_set(err, EBUSY, NULL, "another ckptd is using state dir '%s'", e->cfg->state_dir);
	return 0;
}

/* Finish deletes that a crash interrupted, then let the backend drop data no
 * record refers to (half-made creates). */
static int engine_recover(struct engine *e, ckpt_error *err)
{
	json_t *all = catalog_list(e->catalog, NULL), *rec;
	size_t i, n = 0;
	const char **ids = calloc(json_array_size(all) + 1, sizeof(*ids));
	json_t **data = calloc(json_array_size(all) + 1, sizeof(*data));
	int r = 0;

	if (!all || !ids || !data) {
		free(ids);
		free(data);
		json_decref(all);
		return err_set(err, ENOMEM, NULL, "recovery: out of memory");
	}

	json_array_foreach(all, i, rec)
	{
		const char *status = json_string_value(json_object_get(rec, "status"));
		if (status && !strcmp(status, "deleting")) {
			log_notice("finishing interrupted delete of \"%s\"", record_id(rec));
			engine_drop(e, rec, NULL);
			continue;
		}
		ids[n] = record_id(rec);
		data[n++] = json_object_get(rec, "_backend");
	}
	if (e->backend->recover)
		r = e->backend->recover(e->bst, ids, data, n, err);
	free(ids);
	free(data);
	json_decref(all);
	return r;
}

static int engine_open_state(struct engine *e, const struct engine_deps *deps, ckpt_error *err)
{
	int r;
	e->state_fd = open(e->cfg->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (e->state_fd < 0)
		return err_set(err, errno, NULL, "cannot open state dir '%s': %m", e->cfg->state_dir);
	if ((r = engine_lock_state(e, err)) < 0)
		return r;
	e->bctx = (struct backend_ctx){ .cfg = e->cfg,
					.state_dir = e->cfg->state_dir,
					.state_fd = e->state_fd,
					.roots = e->cfg->roots,
					.n_roots = e->cfg->n_roots };
	if ((r = engine_choose_backend(e, deps, err)) < 0)
		return r;
	if (!e->backend->open || !e->backend->create || !e->backend->restore || !e->backend->remove)
		return err_set(err, ENOTSUP, NULL, "the %s backend is not available in this build", e->backend->name);
	write_file_atomic_sweep(e->state_fd); /* we hold the state lock: nobody else writes */
	if ((r = engine_check_identity(e, err)) < 0)
		return r;
	if ((r = catalog_open(e->state_fd, &e->catalog, err)) < 0)
		return r;
	if ((r = e->backend->open(&e->bctx, &e->bst, err)) < 0)
		return err_prefix(err, "%s backend", e->backend->name);
	return engine_recover(e, err);
}

int engine_open(const struct config *cfg, const struct engine_deps *deps, struct engine **ret, ckpt_error *err)
{
	struct engine *e = calloc(1, sizeof(*e));
	int r;

	if (!e)
		return -ENOMEM;
	e->cfg = cfg;
	e->state_fd = e->lock_fd = -1;
	e->started_ms = mono_ms();
	pthread_mutex_init(&e->op_lock, NULL);
	pthread_mutex_init(&e->state_lock, NULL);
	pthread_cond_init(&e->sweep_cond, NULL);
	metrics_init(&e->metrics);
	r = engine_open_state(e, deps, err);
	if (r == 0)
		r = engine_forks_open(e, err);
	if (r == 0 && deps && deps->services)
		e->services = deps->services, e->services_borrowed = true;
	else if (r == 0)
		r = services_open(cfg, NULL, &e->services, err);
	if (r == 0)
		r = engine_sweeper_start(e, err);
	if (r < 0) {
		engine_close(e);
		return r;
	}
	*ret = e;
	return 0;
}

void engine_close(struct engine *e)
{
	if (!e)
		return;
	engine_sweeper_stop(e);
	/* Let async creates finish: their clients were promised a checkpoint. */
	pthread_mutex_lock(&e->state_lock);
	while (e->pending_async > 0)
		pthread_cond_wait(&e->sweep_cond, &e->state_lock);
	pthread_mutex_unlock(&e->state_lock);
	if (e->bst && e->backend->close)
		e->backend->close(e->bst, e->cfg->unmount_on_exit);
	if (e->services && !e->services_borrowed)
		services_close(e->services);
	catalog_close(e->catalog);
	if (e->lock_fd >= 0)
		close(e->lock_fd);
	if (e->state_fd >= 0)
		close(e->state_fd);
	metrics_destroy(&e->metrics);
	json_decref(e->forks);
	pthread_mutex_destroy(&e->op_lock);
	pthread_mutex_destroy(&e->state_lock);
	pthread_cond_destroy(&e->sweep_cond);
	free(e);
}

/* An id, or a name meaning the newest usable checkpoint with that name: an
 * active one when there is one, so a failed or still-running create does not
 * hide the last good checkpoint of that name. */
json_t *engine_resolve(struct engine *e, const char *id_or_name)
{
	json_t *r = id_valid(id_or_name) ? catalog_get(e->catalog, id_or_name) : NULL;
	json_t *all, *rec;
	size_t i;

	if (r)
		return r;
	all = catalog_list(e->catalog, id_or_name);
	json_array_foreach(all, i, rec) if (!strcmp(json_string_value(json_object_get(rec, "status")), "active"))
	{
		r = json_incref(rec);
		break;
	}
	if (!r)
		r = json_incref(json_array_get(all, 0));
	json_decref(all);
	return r;
}

int engine_get(struct engine *e, const char *id_or_name, json_t **ret_record, ckpt_error *err)
{
	json_t *r = engine_resolve(e, id_or_name);
	if (!r)
		return err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint with id or name '%s'",
				    id_or_name);
	*ret_record = engine_public(e, r);
	json_decref(r);
	return 0;
}

json_t *engine_list(struct engine *e, const char *name)
{
	json_t *all = catalog_list(e->catalog, name), *out = json_array(), *rec;
	size_t i;
	json_array_foreach(all, i, rec) json_array_append_new(out, engine_public(e, rec));
	json_decref(all);
	return out;
}

/* Remove a record's data and then the record; used by delete, the sweeper and
 * recovery. The record is marked "deleting" durably first, so a crash in the
 * middle is finished at the next start rather than leaving a broken checkpoint. */
int engine_drop(struct engine *e, json_t *rec, ckpt_error *err)
{
	const char *id = record_id(rec);
	int r;

	json_object_set_new(rec, "status", json_string("deleting"));
	if ((r = catalog_put(e->catalog, rec, err)) == -ENOSPC || r == -EDQUOT) {
		/* A full disk must not block the delete that frees it: drop the record
		 * first instead; the backend's recover() removes orphaned data. */
		if ((r = catalog_remove(e->catalog, id, err)) < 0)
			return r;
		if (e->backend->remove && e->backend->remove(e->bst, id, json_object_get(rec, "_backend"), NULL) < 0)
			log_warn("data of \"%s\" is left until the next start", id);
		return 0;
	}
	if (r < 0)
		return r;
	if (e->backend->remove && (r = e->backend->remove(e->bst, id, json_object_get(rec, "_backend"), err)) < 0)
		return err_prefix(err, "cannot remove data of '%s'", id);
	return catalog_remove(e->catalog, id, err);
}

int engine_delete(struct engine *e, const char *id_or_name, ckpt_error *err)
{
	int64_t t0 = mono_ms();
	int r;

	json_t *rec = engine_resolve(e, id_or_name);
	if (rec && !strcmp(json_string_value(json_object_get(rec, "status")), "creating")) {
		json_decref(rec);
		return err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "checkpoint '%s' is still being created",
				    id_or_name);
	}
	json_decref(rec);
	pthread_mutex_lock(&e->op_lock);
	engine_set_status(e, "deleting", id_or_name);
	rec = engine_resolve(e, id_or_name);
	if (!rec)
		r = err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint with id or name '%s'",
				 id_or_name);
	else if (!strcmp(json_string_value(json_object_get(rec, "status")), "creating"))
		r = err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "checkpoint '%s' is still being created",
				 record_id(rec));
	else if (engine_fork_uses(e, record_id(rec)))
		r = err_set_kind(err, ERR_CONFLICT, EBUSY, "checkpoint_forked",
				 "checkpoint '%s' has forks: delete them first (GET /v1/forks)", record_id(rec));
	else
		r = engine_drop(e, rec, err);
	if (r == 0)
		log_event(LOG_INFO_, &(struct log_fields){ "delete", record_id(rec), NULL, -1 },
			  "deleted checkpoint \"%s\"", record_id(rec));
	json_decref(rec);
	engine_set_status(e, NULL, NULL);
	pthread_mutex_unlock(&e->op_lock);
	engine_kick_maintenance(e);
	metrics_op(&e->metrics, OP_DELETE, r == 0, (double)(mono_ms() - t0) / 1000.0);
	return r;
}

const char *engine_backend_name(struct engine *e)
{
	return e->backend->name;
}

/* A backend or the catalog ran out of room: the disk's ENOSPC and a quota's
 * EDQUOT both answer 507. Anything else a lower layer reports stays unset (500). */
int engine_storage_err(ckpt_error *err, int r)
{
	if (err && r < 0 && (err->errnum == ENOSPC || err->errnum == EDQUOT)) {
		err->errnum = ENOSPC;
		return err_mark(err, ERR_NO_SPACE, "insufficient_storage", -ENOSPC);
	}
	return r;
}

void engine_count_http(struct engine *e, int status)
{
	metrics_http(&e->metrics, status);
}
