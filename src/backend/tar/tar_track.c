/* tar_track.c: change tracking for the tar backend: arming one tracker per
 * root, collecting what changed since the last create or restore, and the
 * files a walk must read anyway (mapped for writing, linked elsewhere). */
#include "backend/tar/tar_internal.h"

/* Health's copy of root i's tracking, after an arm. */
static void trk_note(struct tar_state *s, size_t i)
{
	if (!s->tinfo)
		return;
	pthread_mutex_lock(&s->lock);
	s->tinfo[i].method = chg_track_armed(&s->trk[i]) ? s->trk[i].method : CHG_TRACK_NONE;
	snprintf(s->tinfo[i].reason, sizeof(s->tinfo[i].reason), "%s", s->trk[i].reason);
	pthread_mutex_unlock(&s->lock);
}

/* A create or restore of root i read only what changed (tracked) or all. */
void tar_track_count(struct tar_state *s, size_t i, bool tracked)
{
	if (!s->tinfo)
		return;
	pthread_mutex_lock(&s->lock);
	if (tracked)
		s->tinfo[i].tracked++;
	else
		s->tinfo[i].walked++;
	pthread_mutex_unlock(&s->lock);
}

/* What root i's filesystem changes without a new ctime (tar_probe.c), and
 * what that leaves a create or restore unable to see: a file mapped,
 * written and unmapped while ckptd is not running, or without tracking
 * between two operations (no close event, no /proc entry, no new ctime). */
static void trk_blind(const struct tar_ctime_probe *b, bool tracking, struct backend_root_health *h)
{
	if (b->xattrs_blind)
		h->ctime_blind[h->n_ctime_blind++] = "xattrs";
	if (b->mapped_blind) {
		h->ctime_blind[h->n_ctime_blind++] = "mapped_writes";
		h->not_guaranteed[h->n_not_guaranteed++] =
			"a write through a shared mapping while ckptd is not running";
	}
	if (b->mapped_blind && !tracking)
		h->not_guaranteed[h->n_not_guaranteed++] =
			"a write through a shared mapping that is mapped and unmapped "
			"between two creates or restores";
}

/* Called with s->lock held. */
void tar_track_health(struct tar_state *s, struct backend_health *out)
{
	for (size_t i = 0; s->tinfo && i < s->n_roots && i < MAX_ROOTS; i++) {
		struct backend_root_health *h = &out->roots[out->n_roots++];
		h->tracking = chg_track_method_name(s->tinfo[i].method);
		snprintf(h->tracking_reason, sizeof(h->tracking_reason), "%s", s->tinfo[i].reason);
		h->detailed = true;
		h->tracked = s->tinfo[i].tracked;
		h->walked = s->tinfo[i].walked;
		trk_blind(&s->blind[i], s->tinfo[i].method != CHG_TRACK_NONE, h);
	}
}

/* Arm root i's tracker (again): a plain directory, ckptd's own writes. */
static int trk_arm_one(struct tar_state *s, size_t i)
{
	_cleanup_close_ int fd = open(s->roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	s->trk[i].plain_dir = true;
	s->trk[i].own_pid = getpid();
	s->trk[i].skip_dev = s->state_dev;
	s->trk[i].skip_ino = s->state_ino;
	s->trk[i].excl = &s->trk_excl;
	/* root /: inotify would watch every file of the system, which gVisor
	 * cannot hold (EMFILE for every process): fanotify or nothing */
	s->trk[i].fanotify_only = s->ctx->whole_root;
	int r = fd < 0 ? -errno : chg_track_arm(&s->trk[i], fd);
	trk_note(s, i);
	return r;
}

void tar_track_free(struct tar_state *s)
{
	for (size_t i = 0; s->trk && i < s->n_roots; i++)
		chg_track_disarm(&s->trk[i]);
	free(s->trk);
	s->trk = NULL;
}

/* Tracking stops for every root, as root failed could not be armed: a
 * create trusts the events only when every root has them. */
static void trk_stop(struct tar_state *s, size_t failed)
{
	tar_track_free(s);
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->n_roots; i++)
		if (i != failed && s->tinfo[i].method != CHG_TRACK_NONE) {
			s->tinfo[i].method = CHG_TRACK_NONE;
			snprintf(s->tinfo[i].reason, sizeof(s->tinfo[i].reason), "stopped: '%.100s' cannot be tracked",
				 s->roots[failed]);
		}
	pthread_mutex_unlock(&s->lock);
}

/* Change tracking: on unless track_changes is "never" (a tar root has no
 * size threshold: a create without it reads every directory). */
