/* overlay_delta.c: delta layers. A create after a tracked one on the same
 * upper need not copy the whole upper: its layer (the delta) holds only
 * what changed in the upper since the previous create, stacked on that
 * create's layers (the last full layer, then the deltas since, newest
 * first: the "previous layers" here). Change tracking (change_track.h)
 * names the directories that changed; each is made in the delta as the
 * upper has it, relative to the previous layers:
 *
 *   - a regular file changed since it was last copied (its inode, size or
 *     ctime differ from the index that copy left, or it is a suspect) is
 *     copied; an unchanged one is left to the previous layers;
 *   - every other non-directory (symlink, whiteout, fifo, device) is copied;
 *   - a name the previous layers show that the upper no longer has gets a
 *     whiteout;
 *   - directories are plain (never opaque, no redirect: the previous layers
 *     hold those of the upper), with the upper's metadata and xattrs.
 *
 * What a delta cannot say the same way answers -EAGAIN, and the caller
 * makes a full layer as before: a directory made, moved or removed since
 * the previous create (its opaque and redirect attributes would have to be
 * rewritten), a changed file of several names (hard links). Each dirty
 * directory is brought to the same result whatever the delta held before,
 * so the frozen pass runs it again for what changed since the first. */
#include "backend/overlay/overlay_internal.h"
#include "lib/walk.h"
#include "lib/xattr.h"

#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

/* Asked with a size of 0: a redirect is any length, and a short buffer
 * would give ERANGE, which reads as no redirect. */
#define DL_REDIRECT "trusted.overlay.redirect"

struct dl {
	const struct ovl_delta_opts *o;
	struct treecopy_stats *st;
	ckpt_error *err;
	char path[PATH_MAX]; /* the entry being looked at, relative */
	const struct pathindex_dirty *dirty;
	size_t n_dirty;
	bool known; /* the directory copied whole is in o->dirs already (a fold's) */
};

static int dl_fail(struct dl *t, int r, const char *what)
{
	if (r == -EAGAIN)
		return r;
	return err_set(t->err, -r, NULL, "delta layer: %s '%s': %s", what, t->path, strerror(-r));
}

