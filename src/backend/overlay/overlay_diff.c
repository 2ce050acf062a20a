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
	int fd[2]; /* old view, new view */
	json_t *done;
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

static void ovl_diff_path(struct ovl_dctx *c, const char *rel, bool deep);

static int ovl_diff_children(struct ovl_dctx *c, const char *rel, int side, json_t *names)
{
	_cleanup_close_ int fd = ovl_diff_open(c->fd[side], rel, O_RDONLY | O_DIRECTORY);
	DIR *d;
	if (fd < 0 || walk_open(fd, NULL, &d) < 0)
		return 0;
	struct dirent *de;
	while ((de = walk_next(d)))
		json_object_set_new(names, de->d_name, json_true());
	closedir(d);
	return 0;
}

static void ovl_diff_expand(struct ovl_dctx *c, const char *rel, const struct bdiff_ent *a, const struct bdiff_ent *b)
{
	json_auto_t *names = json_object();
	if (a->type == 'd')
		ovl_diff_children(c, rel, 0, names);
	if (b->type == 'd')
		ovl_diff_children(c, rel, 1, names);
	const char *name;
	json_t *v;
	json_object_foreach (names, name, v) {
		_cleanup_free_ char *child = path_join(rel, name);
		if (!child) {
			c->q = -ENOMEM;
			return;
		}
		ovl_diff_path(c, child, true);
	}
}

static void ovl_diff_path(struct ovl_dctx *c, const char *rel, bool deep)
{
	struct bdiff_ent a, b;
	if (c->q < 0 || json_object_get(c->done, rel))
		return;
	json_object_set_new(c->done, rel, json_true());
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

static void ovl_diff_mark(json_t *cand, const char *path, bool deep)
{
	if (!json_is_true(json_object_get(cand, path)))
		json_object_set_new(cand, path, json_boolean(deep));
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
	json_t *cand = ctx;
	char v[PATH_MAX];
	if (!S_ISDIR(e->st.st_mode)) {
		ovl_diff_mark(cand, e->path, false);
		return 0;
	}
	if (ovl_diff_xattr(e->dirfd, e->name, "trusted.overlay.opaque", v, sizeof(v)) && v[0] == 'y')
		e->data |= OVL_DIFF_DEEP;
	if (ovl_diff_xattr(e->dirfd, e->name, "trusted.overlay.redirect", v, sizeof(v))) {
		e->data |= OVL_DIFF_DEEP;
		_cleanup_free_ char *from = ovl_diff_from(e, v);
		if (from && *from)
			json_object_set_new(cand, from, json_true());
	}
	return 0;
}

/* A directory counts after what it holds (a redirect below it may name
 * it), and also when it could not be opened. */
static int ovl_diff_collect_post(void *ctx, struct walk_entry *e)
{
	ovl_diff_mark(ctx, e->path, e->data & OVL_DIFF_DEEP);
	return 0;
}

/* An entry gone since listed is left out; a directory that cannot be
 * opened still counts (its post marks it); a read error ends a listing
 * quietly. */
static int ovl_diff_collect_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return err == -ELOOP ? err : 0;
}

/* Every path layer lfd holds: true for those below which the lower layers
 * are hidden or elsewhere (opaque, redirected). */
static int ovl_diff_collect(int lfd, json_t *cand)
{
	struct walk_opts o = { .flags = WALK_STAT,
			       .pre = ovl_diff_collect_pre,
			       .post = ovl_diff_collect_post,
			       .fail = ovl_diff_collect_fail,
			       .ctx = cand };
	return walk_tree(lfd, NULL, &o);
}

static int ovl_diff_cmp(const void *x, const void *y)
{
	return strcmp(*(const char *const *)x, *(const char *const *)y);
}

static const struct ovl_chain *ovl_chain_of(const struct ovl_chains *chains, const char *h)
{
	static const struct ovl_chain none = { 0 };
	const struct ovl_chain *c = overlay_chains_get(chains, h);
	return c ? c : &none;
}

/* Paths the layers of x and y above their common suffix hold. */
static int ovl_diff_candidates(struct ovl_root *r, const struct ovl_chain *x, const struct ovl_chain *y,
			       const char *upper, json_t *cand)
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
	json_auto_t *cand = json_object(), *done = json_object();
	char na[OVL_NAME_LEN + 1] = "", nb[OVL_NAME_LEN + 1] = "";
	struct ovl_dctx c = { .out = out, .root = r->path, .fd = { -1, -1 }, .done = done };
	int q = ovl_diff_candidates(r, xa, xb, live ? r->upper : NULL, cand);
	if (q < 0)
		q = err_set(err, -q, NULL, "read layers of '%s': %s", r->path, strerror(-q));
	if (q == 0 && (c.fd[0] = overlay_chain_view(r, xa, na, err)) < 0)
		q = c.fd[0];
	if (q == 0 && live && (c.fd[1] = open(r->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		q = err_set(err, errno, NULL, "open root '%s': %m", r->path);
	else if (q == 0 && !live && (c.fd[1] = overlay_chain_view(r, xb, nb, err)) < 0)
		q = c.fd[1];
	size_t n = json_object_size(cand), i = 0;
	const char **keys = q == 0 ? calloc(n ? n : 1, sizeof(*keys)) : NULL;
	if (q == 0 && !keys)
		q = err_set(err, ENOMEM, NULL, "out of memory");
	if (q == 0) {
		const char *k;
		json_t *v;
		json_object_foreach (cand, k, v)
			keys[i++] = k;
		qsort(keys, n, sizeof(*keys), ovl_diff_cmp); /* parents before children */
		for (i = 0; i < n && c.q == 0; i++)
			ovl_diff_path(&c, keys[i], json_is_true(json_object_get(cand, keys[i])));
		if (c.q < 0)
			q = err_set(err, -c.q, NULL, "compare '%s': %s", r->path, strerror(-c.q));
	}
	free(keys);
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
