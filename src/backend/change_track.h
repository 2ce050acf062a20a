/* change_track.h: what changed in a tree since a moment, without walking
 * it: an overlay upper, so the create's frozen pass revisits only the
 * directories that changed since its first pass began (see
 * docs/overlay-create.md), or a tar root, so a create reads only the
 * directories that changed since its parent (plain_dir below).
 *
 * fanotify reports each create, delete, move, write, attribute change and
 * last close of a written file by directory and name: marked on each
 * directory of an overlay upper (a mark on the overlay mount is refused, and
 * one on its filesystem hears ckptd's own layer store too), on the whole
 * filesystem of a tar root (whose files may have names outside it);
 * the writes it cannot see, through a shared mapping, belong to a file that
 * is still mapped or open when the pass runs (found in /proc) or whose last
 * close it reported. When anything is not sure, collect answers -EAGAIN and
 * the caller walks the whole upper as before. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "backend/pathindex.h"
#include "backend/rootexcl.h"

struct chg_track_seen;
struct chg_inotify;
struct chg_scan;

/* How a tree is tracked: chosen at its first arm, kept with the reason. */
enum chg_track_method {
	CHG_TRACK_NONE,
	CHG_TRACK_FANOTIFY,
	CHG_TRACK_INOTIFY,
};

struct chg_track {
	int fan;                 /* fanotify group, -1 when not armed */
	struct chg_inotify *ino; /* or the inotify watches (change_track_inotify.c) */
	int upper;               /* the upper dir, for open_by_handle_at */
	char *path;              /* the upper as /proc/self/fd reads it */
	size_t len;
	struct chg_track_seen *seen; /* what the events read so far say */
	/* the last collect's suspects (treecopy_opts.suspects), or NULL */
	struct pathindex *suspects;
	/* of those, what its /proc scan found mapped shared, or NULL */
	struct pathindex *mapped;
	/* Set by the caller before a collect (borrowed, may be NULL): the
	 * files mapped shared at its last operation. Each is a suspect of the
	 * collect, named in its directory: a store into a page that was dirty
	 * and writable then makes no fault, so no new ctime and no event, and
	 * its last close may have come before this collect's scan. */
	const struct pathindex *mapped_last;
	/* A plain directory on a shared filesystem (the tar backend), not a
	 * mount of its own: a file of that filesystem in use or changed
	 * outside the root is no sign of a root file seen under another path,
	 * unless it is mapped shared and writable or its links changed: the
	 * last collect lists those inodes here for the caller to look up among
	 * the root's (n_outside_inos); a root file among them is changed where
	 * no event of the root shows it.
	 * Such a caller also stats every file of several names itself, so a
	 * write to one is no reason to give up; a change of its names is. */
	bool plain_dir;
	/* A process whose writes are never through a mapping (ckptd itself,
	 * when it writes into the tree, as a tar restore does): its closes
	 * after a write make no suspect. 0: none. */
	pid_t own_pid;
	/* This process never writes into the tree (an overlay upper, which
	 * only the writers of its mount change): the tree is tracked by inode
	 * marks on its directories, so that its writes into the layer store,
	 * on the same filesystem, never reach the queue (the kernel filters
	 * create, delete and move events by filesystem or inode only, not by
	 * mount or subtree); an event of its own pid is dropped all the same. */
	bool skip_self;
	pid_t self;            /* getpid() at arming */
	size_t marks;          /* inode marks made (an overlay upper's directories) */
	int64_t scan_us;       /* the last collect's /proc scan, µs (for the log) */
	struct chg_scan *scan; /* a /proc scan started apart (chg_track_scan_start), or NULL */
	ino_t *outside_inos;
	size_t n_outside_inos;
	/* Kept from one arm to the next (disarm leaves them): */
	enum chg_track_method method; /* NONE until the first arm */
	char reason[160];             /* why that method ("fanotify refused: ...") */
	dev_t skip_dev;               /* a directory inotify does not watch (the */
	ino_t skip_ino;               /* state dir, should it live inside a root) */
	const struct rootexcl *excl;  /* nor these (the whole root's /proc...); may be NULL */
	bool fanotify_only;           /* never inotify: a watch per file of a whole system */
	uint64_t fallbacks;           /* collects that gave up for lost events or watches */
	bool fallback_logged;         /* the caller logged the first of those */
	bool lost_logged;             /* the caller logged chg_track_lost's, this arm */
};

#define CHG_TRACK_INIT                 \
	{                              \
		.fan = -1, .upper = -1 \
	}

/* Start recording changes below upper_fd. fanotify where this system allows
 * it; where it is refused (gVisor: ENOSYS; no CAP_SYS_ADMIN: EPERM), inotify:
 * a watch per directory and, for a plain_dir, per regular file (for its link
 * count: a name made outside the root). The first arm chooses, the next ones
 * keep that choice; t->reason says why. < 0 (-errno) when neither works (or
 * inotify reaches the watch limit): walk instead. plain_dir, own_pid and
 * skip_dev/skip_ino are set before arming. */
