/* backend_tar.c: checkpoints as libarchive pax archives, for sandboxes where
 * mounting is not allowed. Layout below <state>/tar/:
 *   <id>/meta.json, <id>/r<N>.tar[.zst], <id>/r<N>.manifest   one checkpoint
 *   base/...                    the roots as ckptd first adopted them
 *   .tmp-<id>/                  a checkpoint being written (never trusted)
 *   restoring.json              intent: a restore in progress ({"id": ...})
 *   head                        the checkpoint the roots were last made or
 *                               restored as: the next create's parent
 *   .keep/<id>/                 a deleted checkpoint whose archives later
 *                               (incremental) checkpoints still read
 *   .compact-<id>/, .trash-<id>/ a compaction being written / replaced
 *   running                     a run under way; left, the last one was cut
 *                               short (tar_meta_running_open)
 * Incremental checkpoints: a create writes into its own archive only what
 * changed since the head (and every directory, link and special file),
 * plus the full manifest, whose lines name the older archive holding each
 * unchanged file's data. meta.json lists those archives ("refs") and the
 * chain's length ("depth"); chains longer than tar_chain_max are compacted
 * into a full archive off the operation lock.
 * A checkpoint directory appears by rename only once its files are durable;
 * a restore runs between writing and removing the intent, and is idempotent,
 * so a restarted daemon finishes it by running it again.
 * This file holds the ops table and the backend's life: open, recover,
 * health, close. tar_internal.h says which file does the rest. */
#include "backend/tar/tar_internal.h"

static int tar_probe(const struct backend_ctx *ctx, ckpt_error *err)
{
	(void)ctx;
	(void)err;
	return 0; /* needs nothing but a writable state dir */
}

static int state_init(struct tar_state *s, const struct backend_ctx *ctx, ckpt_error *err)
{
	struct stat st;

	s->ctx = ctx;
	s->roots = (char **)ctx->roots;
	s->n_roots = ctx->n_roots;
	s->tar_fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->trk_lock, NULL);
	pthread_cond_init(&s->base_cond, NULL);
	if (fstat(ctx->state_fd, &st) < 0)
		return err_set(err, errno, NULL, "cannot stat the state dir: %m");
	s->state_dev = st.st_dev;
	s->state_ino = st.st_ino;
	int made = mkdirat_durable(ctx->state_fd, TAR_DIR, 0700);
	if (made < 0)
		return err_set(err, -made, NULL, "cannot create '%s/" TAR_DIR "': %s", ctx->state_dir, strerror(-made));
	s->tar_fd = openat(ctx->state_fd, TAR_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (s->tar_fd < 0)
		return err_set(err, errno, NULL, "cannot open '%s/" TAR_DIR "': %m", ctx->state_dir);
	s->zstd = tar_create_zstd_available();
	return 0;
}

static void tar_close(void *st, bool unmount)
{
	struct tar_state *s = st;
	(void)unmount;
	if (!s)
		return;
	if (s->base_thread_started)
		pthread_join(s->base_thread, NULL);
	if (s->opened)
		tar_meta_running_close(s);
	if (s->tar_fd >= 0)
		close(s->tar_fd);
	pthread_cond_destroy(&s->base_cond);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_lock(&s->trk_lock);
	tar_track_free(s);
	rootexcl_free(&s->trk_excl);
	pthread_mutex_unlock(&s->trk_lock);
	pthread_mutex_destroy(&s->trk_lock);
	free(s->no_compact);
	free(s->tinfo);
	for (size_t i = 0; i < MAX_ROOTS; i++) {
		tar_mcache_free(&s->mcache[i]);
		pathindex_free(s->mapped_last[i]);
		pathindex_free(s->mapped_now[i]);
	}
	free(s);
}

static int tar_open(const struct backend_ctx *ctx, void **ret_st, ckpt_error *err)
{
	struct tar_state *s = calloc(1, sizeof(*s));
	struct stat st;
	int r;

	if (!s)
		return err_set(err, ENOMEM, NULL, "out of memory");
	r = state_init(s, ctx, err);
	if (r >= 0) {
		for (size_t i = 0; i < s->n_roots; i++)
			tar_probe_ctime(s->tar_fd, s->roots[i], &s->blind[i]);
		tar_meta_head_load(s);
		tar_meta_running_open(s);
		tar_rollback_finish(s);
		tar_track_arm(s); /* before the base: its capture is the first collect */
		rm_rf_at(s->tar_fd, ".tmp-" BASE);
		/* The base is what reset returns to: the roots as first adopted. */
		if (fstatat(s->tar_fd, BASE, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			s->base_state = BASE_PREPARING;
			if ((r = -pthread_create(&s->base_thread, NULL, tar_snapshot_base, s)) < 0)
				err_set(err, -r, NULL, "cannot start taking the roots' base: %s", strerror(-r));
			s->base_thread_started = r == 0;
		}
	}
	if (r < 0) {
		tar_close(s, false);
		return r;
	}
	s->opened = true;
	*ret_st = s;
	return 0;
}

static bool id_listed(const char *name, const char *const *ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] && !strcmp(ids[i], name))
			return true;
	return false;
}