void tar_track_arm(struct tar_state *s)
{
	bool off = s->ctx->track_changes == TRACK_NEVER;
	if (!(s->tinfo = calloc(s->n_roots, sizeof(*s->tinfo))))
		return;
	for (size_t i = 0; i < s->n_roots; i++)
		snprintf(s->tinfo[i].reason, sizeof(s->tinfo[i].reason), "%s",
			 off ? "turned off (track_changes \"never\")" : "out of memory");
	if (off || !(s->trk = calloc(s->n_roots, sizeof(*s->trk))))
		return;
	/* inotify watches what a walk reads: never /proc and the like (root /) */
	ckpt_error xerr = { 0 };
	if (tar_excl_build(s, &s->trk_excl, &xerr) < 0)
		log_warn("tar: %s", xerr.msg);
	for (size_t i = 0; i < s->n_roots; i++) {
		s->trk[i] = (struct chg_track)CHG_TRACK_INIT;
		int r = trk_arm_one(s, i);
		if (r >= 0)
			log_info("tar: change tracking of '%s': %s (%s)", s->roots[i],
				 chg_track_method_name(s->trk[i].method), s->trk[i].reason);
		if (r < 0) {
			log_info("tar: no change tracking for '%s' (%s): creates read the whole tree", s->roots[i],
				 s->trk[i].reason[0] ? s->trk[i].reason : strerror(-r));
			trk_stop(s, i);
			return;
		}
	}
}

/* Add the files of root i a process maps shared and writable now to *sus
 * (made when NULL), and keep them as the ones mapped at this operation. A
 * scan that fails is logged. */
static void trk_scan_one(struct tar_state *s, size_t i, struct pathindex **sus)
{
	struct stat rst;
	const char *why = "cannot stat the root";
	_cleanup_(pathindex_freep) struct pathindex *now = NULL;
	if (stat(s->roots[i], &rst) < 0 || chg_scan_mapped(s->roots[i], rst.st_dev, true, &now, &why) < 0 ||
	    pathindex_merge(sus, now) < 0)
		log_warn("tar: cannot tell which files of '%s' are mapped shared and writable (%s): a write through "
			 "such a mapping may be missed",
			 s->roots[i], why);
	pathindex_free(s->mapped_now[i]);
	s->mapped_now[i] = TAKE_PTR(now);
}

/* What changed in each root since the last collect, into dirty[i] (when
 * dirty is not NULL; else dropped); from now on the trackers count for the
 * checkpoint tar_track_mark names. 0 when every root could tell; a tracker that
 * could not is armed again, so that it can from now on (the walk that
 * follows covers what it lost). */
static int trk_collect_locked(struct tar_state *s, struct pathindex_dirty **dirty, size_t *n_dirty,
			      struct pathindex **sus)
{
	int ret = s->trk ? 0 : -EAGAIN;
	s->trk_for[0] = '\0';
	for (size_t i = 0; s->trk && i < s->n_roots; i++) {
		struct pathindex_dirty *d = NULL;
		size_t n = 0;
		const char *why = "cannot stat the root";
		struct stat rst;
		s->trk[i].mapped_last = s->mapped_last[i];
		int r = stat(s->roots[i], &rst) < 0
			? -EAGAIN
			: chg_track_collect(&s->trk[i], s->roots[i], rst.st_dev, &d, &n, &why);
		s->trk[i].mapped_last = NULL;
		pathindex_free(s->mapped_now[i]); /* this collect's scan's, or trk_scan_one's below */
		s->mapped_now[i] = r >= 0 ? TAKE_PTR(s->trk[i].mapped) : NULL;
		if (r < 0 && s->trk[i].fallbacks && !s->trk[i].fallback_logged) {
			s->trk[i].fallback_logged = true; /* once per root; /metrics counts them all */
			log_info("tar: %s change tracking of '%s' lost track (%s): this create or restore reads the "
				 "whole tree (logged once)",
				 chg_track_method_name(s->trk[i].method), s->roots[i], why);
		}
		/* the files closed after a write that it did read stay suspects:
		 * the walk trusts every other file's ctime */
		_cleanup_(pathindex_freep) struct pathindex *kept = r < 0 ? TAKE_PTR(s->trk[i].suspects) : NULL;
		if (r < 0) {
			log_debug("tar: change tracking of '%s' cannot tell what changed (%s): this create reads "
				  "the whole tree",
				  s->roots[i], why);
			if (trk_arm_one(s, i) < 0) {
				log_info("tar: no change tracking for '%s' from now on (%s): creates read the whole "
					 "tree",
					 s->roots[i], s->trk[i].reason);
				trk_stop(s, i);
				if (sus) {
					pathindex_free(sus[i]);
					trk_scan_one(s, i, &kept);
					sus[i] = TAKE_PTR(kept);
				}
				return -EAGAIN;
			}
			ret = -EAGAIN;
		}
		if (r >= 0 && dirty) {
			dirty[i] = d;
			n_dirty[i] = n;
		} else {
			pathindex_dirty_free(d, n);
		}
		if (sus) {
			pathindex_free(sus[i]);
			/* an empty set when the collect found none: known, not scanned again */
			sus[i] = r < 0               ? (trk_scan_one(s, i, &kept), TAKE_PTR(kept))
				: s->trk[i].suspects ? TAKE_PTR(s->trk[i].suspects)
						     : pathindex_new();
		}
	}
	s->trk_collected = s->trk != NULL; /* each root read or armed again: from now on */
	return ret;
}

