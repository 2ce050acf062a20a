/* change_track.c: the directories of a tree that changed since a moment,
 * from fanotify and /proc (see change_track.h). Facts it relies on, as
 * tools/probe-fanotify.c prints them on this kernel: writes through the
 * overlay reach the upper's real inodes and are reported there; a copy-up or
 * whiteout is made in the work dir and arrives as MOVED_TO into the upper; a
 * write through a shared mapping gives no event, only CLOSE_WRITE once the
 * file's last reference goes. */
#include "backend/change_track_internal.h"
#include "lib/hash.h"
#include "lib/procscan.h"
#include "lib/util.h"
#include "lib/walk.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <limits.h>
#include <sys/fanotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#define TRACK_EVENTS                                                                                           \
	(FAN_MODIFY | FAN_ATTRIB | FAN_CLOSE_WRITE | FAN_CREATE | FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO | \
	 FAN_ONDIR)
#define DIR_CHANGES (FAN_CREATE | FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO)
#ifndef FAN_REPORT_TARGET_FID
#define FAN_REPORT_TARGET_FID 0x00001000 /* Linux 5.17 */
#endif

/* An overlay upper is tracked by inode marks on each of its directories, not
 * by a mark on its whole filesystem: that filesystem also holds ckptd's layer
 * store (every file a create writes would be an event) and, on a VM, every
 * other program's files. A directory's mark reports the changes of its
 * entries and, with FAN_EVENT_ON_CHILD, the writes and attribute changes of
 * its files. A directory made or moved into a marked one is marked when its
 * event is read (mark_tree); what changed in it before that is seen by the
 * pass, which compares it whole (deep). A tar root (plain_dir) keeps the
 * filesystem mark: a name outside the root of one of its files must be heard
 * of (outside_inos). */
static bool by_inode(const struct chg_track *t)
{
	return t->skip_self && !t->plain_dir;
}

static int is_upper(void *ctx, const struct stat *st, dev_t below)
{
	const struct stat *top = ctx;
	(void)below;
	return st->st_dev == top->st_dev && st->st_ino == top->st_ino ? 1 : -1;
}

/* Whether the directory dir is the upper or below it, going up through
 * "..": a path too long for readlink may still be outside (another
 * program's deep tree on a tar root's filesystem). true when unsure. */
static bool dir_below_upper(const struct chg_track *t, int dir)
{
	struct stat top;
	return fstat(t->upper, &top) < 0 || dir_walk_up(dir, PATH_MAX, is_upper, &top) != -1;
}

/* What a handle of an event names, relative to the upper, and its stat: 1,
 * 0 when it is outside the upper (the work dir, ckptd's own layers, other
 * files of that filesystem), 2 when it is removed since (wherever it was:
 * its parent has an event too), < 0 when it cannot be told. */
static int resolve(struct chg_track *t, struct file_handle *fh, char *rel, size_t size, struct stat *st)
{
	char link[64], path[PATH_MAX];
	_cleanup_close_ int d = open_by_handle_at(t->upper, fh, O_PATH | O_CLOEXEC);
	if (d < 0)
		return errno == ESTALE ? 2 : -errno;
	if (fstat(d, st) < 0)
		return -errno;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", d);
	ssize_t n = readlink(link, path, sizeof(path) - 1);
	if (n < 0 && errno == ENAMETOOLONG && S_ISDIR(st->st_mode) && !dir_below_upper(t, d))
		return 0; /* outside */
	if (n < 0)
		return -errno;
	path[n] = 0;
	if (n > 10 && !strcmp(path + n - 10, " (deleted)"))
		return 2;
	if (strncmp(path, t->path, t->len) || (path[t->len] && path[t->len] != '/'))
		return 0;
	snprintf(rel, size, "%s", path[t->len] ? path + t->len + 1 : "");
	return 1;
}

/* The last handle resolved, and what resolve said of it: the events of one
 * read come in runs on one directory and one file (a file made, written,
 * closed and renamed), and each resolve costs four system calls. A memo
 * lives for one read of the queue: what it says is as old as that read. */
struct resolve_memo {
	bool valid;
	int r;
	struct stat st;
	int type;
	unsigned bytes;
	unsigned char handle[MAX_HANDLE_SZ];
	char rel[PATH_MAX];
};

