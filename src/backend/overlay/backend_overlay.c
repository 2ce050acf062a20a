/* backend_overlay.c: the overlayfs layer backend. A root P is an overlay of
 * an immutable chain of layers over P's original contents (base); create
 * copies the upper into a new layer, restore swaps the mount. This file
 * holds the ops table, adoption of the roots, restore and the backend's
 * life; the create pipeline lives in overlay_create.c, the layer store,
 * references and flattening in overlay_layers.c, a root's live state
 * (live.json) in overlay_root.c. */
#include "backend/backend.h"
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"
#include "backend/overlay/overlay_probe.h"
#include "backend/overlay/treecopy.h"
#include "lib/hash.h"

#include <limits.h>
#include <sys/stat.h>
#include "lib/failpoint.h"

static const char *const backend_overlay_subdirs[] = { "l", "u", "w", "idx", "base", "rec", "t" };

static void backend_overlay_hash_path(const char *p, char out[OVL_NAME_LEN + 1])
{
	uint32_t h = hash_fnv32(HASH_FNV32_INIT, p, strlen(p));
	snprintf(out, OVL_NAME_LEN + 1, "%08x", h);
}

/* A fresh upper and work dir pair, durable. */
static int backend_overlay_new_upper(struct ovl_root *r, char name[OVL_NAME_LEN + 1])
{
	_cleanup_close_ int u = openat(r->rdir_fd, "u", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int w = openat(r->rdir_fd, "w", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (u < 0 || w < 0)
		return -errno;
	int q = overlay_layers_new_name(u, name);
	if (q < 0)
		return q;
	if (mkdirat(u, name, 0755) < 0 || mkdirat(w, name, 0700) < 0)
		return -errno;
	struct stat st;
	if (stat(r->path, &st) == 0) { /* the root dir keeps its owner and mode */
		if (fchownat(u, name, st.st_uid, st.st_gid, 0) < 0 || fchmodat(u, name, st.st_mode & 07777, 0) < 0)
			return -errno;
	}
	if (FAILPOINT_AROUND("overlay.upper.new.fsync", fsync_dirfd(u) < 0 || fsync_dirfd(w) < 0))
		return -errno;
	return 0;
}

/* gVisor's mountinfo names no upperdir: record which upper the mount now
 * at P (by its id) has. Durable before the operation answers. */
static int backend_overlay_record_mount(struct ovl_root *r, const char *upper, ckpt_error *err)
{
	struct overlay_mountinfo mi;
	int q = overlay_mountinfo_find(r->path, &mi);
	bool found = q == 0 && mi.found;
	_cleanup_free_ char *s = found ? overlay_json_mnt_dump(mi.id, upper) : NULL;
	overlay_mountinfo_clear(&mi);
	q = !found  ? (q < 0 ? q : -ENOENT)
		: s ? FAILPOINT_AROUND("overlay.gvisor.mount.record",
				       write_file_atomic(r->rdir_fd, "mnt.json", s, strlen(s), 0600))
		    : -ENOMEM;
	return q < 0 ? err_set(err, -q, NULL, "record the mount at '%s': %s", r->path, strerror(-q)) : 0;
}

static int backend_overlay_mount_chain(struct ovl *o, struct ovl_root *r, const struct ovl_chain *chain,
				       const char *upper, ckpt_error *err)
{
	char up[32], wk[32];
	snprintf(up, sizeof(up), "u/%s", upper);
	snprintf(wk, sizeof(wk), "w/%s", upper);
	int q = overlay_mount_layers(r, chain, r->path, up, wk, err);
	if (q == 0 && o->opts.kind == OVERLAY_GVISOR)
		q = backend_overlay_record_mount(r, upper, err);
	return q;
}

/* gVisor: the upper of the overlay at P, by mnt.json. A mount whose id it
 * does not record came after live.json's intent: live.json's upper. */
static bool backend_overlay_gvisor_upper(struct ovl_root *r, const struct overlay_mountinfo *mi,
					 char out[OVL_NAME_LEN + 1])
{
	_cleanup_free_ char *s = NULL;
	char u[OVL_NAME_LEN + 1];
	int64_t id;
	if (!r->upper[0])
		return false;
	snprintf(out, OVL_NAME_LEN + 1, "%s", r->upper);
	if (read_file_at(r->rdir_fd, "mnt.json", 4096, &s, NULL) < 0)
		return true;
	if (overlay_json_mnt_parse(s, &id, u) == 0 && id == mi->id)
		memcpy(out, u, OVL_NAME_LEN + 1);
	return true;
}

static bool backend_overlay_is_our_upper(struct ovl_root *r, const struct overlay_mountinfo *mi, const char *name)
{
	if (!mi->found || strcmp(mi->fstype, "overlay") != 0)
		return false;
	if (!mi->upperdir && r->opts->kind == OVERLAY_GVISOR) {
		char up[OVL_NAME_LEN + 1];
		return backend_overlay_gvisor_upper(r, mi, up) && (!name || !strcmp(up, name));
	}
	if (!mi->upperdir)
		return false;
	_cleanup_free_ char *pre = NULL;
	if (asprintf(&pre, "%s/u/", r->rdir) < 0)
		return false;
	if (strncmp(mi->upperdir, pre, strlen(pre)) != 0)
		return false;
	return !name || !strcmp(mi->upperdir + strlen(pre), name);
}

/* s without its last component, when that is want (NULL: any name). */
static bool backend_overlay_cut_last(char *s, const char *want)
{
	char *slash = strrchr(s, '/');
	if (!slash || slash == s || (want && strcmp(slash + 1, want) != 0))
		return false;
	*slash = 0;
	return true;
}

/* The state dir of another ckptd whose overlay is mounted on the root
 * (upperdir <state>/overlay/r/<h>/u/<name>, <state>/ckptd.json there),
 * malloc'd; NULL when it is ours, not an overlay, or not ckptd's. A second
 * daemon would stack its overlay on that one, and the first one's restores
 * would swap the tree under it. */
static char *backend_overlay_other_state(struct ovl *o, struct ovl_root *r, const struct overlay_mountinfo *mi)
{
	if (!mi->found || strcmp(mi->fstype, "overlay") != 0 || !mi->upperdir ||
	    backend_overlay_is_our_upper(r, mi, NULL))
		return NULL;
	_cleanup_free_ char *s = strdup(mi->upperdir);
	if (!s || !backend_overlay_cut_last(s, NULL) || !backend_overlay_cut_last(s, "u") ||
	    !backend_overlay_cut_last(s, NULL) || !backend_overlay_cut_last(s, "r") ||
	    !backend_overlay_cut_last(s, "overlay"))
		return NULL;
	_cleanup_free_ char *cfg = path_join(s, "ckptd.json"), *odir = path_join(s, "overlay");
	struct stat a, b; /* ours under another spelling of its path: not another */
	bool ours = odir && stat(odir, &a) == 0 && fstat(o->odir_fd, &b) == 0 && a.st_dev == b.st_dev &&
		a.st_ino == b.st_ino;
	if (!cfg || ours || access(cfg, F_OK) < 0)
		return NULL;
	return TAKE_PTR(s);
}

static int backend_overlay_root_dirs(struct ovl *o, struct ovl_root *r, ckpt_error *err)
{
	if (asprintf(&r->rdir, "%s/r/%s", o->odir, r->h) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; i < ARRAY_SIZE(backend_overlay_subdirs); i++) {
		_cleanup_free_ char *p = path_join(r->rdir, backend_overlay_subdirs[i]);
		int q = p ? mkdir_p(p, 0700) : -ENOMEM;
		if (q < 0)
			return err_set(err, -q, NULL, "create '%s': %s", p ? p : r->rdir, strerror(-q));
	}
	r->rdir_fd = open(r->rdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (r->rdir_fd < 0)
		return err_set(err, errno, NULL, "open '%s': %m", r->rdir);
	return 0;
}

/* First adoption: the adoption record (live.json) is durable before anything
 * is mounted, so a crash at any later point is finished by the next start. */
static int backend_overlay_adopt_record(struct ovl_root *r, const struct overlay_mountinfo *mi, ckpt_error *err)
{
	int q = overlay_live_load(r);
	if (q == 0)
		return 0;
	if (q != -ENOENT)
		return err_set(err, -q, NULL, "read '%s/live.json': %s", r->rdir, strerror(-q));
	if (backend_overlay_is_our_upper(r, mi, NULL))
		return err_set(err, EEXIST, NULL, "'%s' is our overlay but its live.json is missing", r->path);
	overlay_chain_free(&r->chain);
	overlay_chain_free(&r->mounted);
	if ((q = backend_overlay_new_upper(r, r->upper)) < 0 || (q = overlay_live_save(r)) < 0)
		return err_set(err, -q, NULL, "adopt '%s': %s", r->path, strerror(-q));
	return 0;
}

static int backend_overlay_ensure_base(struct ovl_root *r, const struct overlay_mountinfo *mi, ckpt_error *err)
{
	_cleanup_free_ char *base = path_join(r->rdir, "base");
	struct overlay_mountinfo bi;
	int q = base ? overlay_mountinfo_find(base, &bi) : -ENOMEM;
	if (q < 0)
		return err_set(err, -q, NULL, "mounts of '%s': %s", r->path, strerror(-q));
	bool have = bi.found;
	overlay_mountinfo_clear(&bi);
	if (have) /* bound by an older ckptd, maybe shared */
		return overlay_mount_private(base) < 0 ? err_set(err, errno, NULL, "make '%s' private: %m", base) : 0;
	if (backend_overlay_is_our_upper(r, mi, NULL))
		return err_set(err, ENOENT, NULL, "base of '%s' is not mounted under its overlay", r->path);
	return overlay_mount_bind_ro(r->path, base, r->opts->kind == OVERLAY_GVISOR, err);
}

/* live.json names an upper that must exist (a lost one restarts empty). */
static int backend_overlay_ensure_upper(struct ovl_root *r, ckpt_error *err)
{
	char u[32], w[32];
	snprintf(u, sizeof(u), "u/%s", r->upper);
	snprintf(w, sizeof(w), "w/%s", r->upper);
	if (faccessat(r->rdir_fd, u, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		if (mkdirat(r->rdir_fd, w, 0700) < 0 && errno != EEXIST)
			return err_set(err, errno, NULL, "create work dir: %m");
		return 0;
	}
	int q = backend_overlay_new_upper(r, r->upper);
	if (q == 0)
		q = overlay_live_save(r);
	return q < 0 ? err_set(err, -q, NULL, "recreate upper: %s", strerror(-q)) : 0;
}

static int backend_overlay_open_root(struct ovl *o, struct ovl_root *r, ckpt_error *err)
{
	struct overlay_mountinfo mi;
	int q = backend_overlay_root_dirs(o, r, err);
	if (q == 0 && overlay_release_recover(o, r) == 1) { /* released: adopt afresh */
		close(r->rdir_fd);
		free(TAKE_PTR(r->rdir));
		q = backend_overlay_root_dirs(o, r, err);
	}
	if (q < 0)
		return q;
	overlay_release_sweep(r);
	write_file_atomic_sweep(r->rdir_fd); /* .live.json.tmp.* of a killed daemon */
	unlinkat(r->rdir_fd, "idx/.index.tmp", 0);
	if ((q = overlay_mountinfo_find(r->path, &mi)) < 0)
		return err_set(err, -q, NULL, "mounts of '%s': %s", r->path, strerror(-q));
	_cleanup_free_ char *other = backend_overlay_other_state(o, r, &mi);
	if (other) {
		overlay_mountinfo_clear(&mi);
		return err_set(err, EBUSY, NULL,
			       "'%s' is mounted as the overlay of another ckptd, state dir '%s': one daemon manages "
			       "a root (stop that one, or start with --state-dir %s)",
			       r->path, other, other);
	}
	q = backend_overlay_adopt_record(r, &mi, err);
	if (q == 0 && o->has_intent && (q = overlay_intent_apply(&o->intent, r)) < 0)
		err_set(err, -q, NULL, "finish the interrupted restore: %s", strerror(-q));
	if (q == 0)
		q = backend_overlay_ensure_base(r, &mi, err);
	if (q == 0 && !backend_overlay_is_our_upper(r, &mi, r->upper)) {
		/* Not mounted (first start, reboot) or an interrupted restore:
		 * bring P to what live.json says. */
		if (o->before_mount)
			o->before_mount(o->hook_ctx, r->path);
		if (backend_overlay_is_our_upper(r, &mi, NULL))
			q = FAILPOINT_AROUND("overlay.open.umount", overlay_umount(r->path, NULL, err));
		q = q == 0 ? backend_overlay_ensure_upper(r, err) : q;
		if (q == 0)
			q = FAILPOINT_AROUND("overlay.open.mount",
					     backend_overlay_mount_chain(o, r, &r->chain, r->upper, err));
		if (q == 0 && (q = overlay_live_set(r, &r->chain, &r->chain)) < 0)
			err_set(err, -q, NULL, "out of memory");
		if (q == 0)
			q = FAILPOINT_AROUND("overlay.open.live.write", overlay_live_save(r));
	}
	overlay_mountinfo_clear(&mi);
	if (q == 0 && o->index_distrust) /* nor by a later start (overlay_running.c) */
		unlinkat(r->rdir_fd, "idx/index", 0);
	else if (q == 0) { /* the index of the live upper, if any */
		char *tag = NULL;
		if (pathindex_load(r->rdir_fd, "idx/index", &r->ix, &tag) == 0 && strlen(tag) == 2 * OVL_NAME_LEN + 1 &&
		    !strncmp(tag, r->upper, OVL_NAME_LEN))
			snprintf(r->ix_layer, sizeof(r->ix_layer), "%s", tag + OVL_NAME_LEN + 1);
		else
			pathindex_free(TAKE_PTR(r->ix));
		free(tag);
	}
	return q < 0 ? err_prefix(err, "root '%s'", r->path) : 0;
}

static void backend_overlay_free(struct ovl *o)
{
	if (!o)
		return;
	for (size_t i = 0; i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		free(r->path);
		free(r->rdir);
		if (r->rdir_fd > 0)
			close(r->rdir_fd);
		overlay_chain_free(&r->chain);
		overlay_chain_free(&r->mounted);
		pathindex_free(r->ix);
		pathindex_free(r->pre_ix);
		pathindex_free(r->pre_ix_next);
		treecopy_dirs_free(&r->pre_dirs);
		pathindex_free(r->cap_ix);
		overlay_delta_reset(r);
		overlay_chain_free(&r->stack);
	}
	free(o->roots);
	free(o->odir);
	if (o->odir_fd >= 0)
		close(o->odir_fd);
	if (o->cdir_fd >= 0)
		close(o->cdir_fd);
	overlay_refs_free(&o->refs);
	overlay_chain_map_free(&o->chains);
	overlay_chain_map_free(&o->forks);
	overlay_intent_free(&o->intent);
	for (size_t i = 0; i < o->n_pins; i++)
		close(o->pins[i]);
	free(o->pins);
	pthread_mutex_destroy(&o->trash_lock);
	free(o);
}

/* Probe dirs of a daemon killed while probing (its probe mount detached). */
static void backend_overlay_sweep_probes(struct ovl *o)
{
	int fd = o->odir_fd >= 0 ? openat(o->odir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	_cleanup_closedir_ DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	struct dirent *de;
	while ((de = readdir(d))) {
		if (strncmp(de->d_name, ".probe-", 7) != 0)
			continue;
		_cleanup_free_ char *m = NULL;
		if (asprintf(&m, "%s/%s/m", o->odir, de->d_name) >= 0)
			overlay_umount_detach(m);
		rm_rf_at(o->odir_fd, de->d_name);
	}
}

static int backend_overlay_open(const struct backend_ctx *ctx, void **ret_st, ckpt_error *err)
{
	struct ovl *o = calloc(1, sizeof(*o));
	if (!o)
		return err_set(err, ENOMEM, NULL, "out of memory");
	o->odir_fd = o->cdir_fd = -1;
	o->flatten_depth = ctx->flatten_depth;
	pthread_mutex_init(&o->trash_lock, NULL);
	int q = overlay_probe(ctx->state_dir, &o->opts, err);
	if (q < 0) {
		pthread_mutex_destroy(&o->trash_lock);
		free(o);
		return q;
	}
	o->before_mount = ctx->before_mount;
	o->hook_ctx = ctx->hook_ctx;
	o->roots = calloc(ctx->n_roots ? ctx->n_roots : 1, sizeof(*o->roots));
	_cleanup_free_ char *cdir = NULL;
	if (!o->roots || asprintf(&o->odir, "%s/overlay", ctx->state_dir) < 0 || asprintf(&cdir, "%s/c", o->odir) < 0 ||
	    (q = mkdir_p(cdir, 0700)) < 0) {
		backend_overlay_free(o);
		return err_set(err, q ? -q : ENOMEM, NULL, "create overlay state dir: %s", strerror(q ? -q : ENOMEM));
	}
	o->odir_fd = open(o->odir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	o->cdir_fd = open(cdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	backend_overlay_sweep_probes(o);
	overlay_release_sweep_gone(o);
	overlay_running_open(o); /* before the roots read their indexes */
	if ((q = overlay_intent_load(o)) < 0)
		err_set(err, -q, NULL, "read '%s/restore.json': %s", o->odir, strerror(-q));
	o->has_intent = q == 1;
	q = q < 0 ? q : 0;
	for (size_t i = 0; i < ctx->n_roots && q == 0; i++) {
		struct ovl_root *r = &o->roots[o->n_roots++];
		r->rdir_fd = -1;
		r->opts = &o->opts;
		r->trk = (struct chg_track)CHG_TRACK_INIT;
		r->track = ctx->track_changes;
		r->track_check = ctx->track_check;
		r->path = strdup(ctx->roots[i]);
		backend_overlay_hash_path(ctx->roots[i], r->h);
		q = r->path ? backend_overlay_open_root(o, r, err) : err_set(err, ENOMEM, NULL, "out of memory");
		if (q == 0 && backend_overlay_new_upper(r, r->spare) < 0)
			r->spare[0] = 0;
	}
	if (q == 0 && o->has_intent && (q = overlay_intent_clear(o)) < 0) /* every root is as it says */
		err_set(err, -q, NULL, "remove '%s/restore.json': %s", o->odir, strerror(-q));
	overlay_intent_free(&o->intent);
	o->has_intent = false;
	if (q < 0) {
		backend_overlay_free(o);
		return q;
	}
	*ret_st = o;
	return 0;
}

static int backend_overlay_recover(void *st, const char *const *ids, json_t *const *data, size_t n, ckpt_error *err)
{
	struct ovl *o = st;
	overlay_chain_map_clear(&o->forks);
	overlay_fork_load(o); /* forks use layers too: counted by load_chains */
	int q = overlay_layers_load_chains(o, ids, data, n);
	if (q < 0)
		return err_set(err, -q, NULL, "load layer chains: %s", strerror(-q));
	for (size_t i = 0; i < o->n_roots; i++) /* before GC, which would take the kept base */
		if ((q = overlay_release_rebase(o, &o->roots[i])) < 0)
			return err_set(err, -q, NULL, "move the checkpoints of '%s' onto its old base: %s",
				       o->roots[i].path, strerror(-q));
	overlay_layers_gc(o);
	for (size_t i = 0; i < o->n_roots; i++)
		overlay_layers_empty_trash(&o->roots[i]);
	return 0;
}

struct ovl_swap {
	struct ovl_chain old_chain, old_mounted;
	bool prepared; /* old_* hold the root's state before the switch */
	char old_upper[OVL_NAME_LEN + 1];
	int pin; /* the old mount, detached (overlay_umount_pinned), or -1 */
};

/* The old upper and work dir go to t/ and the pin to the list: cleanup
 * deletes them, then closes the pin (never under the operation lock). */
static void backend_overlay_discard_upper(struct ovl *o, struct ovl_root *r, struct ovl_swap *s)
{
	_cleanup_close_ int u = openat(r->rdir_fd, "u", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int w = openat(r->rdir_fd, "w", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (u >= 0)
		overlay_layers_trash(r, u, "u", s->old_upper);
	if (w >= 0)
		overlay_layers_trash(r, w, "w", s->old_upper);
	if (s->pin < 0)
		return;
	pthread_mutex_lock(&o->trash_lock);
	int *p = realloc(o->pins, (o->n_pins + 1) * sizeof(*p));
	if (p) {
		o->pins = p;
		o->pins[o->n_pins++] = TAKE_FD(s->pin);
	}
	pthread_mutex_unlock(&o->trash_lock);
	if (s->pin >= 0) /* out of memory: drop it now (writes back) */
		close(TAKE_FD(s->pin));
}

/* Put P back as it was before a failed swap (best effort). */
static void backend_overlay_swap_undo(struct ovl *o, struct ovl_root *r, struct ovl_swap *s)
{
	ckpt_error e;
	struct overlay_mountinfo mi;
	overlay_mountinfo_find(r->path, &mi);
	if (backend_overlay_is_our_upper(r, &mi, r->upper))
		overlay_umount(r->path, NULL, &e);
	if (!backend_overlay_is_our_upper(r, &mi, s->old_upper) || backend_overlay_is_our_upper(r, &mi, r->upper))
		backend_overlay_mount_chain(o, r, &s->old_mounted, s->old_upper, &e);
	overlay_mountinfo_clear(&mi);
	/* the old chains themselves: nothing to copy, nothing to fail */
	overlay_chain_free(&r->chain);
	overlay_chain_free(&r->mounted);
	r->chain = s->old_chain;
	r->mounted = s->old_mounted;
	s->old_chain = s->old_mounted = (struct ovl_chain){ 0 };
	memcpy(r->upper, s->old_upper, sizeof(r->upper));
	overlay_live_save(r);
}

/* Every root's live.json as it is in memory now (the new chains, or the old
 * ones put back by an undo), after restore.json names them all (with
 * several roots: overlay_intent_needed). */
static int backend_overlay_switch_record(struct ovl *o, size_t n, ckpt_error *err)
{
	struct ovl_intent intent = { 0 };
	bool needed = overlay_intent_needed(o);
	int q = 0;
	for (size_t i = 0; needed && q == 0 && i < o->n_roots; i++)
		q = overlay_intent_add(&intent, &o->roots[i], &o->roots[i].chain, o->roots[i].upper);
	if (needed && q == 0)
		q = overlay_intent_write(o, &intent);
	overlay_intent_free(&intent);
	for (size_t i = 0; q == 0 && i < n; i++)
		q = FAILPOINT_AROUND("overlay.restore.live.write", overlay_live_save(&o->roots[i]));
	return q < 0 ? err_set(err, -q, NULL, "record restore intent: %s", strerror(-q)) : 0;
}

/* Put every prepared root back: restore.json (with several roots) first
 * names the old chains, so that a kill during the undo does not leave a
 * mix either. */
static void backend_overlay_switch_undo(struct ovl *o, struct ovl_swap *sw, size_t prepared)
{
	struct ovl_intent intent = { 0 };
	bool needed = overlay_intent_needed(o);
	int q = 0;
	for (size_t i = 0; needed && q == 0 && i < o->n_roots; i++)
		q = i < prepared && sw[i].prepared
			? overlay_intent_add(&intent, &o->roots[i], &sw[i].old_chain, sw[i].old_upper)
			: overlay_intent_add(&intent, &o->roots[i], &o->roots[i].chain, o->roots[i].upper);
	if (needed && q == 0)
		q = overlay_intent_write(o, &intent);
	overlay_intent_free(&intent);
	if (q < 0)
		log_warn("overlay: cannot record the undo of a failed restore: %s", strerror(-q));
	for (size_t i = 0; i < prepared && i < o->n_roots; i++) {
		if (sw[i].pin >= 0)
			close(TAKE_FD(sw[i].pin));
		if (sw[i].prepared)
			backend_overlay_swap_undo(o, &o->roots[i], &sw[i]);
	}
	if (needed && q == 0)
		overlay_intent_clear(o);
}

/* Switch every root to chains[h] with a fresh upper. restore.json (with
 * several roots), then each root's live.json (with the new chain and
 * upper) are written first: they are the intent a restart finishes, so a
 * crash leaves the roots before or after, never a mix. */
static int backend_overlay_switch(struct ovl *o, const struct ovl_chains *chains, struct restore_details *details,
				  ckpt_error *err)
{
	struct ovl_swap *sw = calloc(o->n_roots + 1, sizeof(*sw));
	size_t prepared = 0, swapped = 0;
	int q = sw ? 0 : err_set(err, ENOMEM, NULL, "out of memory");

	for (size_t i = 0; i < o->n_roots; i++) /* a new upper: the next create is full */
		overlay_delta_reset(&o->roots[i]);
	for (; q == 0 && prepared < o->n_roots; prepared++) {
		struct ovl_root *r = &o->roots[prepared];
		const struct ovl_chain *c = overlay_chains_get(chains, r->h);
		static const struct ovl_chain none = { 0 };
		/* the root's chains move to the swap; r gets the new ones below */
		sw[prepared] = (struct ovl_swap){ r->chain, r->mounted, true, "", -1 };
		r->chain = r->mounted = (struct ovl_chain){ 0 };
		memcpy(sw[prepared].old_upper, r->upper, sizeof(r->upper));
		if (r->spare[0]) { /* made durable by maintain: no fsync on the request path */
			memcpy(r->upper, r->spare, sizeof(r->upper));
			r->spare[0] = 0;
		} else if ((q = backend_overlay_new_upper(r, r->upper)) < 0) {
			memcpy(r->upper, sw[prepared].old_upper, sizeof(r->upper));
			r->chain = sw[prepared].old_chain; /* back: this root is not prepared */
			r->mounted = sw[prepared].old_mounted;
			sw[prepared] = (struct ovl_swap){ .pin = -1 };
			err_set(err, -q, NULL, "new upper for '%s': %s", r->path, strerror(-q));
			break;
		}
		if ((q = overlay_live_set(r, c ? c : &none, c ? c : &none)) < 0) /* undone with the prepared */
			err_set(err, -q, NULL, "out of memory");
	}
	if (q == 0)
		q = backend_overlay_switch_record(o, prepared, err);
	for (size_t i = 0; q == 0 && i < o->n_roots; i++, swapped++) {
		struct ovl_root *r = &o->roots[i];
		q = FAILPOINT_AROUND("overlay.restore.umount",
				     overlay_umount_pinned(r->path, details, &sw[i].pin, err));
		if (q == 0)
			q = FAILPOINT_AROUND("overlay.restore.mount",
					     backend_overlay_mount_chain(o, r, &r->chain, r->upper, err));
	}
	if (q < 0)
		backend_overlay_switch_undo(o, sw, prepared);
	for (size_t i = 0; i < o->n_roots && q == 0; i++) {
		struct ovl_root *r = &o->roots[i];
		pathindex_free(TAKE_PTR(r->ix)); /* the new upper is empty */
		r->ix_layer[0] = 0;
		FAILPOINT_AROUND("overlay.restore.index.unlink", unlinkat(r->rdir_fd, "idx/index", 0));
		backend_overlay_discard_upper(o, r, &sw[i]);
	}
	for (size_t i = 0; sw && i < o->n_roots; i++) {
		overlay_chain_free(&sw[i].old_chain);
		overlay_chain_free(&sw[i].old_mounted);
	}
	free(sw);
	o->dirty_gc = true;
	/* every root is switched; a failure is harmless: the next start finds
	 * every root as restore.json names it */
	int c = q == 0 && overlay_intent_needed(o) ? overlay_intent_clear(o) : 0;
	if (c < 0)
		log_warn("overlay: cannot remove restore.json: %s", strerror(-c));
	if (q == 0)
		atomic_store(&o->last_swap_ms, mono_ms());
	(void)swapped;
	return q;
}

static int backend_overlay_restore(void *st, const char *id, json_t *data, struct restore_details *details,
				   struct progress *p, ckpt_error *err)
{
	struct ovl *o = st;
	struct ovl_chains chains = { 0 };
	(void)p;
	int q = overlay_layers_chain_get(o, id, data, &chains);
	if (q == -ENOMEM)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (q < 0)
		return err_set(err, ENOENT, "not_found", "no layers recorded for checkpoint %s", id);
	q = backend_overlay_switch(o, &chains, details, err);
	overlay_chains_free(&chains);
	return q;
}

static int backend_overlay_verify(void *st, const char *id, json_t *data, struct verify_diffs *diffs, size_t max,
				  ckpt_error *err)
{
	struct ovl *o = st;
	struct ovl_chains chains = { 0 };
	static const struct ovl_chain none = { 0 };
	int q = id ? overlay_layers_chain_get(o, id, data, &chains) : 0;
	if (q == -ENOMEM)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (q < 0)
		return err_set(err, ENOENT, "not_found", "no layers recorded for checkpoint %s", id);

	for (size_t i = 0; q == 0 && i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		struct overlay_mountinfo mi;
		const struct ovl_chain *c = overlay_chains_get(&chains, r->h);
		overlay_mountinfo_find(r->path, &mi);
		bool ours = backend_overlay_is_our_upper(r, &mi, r->upper);
		overlay_mountinfo_clear(&mi);
		q = overlay_verify_root(r, c ? c : &none, ours, diffs, max, err);
	}
	overlay_chains_free(&chains);
	return q;
}

static int backend_overlay_reset(void *st, struct restore_details *details, ckpt_error *err)
{
	static const struct ovl_chains empty = { 0 };
	return backend_overlay_switch(st, &empty, details, err);
}

static int backend_overlay_remove(void *st, const char *id, json_t *data, ckpt_error *err)
{
	struct ovl *o = st;
	(void)data;
	int q = overlay_layers_chain_drop(o, id);
	if (q < 0 && q != -ENOENT)
		return err_set(err, -q, NULL, "drop layer chain of %s: %s", id, strerror(-q));
	o->dirty_gc = true; /* layers go in maintain, after the record is gone */
	return 0;
}

/* Each root's tracking: the method its tracker chose at its first arm (a
 * create arms it), and why. */
static void backend_overlay_track_health(struct ovl *o, struct backend_health *out)
{
	for (size_t i = 0; i < o->n_roots && i < MAX_ROOTS; i++) {
		const struct chg_track *t = &o->roots[i].trk;
		bool never = t->method == CHG_TRACK_NONE && !t->reason[0];
		struct backend_root_health *h = &out->roots[out->n_roots++];
		h->tracking = chg_track_method_name(t->method);
		snprintf(h->tracking_reason, sizeof(h->tracking_reason), "%s",
			 never ? "not armed yet: a create arms it once the upper holds 2000 entries" : t->reason);
	}
}

static void backend_overlay_health(void *st, struct backend_health *out)
{
	struct ovl *o = st;
	out->has_overlay_roots = true;
	for (size_t i = 0; i < o->n_roots && i < MAX_ROOTS; i++) {
		struct ovl_root *r = &o->roots[i];
		struct backend_overlay_root *h = &out->overlay_roots[out->n_overlay_roots++];
		h->path = r->path;
		h->layers = r->chain.n;
		snprintf(h->upper, sizeof(h->upper), "%s", r->upper);
		h->released = r->released;
		h->deltas = overlay_delta_ready(r) || overlay_rebase_due(r) ? r->stack.n - 1 : 0;
	}
	backend_overlay_track_health(o, out);
	out->has_overlay = true;
	out->overlay_kind = overlay_kind_name(o->opts.kind);
	out->redirect_dir = o->opts.redirect_dir;
	out->userxattr = o->opts.userxattr;
}

static void backend_overlay_maintain(void *st)
{
	struct ovl *o = st;
	ckpt_error e = { 0 };
	int depth = o->flatten_depth > 0 ? o->flatten_depth : 64;
	if (depth > OVERLAY_MAX_LOWERS - 2)
		depth = OVERLAY_MAX_LOWERS - 2;
	if (overlay_layers_flatten(o, depth, &e) < 0)
		log_debug("overlay: flatten: %s", e.msg);
	if (o->dirty_gc)
		overlay_layers_gc(o);
	for (size_t i = 0; i < o->n_roots; i++) /* a tracker kept for deltas: its queue short */
		if (chg_track_armed(&o->roots[i].trk))
			chg_track_drain(&o->roots[i].trk);
	for (size_t i = 0; i < o->n_roots; i++) /* the next restore's upper, ready */
		if (!o->roots[i].released && !o->roots[i].spare[0] &&
		    backend_overlay_new_upper(&o->roots[i], o->roots[i].spare) < 0)
			o->roots[i].spare[0] = 0;
}

/* Delete what restores and GC put in t/, then let the old mounts go: with
 * their uppers deleted, the last unmount has no dirty data of theirs to
 * write back. That last unmount still syncs the upper's filesystem, which
 * stalls a restore's fsyncs meanwhile: the mounts are let go only once no
 * restore came for a while (or too many are held), else >0: call again.
 * Runs without the operation lock. */
#define OVL_PIN_IDLE_MS 2000
#define OVL_PIN_MAX 64
static int backend_overlay_cleanup_pins(struct ovl *o, bool all)
{
	for (size_t i = 0; i < o->n_roots; i++)
		if (!o->roots[i].released)
			overlay_layers_empty_trash(&o->roots[i]);
	pthread_mutex_lock(&o->trash_lock);
	bool release = all || o->n_pins > OVL_PIN_MAX || mono_ms() - atomic_load(&o->last_swap_ms) >= OVL_PIN_IDLE_MS;
	int *pins = release ? TAKE_PTR(o->pins) : NULL;
	size_t n = release ? o->n_pins : 0;
	if (release)
		o->n_pins = 0;
	int left = (int)o->n_pins;
	pthread_mutex_unlock(&o->trash_lock);
	for (size_t i = 0; i < n; i++)
		close(pins[i]);
	free(pins);
	return left;
}

static int backend_overlay_cleanup(void *st)
{
	return backend_overlay_cleanup_pins(st, false);
}

static void backend_overlay_close(void *st, bool unmount)
{
	struct ovl *o = st;
	ckpt_error e;
	if (o)
		backend_overlay_cleanup_pins(o, true);
	for (size_t i = 0; unmount && o && i < o->n_roots; i++) {
		if (o->roots[i].released)
			continue;
		_cleanup_free_ char *base = path_join(o->roots[i].rdir, "base");
		overlay_umount(o->roots[i].path, NULL, &e);
		if (base)
			overlay_umount(base, NULL, &e);
	}
	if (o)
		overlay_running_close(o);
	backend_overlay_free(o);
}

/* Real test mounts in the state dir, option by option (overlay_probe.c). */
static int backend_overlay_probe(const struct backend_ctx *ctx, ckpt_error *err)
{
	struct overlay_opts opts;
	return overlay_probe(ctx->state_dir, &opts, err);
}

static const struct backend_capture_ops backend_overlay_capture_ops = { .capture = overlay_capture,
									.create_defer = overlay_create_defer };
static const struct backend_compare_ops backend_overlay_compare_ops = { .verify = backend_overlay_verify,
									.diff = overlay_diff };
static const struct backend_fork_ops backend_overlay_fork_ops = { .mount = overlay_fork_mount,
								  .remove = overlay_fork_remove };
/* A checkpoint is layers over the base: an export names it. */
static const struct backend_xfer_ops backend_overlay_xfer_ops = { .view_open = overlay_view_open,
								  .view_close = overlay_view_close,
								  .lineage = overlay_lineage,
								  .import = overlay_import,
								  .base_kind = "overlay-base",
								  .xattr_portable = backend_xattr_portable };
static const struct backend_release_ops backend_overlay_release_ops = { .release = overlay_release, .unmounts = true };

const struct backend_ops backend_overlay_ops = {
	.name = "overlay",
	.probe = backend_overlay_probe,
	.open = backend_overlay_open,
	.recover = backend_overlay_recover,
	.precopy = overlay_precopy,
	.create = overlay_create,
	.restore = backend_overlay_restore,
	.reset = backend_overlay_reset,
	.remove = backend_overlay_remove,
	.health = backend_overlay_health,
	.maintain = backend_overlay_maintain,
	.cleanup = backend_overlay_cleanup,
	.close = backend_overlay_close,
	.capture = &backend_overlay_capture_ops,
	.compare = &backend_overlay_compare_ops,
	.forks = &backend_overlay_fork_ops,
	.xfer = &backend_overlay_xfer_ops,
	.release = &backend_overlay_release_ops,
};
