/* oci_clone.c: a tree made from an immutable one by hard links, so a pull
 * can start from a checkpoint it already holds and apply only the layers
 * that checkpoint lacks. Files are never written in place afterwards: an
 * applied layer replaces a file (unlink, create), so sharing inodes with
 * the checkpoint's own tree is safe, as layers already share them.
 * Directories, symlinks and fifos are made anew with the same metadata. */
#include "engine/oci_clone.h"

#include <sys/stat.h>

#include "engine/engine_xfer.h"
#include "lib/walk.h"
#include "lib/xattr.h"

static int clone_xattrs(int sdir, const char *sname, int ddir, const char *dname)
{
	char list[XATTR_LIST_BUF], val[XATTR_VALUE_BUF];
	struct xattr_ref s, d;
	xattr_ref_init(&s, -1, sdir, sname);
	xattr_ref_init(&d, -1, ddir, dname);
	ssize_t n = xattr_list(&s, list, sizeof(list));
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(list + i) + 1) {
		ssize_t k = xattr_get(&s, list + i, val, sizeof(val));
		if (k >= 0 && xattr_set(&d, list + i, val, (size_t)k) < 0 && errno != ENOTSUP && errno != EPERM)
			return -errno;
	}
	return n < 0 && errno != ENOTSUP && errno != ENODATA ? -errno : 0;
}

/* Owner, mode, xattrs, then times: the order a copy must keep. */
static int clone_meta(int sdir, const char *name, int ddir, const struct stat *st)
{
	struct timespec ts[2] = { st->st_atim, st->st_mtim };
	if (fchownat(ddir, name, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!S_ISLNK(st->st_mode) && fchmodat(ddir, name, st->st_mode & 07777, 0) < 0)
		return -errno;
	int q = clone_xattrs(sdir, name, ddir, name);
	if (q == 0 && utimensat(ddir, name, ts, AT_SYMLINK_NOFOLLOW) < 0)
		q = -errno;
	return q;
}

/* A copy where a link cannot be (another filesystem, too many links). */
static int clone_copy(int sdir, int ddir, const char *name, const struct stat *st)
{
	_cleanup_close_ int in = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_close_ int out = in < 0 ? -1 : openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (out < 0)
		return -errno;
	for (off_t left = st->st_size; left > 0;) {
		ssize_t k = copy_file_range(in, NULL, out, NULL, (size_t)left, 0);
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		left -= k;
	}
	return clone_meta(sdir, name, ddir, st);
}

/* One entry of the source, made in its directory's clone (the parent's
 * data). A directory is made here; its metadata waits for post. */
static int clone_pre(void *ctx, struct walk_entry *e)
{
	(void)ctx;
	int dfd = (int)e->parent->data, sfd = e->dirfd;
	const struct stat *st = &e->st;
	char t[PATH_MAX];
	if (S_ISREG(st->st_mode)) {
		if (linkat(sfd, e->name, dfd, e->name, 0) == 0)
			return 0;
		return errno == EXDEV || errno == EMLINK || errno == EPERM ? clone_copy(sfd, dfd, e->name, st) : -errno;
	}
	if (S_ISDIR(st->st_mode)) {
		if (mkdirat(dfd, e->name, 0700) < 0)
			return -errno;
		int d = openat(dfd, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		e->data = d;
		return d < 0 ? -errno : 0;
	}
	if (S_ISLNK(st->st_mode)) {
		ssize_t k = readlinkat(sfd, e->name, t, sizeof(t) - 1);
		if (k < 0)
			return -errno;
		t[k] = '\0';
		if (symlinkat(t, dfd, e->name) < 0)
			return -errno;
	} else if (S_ISFIFO(st->st_mode)) {
		if (mkfifoat(dfd, e->name, 0600) < 0)
			return -errno;
	} else {
		return 0; /* devices and sockets are no checkpointed data */
	}
	return clone_meta(sfd, e->name, dfd, st);
}

/* A directory's metadata after its children; its clone's fd closed. */
static int clone_post(void *ctx, struct walk_entry *e)
{
	(void)ctx;
	int q = e->err ? e->err : clone_meta(e->dirfd, e->name, (int)e->parent->data, &e->st);
	close((int)e->data);
	return q;
}

int oci_clone_tree(const char *src, int dst_fd, ckpt_error *err)
{
	struct stat st;
	_cleanup_close_ int s = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct walk_opts o = { .flags = WALK_STAT, .data = dst_fd, .pre = clone_pre, .post = clone_post };
	int q = s < 0 || fstat(s, &st) < 0 ? -errno : walk_tree(s, NULL, &o);
	if (q == 0) /* the top's own metadata, after its children */
		q = clone_meta(s, ".", dst_fd, &st);
	return q < 0 ? err_set(err, -q, NULL, "link the tree of '%s': %s", src, strerror(-q)) : 0;
}