static int resolve_memo(struct chg_track *t, struct resolve_memo *mm, struct file_handle *fh, char *rel, size_t size,
			struct stat *st)
{
	if (mm->valid && mm->type == fh->handle_type && mm->bytes == fh->handle_bytes &&
	    !memcmp(mm->handle, fh->f_handle, fh->handle_bytes)) {
		*st = mm->st;
		snprintf(rel, size, "%s", mm->rel);
		return mm->r;
	}
	int r = resolve(t, fh, rel, size, st);
	mm->valid = r >= 0 && fh->handle_bytes <= sizeof(mm->handle);
	if (mm->valid) {
		mm->r = r, mm->st = *st, mm->type = fh->handle_type, mm->bytes = fh->handle_bytes;
		memcpy(mm->handle, fh->f_handle, fh->handle_bytes);
		snprintf(mm->rel, sizeof(mm->rel), "%s", r == 1 ? rel : "");
	}
	return r;
}

const char *chg_track_method_name(enum chg_track_method m)
{
	return m == CHG_TRACK_FANOTIFY ? "fanotify" : m == CHG_TRACK_INOTIFY ? "inotify" : "none";
}

void chg_track_disarm(struct chg_track *t)
{
	chg_scan_free(chg_scan_join(t)); /* before the tracker it reads the settings of goes */
	if (t->fan >= 0)
		close(t->fan);
	chg_inotify_free(t->ino);
	if (t->upper >= 0)
		close(t->upper);
	free(t->path);
	if (t->seen) {
		pathindex_dirty_free(t->seen->s.v, t->seen->s.n);
		pathindex_free(t->seen->sus);
		free(t->seen->ino);
	}
	free(t->seen);
	free(t->outside_inos);
	pathindex_free(t->suspects);
	pathindex_free(t->mapped);
	/* what the caller set, and the choice made at the first arm, stay */
	struct chg_track keep = *t;
	*t = (struct chg_track)CHG_TRACK_INIT;
	t->plain_dir = keep.plain_dir;
	t->own_pid = keep.own_pid;
	t->method = keep.method;
	memcpy(t->reason, keep.reason, sizeof(t->reason));
	t->skip_dev = keep.skip_dev;
	t->skip_ino = keep.skip_ino;
	t->skip_self = keep.skip_self;
	t->excl = keep.excl;
	t->fanotify_only = keep.fanotify_only;
	t->fallbacks = keep.fallbacks;
	t->fallback_logged = keep.fallback_logged;
}

/* One directory's inode mark: name below dirfd, or dirfd itself (NULL). */
static int mark_dir(struct chg_track *t, int dirfd, const char *name)
{
	unsigned flags = FAN_MARK_ADD | FAN_MARK_INODE | FAN_MARK_ONLYDIR | FAN_MARK_DONT_FOLLOW;
	if (fanotify_mark(t->fan, flags, TRACK_EVENTS | FAN_EVENT_ON_CHILD, dirfd, name) < 0)
		return -errno;
	t->marks++;
	return 0;
}

/* Each directory is marked before it is read: an entry made after its
 * listing has an event; one made before is listed (and marked, if a
 * directory). */
static int mark_pre(void *ctx, struct walk_entry *e)
{
	int r = e->type == DT_DIR ? mark_dir(ctx, e->dirfd, e->name) : 0;
	return r == -ENOENT || r == -ENOTDIR ? WALK_SKIP : r; /* gone since: its parent's event tells */
}

static int mark_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return err == -ENOENT || err == -ENOTDIR ? 0 : err;
}

/* name below dirfd (NULL: dirfd itself) and every directory below it. */
static int mark_tree(struct chg_track *t, int dirfd, const char *name)
{
	int r = mark_dir(t, dirfd, name);
	struct walk_opts o = { .flags = WALK_DIRS, .pre = mark_pre, .fail = mark_fail, .ctx = t };
	return r < 0 ? r : walk_tree(dirfd, name, &o);
}

