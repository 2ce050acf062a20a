/* backend_overlay.c: the overlayfs layer backend. A root P is an overlay of
 * an immutable chain of layers over P's original contents (base); create
 * copies the upper into a new layer, restore swaps the mount. The layer
 * store, references and flattening live in overlay_layers.c, a root's live
 * state (live.json) in overlay_root.c. */
#include "backend/backend.h"
#include "config.h"
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"
#include "backend/overlay/treecopy.h"
#include "lib/hash.h"

#include <limits.h>
#include <sys/stat.h>

static const char *const ovl_subdirs[] = { "l", "u", "w", "idx", "base", "rec", "t" };

static void ovl_hash_path(const char *p, char out[OVL_NAME_LEN + 1])
{
	uint32_t h = hash_fnv32(HASH_FNV32_INIT, p, strlen(p));
	snprintf(out, OVL_NAME_LEN + 1, "%08x", h);
}

/* Out of space is the one failure of our own writes a client can act on. */
static int ovl_fail(int q, ckpt_error *err)
{
	if (err && (err->errnum == ENOSPC || err->errnum == EDQUOT))
		err->code = "insufficient_storage";
	return q;
}

/* A fresh upper and work dir pair, durable. */
static int ovl_new_upper(struct ovl_root *r, char name[OVL_NAME_LEN + 1])
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
	if (fsync_dirfd(u) < 0 || fsync_dirfd(w) < 0)
		return -errno;
	return 0;
}

static int ovl_mount_chain(struct ovl *o, struct ovl_root *r, json_t *chain, const char *upper, ckpt_error *err)
{
	char up[32], wk[32];
	snprintf(up, sizeof(up), "u/%s", upper);
	snprintf(wk, sizeof(wk), "w/%s", upper);
	(void)o;
	return overlay_mount_layers(r, chain, r->path, up, wk, err);
}

static bool ovl_is_our_upper(struct ovl_root *r, const struct overlay_mountinfo *mi, const char *name)
{
	if (!mi->found || strcmp(mi->fstype, "overlay") != 0 || !mi->upperdir)
		return false;
	_cleanup_free_ char *pre = NULL;
	if (asprintf(&pre, "%s/u/", r->rdir) < 0)
		return false;
	if (strncmp(mi->upperdir, pre, strlen(pre)) != 0)
		return false;
	return !name || !strcmp(mi->upperdir + strlen(pre), name);
}