int tar_track_collect(struct tar_state *s, struct pathindex_dirty **dirty, size_t *n_dirty, struct pathindex **sus)
{
	pthread_mutex_lock(&s->trk_lock);
	int r = trk_collect_locked(s, dirty, n_dirty, sus);
	pthread_mutex_unlock(&s->trk_lock);
	return r;
}

/* The sweeper reads the events now and then: a tracker armed between
 * creates would otherwise queue, in the kernel, every change of the
 * filesystem (a tar root shares it with everything else). */
void tar_track_drain(struct tar_state *s)
{
	pthread_mutex_lock(&s->trk_lock);
	for (size_t i = 0; s->trk && i < s->n_roots; i++) {
		chg_track_drain(&s->trk[i]);
		const char *why = chg_track_lost(&s->trk[i]);
		if (why && !s->trk[i].lost_logged)
			log_debug("tar: change tracking of '%s' cannot tell what changed (%s): the next create or "
				  "restore reads the whole tree, and the files closed after a write since",
				  s->roots[i], why);
		s->trk[i].lost_logged = why != NULL;
	}
	pthread_mutex_unlock(&s->trk_lock);
}

/* The events of a restore's own writes, read now (change_track.h). */
void tar_track_drain_own(struct tar_state *s)
{
	pthread_mutex_lock(&s->trk_lock);
	for (size_t i = 0; s->trk && i < s->n_roots; i++)
		chg_track_drain_own(&s->trk[i]);
	pthread_mutex_unlock(&s->trk_lock);
}

/* The operation ended: what it found mapped is what the next one reads
 * again; after a failure, what the last one found too. */
static void tar_track_mapped_done(struct tar_state *s, bool ok)
{
	for (size_t i = 0; i < s->n_roots; i++) {
		if (!ok && pathindex_merge(&s->mapped_now[i], s->mapped_last[i]) < 0)
			continue; /* out of memory: the older set stays */
		pathindex_free(s->mapped_last[i]);
		s->mapped_last[i] = TAKE_PTR(s->mapped_now[i]);
	}
}

/* name's capture or restore began at the last collect: it is the one the
 * events since count for, if that collect saw everything. */
void tar_track_mark(struct tar_state *s, const char *name)
{
	snprintf(s->trk_for, sizeof(s->trk_for), "%s", s->trk && s->trk_collected ? name : "");
	s->trk_collected = false;
	tar_track_mapped_done(s, name[0] != '\0');
}

/* A file the checkpoint holds that is mapped for writing, or got another
 * name, outside the root (a chroot, a mount namespace, a hard link): its
 * writes make no event in the root, so only the walk can see them. */
bool tar_track_changed_elsewhere(const struct chg_track *t, int root_fd, const struct tar_manifest *pm)
{
	const struct tar_mentry *e = tar_manifest_holds_ino(pm, root_fd, t->outside_inos, t->n_outside_inos);
	if (e)
		log_debug("tar: '%s' is mapped for writing or linked under a path outside the root: the whole tree "
			  "is read",
			  e->path);
	return e != NULL;
}

/* Files a process maps shared and writable now, for each root change
 * tracking named none for (not tracking, or it could not tell): a write
 * through such a mapping may leave no new ctime, so they are archived and
 * rewritten, never trusted. A scan that fails is logged. */
void tar_track_scan_suspects(struct tar_state *s, struct pathindex **sus)
{
	for (size_t i = 0; i < s->n_roots; i++)
		if (!sus[i])
			trk_scan_one(s, i, &sus[i]);
}

/* The files mapped shared at the last operation stay suspects of this one
 * in every root (the trackers named them already); a capture gives them,
 * and those mapped now, a new ctime (tar_create_opts.mapped_now/_last).
 * Called once the suspects are known. */
int tar_track_mapped_join(struct tar_state *s, struct pathindex **sus)
{
	for (size_t i = 0; i < s->n_roots; i++)
		if (pathindex_merge(&sus[i], s->mapped_last[i]) < 0)
			return -ENOMEM;
	return 0;
}

void tar_track_journal_free(struct journal_bufs *j)
{
	for (size_t i = 0; i < j->n; i++) {
		pathindex_dirty_free(j->dirty[i], j->n_dirty[i]);
		pathindex_free(j->sus[i]);
		if (j->pms)
			tar_manifest_free(&j->pms[i]);
	}
}