static int arm_fanotify(struct chg_track *t, int upper_fd)
{
	unsigned flags = FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE | FAN_REPORT_DFID_NAME |
		FAN_REPORT_FID;
	/* inode marks: as many as the upper has directories; the child of a
	 * directory event named, so that a name made or removed for a file of
	 * several names is seen (a filesystem mark hears of the link count) */
	if (by_inode(t))
		flags |= FAN_UNLIMITED_MARKS | FAN_REPORT_TARGET_FID;
	t->fan = fanotify_init(flags, O_RDONLY);
	int r = t->fan < 0    ? -errno
		: by_inode(t) ? mark_tree(t, upper_fd, NULL)
		: fanotify_mark(t->fan, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, TRACK_EVENTS, upper_fd, NULL) < 0 ? -errno
													      : 0;
	if (r < 0 && t->fan >= 0)
		close(t->fan);
	if (r < 0)
		t->fan = -1;
	return r;
}

/* The first arm: fanotify, else inotify where fanotify is refused (the
 * reason kept); later arms use what it chose. */
static int arm_choose(struct chg_track *t, int upper_fd)
{
	if (t->method == CHG_TRACK_INOTIFY) {
		int q = chg_inotify_arm(t);
		if (q == -ENOSPC)
			chg_track_count_fallback(t);
		if (q < 0)
			snprintf(t->reason, sizeof(t->reason), "inotify: %s",
				 q == -ENOSPC ? "watch limit reached (fs.inotify.max_user_watches)" : strerror(-q));
		return q;
	}
	int r = arm_fanotify(t, upper_fd);
	if (r == 0 || t->method == CHG_TRACK_FANOTIFY) {
		if (r == 0 && t->method == CHG_TRACK_NONE)
			snprintf(t->reason, sizeof(t->reason), "%s",
				 by_inode(t) ? "fanotify marks each directory of the upper"
					     : "fanotify marks the root's filesystem");
		t->method = r == 0 ? CHG_TRACK_FANOTIFY : t->method;
		return r;
	}
	if (t->fanotify_only) {
		snprintf(t->reason, sizeof(t->reason),
			 "fanotify refused: %s; inotify not tried (a watch per file of the whole system)",
			 strerror(-r));
		return r;
	}
	int q = chg_inotify_arm(t);
	if (q == 0) {
		t->method = CHG_TRACK_INOTIFY;
		snprintf(t->reason, sizeof(t->reason), "fanotify refused: %s", strerror(-r));
	} else {
		if (q == -ENOSPC)
			chg_track_count_fallback(t);
		snprintf(t->reason, sizeof(t->reason), "fanotify refused: %s; inotify: %s", strerror(-r),
			 q == -ENOSPC ? "watch limit reached (fs.inotify.max_user_watches)" : strerror(-q));
	}
	return q;
}

int chg_track_arm(struct chg_track *t, int upper_fd)
{
	char link[64], path[PATH_MAX];

	chg_track_disarm(t);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", upper_fd);
	ssize_t n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		return -errno;
	path[n] = 0;
	t->upper = fcntl(upper_fd, F_DUPFD_CLOEXEC, 3);
	t->path = strdup(path);
	t->len = n == 1 ? 0 : (size_t)n; /* "/": its children's paths begin with the slash */
	t->seen = calloc(1, sizeof(*t->seen));
	t->self = getpid();
	int r = t->upper < 0 ? -errno : !t->path || !t->seen ? -ENOMEM : arm_choose(t, upper_fd);
	if (r < 0)
		chg_track_disarm(t);
	return r;
}

static uint64_t handle_hash(const struct file_handle *fh)
{
	uint64_t h = hash_fnv64(HASH_FNV64_INIT, &fh->handle_type, sizeof(fh->handle_type));
	h = hash_fnv64(h, fh->f_handle, fh->handle_bytes);
	return h ? h : 1;
}

/* A hash collision only costs a directory compared that need not be: a
 * handle found here is outside; one not found is resolved. */
static bool outside_has(const struct chg_outside *o, uint64_t h)
{
	for (size_t i = h % CHG_OUTSIDE_SLOTS, k = 0; k < 8 && o->h[i]; i = (i + 1) % CHG_OUTSIDE_SLOTS, k++)
		if (o->h[i] == h)
			return true;
	return false;
}

static void outside_put(struct chg_outside *o, uint64_t h)
{
	for (size_t i = h % CHG_OUTSIDE_SLOTS, k = 0; k < 8; i = (i + 1) % CHG_OUTSIDE_SLOTS, k++)
		if (!o->h[i]) {
			o->h[i] = h;
			return;
		}
}

