/* overlay_delta_pass.c: one pass of a delta layer (overlay_delta.c) into
 * its directory: the previous layers opened, the tracker's collect (and,
 * frozen, the /proc scan and the look at every directory's metadata), the
 * directories named made what the upper has, and what each part took, in
 * the log. overlay_create.c runs it once or twice a create. */
#include "backend/overlay/overlay_internal.h"

#include <sys/stat.h>

/* The previous layers of a delta (r->stack) opened in l; their number, or
 * -EAGAIN when one cannot be. */
static int dp_prev(struct ovl_root *r, int l, int fds[OVL_DELTA_MAX + 1])
{
	size_t n = r->stack.n;
	for (size_t j = 0; j < n; j++) {
		fds[j] = openat(l, r->stack.v[j], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fds[j] < 0) {
			while (j--)
				close(fds[j]);
			return -EAGAIN;
		}
	}
	return (int)n;
}

static void dp_prev_close(int *fds, int n)
{
	for (int j = 0; j < n; j++)
		close(fds[j]);
}

/* The frozen pass's collect, and the look at every directory's metadata
 * (overlay_delta_dir_look: a stat of each of the upper's, 1,001 at 100k
 * files). Both only read, and each takes 1-2 ms. When no unit is frozen
 * both began with the first pass, on threads (overlay_create_delta_one):
 * this side looks at what the look's thread has not reached, then waits
 * for the scan; else the scan runs on a thread while the look runs here.
 * The events are read after the scan. */
static int dp_collect(struct ovl_root *r, int up, dev_t dev, struct pathindex_dirty **dirty, size_t *n,
		      const char **why, int64_t *look_us)
{
	int64_t t0;
	bool scanning = r->trk.scan != NULL; /* begun with a create made in one pass */
	if (r->ddirs.look && scanning) {     /* the look's rest here, while the scan ends */
		t0 = mono_us();
		overlay_delta_dir_look(up, &r->ddirs);
		*look_us = mono_us() - t0;
		return chg_track_collect_scanned(&r->trk, dirty, n, why);
	}
	if (r->ddirs.look) {
		int q = chg_track_collect(&r->trk, r->path, dev, dirty, n, why);
		t0 = mono_us();
		overlay_delta_dir_look(up, &r->ddirs);
		*look_us = mono_us() - t0;
		return q;
	}
	if (!scanning && chg_track_scan_start(&r->trk, r->path, dev) < 0)
		return chg_track_collect(&r->trk, r->path, dev, dirty, n, why);
	t0 = mono_us();
	overlay_delta_dir_look(up, &r->ddirs);
	*look_us = mono_us() - t0;
	return chg_track_collect_scanned(&r->trk, dirty, n, why);
}

int overlay_delta_pass(struct ovl_root *r, int l, int up, int dst, bool frozen, struct treecopy_stats *stats,
		       ckpt_error *err)
{
	struct pathindex_dirty *dirty = NULL;
	size_t n = 0;
	const char *why = "cannot stat the root";
	struct stat rst;
	int pfd[OVL_DELTA_MAX + 1];
	int64_t t0 = mono_us(), look_us = 0;
	r->trk.scan_us = 0;
	int np = dp_prev(r, l, pfd);
	/* the first pass reads the events only: the frozen one's /proc scan
	 * names the files in use and mapped, and those are copied then */
	int q = np < 0                    ? (why = "a previous layer is gone", -EAGAIN)
		: !frozen                 ? chg_track_collect_events(&r->trk, &dirty, &n, &why)
		: stat(r->path, &rst) < 0 ? -EAGAIN
					  : dp_collect(r, up, rst.st_dev, &dirty, &n, &why, &look_us);
	if (q == 0 && !frozen && r->rebase) /* the deltas folded into this one */
		q = overlay_rebase_merge(r, &dirty, &n) < 0 ? (why = "out of memory", -EAGAIN) : 0;
	struct ovl_delta_opts o = { .up = up,
				    .prev = pfd,
				    .n_prev = np > 0 ? (size_t)np : 0,
				    .ix = r->ix,
				    .dix = r->dix,
				    .suspects = r->trk.suspects,
				    .dirs = &r->ddirs,
				    .xattrs_keep_ctime = r->opts->kind == OVERLAY_GVISOR,
				    .early_writeback = r->opts->kind != OVERLAY_GVISOR };
	int64_t t1 = mono_us();
	if (q == 0) {
		why = "a directory moved or made over another entry, or a changed file of several names";
		q = overlay_delta_dirs(&o, dst, dirty, n, stats, err);
	}
	int64_t t2 = mono_us();
	if (q == 0 && frozen)
		q = overlay_delta_dir_meta(&o, dst, &r->ddirs, stats, err);
	pathindex_dirty_free(dirty, n);
	dp_prev_close(pfd, np);
	int64_t t3 = mono_us();
	if (q == -EAGAIN)
		log_info("create: '%s' gets a full layer, not a delta: %s", r->path, why);
	else if (q == 0 && frozen && r->ddirs.look_apart)
		log_info("create: frozen delta pass of '%s' compared %zu changed directories in %.2f ms (collect %.2f "
			 "ms: /proc %.2f ms, then %.2f ms ending a look at %zu directories' metadata begun with "
			 "the first pass, %.2f ms on its thread; directories %.2f ms; their metadata and times %.2f "
			 "ms): %llu entries written, %llu bytes",
			 r->path, n, (t3 - t0) / 1e3, (t1 - t0) / 1e3, r->trk.scan_us / 1e3, look_us / 1e3, r->ddirs.n,
			 r->ddirs.look_us / 1e3, (t2 - t1) / 1e3, (t3 - t2) / 1e3, (unsigned long long)stats->replaced,
			 (unsigned long long)stats->bytes_copied);
	else if (q == 0 && frozen)
		log_info("create: frozen delta pass of '%s' compared %zu changed directories in %.2f ms (collect %.2f "
			 "ms: /proc %.2f ms on a thread, beside a look at %zu directories' metadata %.2f ms; "
			 "directories %.2f ms; their metadata and times %.2f ms): %llu entries written, %llu bytes",
			 r->path, n, (t3 - t0) / 1e3, (t1 - t0) / 1e3, r->trk.scan_us / 1e3, r->ddirs.n, look_us / 1e3,
			 (t2 - t1) / 1e3, (t3 - t2) / 1e3, (unsigned long long)stats->replaced,
			 (unsigned long long)stats->bytes_copied);
	else if (q == 0)
		log_info("create: first delta pass of '%s' compared %zu changed directories in %.2f ms (events %.2f "
			 "ms, directories %.2f ms): %llu entries written, %llu bytes",
			 r->path, n, (t3 - t0) / 1e3, (t1 - t0) / 1e3, (t2 - t1) / 1e3,
			 (unsigned long long)stats->replaced, (unsigned long long)stats->bytes_copied);
	return q;
}