static int tar_recover(void *st, const char *const *ids, json_t *const *data, size_t n, ckpt_error *err)
{
	struct tar_state *s = st;
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	int q = walk_open(s->tar_fd, NULL, &d);
	(void)data;

	pthread_mutex_lock(&s->lock); /* the base being taken is not stale */
	bool preparing = s->base_state == BASE_PREPARING;
	pthread_mutex_unlock(&s->lock);
	if (q < 0)
		return err_set(err, -q, NULL, "cannot list the tar state dir: %s", strerror(-q));
	while ((de = walk_next(d))) {
		const char *nm = de->d_name;
		bool stale = (!strncmp(nm, ".tmp-", 5) && (strcmp(nm, ".tmp-" BASE) || !preparing)) ||
			!strncmp(nm, ".compact-", 9) || !strncmp(nm, "." INTENT ".tmp.", sizeof(INTENT) + 5) ||
			(id_valid(nm) && !id_listed(nm, ids, n));
		if (stale && (nm[0] == '.' ? rm_rf_at(s->tar_fd, nm) : tar_gc_drop(s, nm)) < 0)
			return err_set(err, errno, NULL, "cannot remove stale '%s': %m", nm);
		_cleanup_close_ int cfd = !stale && (id_valid(nm) || !strcmp(nm, BASE))
			? openat(s->tar_fd, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
			: -1;
		if (cfd >= 0) /* an alias file's temp (restore writes into checkpoint dirs and the base) */
			write_file_atomic_sweep(cfd);
	}
	write_file_atomic_sweep(s->tar_fd);
	tar_gc_kept(s);
	return fsync(s->tar_fd) < 0 ? err_set(err, errno, NULL, "cannot sync the tar state dir: %m") : 0;
}

/* Nothing needs the operation lock: compaction and the trackers' drain
 * run in cleanup, outside it. */
static void tar_maintain(void *st)
{
	(void)st;
}

static void tar_health(void *st, struct backend_health *h)
{
	struct tar_state *s = st;
	struct backend_tar_health *t = &h->tar;
	struct stat b;

	if (!s)
		return;
	h->has_tar = true;
	t->zstd = s->zstd;
	t->base = fstatat(s->tar_fd, BASE, &b, AT_SYMLINK_NOFOLLOW) == 0;
	tar_excl_health(s, t);
	pthread_mutex_lock(&s->lock);
	h->preparing = s->base_state == BASE_PREPARING;
	t->base_failed = s->base_state == BASE_FAILED;
	if (t->base_failed)
		snprintf(t->base_error, sizeof(t->base_error), "%s", s->base_error);
	t->rewritten = s->last.rewritten;
	t->removed = s->last.removed;
	t->kept = s->last.kept;
	t->bytes = s->last.bytes;
	t->archives = s->last.archives;
	t->entered = s->last.entered;
	tar_track_health(s, h);
	snprintf(t->pending, sizeof(t->pending), "%s", s->pending);
	snprintf(t->pending_msg, sizeof(t->pending_msg), "%s", s->pending_msg);
	pthread_mutex_unlock(&s->lock);
}

/* The root is a plain directory already, and each archive is a whole tree
 * that restores without the base: nothing to do, checkpoints stay. */
static int tar_release(void *st, size_t i, ckpt_error *err)
{
	(void)st, (void)i, (void)err;
	return 0;
}

static const struct backend_compare_ops tar_compare_ops = { .verify = tar_verify, .diff = tar_diff };
static const struct backend_fork_ops tar_fork_ops = { .mount = tar_fork_mount, .remove = tar_fork_remove };
/* A checkpoint is a whole tree: no base identity. */
static const struct backend_xfer_ops tar_xfer_ops = { .view_open = tar_view_open,
						      .view_close = tar_view_close,
						      .lineage = tar_lineage,
						      .import = tar_import,
						      .xattr_portable = backend_xattr_portable };
static const struct backend_release_ops tar_release_ops = { .release = tar_release };

const struct backend_ops backend_tar_ops = {
	.name = "tar",
	.probe = tar_probe,
	.open = tar_open,
	.recover = tar_recover,
	.create = tar_create,
	.restore = tar_restore,
	.reset = tar_reset,
	.remove = tar_remove,
	.health = tar_health,
	.maintain = tar_maintain,
	.cleanup = tar_cleanup,
	.precopy = tar_precopy,
	.close = tar_close,
	.compare = &tar_compare_ops,
	.forks = &tar_fork_ops,
	.xfer = &tar_xfer_ops,
	.release = &tar_release_ops,
};