/* One event: the directory it names is compared (deep for a directory made,
 * moved or removed under that name: what the first pass holds there may be
 * another directory's), and so is the one the object itself is in now, for
 * a write is reported under whichever name the writer's file has. That name
 * may be one the file no longer has, in a directory removed since: overlayfs
 * keeps, per inode, the upper dentry it first found a file of several names
 * by, and reports every write through any of its names under that one. */
static int one_event(struct chg_track *t, struct chg_dirty_set *s, struct chg_outside *out, struct resolve_memo *mm,
		     const struct fanotify_event_metadata *m, const char *raw, const char **why)
{
	char rel[PATH_MAX], child[PATH_MAX + NAME_MAX + 2];
	struct file_handle *dir = NULL, *obj = NULL;
	const char *name = ".";
	bool has_name = false; /* a DFID_NAME record: name is the kernel's */
	struct stat st;

	for (const char *p = raw + m->metadata_len, *end = raw + m->event_len; p < end;) {
		const struct fanotify_event_info_fid *fid = (const void *)p;
		if (p + sizeof(*fid) > end || fid->hdr.len < sizeof(*fid) || p + fid->hdr.len > end)
			return *why = "a fanotify event of unexpected shape", -EAGAIN;
		struct file_handle *fh = (void *)fid->handle;
		if (fid->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID_NAME ||
		    fid->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID) {
			dir = fh;
			if (fid->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID_NAME)
				name = (const char *)fh->f_handle + fh->handle_bytes, has_name = true;
		} else if (fid->hdr.info_type == FAN_EVENT_INFO_TYPE_FID) {
			obj = fh;
		}
		p += fid->hdr.len;
	}
	if (!dir && !obj)
		return *why = "a fanotify event without a file handle", -EAGAIN;
	uint64_t dh = dir ? handle_hash(dir) : 0;
	if (dir && outside_has(out, dh))
		return 0; /* a write of ckptd's own, or of another program elsewhere */
	int r = dir ? resolve_memo(t, &mm[0], dir, rel, sizeof(rel), &st) : 0;
	if (dir && r == 0) {
		outside_put(out, dh);
		return 0; /* outside (a file of the upper has its directory there) */
	}
	if (r < 0)
		return *why = "a directory of an event could not be resolved", -EAGAIN;
	/* a directory removed since is not cached as outside: the object
	 * tells (overlayfs reports every write to a file of several names
	 * under the name it first found it by, which may be gone) */
	bool dir_gone = r == 2;
	/* the entry the event names: a child's name; "." with FAN_ONDIR for
	 * the directory's own inode (its entries are reported on it with their
	 * names); no name at all: what changed there is unknown */
	bool self = has_name && !strcmp(name, ".") && (m->mask & FAN_ONDIR);
	bool kept = !(m->mask & (FAN_DELETE | FAN_MOVED_FROM)); /* no name left it */
	const char *entry = has_name && strcmp(name, ".") ? name : NULL;
	if (r == 1 &&
	    (entry          ? chg_dirty_add_name(s, rel, strlen(rel), entry)
		     : self ? chg_dirty_add_name(s, rel, strlen(rel), NULL)
			    : chg_dirty_add(s, rel, strlen(rel), false)) < 0)
		return *why = "out of memory", -EAGAIN;
	if (r == 1)
		s->v[s->n - 1].kept = kept;
	if (r == 1 && (m->mask & FAN_ONDIR) && (m->mask & DIR_CHANGES) && strcmp(name, ".")) {
		snprintf(child, sizeof(child), "%s%s%s", rel, rel[0] ? "/" : "", name);
		if (chg_dirty_add(s, child, strlen(child), true) < 0)
			return *why = "out of memory", -EAGAIN;
		/* a directory made or moved here: marked from now on, compared
		 * whole (deep) by the pass that follows this read */
		int k = by_inode(t) && (m->mask & (FAN_CREATE | FAN_MOVED_TO)) ? mark_tree(t, t->upper, child) : 0;
		if (k < 0 && k != -ENOENT && k != -ENOTDIR)
			return *why = "a new directory of the upper could not be marked", -EAGAIN;
	}
	if (!obj || (dir && (m->mask & FAN_ONDIR)))
		return 0;
	st = (struct stat){ 0 };
	if ((r = resolve_memo(t, &mm[1], obj, rel, sizeof(rel), &st)) < 0 && (!dir || dir_gone))
		return *why = "a file of an event could not be resolved", -EAGAIN;
	/* an event on the file alone (its link count: link(2), unlink(2))
	 * that names it outside: one of its names may be in the root, and the
	 * writes through the other one would be reported outside; the caller
	 * looks its inode up among the root's (outside_inos) */
	bool own = t->own_pid && (pid_t)m->pid == t->own_pid; /* ckptd's own (a restore's) */
	if (r == 0 && !dir && t->plain_dir && !own && !S_ISDIR(st.st_mode) && st.st_nlink > 1) {
		ino_t *v = realloc(t->seen->ino, (t->seen->n_ino + 1) * sizeof(*v));
		if (!v)
			return *why = "out of memory", -EAGAIN;
		v[t->seen->n_ino++] = st.st_ino;
		t->seen->ino = v;
		return 0;
	}
	if (r != 1) /* outside, or gone since (its directory is compared all the same) */
		return 0;
	if (S_ISDIR(st.st_mode)) /* an event on a directory itself (its own metadata) */
		return chg_dirty_add(s, rel, strlen(rel), false) < 0 ? (*why = "out of memory", -EAGAIN) : 0;
	/* a plain_dir caller looks at every file of several names anyway: only
	 * a change of names (a link made, moved, removed: ATTRIB for the count)
	 * is one it must walk for */
	bool data_only = t->plain_dir && (own || !(m->mask & ~(FAN_MODIFY | FAN_CLOSE_WRITE)));
	if (!S_ISDIR(st.st_mode) && st.st_nlink > 1 && !(S_ISCHR(st.st_mode) && st.st_rdev == 0) && !data_only)
		return *why = "a changed file has other names", -EAGAIN;
	/* its last close after a write: it may have been written through a
	 * mapping with no new ctime (not by own_pid) */
	if ((m->mask & FAN_CLOSE_WRITE) && S_ISREG(st.st_mode) && (pid_t)m->pid != t->own_pid &&
	    chg_suspect_add(&t->seen->sus, rel) < 0)
		return *why = "out of memory", -EAGAIN;
	/* the file's directory now: the event removed no name of it (a name
	 * removed elsewhere has an event of that directory) */
	const char *slash = strrchr(rel, '/');
	if (chg_dirty_add_name(s, rel, slash ? (size_t)(slash - rel) : 0, slash ? slash + 1 : rel) < 0)
		return *why = "out of memory", -EAGAIN;
	s->v[s->n - 1].kept = true;
	return 0;
}

