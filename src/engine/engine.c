/* engine.c: opening and closing the engine (backend choice, state identity,
 * recovery, the sweeper), and delete. The top of the engine: it calls the
 * other engine files, none of them calls it. Reads (list, get, health) never
 * take the operation lock. */
#include "engine/engine.h"

#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "engine/catalog.h"
#include "config.h"
#include "engine/engine_export.h"
#include "engine/oci_cache.h"
#include "engine/engine_internal.h"
#include "engine/engine_oci.h"
#include "engine/engine_push_note.h"
#include "engine/oci_cache.h"
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
	if (cfg->backend == BACKEND_TAR || cfg->whole_root) {
		e->backend = &backend_tar_ops;
		snprintf(e->backend_reason, sizeof(e->backend_reason), "%s",
			 cfg->backend == BACKEND_TAR ? "tar backend chosen by configuration"
						     : "root / (the whole sandbox) takes the tar backend");
		return 0;
	}
	if (backend_overlay_ops.probe && backend_overlay_ops.probe(&e->bctx, &perr) == 0) {
		e->backend = &backend_overlay_ops;
		snprintf(e->backend_reason, sizeof(e->backend_reason), "%s",
			 cfg->backend == BACKEND_OVERLAY
				 ? "overlay backend chosen by configuration"
				 : "auto: overlayfs mounts here, and a test mount kept a renamed base directory and a "
				   "deleted base file (a restore swaps a layer chain, a create copies only the upper)");
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
	struct catalog_list all;
	const char(*left_out)[32];
	size_t n = 0, n_left_out = catalog_left_out_ids(e->catalog, &left_out);
	int r;

	if (catalog_list(e->catalog, NULL, &all) < 0)
		return err_set(err, ENOMEM, NULL, "recovery: out of memory");
	const char **ids = calloc(all.n + n_left_out + 1, sizeof(*ids));
	json_t **data = calloc(all.n + n_left_out + 1, sizeof(*data));
	if (!ids || !data) {
		free(ids);
		free(data);
		catalog_list_free(&all);
		return err_set(err, ENOMEM, NULL, "recovery: out of memory");
	}
	for (size_t i = 0; i < all.n; i++) {
		const struct ckpt_record *rec = all.v[i];
		if (rec->status == CKPT_DELETING) {
			ckpt_error derr = { 0 };
			log_notice("finishing interrupted delete of \"%s\"", rec->id);
			if (engine_drop(e, rec, &derr) < 0) /* listed as deleting; the next start tries again */
				log_warn("cannot finish the delete of \"%s\": %s", rec->id, derr.msg);
			continue;
		}
		ids[n] = rec->id;
		data[n++] = rec->backend_data;
	}
	/* A record file left out may be one a person can repair: keep its data. */
	for (size_t i = 0; i < n_left_out; i++)
		ids[n++] = left_out[i];
	r = e->backend->recover(e->bst, ids, data, n, err);
	free(ids);
	free(data);
	catalog_list_free(&all);
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
	e->bctx = (struct backend_ctx){ .flatten_depth = e->cfg->flatten_depth,
					.tar_chain_max = e->cfg->tar_chain_max,
					.state_dir = e->cfg->state_dir,
					.state_fd = e->state_fd,
					.roots = e->cfg->roots,
					.n_roots = e->cfg->n_roots,
					.track_changes = e->cfg->track_changes,
					.track_check = e->cfg->track_check,
					.whole_root = e->cfg->whole_root,
					.excludes = e->cfg->excludes,
					.n_excludes = e->cfg->n_excludes,
					.before_mount = engine_adopt_before_mount,
					.hook_ctx = e };
	if ((r = engine_choose_backend(e, deps, err)) < 0)
		return r;
	write_file_atomic_sweep(e->state_fd); /* we hold the state lock: nobody else writes */
	if ((r = engine_check_identity(e, err)) < 0)
		return r;
	if ((r = engine_idem_open(e, err)) < 0)
		return r;
	if ((r = catalog_open(e->state_fd, &e->catalog, err)) < 0)
		return r;
	if ((r = e->backend->open(&e->bctx, &e->bst, err)) < 0)
		return err_prefix(err, "%s backend", e->backend->name);
	engine_xfer_sweep(e); /* exports and imports a killed daemon left */
	oci_cache_sweep(e);   /* and a killed push's or pull's cache entries */
	if ((r = engine_recover(e, err)) < 0)
		return r;
	engine_idem_from_records(e);
	return 0;
}