/* rel ("" the top) below fd, a directory, without following symlinks. */
static int dl_open(int fd, const char *rel)
{
	struct open_how how = { .flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
				.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
	int r = (int)syscall(SYS_openat2, fd, *rel ? rel : ".", &how, sizeof(how));
	if (r < 0 && (errno == ENOSYS || errno == EPERM)) /* no openat2: the layers hold no symlinked dirs */
		r = openat(fd, *rel ? rel : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return r;
}

/* A directory of the delta takes the upper's: owner, mode, xattrs (none of
 * overlayfs's own: a plain one has none, and one copied whole keeps its
 * opaque mark, which hides the previous layers' entries; a user's escaped
 * ones are copied), times. */
static int dl_dir_meta(int ufd, int dfd)
{
	struct stat st;
	char names[XATTR_LIST_BUF];
	if (fstat(ufd, &st) < 0)
		return -errno;
	ssize_t n = flistxattr(dfd, names, sizeof(names));
	for (char *k = names; n > 0 && k < names + n; k += strlen(k) + 1)
		if (!ovl_own_xattr(k) && fremovexattr(dfd, k) < 0 && errno != ENODATA)
			return -errno;
	/* overlayfs's own xattrs are never set: set and removed, each was a
	 * journaled write (six calls a directory) */
	return treecopy_copy_meta_but(-1, -1, NULL, ufd, dfd, &st, ovl_own_xattr);
}

/* The delta's directory at rel, made with its parents where missing (each
 * with the upper's metadata); an fd to it, or < 0. *made (may be NULL):
 * rel itself was made here, its metadata the upper's already. */
static int dl_ensure_dir_made(struct dl *t, int dst, const char *rel, bool *made_last)
{
	if (made_last)
		*made_last = false;
	int d = dl_open(dst, rel);
	if (d >= 0 || errno != ENOENT)
		return d >= 0 ? d : -errno;
	_cleanup_free_ char *copy = strdup(rel);
	if (!copy)
		return -ENOMEM;
	int cur = openat(dst, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int ucur = openat(t->o->up, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char *save = NULL;
	int r = cur < 0 || ucur < 0 ? -errno : 0;
	for (char *part = strtok_r(copy, "/", &save); r == 0 && part; part = strtok_r(NULL, "/", &save)) {
		int u = openat(ucur, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (u < 0) {
			r = errno == ENOENT || errno == ENOTDIR ? -EAGAIN : -errno;
			break;
		}
		close(ucur);
		ucur = u;
		bool made = mkdirat(cur, part, 0700) == 0;
		if (!made && errno != EEXIST) {
			r = -errno;
			break;
		}
		int n = openat(cur, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (n < 0) {
			r = -errno;
			break;
		}
		close(cur);
		cur = n;
		if (made && (r = dl_dir_meta(ucur, cur)) < 0)
			break;
		if (made_last)
			*made_last = made;
	}
	if (ucur >= 0)
		close(ucur);
	if (r < 0) {
		if (cur >= 0)
			close(cur);
		return r;
	}
	return cur;
}

static int dl_ensure_dir(struct dl *t, int dst, const char *rel)
{
	return dl_ensure_dir_made(t, dst, rel, NULL);
}

/* Remove name from the delta's directory dfd, whatever it is. */
static int dl_remove(int dfd, const char *name)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (S_ISDIR(st.st_mode))
		return rm_rf_at(dfd, name);
	return unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
}

/* A copied file's data, and the upper's file it came from, sent to the disk
 * now, without waiting: the record's syncfs after the frozen pass then finds
 * them written or under way and mostly waits for the journal (0.35-0.7 ms
 * instead of 0.7-2 ms, 10 files changed at 10k). Errors are the syncfs's. */
static void dl_writeback_start(int in, int out)
{
	(void)sync_file_range(out, 0, 0, SYNC_FILE_RANGE_WRITE);
	(void)sync_file_range(in, 0, 0, SYNC_FILE_RANGE_WRITE);
}

/* The upper's entry name (st) into the delta, in place of what it held. */
static int dl_copy(struct dl *t, int ufd, int dfd, const char *name, const struct stat *st)
{
	int r = dl_remove(dfd, name);
	if (r < 0)
		return dl_fail(t, r, "remove");
	if (S_ISREG(st->st_mode)) {
		uint64_t copied = 0;
		_cleanup_close_ int in = openat(ufd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (in < 0)
			return dl_fail(t, errno == ENOENT ? -EAGAIN : -errno, "open");
		_cleanup_close_ int out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (out < 0)
			return dl_fail(t, -errno, "create");
		r = treecopy_file_data(in, out, st->st_size, &copied);
		if (r == 0)
			r = treecopy_copy_meta(ufd, dfd, name, in, out, st);
		if (r == 0 && t->o->early_writeback)
			dl_writeback_start(in, out);
		t->st->bytes_copied += copied;
	} else if (S_ISLNK(st->st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlinkat(ufd, name, target, sizeof(target) - 1);
		if (n < 0)
			return dl_fail(t, errno == ENOENT ? -EAGAIN : -errno, "readlink");
		target[n] = 0;
		r = symlinkat(target, dfd, name) < 0 ? -errno : treecopy_copy_meta(ufd, dfd, name, -1, -1, st);
	} else {
		r = mknodat(dfd, name, st->st_mode & (S_IFMT | 07777), st->st_rdev) < 0
			? -errno
			: treecopy_copy_meta(ufd, dfd, name, -1, -1, st);
	}
	if (r < 0)
		return dl_fail(t, r, "copy");
	t->st->files++;
	t->st->replaced++;
	return 0;
}

static int dl_whiteout(struct dl *t, int dfd, const char *name)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && treecopy_is_whiteout(&st))
		return 0;
	int r = dl_remove(dfd, name);
	if (r == 0 && mknodat(dfd, name, S_IFCHR | 0000, makedev(0, 0)) < 0)
		r = -errno;
	if (r < 0)
		return dl_fail(t, r, "whiteout");
	t->st->replaced++;
	return 0;
}

void overlay_delta_names_free(struct ovl_names *ns)
{
	for (size_t i = 0; i < ns->n; i++)
		free(ns->v[i]);
	free(ns->v);
	*ns = (struct ovl_names){ 0 };
}

static int dl_names_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Add the names of directory fd (-1: none) to ns; sorted and unique after. */
int overlay_delta_names_read(int fd, struct ovl_names *ns)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	if (fd < 0)
		return 0;
	int r = walk_open(fd, NULL, &d);
	while (r == 0 && (de = walk_next(d))) {
		if (ns->n == ns->cap) {
			size_t cap = ns->cap ? 2 * ns->cap : 64;
			char **v = realloc(ns->v, cap * sizeof(*v));
			if (!v)
				return -ENOMEM;
			ns->v = v;
			ns->cap = cap;
		}
		if (!(ns->v[ns->n] = strdup(de->d_name)))
			return -ENOMEM;
		ns->n++;
	}
	if (r < 0)
		return r;
	if (ns->n)
		qsort(ns->v, ns->n, sizeof(*ns->v), dl_names_cmp);
	size_t k = 0;
	for (size_t i = 0; i < ns->n; i++) {
		if (k && !strcmp(ns->v[k - 1], ns->v[i])) {
			free(ns->v[i]);
			continue;
		}
		ns->v[k++] = ns->v[i];
	}
	ns->n = k;
	return 0;
}

bool overlay_delta_names_has(const struct ovl_names *ns, const char *name)
{
	return ns->n && bsearch(&name, ns->v, ns->n, sizeof(*ns->v), dl_names_cmp);
}

/* The names a dirty directory's events gave (sorted, each once) into ns. */
static int dl_names_copy(const struct pathindex_dirty *d, struct ovl_names *ns)
{
	ns->v = d->n_names ? calloc(d->n_names, sizeof(*ns->v)) : NULL;
	if (d->n_names && !ns->v)
		return -ENOMEM;
	ns->cap = d->n_names;
	for (; ns->n < d->n_names; ns->n++)
		if (!(ns->v[ns->n] = strdup(d->names[ns->n])))
			return -ENOMEM;
	return 0;
}

static int dl_push(struct dl *t, const char *dir, const char *name)
{
	int n = snprintf(t->path, sizeof(t->path), "%s%s%s", dir, *dir ? "/" : "", name);
	return n < 0 || (size_t)n >= sizeof(t->path) ? -ENAMETOOLONG : 0;
}

/* What the previous layers show at name in their directories pfd: the
 * newest layer holding it decides. 0 with *st, or -ENOENT. */
static int dl_prev(const int *pfd, size_t n, const char *name, struct stat *st)
{
	for (size_t j = 0; j < n; j++)
		if (pfd[j] >= 0 && fstatat(pfd[j], name, st, AT_SYMLINK_NOFOLLOW) == 0)
			return 0;
	return -ENOENT;
}

static int dl_new_dir(struct dl *t, int dst, const char *rel);

/* gVisor: the newest previous layer's copy of path has the xattrs the
 * upper's name has (an xattr change there moves no ctime). */
static bool dl_prev_same_xattrs(const struct ovl_delta_opts *o, int ufd, const char *name, const char *path)
{
	for (size_t i = 0; i < o->n_prev; i++)
		if (o->prev[i] >= 0 && faccessat(o->prev[i], path, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
			return treecopy_same_xattrs(ufd, name, o->prev[i], path);
	return false;
}

/* The previous layers' copies of rel into pfd (newest first; -1 where one
 * holds none), those not opened yet. */
static void dl_prev_all(const struct ovl_delta_opts *o, const char *rel, int *pfd, size_t np)
{
	for (size_t j = 0; j < np; j++)
		if (pfd[j] == -2)
			pfd[j] = dl_open(o->prev[j], rel);
}

/* Whether a previous layer holds rel: all opened (all), else from the
 * oldest until one does (-2: not opened yet). */
static bool dl_prev_held(const struct ovl_delta_opts *o, const char *rel, int *pfd, size_t np, bool all)
{
	bool held = false;
	for (size_t j = 0; j < np; j++)
		pfd[j] = -2;
	if (all)
		dl_prev_all(o, rel, pfd, np);
	for (size_t j = np; j-- > 0 && !held;)
		held = (pfd[j] = pfd[j] == -2 ? dl_open(o->prev[j], rel) : pfd[j]) >= 0;
	return held;
}

/* One dirty directory rel: the delta's copy of it made what the upper's is,
 * relative to the previous layers. */
static int dl_dir(struct dl *t, int dst, const char *rel)
{
	const struct ovl_delta_opts *o = t->o;
	snprintf(t->path, sizeof(t->path), "%s", rel);
	_cleanup_close_ int ufd = dl_open(o->up, rel);
	if (ufd < 0)
		return errno == ENOENT || errno == ENOTDIR ? -EAGAIN : dl_fail(t, -errno, "open");
	int pfd[OVL_DELTA_MAX + 1];
	size_t np = o->n_prev < ARRAY_SIZE(pfd) ? o->n_prev : ARRAY_SIZE(pfd);
	struct ovl_names un = { 0 }, pn = { 0 }, dn = { 0 };
	int r = 0;
	/* no name left it since the last collect: the previous layers (the
	 * upper at that collect) and an earlier pass of this delta hold no name
	 * the upper lacks, and reading them is most of a small delta's cost */
	const struct pathindex_dirty *self = pathindex_dirty_find(t->dirty, t->n_dirty, rel);
	bool kept = self && self->kept && !self->deep;
	/* the previous layers' copies of rel: a kept one needs only to know
	 * that one holds it (the full layer, oldest, mostly does); the others
	 * are opened when an entry is a directory (dl_prev_all) */
	bool held = dl_prev_held(o, rel, pfd, np, !kept);
	if (!held) { /* made since the previous create, its parent not dirty: copied whole */
		for (size_t j = 0; j < np; j++)
			if (pfd[j] >= 0)
				close(pfd[j]);
		return dl_new_dir(t, dst, rel);
	}
	bool made = false;
	int dfd = dl_ensure_dir_made(t, dst, rel, &made);
	if (dfd < 0)
		r = dl_fail(t, dfd, "make directory");
	if (r == 0 && !made && (r = dl_dir_meta(ufd, dfd)) < 0)
		dl_fail(t, r, "directory metadata");
	/* and when the events name every entry that changed, those are all it
	 * compares: the others are what the previous layers hold */
	if (r == 0 && kept && self->named)
		r = dl_names_copy(self, &un);
	else if (r == 0)
		r = overlay_delta_names_read(ufd, &un);
	for (size_t j = 0; r == 0 && !kept && j < np; j++)
		r = overlay_delta_names_read(pfd[j], &pn);
	if (r == 0 && !kept)
		r = overlay_delta_names_read(dfd, &dn);
	if (r < 0 && r != -EAGAIN)
		dl_fail(t, r, "read directory");
	for (size_t i = 0; r == 0 && i < un.n; i++) {
		const char *name = un.v[i];
		struct stat st, ps;
		if ((r = dl_push(t, rel, name)) < 0)
			break;
		if (fstatat(ufd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = errno == ENOENT ? -EAGAIN : dl_fail(t, -errno, "stat");
			break;
		}
		if (S_ISDIR(st.st_mode)) { /* the same directory the previous layers hold, metadata of its own */
			const struct pathindex_dirty *e = pathindex_dirty_find(t->dirty, t->n_dirty, t->path);
			if (e && e->deep)
				continue; /* made or moved here: copied whole (dl_new_dir) */
			dl_prev_all(o, rel, pfd, np);
			if (dl_prev(pfd, np, name, &ps) < 0 || !S_ISDIR(ps.st_mode)) {
				/* new since the previous create: copied whole by an earlier
				 * pass of this delta (then its own events say what changed in
				 * it), else now */
				struct stat ds;
				if (fstatat(dfd, name, &ds, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(ds.st_mode))
					continue;
				char sub[PATH_MAX];
				snprintf(sub, sizeof(sub), "%s", t->path);
				if ((r = dl_new_dir(t, dst, sub)) < 0)
					break;
				continue;
			}
			if (mkdirat(dfd, name, 0700) < 0 && errno != EEXIST) {
				r = dl_fail(t, -errno, "make directory");
				break;
			}
			_cleanup_close_ int u = openat(ufd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			_cleanup_close_ int d = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			r = u < 0 || d < 0 ? -EAGAIN : dl_dir_meta(u, d);
			continue;
		}
		if (S_ISREG(st.st_mode)) {
			if (st.st_nlink > 1) {
				r = -EAGAIN;
				break;
			}
			bool sus = pathindex_has(o->suspects, t->path);
			bool same = !sus &&
				(pathindex_has(o->dix, t->path) ? pathindex_match(o->dix, t->path, &st)
								: pathindex_match(o->ix, t->path, &st)) &&
				(!o->xattrs_keep_ctime || dl_prev_same_xattrs(o, ufd, name, t->path));
			if (same)
				continue;
			if ((r = dl_copy(t, ufd, dfd, name, &st)) < 0)
				break;
			r = sus ? pathindex_put_untrusted(o->dix, t->path, &st) : pathindex_put(o->dix, t->path, &st);
			if (r == 0 && sus) /* a full layer must not link it from the last one either */
				r = pathindex_put_untrusted(o->ix, t->path, &st);
			continue;
		}
		r = dl_copy(t, ufd, dfd, name, &st);
	}
	/* names gone from the upper: hidden, unless the previous layers do */
	for (size_t i = 0; r == 0 && i < pn.n; i++) {
		struct stat ps;
		if (overlay_delta_names_has(&un, pn.v[i]) || (r = dl_push(t, rel, pn.v[i])) < 0)
			continue;
		if (dl_prev(pfd, np, pn.v[i], &ps) < 0)
			continue;
		if (treecopy_is_whiteout(&ps) && (r = dl_remove(dfd, pn.v[i])) < 0)
			dl_fail(t, r, "remove");
		else if (!treecopy_is_whiteout(&ps))
			r = dl_whiteout(t, dfd, pn.v[i]);
	}
	/* what an earlier pass put in the delta for names gone since */
	for (size_t i = 0; r == 0 && i < dn.n; i++)
		if (!overlay_delta_names_has(&un, dn.v[i]) && !overlay_delta_names_has(&pn, dn.v[i]) &&
		    (r = dl_remove(dfd, dn.v[i])) < 0)
			dl_fail(t, r, "remove");
	overlay_delta_names_free(&un);
	overlay_delta_names_free(&pn);
	overlay_delta_names_free(&dn);
	for (size_t j = 0; j < np; j++)
		if (pfd[j] >= 0)
			close(pfd[j]);
	if (dfd >= 0)
		close(dfd);
	return r;
}

/* Every directory of the delta takes the upper's times again, children
 * first: making or changing entries in a directory moved its mtime. Each
 * directory's data is its twin in the upper; one the delta has and the
 * upper lacks is -EAGAIN. */
static int dl_times_set(int up, int dfd)
{
	struct stat st;
	if (fstat(up, &st) < 0)
		return -errno;
	struct timespec ts[2] = { st.st_atim, st.st_mtim };
	return futimens(dfd, ts) < 0 ? -errno : 0;
}

static int dl_times_pre(void *ctx, struct walk_entry *e)
{
	(void)ctx;
	int u = openat((int)e->parent->data, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	e->data = u;
	return u < 0 ? -EAGAIN : 0;
}

static int dl_times_post(void *ctx, struct walk_entry *e)
{
	(void)ctx;
	int r = e->err ? e->err : dl_times_set((int)e->data, e->fd);
	close((int)e->data);
	return r;
}

/* A directory gone from the delta (ENOENT) or replaced (ENOTDIR) has no
 * times to take. Any other failure (EMFILE, EIO, past the depth bound)
 * fails the create: the directory would keep the create's times, not the
 * upper's, and a restore would bring back the wrong ones. */
static int dl_times_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return err == -ENOENT || err == -ENOTDIR ? 0 : err;
}

static int dl_times(int up, int dfd)
{
	struct walk_opts o = {
		.flags = WALK_DIRS, .data = up, .pre = dl_times_pre, .post = dl_times_post, .fail = dl_times_fail
	};
	int r = walk_tree(dfd, NULL, &o);
	return r < 0 ? r : dl_times_set(up, dfd);
}

/* Below a directory new in the upper: no redirect (a directory moved in
 * from elsewhere, whose lower half the previous layers would shadow), no
 * file of several names; each regular file into dix, each directory into
 * dirs. */
static int dl_scan_pre(void *ctx, struct walk_entry *e)
{
	struct dl *t = ctx;
	struct xattr_ref x;
	if (S_ISREG(e->st.st_mode))
		return e->st.st_nlink > 1 ? -EAGAIN : pathindex_put(t->o->dix, e->path, &e->st);
	if (!S_ISDIR(e->st.st_mode))
		return 0;
	xattr_ref_init(&x, -1, e->dirfd, e->name);
	if (xattr_get(&x, DL_REDIRECT, NULL, 0) >= 0)
		return -EAGAIN;
	return t->o->dirs && overlay_delta_dirs_add(t->o->dirs, e->path, &e->st) < 0 ? -ENOMEM : 0;
}

/* An entry that cannot be stat'ed, opened or read here is the full walk's
 * to judge (-EAGAIN: a full layer). A read error too: a directory listed
 * in part would leave those below it out of dirs, and their metadata
 * uncompared by the next deltas. */
static int dl_scan_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return err == -ELOOP || err == -ENAMETOOLONG ? err : -EAGAIN;
}

static int dl_scan_new(struct dl *t, int fd)
{
	struct stat st;
	if (fgetxattr(fd, DL_REDIRECT, NULL, 0) >= 0 || fstat(fd, &st) < 0)
		return -EAGAIN;
	if (t->o->dirs && !t->known && overlay_delta_dirs_add(t->o->dirs, t->path, &st) < 0)
		return -ENOMEM;
	struct walk_opts o = { .flags = WALK_STAT,
			       .path_max = sizeof(t->path) - 1,
			       .prefix = t->path,
			       .pre = dl_scan_pre,
			       .fail = dl_scan_fail,
			       .ctx = t };
	return walk_tree(fd, NULL, &o);
}

/* A directory made or moved into place since the previous create (deep):
 * copied whole, as the upper has it (opaque included). Right when the
 * previous layers hold nothing there, or it is opaque and hides what they
 * hold; else -EAGAIN. Gone since: its parent's pass hides it. */
static int dl_new_dir(struct dl *t, int dst, const char *rel)
{
	const struct ovl_delta_opts *o = t->o;
	snprintf(t->path, sizeof(t->path), "%s", rel);
	_cleanup_close_ int ufd = dl_open(o->up, rel);
	if (ufd < 0)
		return errno == ENOENT || errno == ENOTDIR ? 0 : dl_fail(t, -errno, "open");
	char v[8];
	ssize_t k = fgetxattr(ufd, "trusted.overlay.opaque", v, sizeof(v));
	bool opaque = k > 0 && v[0] == 'y';
	_cleanup_free_ char *copy = strdup(rel);
	if (!copy)
		return -ENOMEM;
	char *slash = strrchr(copy, '/');
	const char *base = slash ? slash + 1 : copy;
	if (slash)
		*slash = '\0';
	const char *parent = slash ? copy : "";
	for (size_t j = 0; !opaque && j < o->n_prev; j++) {
		struct stat ps;
		_cleanup_close_ int pd = dl_open(o->prev[j], parent);
		if (pd >= 0 && fstatat(pd, base, &ps, AT_SYMLINK_NOFOLLOW) == 0)
			return -EAGAIN; /* would merge with what they hold there */
	}
	int r = dl_scan_new(t, ufd);
	snprintf(t->path, sizeof(t->path), "%s", rel);
	if (r < 0)
		return r == -EAGAIN ? r : dl_fail(t, r, "read new directory");
	_cleanup_close_ int pfd = dl_ensure_dir(t, dst, parent);
	if (pfd < 0)
		return dl_fail(t, pfd, "make directory");
	if ((r = dl_remove(pfd, base)) < 0 || (mkdirat(pfd, base, 0700) < 0 && (r = -errno)))
		return dl_fail(t, r, "make directory");
	_cleanup_close_ int dfd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return dl_fail(t, -errno, "open");
	struct treecopy_opts co = { .mode = TREECOPY_NEW, .prev_fd = -1 };
	struct treecopy_stats cs = { 0 };
	r = treecopy_copy(ufd, dfd, &co, &cs, t->err);
	t->st->files += cs.files;
	t->st->bytes_copied += cs.bytes_copied;
	t->st->replaced += cs.files + 1;
	return r;
}

int overlay_delta_dirs(const struct ovl_delta_opts *o, int dst, const struct pathindex_dirty *dirty, size_t n,
		       struct treecopy_stats *st, ckpt_error *err)
{
	struct dl t = { .o = o, .st = st, .err = err, .dirty = dirty, .n_dirty = n };
	if (!o->n_prev || o->n_prev > OVL_DELTA_MAX + 1)
		return -EAGAIN;
	for (size_t i = 0; i < n; i++) {
		if (pathindex_dirty_below_deep(dirty, n, dirty[i].path))
			continue; /* in a directory copied whole */
		t.known = dirty[i].known;
		int r = dirty[i].deep ? dl_new_dir(&t, dst, dirty[i].path) : dl_dir(&t, dst, dirty[i].path);
		if (r < 0)
			return r;
	}
	return 0; /* the times: overlay_delta_dir_meta, which every delta's frozen pass ends with */
}

int overlay_delta_dir_meta(const struct ovl_delta_opts *o, int dst, struct ovl_delta_dirs *dirs,
			   struct treecopy_stats *st, ckpt_error *err)
{
	struct dl t = { .o = o, .st = st, .err = err };
	if (!dirs->looked)
		overlay_delta_dir_look(o->up, dirs);
	dirs->looked = false; /* each pass looks again */
	for (size_t i = 0; i < dirs->n; i++) {
		struct ovl_dmeta *m = &dirs->v[i];
		if (!m->changed)
			continue;
		m->changed = false;
		snprintf(t.path, sizeof(t.path), "%s", m->path);
		_cleanup_close_ int u = dl_open(o->up, m->path);
		_cleanup_close_ int d = dl_ensure_dir(&t, dst, m->path);
		int r = u < 0 ? -EAGAIN : d < 0 ? d : dl_dir_meta(u, d);
		if (r < 0)
			return dl_fail(&t, r, "directory metadata");
		m->mode = m->now.mode, m->uid = m->now.uid, m->gid = m->now.gid, m->mtim = m->now.mtim;
		st->replaced++;
	}
	int r = dl_times(o->up, dst);
	return r < 0 ? dl_fail(&t, r, "directory times") : 0;
}

int overlay_delta_dirs_add(struct ovl_delta_dirs *d, const char *rel, const struct stat *s)
{
	if (d->n == d->cap) {
		size_t cap = d->cap ? 2 * d->cap : 256;
		struct ovl_dmeta *v = realloc(d->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		d->v = v;
		d->cap = cap;
	}
	char *p = strdup(rel);
	if (!p)
		return -ENOMEM;
	d->v[d->n] = (struct ovl_dmeta){
		.path = p, .mode = s->st_mode, .uid = s->st_uid, .gid = s->st_gid, .mtim = s->st_mtim
	};
	d->n++;
	return 0;
}

static int dl_dirs_pre(void *ctx, struct walk_entry *e)
{
	return overlay_delta_dirs_add(ctx, e->path, &e->st);
}

/* A directory gone (ENOENT) or replaced (ENOTDIR) since its parent listed
 * it is left out. Any other failure (EMFILE, EIO) fails the read: a
 * directory missing from the list is one whose own metadata the next
 * deltas never compare, so a chmod of it would be lost. */
static int dl_dirs_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return err == -ENOENT || err == -ENOTDIR ? 0 : err;
}

int overlay_delta_dirs_read(int layer_fd, struct ovl_delta_dirs *out)
{
	struct stat s;
	struct walk_opts o = { .flags = WALK_DIRS | WALK_STAT,
			       .path_max = PATH_MAX - 1,
			       .pre = dl_dirs_pre,
			       .fail = dl_dirs_fail,
			       .ctx = out };
	int r = fstat(layer_fd, &s) < 0 ? -errno : overlay_delta_dirs_add(out, "", &s);
	if (r == 0)
		r = walk_tree(layer_fd, NULL, &o);
	if (r < 0)
		overlay_delta_dirs_free(out);
	return r;
}

void overlay_delta_dirs_free(struct ovl_delta_dirs *d)
{
	overlay_delta_dir_look_drop(d);
	for (size_t i = 0; i < d->n; i++)
		free(d->v[i].path);
	free(d->v);
	*d = (struct ovl_delta_dirs){ 0 };
}

void overlay_delta_reset(struct ovl_root *r)
{
	pathindex_dirty_free(TAKE_PTR(r->rebase), r->n_rebase);
	r->n_rebase = 0;
	r->stack.n = 0;
	pathindex_free(TAKE_PTR(r->dix));
	overlay_delta_dirs_free(&r->ddirs);
	chg_track_disarm(&r->trk);
}

bool overlay_delta_ready(struct ovl_root *r)
{
	size_t n = r->stack.n;
	return n && n <= OVL_DELTA_MAX && r->dix && r->ix && r->ddirs.n && chg_track_armed(&r->trk);
}