static int read_events(struct chg_track *t, struct chg_dirty_set *s, const char **why)
{
	if (t->ino)
		return chg_inotify_read(t, s, false, why);
	char buf[16384] __attribute__((aligned(8)));
	struct chg_outside *out = &t->seen->out;
	_cleanup_free_ struct resolve_memo *mm = calloc(2, sizeof(*mm)); /* directory, file */
	int ret = 0;
	if (!mm)
		return *why = "out of memory", -EAGAIN;
	for (;;) {
		mm[0].valid = mm[1].valid = false; /* as old as this read */
		ssize_t len = read(t->fan, buf, sizeof(buf));
		if (len < 0 && errno == EAGAIN)
			return ret;
		if (len < 0)
			return *why = "reading fanotify events failed", -EAGAIN;
		/* events with names are 4-byte aligned, not 8 as the header's
		 * mask is: each header is copied out (FAN_EVENT_NEXT would
		 * read it in place) */
		for (size_t off = 0; off + sizeof(struct fanotify_event_metadata) <= (size_t)len;) {
			struct fanotify_event_metadata m;
			memcpy(&m, buf + off, sizeof(m));
			if (m.event_len < sizeof(m) || m.metadata_len < sizeof(m) || m.metadata_len > m.event_len ||
			    off + m.event_len > (size_t)len)
				return *why = "a fanotify event of unexpected shape", -EAGAIN;
			if (m.vers != FANOTIFY_METADATA_VERSION)
				return *why = "a fanotify event of unexpected shape", -EAGAIN;
			chg_track_count_events(1);
			const char *w = NULL;
			int r = m.mask & FAN_Q_OVERFLOW                   ? (w = "fanotify queue overflowed", -EAGAIN)
				: t->skip_self && (pid_t)m.pid == t->self ? 0
									  : one_event(t, s, out, mm, &m, buf + off, &w);
			if (r < 0 && !ret) /* the first reason; the rest is read for its suspects */
				ret = r, *why = w ? w : "an event could not be placed";
			off += m.event_len;
		}
	}
}

