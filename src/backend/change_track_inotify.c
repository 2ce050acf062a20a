/* change_track_inotify.c: change tracking where fanotify is refused (gVisor,
 * no CAP_SYS_ADMIN, a user namespace): a watch per directory, kept between
 * operations, and for a plain directory (tar) one per regular file.
 *
 * Facts it relies on, checked on this kernel and under runsc:
 * - a directory's watch reports each create, delete, move, write, attribute
 *   change and close after a write of its entries, by name;
 * - a file's own watch reports IN_ATTRIB when its link count changes, made
 *   from any path: a hard link made outside the root, which no directory
 *   of the root hears of. Writes through that other name reach neither
 *   watch under gVisor, so the caller stats every file of several links
 *   (it does: a multi-link file is never taken as is);
 * - a directory made is watched only once its event is read: what was made
 *   in it before is found by reading it (it is compared whole: deep);
 * - a write through a shared mapping gives no event, as with fanotify: the
 *   /proc scan of change_track.c names those files.
 * The watches are keyed by watch descriptor, each with the path it was
 * added under; a directory moved is read again, which gives its watches
 * (the kernel answers the same descriptor for the same inode) their new
 * paths. */
#include "backend/change_track_internal.h"
#include "lib/util.h"
#include "lib/walk.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#define DIR_MASK                                                                                        \
	(IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | \
	 IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
#define FILE_MASK (IN_ATTRIB | IN_DONT_FOLLOW)

struct watch {
	int wd; /* 0: an empty slot (descriptors start at 1) */
	bool dir;
	bool multi; /* a file seen under two names of the root at once */
	bool lost;  /* such a file, one of whose names went: where is it? */
	ino_t ino;  /* a file's, to tell its path still names it */
	char *rel;
};

/* A directory moved away, until its MOVED_TO (same cookie) is read: if none
 * comes, it left the root and its watches go. */
struct moved {
	uint32_t cookie;
	int *wds;
	char **rels; /* the rel each had: one added again since is not removed */
	size_t n;
};

struct chg_inotify {
	int fd;
	int root_wd;
	struct watch *v; /* open addressing by wd, cap a power of two */
	size_t cap, n;
	struct moved *mv;
	size_t n_mv;
	int *unres; /* files whose IN_ATTRIB could not be placed yet */
	size_t n_unres;
	bool gave_up; /* the events could not tell, since this arm: counted once */
};

static size_t slot(const struct chg_inotify *in, int wd)
{
	size_t i = ((uint32_t)wd * 2654435761u) & (in->cap - 1);
	while (in->v[i].wd && in->v[i].wd != wd)
		i = (i + 1) & (in->cap - 1);
	return i;
}

static struct watch *map_get(struct chg_inotify *in, int wd)
{
	if (!in->cap)
		return NULL;
	struct watch *w = &in->v[slot(in, wd)];
	return w->wd ? w : NULL;
}

static int map_grow(struct chg_inotify *in)
{
	size_t cap = in->cap ? 2 * in->cap : 1024;
	struct watch *old = in->v, *v = calloc(cap, sizeof(*v));
	if (!v)
		return -ENOMEM;
	size_t ocap = in->cap;
	in->v = v;
	in->cap = cap;
	for (size_t i = 0; i < ocap; i++)
		if (old[i].wd)
			in->v[slot(in, old[i].wd)] = old[i];
	free(old);
	return 0;
}

/* Backward-shift deletion keeps every probe chain whole. */
static void map_del(struct chg_inotify *in, int wd)
{
	struct watch *w = map_get(in, wd);
	if (!w)
		return;
	free(w->rel);
	size_t i = (size_t)(w - in->v), j = i;
	in->v[i] = (struct watch){ 0 };
	in->n--;
	for (;;) {
		j = (j + 1) & (in->cap - 1);
		if (!in->v[j].wd)
			return;
		size_t k = ((uint32_t)in->v[j].wd * 2654435761u) & (in->cap - 1);
		if ((j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)) {
			in->v[i] = in->v[j];
			in->v[j] = (struct watch){ 0 };
			i = j;
		}
	}
}

/* Record wd as rel; *old gets the path it had (malloc'd), if another. */
static int map_put(struct chg_inotify *in, int wd, bool dir, ino_t ino, const char *rel, char **old)
{
	if ((in->n + 1) * 2 > in->cap && map_grow(in) < 0)
		return -ENOMEM;
	char *p = strdup(rel);
	if (!p)
		return -ENOMEM;
	struct watch *w = &in->v[slot(in, wd)];
	if (w->wd && old && strcmp(w->rel, rel))
		*old = TAKE_PTR(w->rel);
	if (!w->wd)
		in->n++;
	else
		free(w->rel);
	bool multi = w->wd && w->multi, lost = w->wd && w->lost; /* both stay */
	*w = (struct watch){ .wd = wd, .dir = dir, .multi = multi, .lost = lost, .ino = ino, .rel = p };
	return 0;
}

static int join(char *buf, size_t size, const char *a, const char *b)
{
	int n = snprintf(buf, size, "%s%s%s", a, a[0] && b[0] ? "/" : "", b);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

/* Watch rel (a directory, or a file for its link count). The wd, 0
 * when it is gone or not to be watched, < 0 on failure (-ENOSPC: the
 * limit). *old as map_put. */
static int watch_add(struct chg_track *t, const char *rel, const struct stat *st, char **old)
{
	char path[PATH_MAX];
	bool dir = S_ISDIR(st->st_mode);
	if (join(path, sizeof(path), t->path, rel) < 0)
		return -ENAMETOOLONG;
	int wd = inotify_add_watch(t->ino->fd, path, dir ? DIR_MASK : FILE_MASK);
	if (wd < 0)
		return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
	return map_put(t->ino, wd, dir, st->st_ino, rel, old) < 0 ? -ENOMEM : wd;
}

static int stat_rel(struct chg_track *t, const char *rel, struct stat *st)
{
	int r = rel[0] ? fstatat(t->upper, rel, st, AT_SYMLINK_NOFOLLOW) : fstat(t->upper, st);
	return r < 0 ? -errno : 0;
}

static int scan(struct chg_track *t, const char *rel, struct chg_dirty_set *s);

/* A regular file of a plain_dir, found by a scan or named by an event:
 * watched for its link count. A file already watched under another name
 * has that name's directory compared. */
static int file_found(struct chg_track *t, const char *rel, const struct stat *st, struct chg_dirty_set *s)
{
	char *old = NULL;
	int r = watch_add(t, rel, st, &old);
	struct stat ost;
	/* the other name still names it: two names in the root */
	if (r > 0 && old && stat_rel(t, old, &ost) == 0 && ost.st_ino == st->st_ino)
		map_get(t->ino, r)->multi = true;
	if (old && s) {
		const char *slash = strrchr(old, '/');
		r = chg_dirty_add(s, old, slash ? (size_t)(slash - old) : 0, false) < 0 ? -ENOMEM : r;
	}
	free(old);
	return r;
}

static bool dir_skipped(const struct chg_track *t, const struct stat *st)
{
	return (st->st_dev == t->skip_dev && st->st_ino == t->skip_ino) || rootexcl_has(t->excl, st);
}

/* One entry named by a create or move: watched (a directory, and what it
 * holds, or a regular file of a plain_dir). */
static int entry_found(struct chg_track *t, const char *rel, struct chg_dirty_set *s)
{
	struct stat st;
	if (stat_rel(t, rel, &st) < 0)
		return 0; /* gone since: its directory has the event */
	if (S_ISDIR(st.st_mode))
		return dir_skipped(t, &st) ? 0 : scan(t, rel, s);
	if (!S_ISREG(st.st_mode) || !t->plain_dir)
		return 0;
	return file_found(t, rel, &st, s);
}

struct scan_ctx {
	struct chg_track *t;
	struct chg_dirty_set *s;
};

/* An entry below a scanned directory, as entry_found takes it: a
 * directory is watched before the walk reads it, so what is made in it
 * meanwhile has an event. Only directories (and a plain_dir's regular
 * files) are stat'ed. */
static int scan_pre(void *ctx, struct walk_entry *e)
{
	struct scan_ctx *c = ctx;
	struct stat st;
	if (e->type != DT_DIR && (e->type != DT_REG || !c->t->plain_dir))
		return 0;
	if (fstatat(e->dirfd, e->name, &st, AT_SYMLINK_NOFOLLOW) < 0) /* gone since: its directory has the event */
		return errno == ENOENT || errno == ENOTDIR ? WALK_SKIP : -errno;
	if (S_ISREG(st.st_mode)) {
		int r = c->t->plain_dir ? file_found(c->t, e->path, &st, c->s) : 0;
		return r < 0 ? r : WALK_SKIP;
	}
	/* a directory that replaced what was listed: its parent has the event */
	if (!S_ISDIR(st.st_mode) || e->type != DT_DIR || dir_skipped(c->t, &st))
		return WALK_SKIP;
	int r = watch_add(c->t, e->path, &st, NULL);
	return r < 0 ? r : r == 0 ? WALK_SKIP : 0;
}

/* What is gone (ENOENT, at a read too: a directory removed while it is
 * listed) or replaced (ENOTDIR) since it was listed is its directory's
 * event. Any other failure ends the scan with its errno (the caller gives
 * up on tracking): a directory not read in full (EIO, EMFILE) leaves those
 * below it unwatched, and their changes unseen. */
static int scan_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return err == -ENOENT || err == -ENOTDIR ? 0 : err;
}

/* Watch directory rel, then everything below it: what was made in it
 * before its watch counts too (the caller compares it whole). */
static int scan(struct chg_track *t, const char *rel, struct chg_dirty_set *s)
{
	struct stat st;
	if (stat_rel(t, rel, &st) < 0 || !S_ISDIR(st.st_mode))
		return 0;
	int r = watch_add(t, rel, &st, NULL);
	if (r <= 0)
		return r;
	struct scan_ctx c = { t, s };
	struct walk_opts o = { .path_max = PATH_MAX, .prefix = rel, .pre = scan_pre, .fail = scan_fail, .ctx = &c };
	r = walk_tree(t->upper, rel[0] ? rel : NULL, &o);
	if (r == -ENOENT || r == -ENOTDIR)
		return 0; /* the root of the scan: gone since */
	return r < 0 ? r : 0;
}

void chg_inotify_free(struct chg_inotify *in)
{
	if (!in)
		return;
	if (in->fd >= 0)
		close(in->fd);
	for (size_t i = 0; i < in->cap; i++)
		if (in->v[i].wd)
			free(in->v[i].rel);
	free(in->v);
	for (size_t i = 0; i < in->n_mv; i++) {
		for (size_t k = 0; k < in->mv[i].n; k++)
			free(in->mv[i].rels[k]);
		free(in->mv[i].wds);
		free(in->mv[i].rels);
	}
	free(in->mv);
	free(in->unres);
	free(in);
}

int chg_inotify_arm(struct chg_track *t)
{
	if (!(t->ino = calloc(1, sizeof(*t->ino))))
		return -ENOMEM;
	t->ino->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (t->ino->fd < 0)
		return -errno;
	int r = scan(t, "", NULL);
	struct watch *w = r < 0 ? NULL : map_get(t->ino, 1);
	if (r >= 0 && (!w || strcmp(w->rel, "")))
		r = -EIO; /* the root itself is the first watch */
	t->ino->root_wd = 1;
	return r < 0 ? r : 0;
}

static int give_up(struct chg_track *t, const char **why, const char *msg, bool count)
{
	if (count && !t->ino->gave_up)
		chg_track_count_fallback(t);
	t->ino->gave_up = true;
	*why = msg;
	return -EAGAIN;
}

static int dirty_parent(struct chg_dirty_set *s, const char *rel)
{
	const char *slash = strrchr(rel, '/');
	return chg_dirty_add(s, rel, slash ? (size_t)(slash - rel) : 0, false);
}

/* A file's own watch: its link count (or metadata) changed, maybe through
 * a name outside the root. Its directory is compared, if its path still
 * names it; else that is settled once the batch is read (read_end). */
static int file_event(struct chg_track *t, struct chg_dirty_set *s, struct watch *w, const char **why)
{
	struct stat st;
	if (w->lost)
		return give_up(t, why, "a file's links changed and tracking no longer knows its name", false);
	if (stat_rel(t, w->rel, &st) == 0 && st.st_ino == w->ino)
		return dirty_parent(s, w->rel) < 0 ? -ENOMEM : 0;
	int *v = realloc(t->ino->unres, (t->ino->n_unres + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	t->ino->unres = v;
	v[t->ino->n_unres++] = w->wd;
	return 0;
}

/* A directory moved away from rel: its watches, for read_end. */
static int moved_away(struct chg_inotify *in, uint32_t cookie, const char *rel)
{
	struct moved *mv = realloc(in->mv, (in->n_mv + 1) * sizeof(*mv));
	if (!mv)
		return -ENOMEM;
	in->mv = mv;
	struct moved *m = &mv[in->n_mv++];
	*m = (struct moved){ .cookie = cookie };
	size_t len = strlen(rel);
	for (size_t i = 0; i < in->cap; i++) {
		struct watch *w = &in->v[i];
		if (!w->wd || strncmp(w->rel, rel, len) || (w->rel[len] && w->rel[len] != '/'))
			continue;
		int *wds = realloc(m->wds, (m->n + 1) * sizeof(*wds));
		char **rels = wds ? realloc(m->rels, (m->n + 1) * sizeof(*rels)) : NULL;
		if (wds)
			m->wds = wds;
		if (!rels)
			return -ENOMEM;
		m->rels = rels;
		if (!(rels[m->n] = strdup(w->rel)))
			return -ENOMEM;
		wds[m->n++] = w->wd;
	}
	return 0;
}

static void moved_back(struct chg_inotify *in, uint32_t cookie)
{
	for (size_t i = 0; i < in->n_mv; i++)
		in->mv[i].cookie = in->mv[i].cookie == cookie ? 0 : in->mv[i].cookie;
}

/* An event of a directory's watch, on an entry named name or (name NULL)
 * on the directory itself. */
static int dir_event(struct chg_track *t, struct chg_dirty_set *s, const char *rel, const struct inotify_event *ev,
		     bool own, const char **why)
{
	char child[PATH_MAX];
	struct stat st;
	/* named as fanotify's are (pathindex.h): an event of the directory's
	 * own metadata names no entry; one of an entry names it, and says
	 * whether a name left (a delta then reads the previous layers) */
	const char *entry = ev->len && ev->name[0] ? ev->name : NULL;
	if (chg_dirty_add_name(s, rel, strlen(rel), entry) < 0)
		return -ENOMEM;
	s->v[s->n - 1].kept = !(ev->mask & (IN_DELETE | IN_MOVED_FROM));
	if (!entry)
		return 0;
	if (join(child, sizeof(child), rel, ev->name) < 0)
		return give_up(t, why, "a path of an event is too long", false);
	if (ev->mask & IN_ISDIR) {
		if ((ev->mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)) &&
		    chg_dirty_add(s, child, strlen(child), true) < 0)
			return -ENOMEM;
		if ((ev->mask & IN_MOVED_FROM) && moved_away(t->ino, ev->cookie, child) < 0)
			return -ENOMEM;
		if (ev->mask & IN_MOVED_TO)
			moved_back(t->ino, ev->cookie);
		return ev->mask & (IN_CREATE | IN_MOVED_TO) ? scan(t, child, s) : 0;
	}
	int r = ev->mask & (IN_CREATE | IN_MOVED_TO) ? entry_found(t, child, s) : 0;
	if (r < 0)
		return r;
	/* its last close after a write: it may have been written through a
	 * mapping with no new ctime (not ckptd's own writes) */
	if ((ev->mask & IN_CLOSE_WRITE) && !own && chg_suspect_add(&t->seen->sus, child) < 0)
		return -ENOMEM;
	/* an overlay upper: a write is reported under the name overlayfs
	 * first found a file of several names by, as with fanotify */
	if (!t->plain_dir && (ev->mask & ~(IN_DELETE | IN_MOVED_FROM | IN_ISDIR)) && stat_rel(t, child, &st) == 0 &&
	    !S_ISDIR(st.st_mode) && st.st_nlink > 1 && !(S_ISCHR(st.st_mode) && st.st_rdev == 0))
		return give_up(t, why, "a changed file has other names", false);
	return 0;
}

static int one_event(struct chg_track *t, struct chg_dirty_set *s, const struct inotify_event *ev, bool own,
		     const char **why)
{
	struct chg_inotify *in = t->ino;
	char rel[PATH_MAX];
	if (ev->mask & IN_Q_OVERFLOW)
		return give_up(t, why, "inotify queue overflowed", true);
	struct watch *w = map_get(in, ev->wd);
	if (!w)
		return 0; /* a watch removed since */
	if (ev->mask & IN_IGNORED) {
		if (ev->wd == in->root_wd)
			return give_up(t, why, "the root's watch went away", false);
		map_del(in, ev->wd);
		return 0;
	}
	if (!w->dir)
		return file_event(t, s, w, why);
	if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF))
		return ev->wd == in->root_wd ? give_up(t, why, "the root was moved or removed", false) : 0;
	snprintf(rel, sizeof(rel), "%s", w->rel); /* the map may grow below */
	int r = dir_event(t, s, rel, ev, own, why);
	if (r == -ENOSPC)
		return give_up(t, why, "inotify watch limit reached (fs.inotify.max_user_watches)", true);
	if (r == -ENOMEM)
		*why = "out of memory";
	return r < 0 && r != -EAGAIN ? (*why = *why ? *why : "a new directory could not be watched", -EAGAIN) : r;
}

