/* tar_track.c: change tracking for the tar backend: arming one tracker per
 * root, collecting what changed since the last create or restore, and the
 * files a walk must read anyway (mapped for writing, linked elsewhere). */
#include "backend/tar/tar_internal.h"

/* Arm root i's tracker (again): a plain directory, ckptd's own writes. */
static int trk_arm_one(struct tar_state *s, size_t i)
{
	_cleanup_close_ int fd = open(s->roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int r = fd < 0 ? -errno : chg_track_arm(&s->trk[i], fd);
	if (r >= 0) {
		s->trk[i].plain_dir = true;
		s->trk[i].own_pid = getpid();
	}
	return r;
}

/* Change tracking: CKPTD_TRACK_CHANGES=0 turns it off (as on overlay). */
void tar_track_arm(struct tar_state *s)
{
	const char *v = getenv("CKPTD_TRACK_CHANGES");
	if ((v && !strcmp(v, "0")) || !(s->trk = calloc(s->n_roots, sizeof(*s->trk))))
		return;
	for (size_t i = 0; i < s->n_roots; i++) {
		s->trk[i] = (struct chg_track)CHG_TRACK_INIT;
		int r = trk_arm_one(s, i);
		if (r < 0) {
			log_info("tar: no change tracking for '%s' (%s): creates read the whole tree", s->roots[i],
				 strerror(-r));
			for (size_t k = 0; k <= i; k++)
				chg_track_disarm(&s->trk[k]);
			free(s->trk);
			s->trk = NULL;
			return;
		}
	}
}

void tar_track_free(struct tar_state *s)
{
	for (size_t i = 0; s->trk && i < s->n_roots; i++)
		chg_track_disarm(&s->trk[i]);
	free(s->trk);
	s->trk = NULL;
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
		int r = stat(s->roots[i], &rst) < 0
			? -EAGAIN
			: chg_track_collect(&s->trk[i], s->roots[i], rst.st_dev, &d, &n, &why);
		if (r < 0) {
			log_debug("tar: change tracking of '%s' cannot tell what changed (%s): this create reads "
				  "the whole tree",
				  s->roots[i], why);
			if (trk_arm_one(s, i) < 0) {
				tar_track_free(s);
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
			sus[i] = r < 0               ? NULL
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
	for (size_t i = 0; s->trk && i < s->n_roots; i++)
		chg_track_drain(&s->trk[i]);
	pthread_mutex_unlock(&s->trk_lock);
}

/* name's capture or restore began at the last collect: it is the one the
 * events since count for, if that collect saw everything. */
void tar_track_mark(struct tar_state *s, const char *name)
{
	snprintf(s->trk_for, sizeof(s->trk_for), "%s", s->trk && s->trk_collected ? name : "");
	s->trk_collected = false;
}

/* A file the checkpoint holds that is mapped for writing, or got another
 * name, outside the root (a chroot, a mount namespace, a hard link): its
 * writes make no event in the root, so only the walk can see them. */
bool tar_track_changed_elsewhere(const struct chg_track *t, const struct tar_manifest *pm)
{
	const struct tar_mentry *e = tar_manifest_holds_ino(pm, t->outside_inos, t->n_outside_inos);
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
	for (size_t i = 0; i < s->n_roots; i++) {
		struct stat rst;
		const char *why = "cannot stat the root";
		if (sus[i])
			continue;
		if (stat(s->roots[i], &rst) < 0 || chg_scan_mapped(s->roots[i], rst.st_dev, true, &sus[i], &why) < 0)
			log_warn("tar: cannot tell which files of '%s' are mapped shared and writable (%s): a "
				 "write through such a mapping may be missed",
				 s->roots[i], why);
	}
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