/* own: the events are ckptd's own writes (chg_track_drain_own). Once the
 * events cannot tell what changed (seen->why), they are still read, for the
 * files closed after a write: the walk that follows trusts every other
 * file's ctime, which a write through a mapping may leave (gVisor). */
static void drain(struct chg_track *t, bool own)
{
	if (!chg_track_armed(t))
		return;
	const char *why = NULL;
	int r = t->ino ? chg_inotify_read(t, &t->seen->s, own, &why)
		       : read_events(t, &t->seen->s, &why); /* fanotify knows them by pid */
	if (r < 0 && !t->seen->why)
		t->seen->why = why ? why : "reading the events failed";
	if (t->seen->why) { /* what changed is not kept: the next collect walks */
		pathindex_dirty_free(t->seen->s.v, t->seen->s.n);
		t->seen->s = (struct chg_dirty_set){ 0 };
		return;
	}
	/* a tracker armed for long (tar's, between creates) must not grow
	 * with every write: a directory is kept once, and past a bound the
	 * next collect says to walk */
	if (t->seen->s.n > CHG_TRACK_MAX_DIRS)
		pathindex_dirty_dedup(t->seen->s.v, &t->seen->s.n);
	if (t->seen->s.n > CHG_TRACK_MAX_DIRS && !t->seen->why)
		t->seen->why = "more directories changed than tracking keeps";
}

void chg_track_drain(struct chg_track *t)
{
	drain(t, false);
}

struct mapped_add {
	struct chg_track *t;
	struct chg_dirty_set *s;
};

static int mapped_add_one(void *ctx, const char *rel)
{
	struct mapped_add *a = ctx;
	const char *slash = strrchr(rel, '/');
	if (chg_suspect_add(&a->t->suspects, rel) < 0 ||
	    chg_dirty_add_name(a->s, rel, slash ? (size_t)(slash - rel) : 0, slash ? slash + 1 : rel) < 0)
		return -ENOMEM;
	return 0;
}

/* t->mapped_last into this collect's suspects and directories. */
static int add_mapped_last(struct chg_track *t, struct chg_dirty_set *s)
{
	struct mapped_add a = { t, s };
	return pathindex_each(t->mapped_last, mapped_add_one, &a);
}

/* sc: a scan of /proc that ended before this call, or NULL (events only).
 * The events are read after the scan: a file written through a mapping
 * before the scan began, by a process that is not frozen, was still mapped
 * or open when the scan read that process (and is named by it), or its last
 * close came before: FAN_CLOSE_WRITE is in the queue read here. Read in the
 * other order, a close between the read and the scan was in neither. */
static int collect(struct chg_track *t, struct chg_scan *sc, struct pathindex_dirty **ret, size_t *ret_n,
		   const char **why)
{
	*why = NULL;
	if (!chg_track_armed(t))
		return *why = "not tracking", -EAGAIN;
	if (t->seen->why) { /* the drain gave up already: the rest read for its suspects */
		drain(t, false);
		pathindex_free(t->suspects);
		t->suspects = TAKE_PTR(t->seen->sus);
		return *why = t->seen->why, -EAGAIN;
	}
	struct chg_dirty_set s = t->seen->s;
	t->seen->s = (struct chg_dirty_set){ 0 };
	int r = read_events(t, &s, why);
	/* the suspects of this collect: closed after a write since the last
	 * one, and mapped shared now (kept when it fails: the caller's walk
	 * needs them too) */
	pathindex_free(t->suspects);
	t->suspects = TAKE_PTR(t->seen->sus);
	if (sc) { /* what the scan found: in use, mapped; outside a plain root */
		free(t->outside_inos);
		t->outside_inos = TAKE_PTR(t->seen->ino);
		t->n_outside_inos = t->seen->n_ino;
		t->seen->n_ino = 0;
		const char *scan_why = NULL;
		int q = chg_scan_merge(t, sc, &s, &scan_why);
		if (r == 0 && q < 0)
			r = q, *why = scan_why;
	}
	if (r == 0 && add_mapped_last(t, &s) < 0)
		r = -EAGAIN, *why = "out of memory";
	if (r < 0) {
		pathindex_dirty_free(s.v, s.n);
		return r;
	}
	pathindex_dirty_dedup(s.v, &s.n);
	*ret = s.v;
	*ret_n = s.n;
	return 0;
}