/* The batch is read: directories moved out of the root lose their watches;
 * files whose link count changed are placed where their path names them
 * now, or, their name gone while they live on (open, or another name),
 * marked lost: another change of their links makes the caller walk. */
static int read_end(struct chg_track *t, struct chg_dirty_set *s)
{
	struct chg_inotify *in = t->ino;
	for (size_t i = 0; i < in->n_mv; i++) {
		struct moved *m = &in->mv[i];
		for (size_t k = 0; k < m->n; k++) {
			struct watch *w = m->cookie ? map_get(in, m->wds[k]) : NULL;
			if (w && !strcmp(w->rel, m->rels[k])) {
				inotify_rm_watch(in->fd, m->wds[k]);
				map_del(in, m->wds[k]);
			}
			free(m->rels[k]);
		}
		free(m->wds);
		free(m->rels);
	}
	in->n_mv = 0;
	int r = 0;
	for (size_t i = 0; i < in->n_unres; i++) {
		struct watch *w = map_get(in, in->unres[i]);
		struct stat st;
		if (!w)
			continue; /* removed: its directory has the event */
		if (dirty_parent(s, w->rel) < 0)
			r = -ENOMEM;
		if (stat_rel(t, w->rel, &st) == 0 && st.st_ino == w->ino)
			continue;
		/* its name went (a restore's rewrite, an unlink): with no other
		 * name in the root it is none of the root's business now */
		if (w->multi) {
			w->lost = true;
		} else {
			inotify_rm_watch(in->fd, w->wd);
			map_del(in, w->wd);
		}
	}
	in->n_unres = 0;
	return r;
}

int chg_inotify_read(struct chg_track *t, struct chg_dirty_set *s, bool own, const char **why)
{
	char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
	int ret = 0;
	for (;;) {
		ssize_t len = read(t->ino->fd, buf, sizeof(buf));
		if (len < 0 && errno == EAGAIN)
			return read_end(t, s) < 0 ? (*why = "out of memory", -EAGAIN) : ret;
		if (len < 0)
			return give_up(t, why, "reading inotify events failed", false);
		for (size_t off = 0; off + sizeof(struct inotify_event) <= (size_t)len;) {
			const struct inotify_event *ev = (const void *)(buf + off);
			if (off + sizeof(*ev) + ev->len > (size_t)len)
				return give_up(t, why, "an inotify event of unexpected shape", false);
			chg_track_count_events(1);
			const char *w = NULL;
			int r = one_event(t, s, ev, own, &w);
			if (r < 0 && !ret) /* the first reason; the rest is read for its suspects */
				ret = r, *why = w ? w : "out of memory";
			off += sizeof(*ev) + ev->len;
		}
	}
}