int engine_open(const struct config *cfg, const struct engine_deps *deps, struct engine **ret, ckpt_error *err)
{
	struct engine *e = calloc(1, sizeof(*e));
	int r = 0;

	if (!e)
		return -ENOMEM;
	e->cfg = cfg;
	e->state_fd = e->lock_fd = e->idem_fd = -1;
	pthread_mutex_init(&e->idem_lock, NULL);
	e->started_ms = mono_ms();
	pthread_mutex_init(&e->op_lock, NULL);
	pthread_mutex_init(&e->state_lock, NULL);
	pthread_rwlock_init(&e->oci_lock, NULL);
	pthread_cond_init(&e->sweep_cond, NULL);
	metrics_init(&e->metrics);
	/* Services first: mounting a root at start stops the units using it. */
	if (deps && deps->services)
		e->services = deps->services, e->services_borrowed = true;
	else
		r = services_open(cfg, NULL, &e->services, err);
	if (r == 0)
		r = engine_open_state(e, deps, err);
	if (r == 0) /* the roots are mounted: units a crash left stopped or frozen */
		engine_svc_journal_recover(e);
	if (r == 0)
		oci_trim(e); /* what a killed push or pull left, and the size to count */
	if (r == 0)
		engine_push_recover(e);
	if (r == 0)
		r = engine_forks_open(e, err);
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
	if (e->bst)
		e->backend->close(e->bst, e->cfg->unmount_on_exit);
	if (e->adoption_pending) /* a failed start: bring back the units it stopped */
		engine_adoption_finish(e);
	if (e->services && !e->services_borrowed)
		services_close(e->services);
	engine_adoption_free(e);
	catalog_close(e->catalog);
	engine_pushes_free(e);
	pthread_rwlock_destroy(&e->oci_lock);
	engine_idem_close(e);
	pthread_mutex_destroy(&e->idem_lock);
	if (e->lock_fd >= 0)
		close(e->lock_fd);
	if (e->state_fd >= 0)
		close(e->state_fd);
	metrics_destroy(&e->metrics);
	engine_forks_free(e);
	pthread_mutex_destroy(&e->op_lock);
	pthread_mutex_destroy(&e->state_lock);
	pthread_cond_destroy(&e->sweep_cond);
	free(e);
}

int engine_delete(struct engine *e, const char *id_or_name, ckpt_error *err)
{
	int64_t t0 = mono_ms();
	int r;

	const struct ckpt_record *rec = engine_resolve(e, id_or_name);
	if (rec && rec->status == CKPT_CREATING) {
		record_unref(rec);
		return err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "checkpoint '%s' is still being created",
				    id_or_name);
	}
	record_unref(rec);
	pthread_mutex_lock(&e->op_lock);
	engine_set_status(e, "deleting", id_or_name);
	rec = engine_resolve(e, id_or_name);
	if (!rec)
		r = err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint with id or name '%s'",
				 id_or_name);
	else if (rec->status == CKPT_CREATING)
		r = err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "checkpoint '%s' is still being created",
				 rec->id);
	else if (engine_check_forked(e, rec->id))
		r = err_set_kind(err, ERR_CONFLICT, EBUSY, "checkpoint_forked",
				 "checkpoint '%s' has forks: delete them first (GET /v1/forks)", rec->id);
	else
		r = engine_err_classify(err, ENGINE_CTX_DELETE, engine_drop(e, rec, err));
	if (r == 0)
		log_event(LOG_INFO_, &(struct log_fields){ "delete", rec->id, NULL, -1 }, "deleted checkpoint \"%s\"",
			  rec->id);
	record_unref(rec);
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