int chg_track_collect(struct chg_track *t, const char *root_path, dev_t root_dev, struct pathindex_dirty **ret,
		      size_t *ret_n, const char **why)
{
	chg_scan_free(chg_scan_join(t)); /* one started apart is too old for this collect */
	struct chg_scan *sc = chg_track_armed(t) ? chg_scan_new(root_path, root_dev, t->plain_dir, true) : NULL;
	if (chg_track_armed(t) && !sc)
		return *why = "out of memory", -EAGAIN;
	/* what is queued already is read before the scan too: its handles are
	 * resolved while their files exist (a filesystem mark hears other
	 * programs' short-lived files); collect reads what came since */
	chg_track_drain(t);
	if (sc)
		chg_scan_run(sc);
	int r = collect(t, sc, ret, ret_n, why);
	chg_scan_free(sc);
	return r;
}

int chg_track_scan_start(struct chg_track *t, const char *root_path, dev_t root_dev)
{
	chg_scan_free(chg_scan_join(t));
	if (!chg_track_armed(t))
		return -EAGAIN;
	chg_track_drain(t); /* what is queued now, resolved while it exists (collect reads the rest) */
	struct chg_scan *sc = chg_scan_new(root_path, root_dev, t->plain_dir, true);
	if (!sc)
		return -ENOMEM;
	chg_scan_spawn(sc);
	t->scan = sc;
	return 0;
}

int chg_track_collect_scanned(struct chg_track *t, struct pathindex_dirty **ret, size_t *ret_n, const char **why)
{
	struct chg_scan *sc = chg_scan_join(t);
	if (!sc) {
		*why = "no /proc scan was started";
		return -EAGAIN;
	}
	int r = collect(t, sc, ret, ret_n, why);
	chg_scan_free(sc);
	return r;
}

int chg_track_collect_events(struct chg_track *t, struct pathindex_dirty **ret, size_t *ret_n, const char **why)
{
	return collect(t, NULL, ret, ret_n, why);
}

const char *chg_track_lost(const struct chg_track *t)
{
	return chg_track_armed(t) ? t->seen->why : NULL;
}

/* The events read are kept for the next collect (a tracker kept between
 * creates for deltas must not lose them). */
bool chg_track_changed_since(struct chg_track *t)
{
	if (!chg_track_armed(t) || t->seen->why)
		return true;
	size_t before = t->seen->s.n;
	chg_track_drain(t);
	return t->seen->why || t->seen->s.n != before;
}

void chg_track_drain_own(struct chg_track *t)
{
	/* fanotify tells ckptd's own events by pid whenever they are read:
	 * the next drain (the sweeper's, kicked after each restore) or
	 * collect reads them, outside the restore's time */
	if (!t->ino)
		return;
	drain(t, true);
}

/* rel lies at or below dir ("" is the top). */
static bool chg_under(const char *rel, const char *dir)
{
	size_t n = strlen(dir);
	return !n || (!strncmp(rel, dir, n) && (rel[n] == '/' || !rel[n]));
}

/* A change after the collect explains a difference at rel: an event in its
 * directory or on itself (a directory), one made or moved deep above it, a
 * file closed after a write; or the events cannot say (lost, unresolved). */
bool chg_track_changed_at(struct chg_track *t, const char *rel)
{
	if (!chg_track_armed(t) || t->seen->why)
		return true;
	chg_track_drain(t);
	if (t->seen->why || pathindex_has(t->seen->sus, rel) || pathindex_has(t->suspects, rel))
		return true;
	const char *slash = strrchr(rel, '/');
	size_t plen = slash ? (size_t)(slash - rel) : 0;
	for (size_t i = 0; i < t->seen->s.n; i++) {
		const struct pathindex_dirty *d = &t->seen->s.v[i];
		bool parent = strlen(d->path) == plen && !strncmp(d->path, rel, plen);
		if (parent || !strcmp(d->path, rel) || (d->deep && chg_under(rel, d->path)))
			return true;
	}
	return false;
}