static int ovl_root_dirs(struct ovl *o, struct ovl_root *r, ckpt_error *err)
{
	if (asprintf(&r->rdir, "%s/r/%s", o->odir, r->h) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; i < ARRAY_SIZE(ovl_subdirs); i++) {
		_cleanup_free_ char *p = path_join(r->rdir, ovl_subdirs[i]);
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
static int ovl_adopt_record(struct ovl_root *r, const struct overlay_mountinfo *mi, ckpt_error *err)
{
	int q = overlay_live_load(r);
	if (q == 0)
		return 0;
	if (q != -ENOENT)
		return err_set(err, -q, NULL, "read '%s/live.json': %s", r->rdir, strerror(-q));
	if (ovl_is_our_upper(r, mi, NULL))
		return err_set(err, EEXIST, NULL, "'%s' is our overlay but its live.json is missing", r->path);
	r->chain = json_array();
	r->mounted = json_array();
	if ((q = ovl_new_upper(r, r->upper)) < 0 || (q = overlay_live_save(r)) < 0)
		return err_set(err, -q, NULL, "adopt '%s': %s", r->path, strerror(-q));
	return 0;
}

static int ovl_ensure_base(struct ovl_root *r, const struct overlay_mountinfo *mi, ckpt_error *err)
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
	if (ovl_is_our_upper(r, mi, NULL))
		return err_set(err, ENOENT, NULL, "base of '%s' is not mounted under its overlay", r->path);
	return overlay_mount_bind_ro(r->path, base, err);
}

/* live.json names an upper that must exist (a lost one restarts empty). */
static int ovl_ensure_upper(struct ovl_root *r, ckpt_error *err)
{
	char u[32], w[32];
	snprintf(u, sizeof(u), "u/%s", r->upper);
	snprintf(w, sizeof(w), "w/%s", r->upper);
	if (faccessat(r->rdir_fd, u, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		if (mkdirat(r->rdir_fd, w, 0700) < 0 && errno != EEXIST)
			return err_set(err, errno, NULL, "create work dir: %m");
		return 0;
	}
	int q = ovl_new_upper(r, r->upper);
	if (q == 0)
		q = overlay_live_save(r);
	return q < 0 ? err_set(err, -q, NULL, "recreate upper: %s", strerror(-q)) : 0;
}

static int ovl_open_root(struct ovl *o, struct ovl_root *r, ckpt_error *err)
{
	struct overlay_mountinfo mi;
	int q = ovl_root_dirs(o, r, err);
	if (q == 0 && overlay_release_recover(o, r) == 1) { /* released: adopt afresh */
		close(r->rdir_fd);
		free(TAKE_PTR(r->rdir));
		q = ovl_root_dirs(o, r, err);
	}
	if (q < 0)
		return q;
	overlay_release_sweep(r);
	write_file_atomic_sweep(r->rdir_fd); /* .live.json.tmp.* of a killed daemon */
	unlinkat(r->rdir_fd, "idx/.index.tmp", 0);
	if ((q = overlay_mountinfo_find(r->path, &mi)) < 0)
		return err_set(err, -q, NULL, "mounts of '%s': %s", r->path, strerror(-q));
	q = ovl_adopt_record(r, &mi, err);
	if (q == 0)
		q = ovl_ensure_base(r, &mi, err);
	if (q == 0 && !ovl_is_our_upper(r, &mi, r->upper)) {
		/* Not mounted (first start, reboot) or an interrupted restore:
		 * bring P to what live.json says. */
		if (o->before_mount)
			o->before_mount(o->hook_ctx, r->path);
		if (ovl_is_our_upper(r, &mi, NULL))
			q = overlay_umount(r->path, NULL, err);
		q = q == 0 ? ovl_ensure_upper(r, err) : q;
		if (q == 0)
			q = ovl_mount_chain(o, r, r->chain, r->upper, err);
		if (q == 0) {
			overlay_live_set(r, r->chain, r->chain);
			q = overlay_live_save(r);
		}
	}
	overlay_mountinfo_clear(&mi);
	if (q == 0) { /* the index of the live upper, if any */
		char *tag = NULL;
		if (treecopy_index_load(r->rdir_fd, "idx/index", &r->ix, &tag) == 0 &&
		    strlen(tag) == 2 * OVL_NAME_LEN + 1 && !strncmp(tag, r->upper, OVL_NAME_LEN))
			snprintf(r->ix_layer, sizeof(r->ix_layer), "%s", tag + OVL_NAME_LEN + 1);
		else
			treecopy_index_free(TAKE_PTR(r->ix));
		free(tag);
	}
	return q < 0 ? err_prefix(err, "root '%s'", r->path) : 0;
}

static void ovl_free(struct ovl *o)
{
	if (!o)
		return;
	for (size_t i = 0; i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		free(r->path);
		free(r->rdir);
		if (r->rdir_fd > 0)
			close(r->rdir_fd);
		json_decref(r->chain);
		json_decref(r->mounted);
		treecopy_index_free(r->ix);
		treecopy_index_free(r->pre_ix);
		treecopy_index_free(r->pre_ix_next);
		treecopy_dirs_free(&r->pre_dirs);
		treecopy_index_free(r->cap_ix);
		overlay_delta_reset(r);
		json_decref(r->stack);
	}
	free(o->roots);
	free(o->odir);
	if (o->odir_fd >= 0)
		close(o->odir_fd);
	if (o->cdir_fd >= 0)
		close(o->cdir_fd);
	json_decref(o->refs);
	json_decref(o->chains);
	json_decref(o->forks);
	for (size_t i = 0; i < o->n_pins; i++)
		close(o->pins[i]);
	free(o->pins);
	pthread_mutex_destroy(&o->trash_lock);
	free(o);
}

/* Probe dirs of a daemon killed while probing (its probe mount detached). */
static void ovl_sweep_probes(struct ovl *o)
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

static int ovl_open(const struct backend_ctx *ctx, void **ret_st, ckpt_error *err)
{
	struct ovl *o = calloc(1, sizeof(*o));
	if (!o)
		return err_set(err, ENOMEM, NULL, "out of memory");
	o->odir_fd = o->cdir_fd = -1;
	o->cfg = ctx->cfg;
	pthread_mutex_init(&o->trash_lock, NULL);
	o->before_mount = ctx->before_mount;
	o->hook_ctx = ctx->hook_ctx;
	o->refs = json_object();
	o->forks = json_object();
	o->chains = json_object();
	o->roots = calloc(ctx->n_roots ? ctx->n_roots : 1, sizeof(*o->roots));
	_cleanup_free_ char *cdir = NULL;
	int q = 0;
	if (!o->roots || asprintf(&o->odir, "%s/overlay", ctx->state_dir) < 0 || asprintf(&cdir, "%s/c", o->odir) < 0 ||
	    (q = mkdir_p(cdir, 0700)) < 0) {
		ovl_free(o);
		return err_set(err, q ? -q : ENOMEM, NULL, "create overlay state dir: %s", strerror(q ? -q : ENOMEM));
	}
	o->odir_fd = open(o->odir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	o->cdir_fd = open(cdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ovl_sweep_probes(o);
	overlay_release_sweep_gone(o);
	for (size_t i = 0; i < ctx->n_roots && q == 0; i++) {
		struct ovl_root *r = &o->roots[o->n_roots++];
		r->rdir_fd = -1;
		r->trk = (struct chg_track)CHG_TRACK_INIT;
		r->stack = json_array();
		r->path = strdup(ctx->roots[i]);
		ovl_hash_path(ctx->roots[i], r->h);
		q = r->path ? ovl_open_root(o, r, err) : err_set(err, ENOMEM, NULL, "out of memory");
		if (q == 0 && ovl_new_upper(r, r->spare) < 0)
			r->spare[0] = 0;
	}
	if (q < 0) {
		ovl_free(o);
		return q;
	}
	*ret_st = o;
	return 0;
}

static int ovl_recover(void *st, const char *const *ids, json_t *const *data, size_t n, ckpt_error *err)
{
	struct ovl *o = st;
	json_object_clear(o->forks);
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

static int ovl_open_dir(int dfd, const char *a, const char *b)
{
	char p[64];
	snprintf(p, sizeof(p), "%s/%s", a, b);
	return openat(dfd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* What create's first pass of r left in memory: its index and directory
 * list, and the tracker (closing a fanotify group waits for the kernel: the
 * capture leaves this to after the thaw). */
static void ovl_forget_pre(struct ovl_root *r)
{
	treecopy_index_free(TAKE_PTR(r->pre_ix));
	treecopy_index_free(TAKE_PTR(r->pre_ix_next));
	treecopy_dirs_free(&r->pre_dirs);
	treecopy_index_free(TAKE_PTR(r->pre_sus));
	r->pre_bytes = 0;
	/* kept while deltas can follow: the next create's delta reads it */
	if (!overlay_delta_ready(r) && !(r->cap_tmp[0] && (r->cap_delta || r->cap_tracked)))
		chg_track_disarm(&r->trk);
}

/* Forget create's first pass of r (its files go with the trash). */
static void ovl_drop_pre(struct ovl_root *r, int l)
{
	if (r->pre[0])
		overlay_layers_trash(r, l, "l", r->pre);
	if (r->pre[0] && r->pre_delta) /* its collect's changes are in no layer */
		overlay_delta_reset(r);
	r->pre[0] = 0;
	r->pre_delta = false;
	ovl_forget_pre(r);
}

/* Change tracking for the frozen pass (docs/overlay-create.md), for an upper
 * of that many entries. CKPTD_TRACK_CHANGES=0: never; =1: always; unset:
 * from OVL_TRACK_MIN_ENTRIES on. Below it the frozen walk costs less than
 * the tracker's fixed part (the /proc scan, reading events, copying the
 * index: about 5-10 ms a create, measured). */
#define OVL_TRACK_MIN_ENTRIES 2000
static bool ovl_track_wanted(uint64_t entries)
{
	static atomic_bool said;
	const char *v = getenv("CKPTD_TRACK_CHANGES");
	if (v && !strcmp(v, "0"))
		return false;
	if (v && *v && strcmp(v, "1") && !atomic_exchange(&said, true))
		log_warn("CKPTD_TRACK_CHANGES='%s' is neither 0 nor 1: the default applies (tracking from %d entries)",
			 v, OVL_TRACK_MIN_ENTRIES);
	return (v && !strcmp(v, "1")) || entries >= OVL_TRACK_MIN_ENTRIES;
}

/* The suspects of a pass that tracking does not name (change_track.h): the
 * files of r mapped shared and writable now, added to *sus. A scan that fails
 * is logged; the pass then trusts those files' ctimes, as it did before. */
static void ovl_scan_suspects(struct ovl_root *r, struct treecopy_index **sus)
{
	struct stat rst;
	const char *why = "cannot stat the root";
	if (stat(r->path, &rst) < 0 || chg_scan_mapped(r->path, rst.st_dev, false, sus, &why) < 0)
		log_warn("create: cannot tell which files of '%s' are mapped shared and writable (%s): a write "
			 "through such a mapping during the copy may be missed",
			 r->path, why);
}

/* A first pass that took this long is followed by a second one, not frozen
 * either (ovl_catch_up); after every first pass under CKPTD_TRACK_CHECK,
 * so that the tests' creates check it too. */
#define OVL_CATCH_UP_MS 50
static int64_t ovl_catch_up_ms(void)
{
	return getenv("CKPTD_TRACK_CHECK") ? 0 : OVL_CATCH_UP_MS;
}

/* The second pass: what changed during a long first pass (the tracker's
 * directories since it was armed) is brought up to date in dst, so that the
 * frozen pass has only what changes during this one, much shorter. Where the
 * tracker cannot tell, the whole upper is compared, still not frozen: the
 * frozen pass then takes the events that came after this collect, which
 * name every change made since it. *ix becomes the upper's index after it. */
static int ovl_catch_up(struct ovl_root *r, int up, int dst, struct treecopy_index **ix, struct treecopy_stats *stats,
			ckpt_error *err)
{
	struct treecopy_dirty *dirty = NULL;
	size_t n = 0;
	const char *why = "cannot stat the root";
	struct stat rst;
	int64_t t0 = mono_ms();
	int q = stat(r->path, &rst) < 0 ? -EAGAIN : chg_track_collect(&r->trk, r->path, rst.st_dev, &dirty, &n, &why);
	struct treecopy_index *nix = treecopy_index_copy(*ix);
	struct treecopy_opts o = {
		.prev_fd = -1, .prev_ix = *ix, .new_ix = nix, .dirs = r->pre_dirs.n ? &r->pre_dirs : NULL
	};
	if (q == 0) {
		o.suspects = r->trk.suspects;
		q = nix ? treecopy_update_dirs(up, dst, dirty, n, &o, stats, err)
			: err_set(err, ENOMEM, NULL, "second pass: out of memory");
	}
	treecopy_dirty_free(dirty, n);
	if (q == -EAGAIN) {
		log_info("create: the second pass of '%s' walks the upper: %s", r->path,
			 why ? why : "a changed file has other names, or a directory no event explains");
		treecopy_index_free(nix);
		nix = o.new_ix = treecopy_index_new();
		o.dirs = NULL;
		ovl_scan_suspects(r, &r->trk.suspects);
		o.suspects = r->trk.suspects;
		q = nix ? treecopy_update(up, dst, &o, stats, err) : err_set(err, ENOMEM, NULL, "out of memory");
	}
	if (q < 0) {
		treecopy_index_free(nix);
		return q;
	}
	log_info("create: second pass of '%s' compared %zu changed directories in %lld ms: %llu entries replaced, "
		 "%llu bytes written",
		 r->path, n, (long long)(mono_ms() - t0), (unsigned long long)stats->replaced,
		 (unsigned long long)stats->bytes_copied);
	treecopy_index_free(*ix);
	*ix = nix;
	return 0;
}

/* The previous layers of a delta (r->stack) opened in l; their number, or
 * -EAGAIN when one cannot be. */
static int ovl_delta_prev(struct ovl_root *r, int l, int fds[OVL_DELTA_MAX + 1])
{
	size_t n = json_array_size(r->stack);
	for (size_t j = 0; j < n; j++) {
		fds[j] = openat(l, json_string_value(json_array_get(r->stack, j)),
				O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fds[j] < 0) {
			while (j--)
				close(fds[j]);
			return -EAGAIN;
		}
	}
	return (int)n;
}

static void ovl_delta_prev_close(int *fds, int n)
{
	for (int j = 0; j < n; j++)
		close(fds[j]);
}

/* One pass of a delta into dst: the directories the tracker names since its
 * last collect, then (frozen) every directory's own metadata. -EAGAIN: make
 * a full layer. */
static int ovl_delta_pass(struct ovl_root *r, int l, int up, int dst, bool frozen, struct treecopy_stats *stats,
			  ckpt_error *err)
{
	struct treecopy_dirty *dirty = NULL;
	size_t n = 0;
	const char *why = "cannot stat the root";
	struct stat rst;
	int pfd[OVL_DELTA_MAX + 1];
	int64_t t0 = mono_ms();
	int np = ovl_delta_prev(r, l, pfd);
	/* the first pass reads the events only: the frozen one's /proc scan
	 * names the files in use and mapped, and those are copied then */
	int q = np < 0                    ? (why = "a previous layer is gone", -EAGAIN)
		: !frozen                 ? chg_track_collect_events(&r->trk, &dirty, &n, &why)
		: stat(r->path, &rst) < 0 ? -EAGAIN
					  : chg_track_collect(&r->trk, r->path, rst.st_dev, &dirty, &n, &why);
	struct ovl_delta_opts o = { .up = up,
				    .prev = pfd,
				    .n_prev = np > 0 ? (size_t)np : 0,
				    .ix = r->ix,
				    .dix = r->dix,
				    .suspects = r->trk.suspects,
				    .dirs = &r->ddirs };
	if (q == 0) {
		why = "a directory moved or made over another entry, or a changed file of several names";
		q = overlay_delta_dirs(&o, dst, dirty, n, stats, err);
	}
	if (q == 0 && frozen)
		q = overlay_delta_dir_meta(&o, dst, &r->ddirs, stats, err);
	treecopy_dirty_free(dirty, n);
	ovl_delta_prev_close(pfd, np);
	if (q == -EAGAIN)
		log_info("create: '%s' gets a full layer, not a delta: %s", r->path, why);
	else if (q == 0)
		log_info("create: %s delta pass of '%s' compared %zu changed directories in %lld ms: %llu entries "
			 "written, %llu bytes",
			 frozen ? "frozen" : "first", r->path, n, (long long)(mono_ms() - t0),
			 (unsigned long long)stats->replaced, (unsigned long long)stats->bytes_copied);
	return q;
}

/* The first pass's directory l/.pre-<name>, empty, named in r->pre. */
static int ovl_pre_make(struct ovl_root *r, int l, ckpt_error *err)
{
	char name[OVL_NAME_LEN + 1];
	int q = overlay_layers_new_name(l, name);
	if (q < 0)
		return err_set(err, -q, NULL, "name a layer: %s", strerror(-q));
	snprintf(r->pre, sizeof(r->pre), ".pre-%s", name);
	if (mkdirat(l, r->pre, 0700) < 0) {
		r->pre[0] = 0;
		return err_set(err, errno, NULL, "create first pass: %m");
	}
	return 0;
}

/* Create's first pass as a delta (overlay_delta.c): l/.pre-<name> holds
 * what changed since the last create. -EAGAIN: a full one is needed. */
static int ovl_delta_first(struct ovl_root *r, int l, int up, struct progress *p, ckpt_error *err)
{
	int q = ovl_pre_make(r, l, err);
	if (q < 0)
		return q;
	r->pre_delta = true;
	_cleanup_close_ int dst = openat(l, r->pre, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct treecopy_stats stats = { 0 };
	q = dst < 0 ? err_set(err, errno, NULL, "open first pass: %m")
		    : ovl_delta_pass(r, l, up, dst, false, &stats, err);
	if (q < 0) {
		ovl_drop_pre(r, l); /* and the delta state with it */
		return q;
	}
	if (p) { /* the totals are what it copied: known once done */
		atomic_fetch_add(&p->files_total, stats.files);
		atomic_fetch_add(&p->bytes_total, stats.bytes_copied);
		atomic_fetch_add(&p->files_done, stats.files);
		atomic_fetch_add(&p->bytes_done, stats.bytes_copied);
	}
	r->pre_bytes = stats.bytes_copied;
	chg_track_drain(&r->trk); /* its own writes, read now rather than frozen */
	return 0;
}

/* Create's first pass, before the freeze: the upper into l/.pre-<name>,
 * synced, itself linking what the last layer has. The frozen pass then links
 * from it every file unchanged since, and has little to copy or sync. */
static int ovl_precopy_root(struct ovl_root *r, struct progress *p, ckpt_error *err)
{
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int up = ovl_open_dir(r->rdir_fd, "u", r->upper);
	if (l < 0 || up < 0)
		return err_set(err, errno, NULL, "open layer store of '%s': %m", r->path);
	ovl_drop_pre(r, l);
	if (overlay_delta_ready(r)) {
		int d = ovl_delta_first(r, l, up, p, err);
		if (d != -EAGAIN)
			return d;
	}
	overlay_delta_reset(r); /* a full layer: its frozen pass decides whether deltas follow */
	int q = ovl_pre_make(r, l, err);
	if (q < 0)
		return q;
	_cleanup_close_ int dst = openat(l, r->pre, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int prev = r->ix ? openat(l, r->ix_layer, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	_cleanup_(treecopy_index_freep) struct treecopy_index *ix = treecopy_index_new();
	uint64_t files = 0, bytes = 0; /* totals for a progress bar; a failed count only loses the bar */
	int m = p ? treecopy_measure(up, prev >= 0 ? r->ix : NULL, &files, &bytes) : -EAGAIN;
	if (m == 0) {
		atomic_fetch_add(&p->files_total, files);
		atomic_fetch_add(&p->bytes_total, bytes);
	}
	/* armed before the copy, so that what changes during it is seen */
	int t = ovl_track_wanted(m == 0 ? files : UINT64_MAX) ? chg_track_arm(&r->trk, up) : 0;
	if (t < 0 && !r->trk_said)
		log_notice("create: no change tracking for '%s' (%s): the frozen pass walks the upper", r->path,
			   strerror(-t));
	r->trk_said = r->trk_said || t < 0;
	struct treecopy_opts opts = { .mode = TREECOPY_NEW,
				      .prev_fd = prev,
				      .prev_ix = r->ix,
				      .new_ix = ix,
				      .progress = p,
				      /* what a tracked frozen pass checks directory metadata of */
				      .dirs = chg_track_armed(&r->trk) ? &r->pre_dirs : NULL };
	struct treecopy_stats stats = { 0 }, again = { 0 };
	/* with tracking, the frozen pass's collect names the suspects */
	_cleanup_(treecopy_index_freep) struct treecopy_index *sus = NULL;
	if (!chg_track_armed(&r->trk))
		ovl_scan_suspects(r, &sus);
	opts.suspects = sus;
	int64_t t0 = mono_ms();
	q = dst < 0 || !ix ? err_set(err, ENOMEM, NULL, "first pass: out of memory")
			   : treecopy_copy(up, dst, &opts, &stats, err);
	/* synced so that the frozen pass's syncfs has only the changes, and so
	 * that a write through a mapping faults again and changes the file's
	 * ctime, which the next pass compares (syncfs reaches the upper too: the
	 * layer store is on its filesystem) */
	bool second = q == 0 && chg_track_armed(&r->trk) && mono_ms() - t0 >= ovl_catch_up_ms();
	if (q == 0 && syncfs(dst) < 0)
		q = err_set(err, errno, NULL, "sync first pass: %m");
	if (q == 0 && second && (q = ovl_catch_up(r, up, dst, &ix, &again, err)) == 0 && syncfs(dst) < 0)
		q = err_set(err, errno, NULL, "sync second pass: %m");
	/* without tracking, the frozen walk's suspects: the files mapped shared
	 * and writable now, after the sync (found here, not frozen) */
	if (q == 0 && !chg_track_armed(&r->trk))
		ovl_scan_suspects(r, &r->pre_sus);
	if (q == 0) /* the first pass's own events, read now rather than frozen */
		chg_track_drain(&r->trk);
	if (q < 0) {
		ovl_drop_pre(r, l);
		return q;
	}
	r->pre_ix = TAKE_PTR(ix);
	r->pre_bytes = stats.bytes_copied + again.bytes_copied;
	/* the tracked frozen pass starts from a copy of that index: made now,
	 * not frozen (about 0.4 ms per 1,000 files) */
	if (chg_track_armed(&r->trk))
		r->pre_ix_next = treecopy_index_copy(r->pre_ix);
	return 0;
}

static int ovl_precopy(void *st, struct progress *p, ckpt_error *err)
{
	struct ovl *o = st;
	for (size_t i = 0; i < o->n_roots; i++) {
		int q = ovl_precopy_root(&o->roots[i], p, err);
		if (q < 0)
			return q;
	}
	return 0;
}

/* CKPTD_TRACK_CHECK (the tests set it): after a tracked frozen pass, the
 * full one must find nothing left to do, unless the upper changed since the
 * tracked pass (a writer that is not frozen). */
static int ovl_track_check(struct ovl_root *r, int up, int dst, const struct treecopy_index *ix, ckpt_error *err)
{
	_cleanup_(treecopy_index_freep) struct treecopy_index *scratch = treecopy_index_new();
	struct treecopy_opts co = { .prev_fd = -1, .prev_ix = ix, .new_ix = scratch };
	struct treecopy_stats cs = { 0 };
	int q = scratch ? treecopy_update(up, dst, &co, &cs, err) : err_set(err, ENOMEM, NULL, "out of memory");
	if (q == 0 && cs.replaced && chg_track_changed_since(&r->trk)) {
		log_debug("create: tracking check of '%s' inconclusive: the upper changed meanwhile", r->path);
		return 0;
	}
	if (q == 0 && cs.replaced)
		q = err_set(err, EIO, NULL, "change tracking missed %llu entries of '%s' (CKPTD_TRACK_CHECK)",
			    (unsigned long long)cs.replaced, r->path);
	return q;
}

/* The frozen pass: the first pass brought up to date. Only the directories
 * that changed since it began, when the tracker can tell which; else the
 * whole upper is compared. On success *ix is the upper's new index. */
static int ovl_frozen_pass(struct ovl_root *r, int up, int dst, struct treecopy_opts *opts, struct treecopy_index **ix,
			   struct treecopy_stats *stats, ckpt_error *err)
{
	struct treecopy_dirty *dirty = NULL;
	size_t n = 0;
	const char *why = "no change tracking";
	struct stat rst;
	int q = -EAGAIN;
	int64_t t0 = mono_ms();
	if (chg_track_armed(&r->trk))
		q = stat(r->path, &rst) < 0 ? (why = "cannot stat the root", -EAGAIN)
					    : chg_track_collect(&r->trk, r->path, rst.st_dev, &dirty, &n, &why);
	int64_t t1 = mono_ms();
	if (q == 0) {
		/* the copy made before the freeze, when there is one */
		struct treecopy_index *tix = r->pre_ix_next ? TAKE_PTR(r->pre_ix_next) : treecopy_index_copy(r->pre_ix);
		struct treecopy_opts to = *opts;
		to.new_ix = tix;
		to.dirs = r->pre_dirs.n ? &r->pre_dirs : NULL;
		to.suspects = r->trk.suspects;
		q = tix ? treecopy_update_dirs(up, dst, dirty, n, &to, stats, err)
			: err_set(err, ENOMEM, NULL, "out of memory");
		if (q == 0 && getenv("CKPTD_TRACK_CHECK"))
			q = ovl_track_check(r, up, dst, tix, err);
		if (q == 0) {
			log_info("create: frozen pass of '%s' compared %zu changed directories in %lld ms "
				 "(events and /proc %lld ms): %llu entries replaced, %llu of them files "
				 "refreshed in place, %llu bytes written",
				 r->path, n, (long long)(mono_ms() - t0), (long long)(t1 - t0),
				 (unsigned long long)stats->replaced, (unsigned long long)stats->refreshed,
				 (unsigned long long)stats->bytes_copied);
			treecopy_index_free(*ix);
			*ix = tix;
			r->cap_tracked = true; /* deltas can follow this layer */
		} else {
			treecopy_index_free(tix);
			why = "a changed file has other names, or a directory no event explains";
		}
	}
	treecopy_dirty_free(dirty, n);
	if (q != -EAGAIN)
		return q;
	if (chg_track_armed(&r->trk))
		log_info("create: the frozen pass of '%s' walks the upper: %s", r->path, why);
	/* the suspects: untracked, those the first pass found after its sync
	 * (and those it found before it are untrusted in its index); else what
	 * the tracker knows, and those mapped now */
	if (chg_track_armed(&r->trk))
		ovl_scan_suspects(r, &r->trk.suspects);
	opts->suspects = chg_track_armed(&r->trk) ? r->trk.suspects : r->pre_sus;
	return treecopy_update(up, dst, opts, stats, err);
}

/* Forget r's capture (its copy goes with the trash). */
static void ovl_drop_capture(struct ovl_root *r, int l)
{
	if (r->cap_tmp[0])
		overlay_layers_trash(r, l, "l", r->cap_tmp);
	if (r->cap_tmp[0] && (r->cap_delta || r->cap_tracked)) /* its collect's changes are in no layer */
		overlay_delta_reset(r);
	r->cap_delta = r->cap_tracked = false;
	r->cap_tmp[0] = 0;
	treecopy_index_free(TAKE_PTR(r->cap_ix));
	r->cap_size = 0;
}

/* The frozen pass of a delta: the first pass (l/<pre>) becomes l/<tmp>,
 * brought up to date. -EAGAIN (the delta state then reset): copy in full. */
static int ovl_capture_delta(struct ovl_root *r, int l, int up, const char *name, const char *tmp, ckpt_error *err)
{
	struct treecopy_stats stats = { 0 };
	int q = renameat(l, r->pre, l, tmp) < 0 ? err_set(err, errno, NULL, "create layer: %m") : 0;
	if (q == 0) {
		r->pre[0] = 0; /* now tmp */
		r->pre_delta = false;
	}
	_cleanup_close_ int dst = q == 0 ? openat(l, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (q == 0 && dst < 0)
		q = err_set(err, errno, NULL, "open layer: %m");
	if (q == 0)
		q = ovl_delta_pass(r, l, up, dst, true, &stats, err);
	if (q == 0 && getenv("CKPTD_TRACK_CHECK"))
		q = overlay_delta_check(r, tmp, err);
	if (q < 0) {
		rm_rf_at(l, tmp);
		ovl_drop_pre(r, l);
		overlay_delta_reset(r);
		return q;
	}
	memcpy(r->cap_tmp, tmp, sizeof(r->cap_tmp));
	memcpy(r->cap_name, name, sizeof(r->cap_name));
	r->cap_ix = NULL;
	r->cap_size = stats.bytes_copied + r->pre_bytes;
	r->cap_delta = true;
	return 0;
}

/* Copy r's upper into l/.tmp-<name>, not yet durable (the capture, which
 * create runs frozen); r->cap_* say what it holds. With a first pass
 * (precopy), that copy becomes the layer: only what changed since is
 * replaced in it (treecopy_update), instead of linking every file again. */
static int ovl_capture_layer(struct ovl_root *r, struct progress *p, ckpt_error *err)
{
	char name[OVL_NAME_LEN + 1], tmp[sizeof(r->cap_tmp)];
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int up = ovl_open_dir(r->rdir_fd, "u", r->upper);
	if (l < 0 || up < 0)
		return err_set(err, errno, NULL, "open layer store of '%s': %m", r->path);
	ovl_drop_capture(r, l);
	r->cap_tracked = r->cap_delta = false;
	int q = overlay_layers_new_name(l, name);
	if (q < 0)
		return err_set(err, -q, NULL, "name a layer: %s", strerror(-q));
	snprintf(tmp, sizeof(tmp), ".tmp-%s", name);
	if (r->pre[0] && r->pre_delta) {
		q = ovl_capture_delta(r, l, up, name, tmp, err);
		if (q != -EAGAIN)
			return q;
		/* a change a delta cannot say: the full copy, frozen (rare) */
	}
	bool update = r->pre_ix != NULL; /* the first pass becomes the layer */
	if (update ? renameat(l, r->pre, l, tmp) < 0 : mkdirat(l, tmp, 0700) < 0)
		return err_set(err, errno, NULL, "create layer: %m");
	if (update)
		r->pre[0] = 0; /* now tmp */
	_cleanup_close_ int dst = openat(l, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	const char *from = r->ix && !update ? r->ix_layer : NULL;
	_cleanup_close_ int prev = from ? openat(l, from, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	_cleanup_(treecopy_index_freep) struct treecopy_index *ix = treecopy_index_new();
	struct treecopy_opts opts = {
		.mode = TREECOPY_NEW,
		.prev_fd = prev,
		.prev_ix = update ? r->pre_ix : r->ix,
		.new_ix = ix,
		.progress = update ? NULL : p, /* the bar follows the first pass, which has the totals */
	};
	struct treecopy_stats stats = { 0 };
	uint64_t pre_bytes = r->pre_bytes;
	_cleanup_(treecopy_index_freep) struct treecopy_index *sus = NULL;
	if (!update) { /* a copy with no first pass: its suspects (change_track.h) */
		ovl_scan_suspects(r, &sus);
		opts.suspects = sus;
	}
	if (dst < 0 || !ix)
		q = err_set(err, ENOMEM, NULL, "create layer: out of memory");
	else
		q = update ? ovl_frozen_pass(r, up, dst, &opts, &ix, &stats, err)
			   : treecopy_copy(up, dst, &opts, &stats, err);
	if (r->pre[0])
		overlay_layers_trash(r, l, "l", r->pre);
	r->pre[0] = 0; /* the rest of the first pass goes after the thaw (ovl_forget_pre) */
	if (q < 0) {
		rm_rf_at(l, tmp);
		return q;
	}
	memcpy(r->cap_tmp, tmp, sizeof(tmp));
	memcpy(r->cap_name, name, sizeof(name));
	r->cap_ix = TAKE_PTR(ix);
	r->cap_size = stats.bytes_copied + pre_bytes; /* a file rewritten since the first pass counts twice */
	return 0;
}

/* Make r's capture the durable layer r->cap_name; on success ix (the
 * upper's new index; NULL for a delta) is handed to the caller, and what
 * kind it was: a delta, or a full layer deltas can follow. */
static int ovl_publish_capture(struct ovl_root *r, char name[OVL_NAME_LEN + 1], struct treecopy_index **ret_ix,
			       uint64_t *size, bool *ret_delta, bool *ret_tracked, ckpt_error *err)
{
	*ret_delta = r->cap_delta;
	*ret_tracked = r->cap_tracked;
	ovl_forget_pre(r);
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (l < 0)
		return err_set(err, errno, NULL, "open layer store of '%s': %m", r->path);
	_cleanup_close_ int dst = openat(l, r->cap_tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = dst < 0 ? err_set(err, errno, NULL, "open layer: %m") : 0;
	q = overlay_layer_publish(r, l, dst, r->cap_tmp, r->cap_name, q, err); /* removes tmp on failure */
	r->cap_tmp[0] = 0;
	if (q < 0) {
		ovl_drop_capture(r, l);
		return q;
	}
	memcpy(name, r->cap_name, OVL_NAME_LEN + 1);
	*size += r->cap_size;
	*ret_ix = TAKE_PTR(r->cap_ix);
	r->cap_size = 0;
	r->cap_delta = r->cap_tracked = false;
	return 0;
}

/* After a create of r published layer name: what the next create stacks on.
 * A delta goes on top of the stack; a full layer the tracker answered for
 * starts a new one (the tracker stays armed); else the next is full. */
static void ovl_delta_after(struct ovl_root *r, const char *name, bool delta, bool tracked)
{
	if (delta) {
		json_array_insert_new(r->stack, 0, json_string(name));
		return;
	}
	bool keep = tracked && chg_track_armed(&r->trk);
	json_array_clear(r->stack);
	treecopy_index_free(TAKE_PTR(r->dix));
	overlay_delta_dirs_free(&r->ddirs);
	char rel[32];
	snprintf(rel, sizeof(rel), "l/%s", name);
	_cleanup_close_ int fd = keep ? openat(r->rdir_fd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (fd >= 0 && (r->dix = treecopy_index_new()) && overlay_delta_dirs_read(fd, &r->ddirs) == 0)
		json_array_append_new(r->stack, json_string(name));
	else
		overlay_delta_reset(r);
}

static void ovl_discard_layers(struct ovl *o, char (*names)[OVL_NAME_LEN + 1], size_t n)
{
	for (size_t i = 0; i < n; i++) {
		_cleanup_close_ int l = openat(o->roots[i].rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (l >= 0)
			rm_rf_at(l, names[i]);
	}
}

static void ovl_drop_captures(struct ovl *o)
{
	for (size_t i = 0; i < o->n_roots; i++) {
		_cleanup_close_ int l = openat(o->roots[i].rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (l >= 0)
			ovl_drop_capture(&o->roots[i], l);
		ovl_forget_pre(&o->roots[i]);
	}
}

/* The frozen part of create: every root's copy, kept for create. */
static int ovl_capture(void *st, struct progress *p, ckpt_error *err)
{
	struct ovl *o = st;
	int q = 0;
	for (size_t i = 0; q == 0 && i < o->n_roots; i++)
		q = ovl_capture_layer(&o->roots[i], p, err);
	if (q < 0) {
		ovl_drop_captures(o);
		return ovl_fail(q, err);
	}
	return 0;
}

/* Capture (unless ovl_capture just did, frozen), then publish the layers,
 * the chain and the upper's index. */
static int ovl_create(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p,
		      ckpt_error *err)
{
	struct ovl *o = st;
	char(*names)[OVL_NAME_LEN + 1] = calloc(o->n_roots + 1, sizeof(*names));
	struct treecopy_index **ixs = calloc(o->n_roots + 1, sizeof(*ixs));
	bool *delta = calloc(o->n_roots + 1, sizeof(bool)), *tracked = calloc(o->n_roots + 1, sizeof(bool));
	json_auto_t *chains = json_object(), *data = json_pack("{s:[]}", "roots");
	uint64_t size = 0;
	int q = names && ixs && delta && tracked && chains && data ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
	size_t done = 0;

	/* No syncfs of the roots: the copy reads the page cache, and syncing a
	 * shared filesystem costs more than the copy; syncfs(layer) makes it durable. */
	for (size_t i = 0; q == 0 && i < o->n_roots; i++)
		if (!o->roots[i].cap_tmp[0])
			q = ovl_capture_layer(&o->roots[i], p, err);
	for (; q == 0 && done < o->n_roots; done++)
		q = ovl_publish_capture(&o->roots[done], names[done], &ixs[done], &size, &delta[done], &tracked[done],
					err);
	for (size_t i = 0; q == 0 && i < o->n_roots; i++) {
		json_t *c = json_pack("[s]", names[i]);
		if (delta[i]) /* over the layers the previous creates made from this upper */
			json_array_extend(c, o->roots[i].stack);
		json_array_extend(c, o->roots[i].chain);
		json_object_set_new(chains, o->roots[i].h, c);
		json_array_append_new(json_object_get(data, "roots"),
				      json_pack("{s:s,s:O}", "path", o->roots[i].path, "layers", c));
	}
	if (q == 0 && (q = overlay_layers_chain_save(o, id, chains)) < 0)
		err_set(err, -q, NULL, "record layer chain: %s", strerror(-q));
	if (q < 0)
		ovl_discard_layers(o, names, done);
	for (size_t i = 0; i < o->n_roots && ixs && delta; i++) {
		struct ovl_root *r = &o->roots[i];
		if (q < 0)
			overlay_delta_reset(r); /* the changes collected are in no checkpoint */
		if (q == 0)
			ovl_delta_after(r, names[i], delta[i], tracked[i]);
		if (q == 0 && !delta[i]) { /* a delta leaves the index of the full layer below it */
			char tag[2 * OVL_NAME_LEN + 2];
			snprintf(tag, sizeof(tag), "%s:%s", r->upper, names[i]);
			treecopy_index_save(ixs[i], tag, r->rdir_fd, "idx/index");
			treecopy_index_free(r->ix);
			r->ix = TAKE_PTR(ixs[i]);
			snprintf(r->ix_layer, sizeof(r->ix_layer), "%s", names[i]);
		}
		treecopy_index_free(ixs[i]);
	}
	ovl_drop_captures(o); /* what a failure left (the trackers deltas need stay) */
	free(names);
	free(ixs);
	free(delta);
	free(tracked);
	if (q < 0)
		return ovl_fail(q, err);
	*ret_size = size;
	*ret_data = TAKE_PTR(data);
	return 0;
}

struct ovl_swap {
	json_t *old_chain, *old_mounted;
	char old_upper[OVL_NAME_LEN + 1];
	int pin; /* the old mount, detached (overlay_umount_pinned), or -1 */
};

/* The old upper and work dir go to t/ and the pin to the list: cleanup
 * deletes them, then closes the pin (never under the operation lock). */
static void ovl_discard_upper(struct ovl *o, struct ovl_root *r, struct ovl_swap *s)
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
static void ovl_swap_undo(struct ovl *o, struct ovl_root *r, struct ovl_swap *s)
{
	ckpt_error e;
	struct overlay_mountinfo mi;
	overlay_mountinfo_find(r->path, &mi);
	if (ovl_is_our_upper(r, &mi, r->upper))
		overlay_umount(r->path, NULL, &e);
	if (!ovl_is_our_upper(r, &mi, s->old_upper) || ovl_is_our_upper(r, &mi, r->upper))
		ovl_mount_chain(o, r, s->old_mounted, s->old_upper, &e);
	overlay_mountinfo_clear(&mi);
	overlay_live_set(r, s->old_chain, s->old_mounted);
	memcpy(r->upper, s->old_upper, sizeof(r->upper));
	overlay_live_save(r);
}

/* Switch every root to chains[h] with a fresh upper. live.json (with the new
 * chain and upper) is written for all roots first: it is the intent a restart
 * finishes, so a crash leaves P before or after, never a mix. */
static int ovl_switch(struct ovl *o, json_t *chains, struct restore_details *details, ckpt_error *err)
{
	struct ovl_swap *sw = calloc(o->n_roots + 1, sizeof(*sw));
	size_t prepared = 0, swapped = 0;
	int q = sw ? 0 : err_set(err, ENOMEM, NULL, "out of memory");

	for (size_t i = 0; i < o->n_roots; i++) /* a new upper: the next create is full */
		overlay_delta_reset(&o->roots[i]);
	for (; q == 0 && prepared < o->n_roots; prepared++) {
		struct ovl_root *r = &o->roots[prepared];
		json_t *c = json_object_get(chains, r->h);
		sw[prepared] = (struct ovl_swap){ json_incref(r->chain), json_incref(r->mounted), "", -1 };
		memcpy(sw[prepared].old_upper, r->upper, sizeof(r->upper));
		if (r->spare[0]) { /* made durable by maintain: no fsync on the request path */
			memcpy(r->upper, r->spare, sizeof(r->upper));
			r->spare[0] = 0;
		} else if ((q = ovl_new_upper(r, r->upper)) < 0) {
			memcpy(r->upper, sw[prepared].old_upper, sizeof(r->upper));
			err_set(err, -q, NULL, "new upper for '%s': %s", r->path, strerror(-q));
			break;
		}
		json_auto_t *none = json_array();
		overlay_live_set(r, c ? c : none, c ? c : none);
		if ((q = overlay_live_save(r)) < 0)
			err_set(err, -q, NULL, "record restore intent: %s", strerror(-q));
	}
	for (size_t i = 0; q == 0 && i < o->n_roots; i++, swapped++) {
		struct ovl_root *r = &o->roots[i];
		q = overlay_umount_pinned(r->path, details, &sw[i].pin, err);
		if (q == 0)
			q = ovl_mount_chain(o, r, r->chain, r->upper, err);
	}
	if (q < 0)
		for (size_t i = 0; i < prepared && i < o->n_roots; i++) {
			if (sw[i].pin >= 0)
				close(TAKE_FD(sw[i].pin));
			if (sw[i].old_chain)
				ovl_swap_undo(o, &o->roots[i], &sw[i]);
		}
	for (size_t i = 0; i < o->n_roots && q == 0; i++) {
		struct ovl_root *r = &o->roots[i];
		treecopy_index_free(TAKE_PTR(r->ix)); /* the new upper is empty */
		r->ix_layer[0] = 0;
		unlinkat(r->rdir_fd, "idx/index", 0);
		ovl_discard_upper(o, r, &sw[i]);
	}
	for (size_t i = 0; sw && i < o->n_roots; i++) {
		json_decref(sw[i].old_chain);
		json_decref(sw[i].old_mounted);
	}
	free(sw);
	o->dirty_gc = true;
	if (q == 0)
		atomic_store(&o->last_swap_ms, mono_ms());
	(void)swapped;
	return ovl_fail(q, err);
}

static int ovl_restore(void *st, const char *id, json_t *data, struct restore_details *details, struct progress *p,
		       ckpt_error *err)
{
	struct ovl *o = st;
	(void)p;
	json_auto_t *chains = overlay_layers_chain_get(o, id, data);
	if (!chains)
		return err_set(err, ENOENT, "not_found", "no layers recorded for checkpoint %s", id);
	return ovl_switch(o, chains, details, err);
}

static int ovl_verify(void *st, const char *id, json_t *data, json_t *diffs, size_t max, ckpt_error *err)
{
	struct ovl *o = st;
	json_auto_t *chains = id ? overlay_layers_chain_get(o, id, data) : json_object();
	int q = chains ? 0 : err_set(err, ENOENT, "not_found", "no layers recorded for checkpoint %s", id);

	for (size_t i = 0; q == 0 && i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		struct overlay_mountinfo mi;
		json_t *c = json_object_get(chains, r->h);
		json_auto_t *none = c ? NULL : json_array();
		overlay_mountinfo_find(r->path, &mi);
		bool ours = ovl_is_our_upper(r, &mi, r->upper);
		overlay_mountinfo_clear(&mi);
		q = overlay_verify_root(r, c ? c : none, ours, diffs, max, err);
	}
	return q;
}

static int ovl_reset(void *st, struct restore_details *details, ckpt_error *err)
{
	json_auto_t *empty = json_object();
	return ovl_switch(st, empty, details, err);
}

static int ovl_remove(void *st, const char *id, json_t *data, ckpt_error *err)
{
	struct ovl *o = st;
	(void)data;
	int q = overlay_layers_chain_drop(o, id);
	if (q < 0 && q != -ENOENT)
		return err_set(err, -q, NULL, "drop layer chain of %s: %s", id, strerror(-q));
	o->dirty_gc = true; /* layers go in maintain, after the record is gone */
	return 0;
}

static void ovl_health(void *st, json_t *out)
{
	struct ovl *o = st;
	json_t *roots = json_array();
	for (size_t i = 0; i < o->n_roots; i++)
		json_array_append_new(roots,
				      json_pack("{s:s,s:I,s:s,s:b,s:I}", "path", o->roots[i].path, "layers",
						(json_int_t)json_array_size(o->roots[i].chain), "upper",
						o->roots[i].upper, "released", o->roots[i].released, "deltas",
						(json_int_t)(overlay_delta_ready(&o->roots[i])
								     ? json_array_size(o->roots[i].stack) - 1
								     : 0)));
	json_object_set_new(
		out, "backend_reason",
		json_string("overlayfs mounts work here: restore swaps a layer chain, create copies only the upper"));
	json_object_set_new(out, "overlay_roots", roots);
}

static void ovl_maintain(void *st)
{
	struct ovl *o = st;
	ckpt_error e = { 0 };
	int depth = o->cfg && o->cfg->flatten_depth > 0 ? o->cfg->flatten_depth : 64;
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
		    ovl_new_upper(&o->roots[i], o->roots[i].spare) < 0)
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
static int ovl_cleanup_pins(struct ovl *o, bool all)
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

static int ovl_cleanup(void *st)
{
	return ovl_cleanup_pins(st, false);
}

static void ovl_close(void *st, bool unmount)
{
	struct ovl *o = st;
	ckpt_error e;
	if (o)
		ovl_cleanup_pins(o, true);
	for (size_t i = 0; unmount && o && i < o->n_roots; i++) {
		if (o->roots[i].released)
			continue;
		_cleanup_free_ char *base = path_join(o->roots[i].rdir, "base");
		overlay_umount(o->roots[i].path, NULL, &e);
		if (base)
			overlay_umount(base, NULL, &e);
	}
	ovl_free(o);
}

/* A real tiny overlay mount in the state dir: the kernel's answer is the reason. */
static int ovl_probe(const struct backend_ctx *ctx, ckpt_error *err)
{
	static const char *const sub[] = { "l", "u", "w", "m" };
	char rnd[9];
	_cleanup_free_ char *dir = NULL;
	random_hex(rnd, 4);
	if (asprintf(&dir, "%s/overlay/.probe-%s", ctx->state_dir, rnd) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; i < ARRAY_SIZE(sub); i++) {
		_cleanup_free_ char *p = path_join(dir, sub[i]);
		int q = mkdir_p(p, 0700);
		if (q < 0)
			return err_set(err, -q, NULL, "overlay probe: create '%s': %s", p, strerror(-q));
	}
	_cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_free_ char *m = path_join(dir, "m");
	const char *lowers[] = { "l" };
	struct overlay_spec s = {
		.target = m, .dir = dir, .dir_fd = fd, .lowers = lowers, .n_lowers = 1, .upper = "u", .work = "w"
	};
	int q = overlay_mount(&s, err);
	if (q == 0)
		overlay_umount(m, NULL, err);
	_cleanup_free_ char *parent = path_join(ctx->state_dir, "overlay");
	_cleanup_close_ int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd >= 0)
		rm_rf_at(pfd, strrchr(dir, '/') + 1);
	return q < 0 ? err_prefix(err, "overlayfs refused a test mount") : 0;
}

const struct backend_ops backend_overlay_ops = {
	.name = "overlay",
	.probe = ovl_probe,
	.open = ovl_open,
	.recover = ovl_recover,
	.precopy = ovl_precopy,
	.capture = ovl_capture,
	.create = ovl_create,
	.restore = ovl_restore,
	.verify = ovl_verify,
	.reset = ovl_reset,
	.remove = ovl_remove,
	.fork_mount = overlay_fork_mount,
	.fork_remove = overlay_fork_remove,
	.diff = overlay_diff,
	.health = ovl_health,
	.maintain = ovl_maintain,
	.cleanup = ovl_cleanup,
	.close = ovl_close,
	.view_open = overlay_view_open,
	.view_close = overlay_view_close,
	.import = overlay_import,
	.release = overlay_release,
	.release_unmounts = true,
};
