/* overlay_create.c: the create pipeline of the overlay backend
 * (docs/overlay-create.md): a precopy of each upper before the freeze, the
 * frozen pass that catches up with what changed since (tracked or walked),
 * a delta layer over the previous create's when it can, and publishing the
 * new layers as the checkpoint's chains. */
#include "backend/backend.h"
#include "config.h"
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"
#include "backend/overlay/treecopy.h"

#include <limits.h>
#include <sys/stat.h>
#include "lib/failpoint.h"

/* Change tracking for the frozen pass starts at this many entries of the
 * upper (overlay_create_track_wanted). */
#define OVL_TRACK_MIN_ENTRIES 2000
/* A first pass that took this long is followed by a second one, not frozen
 * either (overlay_create_catch_up). */
#define OVL_CATCH_UP_MS 50

static int overlay_create_open_dir(int dfd, const char *a, const char *b)
{
	char p[64];
	snprintf(p, sizeof(p), "%s/%s", a, b);
	return openat(dfd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* What create's first pass of r left in memory: its index and directory
 * list, and the tracker (closing a fanotify group waits for the kernel: the
 * capture leaves this to after the thaw). */
static void overlay_create_forget_pre(struct ovl_root *r)
{
	pathindex_free(TAKE_PTR(r->pre_ix));
	pathindex_free(TAKE_PTR(r->pre_ix_next));
	treecopy_dirs_free(&r->pre_dirs);
	pathindex_free(TAKE_PTR(r->pre_sus));
	r->pre_bytes = 0;
	/* kept while deltas can follow (or fold): the next create's delta reads it */
	if (!overlay_delta_ready(r) && !overlay_rebase_due(r) && !(r->cap_tmp[0] && (r->cap_delta || r->cap_tracked)))
		chg_track_disarm(&r->trk);
}

/* Forget create's first pass of r (its files go with the trash). */
static void overlay_create_drop_pre(struct ovl_root *r, int l)
{
	if (r->pre[0])
		overlay_layers_trash(r, l, "l", r->pre);
	if (r->pre[0] && r->pre_delta) /* its collect's changes are in no layer */
		overlay_delta_reset(r);
	r->pre[0] = 0;
	r->pre_delta = false;
	overlay_create_forget_pre(r);
}

/* Change tracking for the frozen pass (docs/overlay-create.md), for an upper
 * of that many entries. track_changes "never": never; "always": always;
 * "auto": from OVL_TRACK_MIN_ENTRIES on. Below it the frozen walk costs less
 * than the tracker's fixed part (the /proc scan, reading events, copying the
 * index: about 5-10 ms a create, measured). */
static bool overlay_create_track_wanted(const struct ovl_root *r, uint64_t entries)
{
	return r->track == TRACK_ALWAYS || (r->track == TRACK_AUTO && entries >= OVL_TRACK_MIN_ENTRIES);
}

/* The suspects of a pass that tracking does not name (change_track.h): the
 * files of r mapped shared and writable now, added to *sus. A scan that fails
 * is logged; the pass then trusts those files' ctimes, as it did before. */
static void overlay_create_scan_suspects(struct ovl_root *r, struct pathindex **sus)
{
	struct stat rst;
	const char *why = "cannot stat the root";
	if (stat(r->path, &rst) < 0 || chg_scan_mapped(r->path, rst.st_dev, false, sus, &why) < 0)
		log_warn("create: cannot tell which files of '%s' are mapped shared and writable (%s): a write "
			 "through such a mapping during the copy may be missed",
			 r->path, why);
}

/* The second pass: what changed during a long first pass (the tracker's
 * directories since it was armed) is brought up to date in dst, so that the
 * frozen pass has only what changes during this one, much shorter. Where the
 * tracker cannot tell, the whole upper is compared, still not frozen: the
 * frozen pass then takes the events that came after this collect, which
 * name every change made since it. *ix becomes the upper's index after it. */
static int overlay_create_catch_up(struct ovl_root *r, int up, int dst, struct pathindex **ix,
				   struct treecopy_stats *stats, ckpt_error *err)
{
	struct pathindex_dirty *dirty = NULL;
	size_t n = 0;
	const char *why = "cannot stat the root";
	struct stat rst;
	int64_t t0 = mono_ms();
	int q = stat(r->path, &rst) < 0 ? -EAGAIN : chg_track_collect(&r->trk, r->path, rst.st_dev, &dirty, &n, &why);
	struct pathindex *nix = pathindex_copy(*ix);
	struct treecopy_opts o = { .prev_fd = -1,
				   .prev_ix = *ix,
				   .new_ix = nix,
				   .dirs = r->pre_dirs.n ? &r->pre_dirs : NULL,
				   .xattrs_keep_ctime = r->opts->kind == OVERLAY_GVISOR };
	if (q == 0) {
		o.suspects = r->trk.suspects;
		q = nix ? treecopy_update_dirs(up, dst, dirty, n, &o, stats, err)
			: err_set(err, ENOMEM, NULL, "second pass: out of memory");
	}
	pathindex_dirty_free(dirty, n);
	if (q == -EAGAIN) {
		log_info("create: the second pass of '%s' walks the upper: %s", r->path,
			 why ? why : "a changed file has other names, or a directory no event explains");
		pathindex_free(nix);
		nix = o.new_ix = pathindex_new();
		o.dirs = NULL;
		overlay_create_scan_suspects(r, &r->trk.suspects);
		o.suspects = r->trk.suspects;
		q = nix ? treecopy_update(up, dst, &o, stats, err) : err_set(err, ENOMEM, NULL, "out of memory");
	}
	if (q < 0) {
		pathindex_free(nix);
		return q;
	}
	log_info("create: second pass of '%s' compared %zu changed directories in %lld ms: %llu entries replaced, "
		 "%llu bytes written",
		 r->path, n, (long long)(mono_ms() - t0), (unsigned long long)stats->replaced,
		 (unsigned long long)stats->bytes_copied);
	pathindex_free(*ix);
	*ix = nix;
	return 0;
}

/* The first pass's directory l/.pre-<name>, empty, named in r->pre. */
static int overlay_create_pre_make(struct ovl_root *r, int l, ckpt_error *err)
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

/* The pass's totals to the progress bar: what it copied, known once done. */
static void overlay_create_delta_progress(struct progress *p, const struct treecopy_stats *stats)
{
	if (!p)
		return;
	atomic_fetch_add(&p->files_total, stats->files);
	atomic_fetch_add(&p->bytes_total, stats->bytes_copied);
	atomic_fetch_add(&p->files_done, stats->files);
	atomic_fetch_add(&p->bytes_done, stats->bytes_copied);
}

/* Create's first pass as a delta (overlay_delta.c), when units will be
 * frozen after it: l/.pre-<name> holds what changed since the last create.
 * -EAGAIN: a full one is needed. */
static int overlay_create_delta_first(struct ovl_root *r, int l, int up, struct progress *p, ckpt_error *err)
{
	int q = overlay_create_pre_make(r, l, err);
	if (q < 0)
		return q;
	r->pre_delta = true;
	_cleanup_close_ int dst = openat(l, r->pre, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct treecopy_stats stats = { 0 };
	q = dst < 0 ? err_set(err, errno, NULL, "open first pass: %m")
		    : overlay_delta_pass(r, l, up, dst, false, &stats, err);
	if (q < 0) {
		overlay_create_drop_pre(r, l); /* and the delta state with it */
		return q;
	}
	overlay_create_delta_progress(p, &stats);
	r->pre_bytes = stats.bytes_copied;
	chg_track_drain(&r->trk); /* its own writes, read now rather than frozen */
	return 0;
}

/* Create's first pass, before the freeze: the upper into l/.pre-<name>,
 * synced, itself linking what the last layer has. The frozen pass then links
 * from it every file unchanged since, and has little to copy or sync. */
static int overlay_create_precopy_root(struct ovl_root *r, bool units, struct progress *p, ckpt_error *err)
{
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int up = overlay_create_open_dir(r->rdir_fd, "u", r->upper);
	if (l < 0 || up < 0)
		return err_set(err, errno, NULL, "open layer store of '%s': %m", r->path);
	overlay_create_drop_pre(r, l);
	if (overlay_rebase(r, l) < 0)
		overlay_delta_reset(r); /* a full layer, as without it */
	if (overlay_delta_ready(r) && !units)
		return 0; /* nothing will be frozen: the capture makes the delta in one pass */
	if (overlay_delta_ready(r)) {
		int d = overlay_create_delta_first(r, l, up, p, err);
		if (d != -EAGAIN)
			return d;
	}
	overlay_delta_reset(r); /* a full layer: its frozen pass decides whether deltas follow */
	int q = overlay_create_pre_make(r, l, err);
	if (q < 0)
		return q;
	_cleanup_close_ int dst = openat(l, r->pre, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int prev = r->ix ? openat(l, r->ix_layer, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	_cleanup_(pathindex_freep) struct pathindex *ix = pathindex_new();
	uint64_t files = 0, bytes = 0; /* totals for a progress bar; a failed count only loses the bar */
	int m = p ? treecopy_measure(up, prev >= 0 ? r->ix : NULL, &files, &bytes) : -EAGAIN;
	if (m == 0) {
		atomic_fetch_add(&p->files_total, files);
		atomic_fetch_add(&p->bytes_total, bytes);
	}
	/* armed before the copy, so that what changes during it is seen */
	r->trk.skip_self = true; /* ckptd writes only into the layer store, never through the mount */
	int t = overlay_create_track_wanted(r, m == 0 ? files : UINT64_MAX) ? chg_track_arm(&r->trk, up) : 0;
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
				      .dirs = chg_track_armed(&r->trk) ? &r->pre_dirs : NULL,
				      .xattrs_keep_ctime = r->opts->kind == OVERLAY_GVISOR };
	struct treecopy_stats stats = { 0 }, again = { 0 };
	/* with tracking, the frozen pass's collect names the suspects */
	_cleanup_(pathindex_freep) struct pathindex *sus = NULL;
	if (!chg_track_armed(&r->trk))
		overlay_create_scan_suspects(r, &sus);
	opts.suspects = sus;
	int64_t t0 = mono_ms();
	q = dst < 0 || !ix ? err_set(err, ENOMEM, NULL, "first pass: out of memory")
			   : treecopy_copy(up, dst, &opts, &stats, err);
	/* synced so that the frozen pass's syncfs has only the changes, and so
	 * that a write through a mapping faults again and changes the file's
	 * ctime, which the next pass compares (syncfs reaches the upper too: the
	 * layer store is on its filesystem) */
	bool second = q == 0 && chg_track_armed(&r->trk) && mono_ms() - t0 >= OVL_CATCH_UP_MS;
	if (q == 0 && FAILPOINT_AROUND("overlay.precopy.syncfs", syncfs(dst)) < 0)
		q = err_set(err, errno, NULL, "sync first pass: %m");
	if (q == 0 && second && (q = overlay_create_catch_up(r, up, dst, &ix, &again, err)) == 0 && syncfs(dst) < 0)
		q = err_set(err, errno, NULL, "sync second pass: %m");
	/* without tracking, the frozen walk's suspects: the files mapped shared
	 * and writable now, after the sync (found here, not frozen) */
	if (q == 0 && !chg_track_armed(&r->trk))
		overlay_create_scan_suspects(r, &r->pre_sus);
	if (q == 0) /* the first pass's own events, read now rather than frozen */
		chg_track_drain(&r->trk);
	if (q < 0) {
		overlay_create_drop_pre(r, l);
		return q;
	}
	r->pre_ix = TAKE_PTR(ix);
	r->pre_bytes = stats.bytes_copied + again.bytes_copied;
	/* the tracked frozen pass starts from a copy of that index: made now,
	 * not frozen (about 0.4 ms per 1,000 files) */
	if (chg_track_armed(&r->trk))
		r->pre_ix_next = pathindex_copy(r->pre_ix);
	return 0;
}

/* Made whether or not a unit is frozen: the frozen pass then links every
 * file from it, so the first pass costs create nothing it would not copy. */
int overlay_precopy(void *st, bool frozen, struct progress *p, ckpt_error *err)
{
	struct ovl *o = st;
	for (size_t i = 0; i < o->n_roots; i++) {
		int q = overlay_create_precopy_root(&o->roots[i], frozen, p, err);
		if (q < 0)
			return q;
	}
	return 0;
}

/* The frozen pass: the first pass brought up to date. Only the directories
 * that changed since it began, when the tracker can tell which; else the
 * whole upper is compared. On success *ix is the upper's new index. */
static int overlay_create_frozen_pass(struct ovl_root *r, int up, int dst, struct treecopy_opts *opts,
				      struct pathindex **ix, struct treecopy_stats *stats, ckpt_error *err)
{
	struct pathindex_dirty *dirty = NULL;
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
		struct pathindex *tix = r->pre_ix_next ? TAKE_PTR(r->pre_ix_next) : pathindex_copy(r->pre_ix);
		struct treecopy_opts to = *opts;
		to.new_ix = tix;
		to.dirs = r->pre_dirs.n ? &r->pre_dirs : NULL;
		to.suspects = r->trk.suspects;
		q = tix ? treecopy_update_dirs(up, dst, dirty, n, &to, stats, err)
			: err_set(err, ENOMEM, NULL, "out of memory");
		if (q == 0 && r->track_check) /* reads only: the layer stays as tracked */
			q = overlay_check_layer(r, up, dst, err);
		if (q == 0) {
			log_info("create: frozen pass of '%s' compared %zu changed directories in %lld ms "
				 "(events and /proc %lld ms): %llu entries replaced, %llu of them files "
				 "refreshed in place, %llu bytes written",
				 r->path, n, (long long)(mono_ms() - t0), (long long)(t1 - t0),
				 (unsigned long long)stats->replaced, (unsigned long long)stats->refreshed,
				 (unsigned long long)stats->bytes_copied);
			pathindex_free(*ix);
			*ix = tix;
			r->cap_tracked = true; /* deltas can follow this layer */
		} else {
			pathindex_free(tix);
			why = "a changed file has other names, or a directory no event explains";
		}
	}
	pathindex_dirty_free(dirty, n);
	if (q != -EAGAIN)
		return q;
	if (chg_track_armed(&r->trk))
		log_info("create: the frozen pass of '%s' walks the upper: %s", r->path, why);
	/* the suspects: untracked, those the first pass found after its sync
	 * (and those it found before it are untrusted in its index); else what
	 * the tracker knows, and those mapped now */
	if (chg_track_armed(&r->trk))
		overlay_create_scan_suspects(r, &r->trk.suspects);
	opts->suspects = chg_track_armed(&r->trk) ? r->trk.suspects : r->pre_sus;
	return treecopy_update(up, dst, opts, stats, err);
}

/* Forget r's capture (its copy goes with the trash). */
static void overlay_create_drop_capture(struct ovl_root *r, int l)
{
	if (r->cap_tmp[0])
		overlay_layers_trash(r, l, "l", r->cap_tmp);
	if (r->cap_tmp[0] && (r->cap_delta || r->cap_tracked)) /* its collect's changes are in no layer */
		overlay_delta_reset(r);
	r->cap_delta = r->cap_tracked = false;
	r->cap_tmp[0] = 0;
	pathindex_free(TAKE_PTR(r->cap_ix));
	r->cap_size = 0;
}

/* A delta made in one pass, when no unit will be frozen: a first pass
 * would only shorten a freeze that does not happen. The /proc scan, and the
 * look at the directories' metadata when they are many, begin on threads;
 * the events queued are read and their directories made meanwhile. Then,
 * as the frozen pass after a first one, the directories the scan and the
 * events since name, and every directory's metadata. */
static int overlay_create_delta_one(struct ovl_root *r, int l, int up, int dst, struct treecopy_stats *stats,
				    ckpt_error *err)
{
	struct stat rst;
	overlay_delta_dir_look_start(up, &r->ddirs);
	/* the scan on a thread of its own too: the look's thread takes the CPU
	 * the first pass leaves, and the second part shares what is left of the
	 * look before it waits for the scan (at 100k files its collect took
	 * 0.5-1.5 ms, against 1.9-2.5 with the scan there: 2026-11-29) */
	if (stat(r->path, &rst) == 0) /* else the second part fails and says why */
		chg_track_scan_start(&r->trk, r->path, rst.st_dev);
	int q = overlay_delta_pass(r, l, up, dst, false, stats, err);
	return q < 0 ? q : overlay_delta_pass(r, l, up, dst, true, stats, err);
}

/* The frozen pass of a delta: the first pass (l/<pre>) becomes l/<tmp>,
 * brought up to date; with no first pass (none made when no unit is
 * frozen), l/<tmp> is made in one (overlay_create_delta_one). -EAGAIN (the
 * delta state then reset): copy in full. */
static int overlay_create_capture_delta(struct ovl_root *r, int l, int up, const char *name, const char *tmp,
					struct progress *p, ckpt_error *err)
{
	struct treecopy_stats stats = { 0 };
	bool one = !r->pre[0];
	int q = FAILPOINT_AROUND("overlay.create.delta.tmp", one ? mkdirat(l, tmp, 0700) : renameat(l, r->pre, l, tmp));
	q = q < 0 ? err_set(err, errno, NULL, "create layer: %m") : 0;
	if (q == 0) {
		r->pre[0] = 0; /* now tmp */
		r->pre_delta = false;
	}
	_cleanup_close_ int dst = q == 0 ? openat(l, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (q == 0 && dst < 0)
		q = err_set(err, errno, NULL, "open layer: %m");
	if (q == 0)
		q = one ? overlay_create_delta_one(r, l, up, dst, &stats, err)
			: overlay_delta_pass(r, l, up, dst, true, &stats, err);
	if (q == 0 && r->track_check)
		q = overlay_check_delta(r, tmp, err);
	if (q < 0) {
		rm_rf_at(l, tmp);
		overlay_create_drop_pre(r, l);
		overlay_delta_reset(r);
		return q;
	}
	if (one)
		overlay_create_delta_progress(p, &stats);
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
static int overlay_create_capture_layer(struct ovl_root *r, struct progress *p, ckpt_error *err)
{
	char name[OVL_NAME_LEN + 1], tmp[sizeof(r->cap_tmp)];
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int up = overlay_create_open_dir(r->rdir_fd, "u", r->upper);
	if (l < 0 || up < 0)
		return err_set(err, errno, NULL, "open layer store of '%s': %m", r->path);
	overlay_create_drop_capture(r, l);
	r->cap_tracked = r->cap_delta = false;
	int q = overlay_layers_new_name(l, name);
	if (q < 0)
		return err_set(err, -q, NULL, "name a layer: %s", strerror(-q));
	snprintf(tmp, sizeof(tmp), ".tmp-%s", name);
	bool one = !r->pre[0] && overlay_delta_ready(r); /* no first pass was made for this delta */
	if (one || (r->pre[0] && r->pre_delta)) {
		q = overlay_create_capture_delta(r, l, up, name, tmp, p, err);
		if (q != -EAGAIN)
			return q;
		/* a change a delta cannot say: the full copy, frozen (rare); with
		 * no first pass, one is made now, tracked, that deltas can follow */
		if (one && (q = overlay_create_precopy_root(r, false, p, err)) < 0)
			return q;
	}
	bool update = r->pre_ix != NULL; /* the first pass becomes the layer */
	if (update ? FAILPOINT_AROUND("overlay.create.full.rename", renameat(l, r->pre, l, tmp)) < 0
		   : mkdirat(l, tmp, 0700) < 0)
		return err_set(err, errno, NULL, "create layer: %m");
	if (update)
		r->pre[0] = 0; /* now tmp */
	_cleanup_close_ int dst = openat(l, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	const char *from = r->ix && !update ? r->ix_layer : NULL;
	_cleanup_close_ int prev = from ? openat(l, from, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	_cleanup_(pathindex_freep) struct pathindex *ix = pathindex_new();
	struct treecopy_opts opts = {
		.mode = TREECOPY_NEW,
		.prev_fd = prev,
		.prev_ix = update ? r->pre_ix : r->ix,
		.new_ix = ix,
		.progress = update ? NULL : p, /* the bar follows the first pass, which has the totals */
		.xattrs_keep_ctime = r->opts->kind == OVERLAY_GVISOR,
	};
	struct treecopy_stats stats = { 0 };
	uint64_t pre_bytes = r->pre_bytes;
	_cleanup_(pathindex_freep) struct pathindex *sus = NULL;
	if (!update) { /* a copy with no first pass: its suspects (change_track.h) */
		overlay_create_scan_suspects(r, &sus);
		opts.suspects = sus;
	}
	if (dst < 0 || !ix)
		q = err_set(err, ENOMEM, NULL, "create layer: out of memory");
	else
		q = update ? overlay_create_frozen_pass(r, up, dst, &opts, &ix, &stats, err)
			   : treecopy_copy(up, dst, &opts, &stats, err);
	if (r->pre[0])
		overlay_layers_trash(r, l, "l", r->pre);
	r->pre[0] = 0; /* the rest of the first pass goes after the thaw (overlay_create_forget_pre) */
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

/* A create that leaves the syncfs of its new layers to its caller
 * (overlay_create_defer): those whose layer store lies on file system dev,
 * which the caller syncs before anything durable names them. deferred says
 * one was left so. dev 0: each layer is synced as it is published. */
struct ovl_defer {
	dev_t dev;
	bool deferred;
};

/* Whether layer store l lies on the file system the caller syncs. rec/, the
 * chain's and the index's files are in the same state dir, so they do too,
 * and that syncfs covers them as the layer's own would. */
static bool overlay_create_defers(int l, const struct ovl_defer *d)
{
	struct stat st;
	return d->dev != 0 && fstat(l, &st) == 0 && st.st_dev == d->dev;
}

/* Make r's capture the layer r->cap_name, durable unless defer takes its
 * sync; on success ix (the upper's new index; NULL for a delta) is handed
 * to the caller, and what kind it was: a delta, or a full layer deltas can
 * follow. */
static int overlay_create_publish_capture(struct ovl_root *r, char name[OVL_NAME_LEN + 1], struct pathindex **ret_ix,
					  uint64_t *size, bool *ret_delta, bool *ret_tracked, struct ovl_defer *defer,
					  ckpt_error *err)
{
	*ret_delta = r->cap_delta;
	*ret_tracked = r->cap_tracked;
	overlay_create_forget_pre(r);
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (l < 0)
		return err_set(err, errno, NULL, "open layer store of '%s': %m", r->path);
	_cleanup_close_ int dst = openat(l, r->cap_tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = dst < 0 ? err_set(err, errno, NULL, "open layer: %m") : 0;
	bool leave = q == 0 && overlay_create_defers(l, defer);
	q = overlay_layer_publish_new(r, l, dst, r->cap_tmp, r->cap_name, !leave, q, err); /* removes it on failure */
	defer->deferred |= q == 0 && leave;
	r->cap_tmp[0] = 0;
	if (q < 0) {
		overlay_create_drop_capture(r, l);
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
static void overlay_create_delta_after(struct ovl_root *r, const char *name, bool delta, bool tracked)
{
	if (delta) {
		if (overlay_chain_push_top(&r->stack, name) < 0)
			overlay_delta_reset(r); /* out of memory: the next create is full */
		return;
	}
	bool keep = tracked && chg_track_armed(&r->trk);
	r->stack.n = 0;
	pathindex_free(TAKE_PTR(r->dix));
	overlay_delta_dirs_free(&r->ddirs);
	char rel[32];
	snprintf(rel, sizeof(rel), "l/%s", name);
	_cleanup_close_ int fd = keep ? openat(r->rdir_fd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	bool ok = fd >= 0 && (r->dix = pathindex_new()) && overlay_delta_dirs_read(fd, &r->ddirs) == 0 &&
		overlay_chain_push(&r->stack, name) == 0;
	if (!ok)
		overlay_delta_reset(r);
}

static void overlay_create_discard_layers(struct ovl *o, char (*names)[OVL_NAME_LEN + 1], size_t n)
{
	for (size_t i = 0; i < n; i++) {
		_cleanup_close_ int l = openat(o->roots[i].rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (l >= 0)
			rm_rf_at(l, names[i]);
	}
}

static void overlay_create_drop_captures(struct ovl *o)
{
	for (size_t i = 0; i < o->n_roots; i++) {
		_cleanup_close_ int l = openat(o->roots[i].rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (l >= 0)
			overlay_create_drop_capture(&o->roots[i], l);
		overlay_create_forget_pre(&o->roots[i]);
	}
}

/* The frozen part of create: every root's copy, kept for create. */
int overlay_capture(void *st, struct progress *p, ckpt_error *err)
{
	struct ovl *o = st;
	int q = 0;
	for (size_t i = 0; q == 0 && i < o->n_roots; i++)
		q = overlay_create_capture_layer(&o->roots[i], p, err);
	if (q < 0) {
		overlay_create_drop_captures(o);
		return q;
	}
	return 0;
}

/* The chains of a create that published layers names[i]: each over the
 * layers the previous creates made from the upper when a delta, over the
 * live chain. */
static int overlay_create_chains(struct ovl *o, char (*names)[OVL_NAME_LEN + 1], const bool *delta,
				 struct ovl_chains *out)
{
	int q = 0;
	for (size_t i = 0; q == 0 && i < o->n_roots; i++) {
		struct ovl_chain c = { 0 };
		q = overlay_chain_push(&c, names[i]);
		if (q == 0 && delta[i])
			q = overlay_chain_extend(&c, &o->roots[i].stack);
		if (q == 0)
			q = overlay_chain_extend(&c, &o->roots[i].chain);
		if (q == 0)
			q = overlay_chains_set(out, o->roots[i].h, &c);
		overlay_chain_free(&c);
	}
	return q;
}

/* Capture (unless overlay_capture just did, frozen), then publish the layers,
 * the chain and the upper's index. */
static int overlay_create_run(void *st, const char *id, struct ovl_defer *defer, json_t **ret_data, uint64_t *ret_size,
			      struct progress *p, ckpt_error *err)
{
	struct ovl *o = st;
	char(*names)[OVL_NAME_LEN + 1] = calloc(o->n_roots + 1, sizeof(*names));
	struct pathindex **ixs = calloc(o->n_roots + 1, sizeof(*ixs));
	bool *delta = calloc(o->n_roots + 1, sizeof(bool)), *tracked = calloc(o->n_roots + 1, sizeof(bool));
	_cleanup_(overlay_chains_free) struct ovl_chains chains = { 0 };
	json_auto_t *data = NULL;
	uint64_t size = 0;
	int q = names && ixs && delta && tracked ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
	size_t done = 0;

	/* No syncfs of the roots: the copy reads the page cache, and syncing a
	 * shared filesystem costs more than the copy; syncfs(layer) makes it durable. */
	for (size_t i = 0; q == 0 && i < o->n_roots; i++)
		if (!o->roots[i].cap_tmp[0])
			q = overlay_create_capture_layer(&o->roots[i], p, err);
	for (; q == 0 && done < o->n_roots; done++)
		q = overlay_create_publish_capture(&o->roots[done], names[done], &ixs[done], &size, &delta[done],
						   &tracked[done], defer, err);
	if (q == 0 &&
	    ((q = overlay_create_chains(o, names, delta, &chains)) < 0 || !(data = overlay_json_data(o, &chains))))
		q = err_set(err, ENOMEM, NULL, "out of memory");
	if (q == 0 &&
	    (q = FAILPOINT_AROUND("overlay.create.chain.write", overlay_layers_chain_save(o, id, &chains, true))) < 0)
		err_set(err, -q, NULL, "record layer chain: %s", strerror(-q));
	if (q < 0)
		overlay_create_discard_layers(o, names, done);
	for (size_t i = 0; i < o->n_roots && ixs && delta; i++) {
		struct ovl_root *r = &o->roots[i];
		if (q < 0)
			overlay_delta_reset(r); /* the changes collected are in no checkpoint */
		if (q == 0)
			overlay_create_delta_after(r, names[i], delta[i], tracked[i]);
		if (q == 0 && !delta[i]) { /* a delta leaves the index of the full layer below it */
			char tag[2 * OVL_NAME_LEN + 2];
			snprintf(tag, sizeof(tag), "%s:%s", r->upper, names[i]);
			if (!o->index_unsaved) /* else a crash would leave it trusted */
				FAILPOINT_AROUND("overlay.create.index.write",
						 pathindex_save(ixs[i], tag, r->rdir_fd, "idx/index"));
			pathindex_free(r->ix);
			r->ix = TAKE_PTR(ixs[i]);
			snprintf(r->ix_layer, sizeof(r->ix_layer), "%s", names[i]);
		}
		pathindex_free(ixs[i]);
	}
	overlay_create_drop_captures(o); /* what a failure left (the trackers deltas need stay) */
	free(names);
	free(ixs);
	free(delta);
	free(tracked);
	if (q < 0)
		return q;
	*ret_size = size;
	*ret_data = TAKE_PTR(data);
	return 0;
}

int overlay_create(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p, ckpt_error *err)
{
	struct ovl_defer none = { 0 };
	return overlay_create_run(st, id, &none, ret_data, ret_size, p, err);
}

/* overlay_create leaving the syncfs of the layer stores on file system dev
 * to the caller. The chain and the index are written before that syncfs,
 * which then covers them too; neither needs it (a chain file lost falls
 * back to the record's data, an index to a full copy). */
int overlay_create_defer(void *st, const char *id, dev_t dev, json_t **ret_data, uint64_t *ret_size, struct progress *p,
			 bool *ret_deferred, ckpt_error *err)
{
	struct ovl_defer defer = { .dev = dev };
	int q = overlay_create_run(st, id, &defer, ret_data, ret_size, p, err);
	*ret_deferred = q == 0 && defer.deferred;
	return q;
}
