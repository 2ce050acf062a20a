/* overlay_flatten.c: merge a chain of layers into one layer that mounts over
 * base as the chain did. Directories are resolved the way overlayfs looks
 * them up (opaque dirs, whiteouts, relative and absolute redirects, also on
 * intermediate components), top layer first, so a directory renamed in one
 * layer takes along what older layers held under its old name. Files are
 * shared with the source layers by hard links: layers are immutable. */
#include "backend/overlay/overlay_internal.h"
#include "lib/strset.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#define FL_REDIRECT "trusted.overlay.redirect"
#define FL_OPAQUE "trusted.overlay.opaque"

struct fl {
	const int *lfd; /* layer fds, newest first */
	size_t n;       /* layers; index n stands for base, which is never read */
	ckpt_error *err;
};

/* One directory of the result: where it is in each layer (relative to the
 * layer's root, "" for the root) or NULL, and at [n] the path base is asked
 * for (NULL when the lookup stopped above base). */
struct fl_dir {
	char **at;
};

/* An overlayfs lookup in progress: the name to find (absolute when it starts
 * with '/'), and whether lower layers are still consulted. */
struct fl_look {
	char *name;
	bool stop;
};

static void fl_dir_free(struct fl *f, struct fl_dir *d)
{
	for (size_t k = 0; d->at && k <= f->n; k++)
		free(d->at[k]);
	free(d->at);
}

static char *fl_join(const char *a, const char *b, size_t blen)
{
	char *r = NULL;
	if (asprintf(&r, "%s%s%.*s", a, *a ? "/" : "", (int)blen, b) < 0)
		return NULL;
	return r;
}

static ssize_t fl_xattr(int lfd, const char *path, const char *key, char *buf, size_t len)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "/proc/self/fd/%d/%s", lfd, path);
	ssize_t n = lgetxattr(p, key, buf, len - 1);
	buf[n > 0 ? n : 0] = 0;
	return n;
}

/* A redirect found on a dir: absolute replaces the whole name, relative the
 * component just looked up; the rest of the path (post) follows. */
static int fl_redirect(struct fl_look *d, const char *rd, size_t prelen, const char *post)
{
	char *nn = NULL;
	if (rd[0] == '/' ? asprintf(&nn, "%s%s", rd, post) < 0
			 : asprintf(&nn, "%.*s%s%s", (int)prelen, d->name, rd, post) < 0)
		return -ENOMEM;
	free(d->name);
	d->name = nn;
	return 0;
}

/* ovl_lookup_single: component (s, len) in dir at of layer k. Returns 1 with
 * *ret the path of a directory found, 0 when absent or stopped. */
