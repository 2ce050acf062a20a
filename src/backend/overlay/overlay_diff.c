/* overlay_diff.c: what differs between a checkpoint and another checkpoint
 * or the live tree, from the layers above their common ancestor: only paths
 * some such layer holds (entries, whiteouts, the origins of redirected
 * directories) are looked at, so the cost follows what changed, not the tree.
 * Each side is looked at through a read-only view (the checkpoint's chain
 * mounted privately, or the live root), so redirects, opaque directories and
 * whiteouts resolve as the kernel resolves them. Below a directory that is
 * opaque, redirected or only on one side, both sides are walked in full. */
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"
#include "backend/backend_diff.h"
#include "lib/strset.h"
#include "lib/walk.h"
#include "lib/xattr.h"

#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>

struct ovl_dctx {
	struct bdiff_list *out;
	const char *root;
	int fd[2];          /* old view, new view */
	struct strset done; /* the paths compared */
	int q;
};

/* The paths some layer holds, and those of them below which the lower
 * layers are hidden or elsewhere (opaque, redirected): walked in full. */
struct ovl_dcand {
	struct strset all, deep;
	int q;
};

/* Open rel below vfd without following any symlink or leaving it. */
static int ovl_diff_open(int vfd, const char *rel, int flags)
{
	struct open_how how = { .flags = (uint64_t)(flags | O_CLOEXEC),
				.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
	int fd = (int)syscall(SYS_openat2, vfd, rel && *rel ? rel : ".", &how, sizeof(how));
	if (fd >= 0 || (errno != ENOSYS && errno != EPERM))
		return fd;
	/* No openat2 (old kernel, a seccomp filter): one component at a time. */
	_cleanup_free_ char *copy = strdup(rel && *rel ? rel : ".");
	char *save = NULL, *part = copy ? strtok_r(copy, "/", &save) : NULL;
	int cur = copy ? openat(vfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
	while (cur >= 0 && part) {
		char *next = strtok_r(NULL, "/", &save);
		int f = !strcmp(part, "..")
			? (errno = EPERM, -1)
			: openat(cur, part, (next ? O_PATH | O_DIRECTORY : flags) | O_NOFOLLOW | O_CLOEXEC);
		close(cur);
		cur = f;
		part = next;
	}
	return cur;
}

static void ovl_diff_stat(int vfd, const char *rel, struct bdiff_ent *e)
{
	struct stat st;
	const char *slash = strrchr(rel, '/');
	memset(e, 0, sizeof(*e));
	if (!slash) {
		if (fstatat(vfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0)
			bdiff_from_stat(e, &st);
		return;
	}
	_cleanup_free_ char *parent = strndup(rel, (size_t)(slash - rel));
	_cleanup_close_ int pfd = parent ? ovl_diff_open(vfd, parent, O_PATH | O_DIRECTORY) : -1;
	if (pfd >= 0 && fstatat(pfd, slash + 1, &st, AT_SYMLINK_NOFOLLOW) == 0)
		bdiff_from_stat(e, &st);
}

/* A path compared once: false when it was already (or memory ran out:
 * then c->q says so). */
static bool ovl_diff_first(struct ovl_dctx *c, const char *rel)
{
	int added = strset_add(&c->done, rel);
	if (added < 0)
		c->q = added;
	return added > 0;
}

/* An entry gone since its directory was listed (ENOENT), or replaced by a
 * non-directory (ENOTDIR): absent there, as the live tree now is. */
static bool ovl_diff_gone(int err)
{
	return err == -ENOENT || err == -ENOTDIR;
}

/* One path of the union below an expanded directory, from the stats the
 * walk took: compared, and walked below wherever a side has a directory. */
static int ovl_diff_walk_pre(void *ctx, struct walk_merge_entry *e)
{
	struct ovl_dctx *c = ctx;
	struct bdiff_ent ab[2];
	if (!ovl_diff_first(c, e->path))
		return c->q < 0 ? c->q : WALK_SKIP;
	for (int s = 0; s < 2; s++) {
		memset(&ab[s], 0, sizeof(ab[s]));
		if (e->side[s].held)
			bdiff_from_stat(&ab[s], &e->side[s].st);
	}
	int r = bdiff_compare(c->out, c->root, e->path, &ab[0], &ab[1]);
	return r < 0 ? (c->q = r) : 0;
}

/* What is gone from a side counts as absent there; any other failure
 * (EMFILE, ENFILE, EIO, past the depth bound) fails the diff: taking it as
 * absent would list a subtree that is there as added or deleted. */
static int ovl_diff_walk_fail(void *ctx, const struct walk_merge_entry *e, int err)
{
	struct ovl_dctx *c = ctx;
	(void)e;
	if (ovl_diff_gone(err))
		return 0;
	if (c->q == 0)
		c->q = err;
	return err;
}

/* Both sides below rel in full (a and b: what rel is on each). */
static void ovl_diff_expand(struct ovl_dctx *c, const char *rel, const struct bdiff_ent *a, const struct bdiff_ent *b)
{
	const struct bdiff_ent *ab[2] = { a, b };
	int fds[2] = { -1, -1 };
	for (int s = 0; s < 2; s++) {
		fds[s] = ab[s]->type == 'd' ? ovl_diff_open(c->fd[s], rel, O_RDONLY | O_DIRECTORY) : -1;
		if (ab[s]->type == 'd' && fds[s] < 0 && !ovl_diff_gone(-errno) && c->q == 0)
			c->q = -errno;
	}
	struct walk_merge_opts o = { .prefix = rel, .pre = ovl_diff_walk_pre, .fail = ovl_diff_walk_fail, .ctx = c };
	int r = c->q < 0 ? c->q : walk_merge(fds, 2, &o);
	if (r < 0 && c->q == 0)
		c->q = r; /* a root's open, memory */
	for (int s = 0; s < 2; s++)
		if (fds[s] >= 0)
			close(fds[s]);
}

static void ovl_diff_path(struct ovl_dctx *c, const char *rel, bool deep)
{
	struct bdiff_ent a, b;
	if (c->q < 0 || !ovl_diff_first(c, rel))
		return;
	ovl_diff_stat(c->fd[0], rel, &a);
	ovl_diff_stat(c->fd[1], rel, &b);
	int r = bdiff_compare(c->out, c->root, rel, &a, &b);
	if (r < 0) {
		c->q = r;
		return;
	}
	bool adir = a.present && a.type == 'd', bdir = b.present && b.type == 'd';
	if ((adir != bdir) || (deep && (adir || bdir)))
		ovl_diff_expand(c, rel, &a, &b);
}

static bool ovl_diff_xattr(int dirfd, const char *name, const char *key, char *buf, size_t n)
{
	struct xattr_ref x;
	xattr_ref_init(&x, -1, dirfd, name);
	ssize_t len = xattr_get(&x, key, buf, n - 1);
	if (len < 0)
		return false;
	buf[len] = 0;
	return true;
}

/* path is a candidate, deep when the lower layers are hidden or elsewhere
 * below it (a mark without deep never undoes one with it). */
static void ovl_diff_mark(struct ovl_dcand *cand, const char *path, bool deep)
{
	int q = strset_add(&cand->all, path);
	if (q >= 0 && deep)
		q = strset_add(&cand->deep, path);
	if (q < 0)
		cand->q = q;
}

/* A directory's data: OVL_DIFF_DEEP when the lower layers are hidden or
 * elsewhere below it (opaque, redirected). */
#define OVL_DIFF_DEEP 1

/* A redirect's source: absolute from the root, else beside e. */
static char *ovl_diff_from(const struct walk_entry *e, const char *v)
{
	size_t plen = e->path_len - strlen(e->name);
	char *out;
	if (v[0] == '/')
		return strdup(v + 1);
	if (plen == 0)
		return strdup(v);
	return asprintf(&out, "%.*s/%s", (int)plen - 1, e->path, v) < 0 ? NULL : out;
}

static int ovl_diff_collect_pre(void *ctx, struct walk_entry *e)
{
	struct ovl_dcand *cand = ctx;
	char v[PATH_MAX];
	if (!S_ISDIR(e->st.st_mode)) {
		ovl_diff_mark(cand, e->path, false);
		return cand->q;
	}
	if (ovl_diff_xattr(e->dirfd, e->name, "trusted.overlay.opaque", v, sizeof(v)) && v[0] == 'y')
		e->data |= OVL_DIFF_DEEP;
	if (ovl_diff_xattr(e->dirfd, e->name, "trusted.overlay.redirect", v, sizeof(v))) {
		e->data |= OVL_DIFF_DEEP;
		_cleanup_free_ char *from = ovl_diff_from(e, v);
		if (!from)
			cand->q = -ENOMEM;
		else if (*from)
			ovl_diff_mark(cand, from, true);
	}
	return cand->q;
}

/* A directory counts after what it holds (a redirect below it may name
 * it), and also when it could not be opened. */
static int ovl_diff_collect_post(void *ctx, struct walk_entry *e)
{
	struct ovl_dcand *cand = ctx;
	ovl_diff_mark(cand, e->path, e->data & OVL_DIFF_DEEP);
	return cand->q;
}

/* An entry gone since listed (the live upper changes) is left out; any
 * other failure fails the diff: a directory not read (EMFILE, EIO) would
 * hide the changes below it. */
static int ovl_diff_collect_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return ovl_diff_gone(err) ? 0 : err;
}

/* Every path layer lfd holds, into cand. */
static int ovl_diff_collect(int lfd, struct ovl_dcand *cand)
{
	struct walk_opts o = { .flags = WALK_STAT,
			       .pre = ovl_diff_collect_pre,
			       .post = ovl_diff_collect_post,
			       .fail = ovl_diff_collect_fail,
			       .ctx = cand };
	int q = walk_tree(lfd, NULL, &o);
	return q < 0 ? q : cand->q;
}

static void ovl_dcand_free(struct ovl_dcand *cand)
{
	strset_free(&cand->all);
	strset_free(&cand->deep);
}

static const struct ovl_chain *ovl_chain_of(const struct ovl_chains *chains, const char *h)
{
	static const struct ovl_chain none = { 0 };
	const struct ovl_chain *c = overlay_chains_get(chains, h);
	return c ? c : &none;
}

/* Paths the layers of x and y above their common suffix hold. */
static int ovl_diff_candidates(struct ovl_root *r, const struct ovl_chain *x, const struct ovl_chain *y,
			       const char *upper, struct ovl_dcand *cand)
{
	size_t nx = x->n, ny = y->n, k = 0;
	while (k < nx && k < ny && !strcmp(x->v[nx - 1 - k], y->v[ny - 1 - k]))
		k++;
	const struct ovl_chain *sides[2] = { x, y };
	size_t tops[2] = { nx - k, ny - k };
	int q = 0;
	for (int s = 0; q == 0 && s < 2; s++)
		for (size_t i = 0; q == 0 && i < tops[s]; i++) {
			char p[32];
			snprintf(p, sizeof(p), "l/%s", sides[s]->v[i]);
			_cleanup_close_ int fd = openat(r->rdir_fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			q = fd < 0 ? -errno : ovl_diff_collect(fd, cand);
		}
	/* One side on the base dir, the other on a base layer: the base dir is
	 * a side of its own (the base layer, a whole tree, was collected). */
	if (q == 0 && overlay_chain_on_base(x) != overlay_chain_on_base(y)) {
		_cleanup_close_ int fd = openat(r->rdir_fd, "base", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		q = fd < 0 ? -errno : ovl_diff_collect(fd, cand);
	}
	if (q == 0 && upper) {
		char p[32];
		snprintf(p, sizeof(p), "u/%s", upper);
		_cleanup_close_ int fd = openat(r->rdir_fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		q = fd < 0 ? -errno : ovl_diff_collect(fd, cand);
	}
	return q;
}

static int ovl_diff_root(struct ovl_root *r, const struct ovl_chains *ca, const struct ovl_chains *cb, bool live,
			 struct bdiff_list *out, ckpt_error *err)
{
	const struct ovl_chain *xa = ovl_chain_of(ca, r->h), *xb = live ? &r->mounted : ovl_chain_of(cb, r->h);
	_cleanup_(ovl_dcand_free) struct ovl_dcand cand = { 0 };
	char na[OVL_NAME_LEN + 1] = "", nb[OVL_NAME_LEN + 1] = "";
	struct ovl_dctx c = { .out = out, .root = r->path, .fd = { -1, -1 } };
	int q = ovl_diff_candidates(r, xa, xb, live ? r->upper : NULL, &cand);
	if (q < 0)
		q = err_set(err, -q, NULL, "read layers of '%s': %s", r->path, strerror(-q));
	if (q == 0 && (c.fd[0] = overlay_chain_view(r, xa, na, err)) < 0)
		q = c.fd[0];
	if (q == 0 && live && (c.fd[1] = open(r->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		q = err_set(err, errno, NULL, "open root '%s': %m", r->path);
	else if (q == 0 && !live && (c.fd[1] = overlay_chain_view(r, xb, nb, err)) < 0)
		q = c.fd[1];
	size_t n = strset_count(&cand.all);
	const char **keys = NULL;
	if (q == 0 && strset_sorted(&cand.all, &keys) < 0) /* parents before children */
		q = err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; q == 0 && i < n && c.q == 0; i++)
		ovl_diff_path(&c, keys[i], strset_has(&cand.deep, keys[i]));
	if (q == 0 && c.q < 0)
		q = err_set(err, -c.q, NULL, "compare '%s': %s", r->path, strerror(-c.q));
	free(keys);
	strset_free(&c.done);
	for (int s = 0; s < 2; s++)
		if (c.fd[s] >= 0)
			close(c.fd[s]);
	overlay_chain_view_drop(r, na);
	overlay_chain_view_drop(r, nb);
	return q;
}

int overlay_diff(void *st, const char *id, json_t *data, const char *id2, json_t *data2, struct bdiff_list *out,
		 ckpt_error *err)
{
	struct ovl *o = st;
	_cleanup_(overlay_chains_free) struct ovl_chains ca = { 0 };
	_cleanup_(overlay_chains_free) struct ovl_chains cb = { 0 };
	int qa = overlay_layers_chain_get(o, id, data, &ca);
	int qb = id2 ? overlay_layers_chain_get(o, id2, data2, &cb) : 0;
	if (qa == -ENOMEM || qb == -ENOMEM)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (qa < 0 || qb < 0)
		return err_set(err, ENOENT, NULL, "no layer chain recorded for %s", qa < 0 ? id : id2);
	for (size_t i = 0; i < o->n_roots; i++) {
		int q = ovl_diff_root(&o->roots[i], &ca, id2 ? &cb : NULL, !id2, out, err);
		if (q < 0)
			return q;
	}
	bdiff_sort(out);
	return 0;
}