int chg_track_arm(struct chg_track *t, int upper_fd);
void chg_track_disarm(struct chg_track *t);
static inline bool chg_track_armed(const struct chg_track *t)
{
	return t->fan >= 0 || t->ino;
}
/* "fanotify", "inotify" or "none". */
const char *chg_track_method_name(enum chg_track_method m);
/* Collects, of every tracker of this process, that gave up because events
 * were lost (queue overflow) or a watch could not be added (the limit):
 * each made its caller walk the tree. For /metrics. */
uint64_t chg_track_fallbacks_total(void);
/* Events every tracker of this process read from its queue (fanotify or
 * inotify), its own writes (dropped by pid) included. For /metrics: what a
 * create's own writes into the layer store cost a tracker shows here. */
uint64_t chg_track_events_total(void);

/* Read the events queued so far as ckptd's own writes (a tar restore's):
 * the files they closed after writing are no suspects. fanotify tells them
 * by pid (own_pid) whenever they are read, so this reads nothing then;
 * inotify cannot, so the caller reads them right after its writes, while
 * the services that use the root are stopped. */
void chg_track_drain_own(struct chg_track *t);

/* Read the events queued so far (chg_track_collect's first part), so that
 * collect, inside the freeze, reads only those that came after: the first
 * pass's own writes make one event per file, on the same filesystem. A
 * tracker armed for long is drained now and then (tar's, by the sweeper),
 * so that the kernel's queue stays short; past CHG_TRACK_MAX_DIRS distinct
 * directories the next collect answers -EAGAIN (walk). */
#define CHG_TRACK_MAX_DIRS 65536
void chg_track_drain(struct chg_track *t);

/* What changed since arming: the directories below the upper (relative, ""
 * for the upper itself) whose entries or own metadata changed, and the
 * directories of files of the root mounted at root_path (device root_dev)
 * that a process still has open or mapped; deep for a directory created,
 * moved or removed under its name (its whole subtree is compared). Sorted so
 * that a directory comes before those below it. *ret malloc'd (free with
 * pathindex_dirty_free). -EAGAIN when the walk is needed (events lost, a
 * directory handle that cannot be resolved, a file in use whose path is not
 * under root_path); *why then says which. */
int chg_track_collect(struct chg_track *t, const char *root_path, dev_t root_dev, struct pathindex_dirty **ret,
		      size_t *ret_n, const char **why);

/* chg_track_collect in two halves, so that the caller's own reads run
 * while /proc is scanned: start the scan on a thread of its own (it reads
 * no state of t but its settings; a failed thread runs it here), then
 * collect_scanned waits for it and reads the events queued by then, after
 * the scan (why that order: collect in change_track.c). Nothing else of t
 * may be called in between but chg_track_collect_events (a delta's first
 * pass) and disarm (which waits for the scan). */
int chg_track_scan_start(struct chg_track *t, const char *root_path, dev_t root_dev);
int chg_track_collect_scanned(struct chg_track *t, struct pathindex_dirty **ret, size_t *ret_n, const char **why);

/* chg_track_collect from the events alone, with no /proc scan (about 4 ms):
 * for a pass a later collect completes (a delta's first pass: the frozen
 * one scans), so files in use or mapped are not named here, and the
 * suspects are only the files closed after a write. */
int chg_track_collect_events(struct chg_track *t, struct pathindex_dirty **ret, size_t *ret_n, const char **why);

/* After chg_track_collect, t->suspects holds the files whose data may have
 * changed with no new ctime, which the pass must compare rather than trust
 * their index entry: those a process maps shared and writable now, and those
 * closed after a write since the last collect (a write through a mapping
 * into a page already dirty makes no fault, so no new ctime; only syncfs,
 * which write-protects the pages again, ends that). Also when collect fails:
 * the walk that follows needs them too. */

/* The files of the root (mounted at root_path, device root_dev) that a
 * process maps shared and writable, added to the set *sus (made when NULL):
 * the suspects of a pass without tracking. < 0 with *why when one is mapped
 * under another path (a mount namespace or chroot) or /proc cannot be read.
 * plain_dir: the root is a directory of a filesystem others use too (tar),
 * so files mapped outside its path are taken as not its own. */
int chg_scan_mapped(const char *root_path, dev_t root_dev, bool plain_dir, struct pathindex **sus, const char **why);

/* Why the events read since the last collect cannot tell what changed
 * (the next collect fails), or NULL. They are still read, for the files
 * closed after a write (the suspects that collect gives all the same). */
const char *chg_track_lost(const struct chg_track *t);

/* Whether anything changed in the upper since the last collect (or this
 * cannot be told): what makes a check of collect's answer inconclusive. The
 * events it reads stay for the next collect. */
bool chg_track_changed_since(struct chg_track *t);
/* Narrower, for a difference found at rel (relative to the upper): whether
 * a change since the last collect explains it (the check of a tracked pass
 * excuses that difference, and no other). A file the last collect found
 * mapped shared (a suspect, copied by the pass) may have been written
 * through that mapping since, which no event tells: it is excused too. The
 * events stay, as above. */
bool chg_track_changed_at(struct chg_track *t, const char *rel);