static int fl_single(struct fl *f, size_t k, const char *at, const char *s, size_t len, size_t prelen, const char *post,
		     struct fl_look *d, char **ret)
{
	struct stat st;
	char v[PATH_MAX];
	_cleanup_free_ char *p = fl_join(at, s, len);
	*ret = NULL;
	if (!p)
		return -ENOMEM;
	if (fstatat(f->lfd[k], p, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT || errno == ENAMETOOLONG ? 0 : -errno;
	if (!S_ISDIR(st.st_mode)) { /* whiteout or non-dir: nothing below shows */
		d->stop = true;
		return 0;
	}
	if (fl_xattr(f->lfd[k], p, FL_OPAQUE, v, sizeof(v)) == 1 && v[0] == 'y')
		d->stop = true;
	else if (fl_xattr(f->lfd[k], p, FL_REDIRECT, v, sizeof(v)) > 0 && fl_redirect(d, v, prelen, post) < 0)
		return -ENOMEM;
	*ret = TAKE_PTR(p);
	return 1;
}

/* ovl_lookup_layer: d->name in layer k, from dir at (relative name) or from
 * the layer's root (absolute name, walked component by component). */
static int fl_lookup_layer(struct fl *f, size_t k, const char *at, struct fl_look *d, char **ret)
{
	*ret = NULL;
	if (d->name[0] != '/')
		return fl_single(f, k, at, d->name, strlen(d->name), 0, "", d, ret);
	_cleanup_free_ char *cur = strdup("");
	size_t rem = strlen(d->name) - 1; /* counted from the end: a redirect changes the prefix */
	while (cur) {
		size_t total = strlen(d->name);
		const char *s = d->name + total - rem, *next = strchrnul(s, '/');
		size_t len = next - s;
		bool end = !*next;
		_cleanup_free_ char *post = strdup(next), *found = NULL;
		if (!post)
			return -ENOMEM;
		int q = fl_single(f, k, cur, s, len, total - rem, post, d, &found);
		if (q <= 0)
			return q;
		free(cur);
		cur = TAKE_PTR(found);
		if (end) {
			*ret = TAKE_PTR(cur);
			return 1;
		}
		rem -= len + 1;
	}
	return -ENOMEM;
}

/* Where child `name` of dir p lives in each layer, its topmost copy being in
 * layer top: overlayfs' lookup through p's stack of layer dirs. */
static int fl_resolve(struct fl *f, const struct fl_dir *p, const char *name, size_t top, struct fl_dir *c)
{
	struct fl_look d = { strdup(name), false };
	c->at = calloc(f->n + 1, sizeof(*c->at));
	int q = d.name && c->at ? 0 : -ENOMEM;
	for (size_t k = top; q >= 0 && !d.stop && k < f->n; k++) {
		bool abs = d.name[0] == '/';
		if (!abs && !p->at[k])
			continue;
		q = fl_lookup_layer(f, k, abs ? "" : p->at[k], &d, &c->at[k]);
	}
	if (q >= 0 && !d.stop) {
		if (d.name[0] == '/')
			c->at[f->n] = strdup(d.name + 1);
		else if (p->at[f->n])
			c->at[f->n] = fl_join(p->at[f->n], d.name, strlen(d.name));
	}
	free(d.name);
	return q < 0 ? q : 0;
}

/* The merged dir's own overlay xattrs: opaque when base is not consulted,
 * an absolute redirect when base is asked for another path than its own. */
static int fl_dir_xattrs(struct fl *f, const struct fl_dir *p, const char *name, const struct fl_dir *c, int fd)
{
	if (fremovexattr(fd, FL_REDIRECT) < 0 && errno != ENODATA)
		return -errno;
	if (fremovexattr(fd, FL_OPAQUE) < 0 && errno != ENODATA)
		return -errno;
	const char *b = c->at[f->n];
	if (!b)
		return fsetxattr(fd, FL_OPAQUE, "y", 1, 0) < 0 ? -errno : 0;
	_cleanup_free_ char *same = p->at[f->n] ? fl_join(p->at[f->n], name, strlen(name)) : NULL;
	if (same && !strcmp(same, b))
		return 0;
	_cleanup_free_ char *rd = NULL;
	if (asprintf(&rd, "/%s", b) < 0)
		return -ENOMEM;
	return fsetxattr(fd, FL_REDIRECT, rd, strlen(rd), 0) < 0 ? -errno : 0;
}

static int fl_merge_dir(struct fl *f, const struct fl_dir *d, int dst, const char *where);

/* The flatten's own recursion, not walk_merge's (src/lib/walk.c): below a
 * directory each layer holds its part at a path of its own (a redirect
 * renames it in the layers under the one holding the redirect, also on an
 * intermediate component; an opaque one cuts them off), found by
 * fl_resolve as overlayfs looks it up. walk_merge goes down every tree by
 * the same name. Its depth is bounded by the length of those paths: a
 * lookup past PATH_MAX fails. */
static int fl_subdir(struct fl *f, const struct fl_dir *p, const char *name, size_t top, int dst)
{
	struct fl_dir c = { 0 };
	struct stat st;
	int q = fl_resolve(f, p, name, top, &c);
	if (q == 0 && mkdirat(dst, name, 0700) < 0)
		q = -errno;
	_cleanup_close_ int s =
		q == 0 ? openat(f->lfd[top], c.at[top], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
	_cleanup_close_ int o = q == 0 ? openat(dst, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
	if (q == 0 && (s < 0 || o < 0 || fstat(s, &st) < 0))
		q = -errno;
	if (q == 0)
		q = fl_merge_dir(f, &c, o, c.at[top]);
	if (q == 0 && (q = treecopy_copy_meta(-1, -1, NULL, s, o, &st)) == 0)
		q = fl_dir_xattrs(f, p, name, &c, o);
	fl_dir_free(f, &c);
	return q;
}

/* A copy where a hard link is refused (EMLINK: a file shared by too many layers). */
static int fl_copy_file(int sfd, const char *name, int dst, const struct stat *st)
{
	uint64_t copied;
	_cleanup_close_ int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_close_ int out =
		in < 0 ? -1 : openat(dst, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (in < 0 || out < 0)
		return -errno;
	int q = treecopy_file_data(in, out, st->st_size, &copied);
	return q < 0 ? q : treecopy_copy_meta(-1, -1, NULL, in, out, st);
}

/* The entry shown for name, from its topmost layer. */
static int fl_entry(struct fl *f, const struct fl_dir *d, int sfd, const char *name, size_t top, int dst)
{
	struct stat st;
	if (fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (S_ISDIR(st.st_mode))
		return fl_subdir(f, d, name, top, dst);
	if (treecopy_is_whiteout(&st))
		return mknodat(dst, name, S_IFCHR | 0600, makedev(0, 0)) < 0 ? -errno : 0;
	if (linkat(sfd, name, dst, name, 0) == 0)
		return 0;
	return errno == EMLINK && S_ISREG(st.st_mode) ? fl_copy_file(sfd, name, dst, &st) : -errno;
}

static int fl_merge_layer(struct fl *f, const struct fl_dir *d, size_t k, struct strset *seen, int dst)
{
	_cleanup_closedir_ DIR *dir = NULL;
	int fd = openat(f->lfd[k], *d->at[k] ? d->at[k] : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || !(dir = fdopendir(fd))) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return -e;
	}
	struct dirent *de;
	while ((errno = 0, de = readdir(dir))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		int q = strset_add(seen, de->d_name); /* 0: a layer above holds it */
		if (q <= 0) {
			if (q < 0)
				return q;
			continue;
		}
		q = fl_entry(f, d, dirfd(dir), de->d_name, k, dst);
		if (q < 0)
			return q;
	}
	return -errno;
}

/* Every name of d's layer dirs, its topmost entry winning. */
static int fl_merge_dir(struct fl *f, const struct fl_dir *d, int dst, const char *where)
{
	_cleanup_(strset_free) struct strset seen = { 0 };
	int q = 0;
	for (size_t k = 0; q == 0 && k < f->n; k++)
		if (d->at[k])
			q = fl_merge_layer(f, d, k, &seen, dst);
	if (q < 0 && !f->err->msg[0])
		err_set(f->err, -q, NULL, "flatten '%s': %s", *where ? where : ".", strerror(-q));
	return q;
}

int overlay_flatten(const int *lfd, size_t n, int dst, ckpt_error *err)
{
	struct fl f = { lfd, n, err };
	struct fl_dir root = { calloc(n + 1, sizeof(char *)) };
	struct stat st;
	int q = root.at ? 0 : -ENOMEM;
	for (size_t k = 0; q == 0 && k <= n; k++)
		if (!(root.at[k] = strdup("")))
			q = -ENOMEM;
	err->msg[0] = 0;
	if (q == 0)
		q = fl_merge_dir(&f, &root, dst, "");
	if (q == 0 && n && fstat(lfd[0], &st) == 0)
		q = treecopy_copy_meta(-1, -1, NULL, lfd[0], dst, &st);
	fl_dir_free(&f, &root);
	if (q < 0 && !err->msg[0])
		err_set(err, -q, NULL, "flatten: %s", strerror(-q));
	return q;
}
