/* tar_verify.c: after a restore, compare a root with its checkpoint's
 * manifest without trusting the (inode, ctime, size) shortcut restore uses:
 * every entry's type, mode, owner, times and xattrs, and the content of every
 * regular file against the SHA-256 recorded at create (manifests of version 1
 * have none: there size and mtime stand in for it). */
#include "backend/tar/tar_verify.h"

#include <limits.h>
#include <nettle/sha2.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "backend/tar/tar_fs.h"

#define VERIFY_BUF (1 << 20)

struct vctx {
	struct tar_manifest m;
	const struct tar_verify_opts *o;
	struct verify_diffs *diffs;
	char *buf;
	int root_fd;
	ckpt_error *err;
};

static bool full(const struct vctx *c)
{
	return c->diffs->n >= c->o->max_diffs;
}

static void differ(struct vctx *c, const char *path, const char *reason)
{
	char abs[PATH_MAX + 64];
	if (full(c))
		return;
	snprintf(abs, sizeof(abs), "%s%s%s", c->o->root_path, strcmp(path, ".") ? "/" : "",
		 strcmp(path, ".") ? path : "");
	verify_diffs_add(c->diffs, abs, reason);
}

static int content_hash(struct vctx *c, int dirfd, const char *name, unsigned char out[TAR_SHA256_LEN])
{
	struct sha256_ctx h;
	_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	ssize_t n;

	if (fd < 0)
		return -errno;
	sha256_init(&h);
	while ((n = read(fd, c->buf, VERIFY_BUF)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		sha256_update(&h, (size_t)n, (const uint8_t *)c->buf);
	}
	sha256_digest(&h, TAR_SHA256_LEN, out);
	return 0;
}

static bool ts_eq(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* The first difference of one live entry from its manifest entry, or NULL. */
static const char *compare_meta(const struct tar_mentry *e, const struct stat *st, uint64_t xhash)
{
	if (!tar_type_matches(e, st))
		return "type";
	if ((st->st_mode & 07777) != e->mode)
		return "mode";
	if (st->st_uid != e->uid || st->st_gid != e->gid)
		return "owner";
	if (S_ISREG(st->st_mode) && (uint64_t)st->st_size != e->size)
		return "size";
	if (!ts_eq(st->st_mtim, e->mtime))
		return "mtime";
	return xhash != e->xhash ? "xattrs" : NULL;
}

static const char *compare_content(struct vctx *c, int dirfd, const char *name, const struct tar_mentry *e,
				   const struct stat *st, int *r)
{
	unsigned char sum[TAR_SHA256_LEN];
	struct stat t;

	*r = 0;
	if (e->type == 'h') /* the group's first member carries the content */
		return fstatat(c->root_fd, e->link, &t, AT_SYMLINK_NOFOLLOW) < 0 || t.st_ino != st->st_ino ? "hardlink"
													   : NULL;
	if (e->type != 'f' || !e->has_sha256)
		return NULL;
	if ((*r = content_hash(c, dirfd, name, sum)) < 0)
		return NULL;
	return memcmp(sum, e->sha256, TAR_SHA256_LEN) ? "content" : NULL;
}

/* One live entry against the manifest; below a directory the checkpoint
 * also holds as one. */
static int verify_one(void *ctx, struct walk_entry *e)
{
	struct vctx *c = ctx;
	struct tar_xattr *xa = NULL;
	size_t n_xa = 0;
	const char *why, *path = e->path;
	int r;

	if (full(c) || tar_skipped(&e->st, c->o->skip_dev, c->o->skip_ino, c->o->excl))
		return WALK_SKIP;
	struct tar_mentry *m = tar_manifest_find(&c->m, path);
	if (!m) {
		differ(c, path, "unexpected");
		return WALK_SKIP;
	}
	m->seen = true;
	if ((r = tar_xattrs_read(e->dirfd, e->name, &xa, &n_xa)) < 0)
		return err_set(c->err, -r, NULL, "cannot read the xattrs of '%s': %s", path, strerror(-r));
	why = compare_meta(m, &e->st, tar_xattrs_hash(xa, n_xa));
	tar_xattrs_free(xa, n_xa);
	if (!why && S_ISREG(e->st.st_mode) && !(why = compare_content(c, e->dirfd, e->name, m, &e->st, &r)) && r < 0)
		return err_set(c->err, -r, NULL, "cannot read '%s': %s", path, strerror(-r));
	if (why)
		differ(c, path, why);
	return S_ISDIR(e->st.st_mode) && m->type == 'd' ? 0 : WALK_SKIP;
}

/* Once the list of differences is full, nothing more is looked at. */
static int verify_fail(void *ctx, const struct walk_entry *e, int r)
{
	struct vctx *c = ctx;
	return e->step == WALK_AT_STAT && full(c) ? 0 : tar_walk_failed(c->err, e, r);
}

static int verify_walk(struct vctx *c)
{
	struct walk_opts o = {
		.flags = WALK_STAT, .path_max = PATH_MAX, .pre = verify_one, .fail = verify_fail, .ctx = c
	};
	return tar_walk_root(c->root_fd, &o, c->err);
}

static int verify_root_meta(struct vctx *c)
{
	struct tar_xattr *xa = NULL;
	size_t n = 0;
	struct stat st;
	int r;

	if (fstat(c->root_fd, &st) < 0)
		return err_set(c->err, errno, NULL, "cannot stat the root: %m");
	if ((r = tar_xattrs_read(c->root_fd, NULL, &xa, &n)) < 0)
		return err_set(c->err, -r, NULL, "cannot read the root's xattrs: %s", strerror(-r));
	const char *why = compare_meta(&c->m.root, &st, tar_xattrs_hash(xa, n));
	tar_xattrs_free(xa, n);
	if (why)
		differ(c, ".", why);
	return 0;
}

/* Report a missing subtree once, at its top. */
static bool top_missing(const struct tar_manifest *m, const struct tar_mentry *e)
{
	const struct tar_mentry *p = tar_manifest_parent(m, e->path);
	return !e->seen && (!p || p->seen);
}

int tar_verify_root(int root_fd, int ckpt_dirfd, const char *manifest, const struct tar_verify_opts *o,
		    struct verify_diffs *diffs, ckpt_error *err)
{
	struct vctx c = { .o = o, .diffs = diffs, .root_fd = root_fd, .err = err };
	int r = tar_manifest_load(ckpt_dirfd, manifest, &c.m, err);

	if (r < 0)
		return r;
	c.buf = malloc(VERIFY_BUF);
	r = c.buf ? verify_root_meta(&c) : err_set(err, ENOMEM, NULL, "out of memory");
	if (r >= 0)
		r = verify_walk(&c);
	for (size_t i = 0; r >= 0 && i < c.m.n; i++)
		if (top_missing(&c.m, &c.m.v[i]))
			differ(&c, c.m.v[i].path, "missing");
	free(c.buf);
	tar_manifest_free(&c.m);
	return r;
}
