/* tar_diff.c: diffs of the tar backend from its manifests. */
#include "backend/tar/tar_diff.h"

#include "backend/backend_diff.h"
#include "backend/tar/tar_fs.h"
#include "backend/tar/tar_manifest.h"
#include "lib/walk.h"

static void tar_diff_ent(const struct tar_manifest *m, const struct tar_mentry *e, struct bdiff_ent *d)
{
	memset(d, 0, sizeof(*d));
	if (!e)
		return;
	const struct tar_mentry *data =
		e->type == 'h' && e->group >= 0 && (size_t)e->group < m->n ? &m->v[e->group] : e;
	d->present = true;
	d->type = e->type == 'h' ? 'f' : e->type;
	d->mode = e->mode & 07777;
	d->uid = e->uid;
	d->gid = e->gid;
	d->size = d->type == 'd' ? 0 : data->size;
	d->mtime_ns = (int64_t)data->mtime.tv_sec * 1000000000LL + data->mtime.tv_nsec;
	d->has_sha = data->has_sha256;
	memcpy(d->sha, data->sha256, sizeof(d->sha));
}

struct tar_dctx {
	const struct tar_manifest *a;
	const char *root;
	dev_t skip_dev;
	ino_t skip_ino;
	const struct rootexcl *excl;
	struct bdiff_list *out;
};

static int tar_diff_live_pre(void *ctx, struct walk_entry *e)
{
	struct tar_dctx *c = ctx;
	struct bdiff_ent ea, eb;
	if (tar_skipped(&e->st, c->skip_dev, c->skip_ino, c->excl))
		return WALK_SKIP;
	struct tar_mentry *m = tar_manifest_find(c->a, e->path);
	if (m)
		m->seen = true;
	tar_diff_ent(c->a, m, &ea);
	bdiff_from_stat(&eb, &e->st);
	if (eb.type == 'l') /* manifests keep no symlink size: compared by mtime */
		eb.size = 0;
	int q = bdiff_compare(c->out, c->root, e->path, &ea, &eb);
	return q < 0 ? q : 0;
}

/* An entry gone (ENOENT) or replaced by a file (ENOTDIR) since listed is
 * left out of the live side. Any other failure fails the diff: a directory
 * not read (EMFILE, EIO) would show what it holds as deleted. */
static int tar_diff_live_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return err == -ENOENT || err == -ENOTDIR ? 0 : err;
}

static int tar_diff_live(struct tar_dctx *c, int dfd)
{
	struct walk_opts o = { .flags = WALK_STAT, .pre = tar_diff_live_pre, .fail = tar_diff_live_fail, .ctx = c };
	return walk_tree(dfd, NULL, &o);
}

int tar_diff_root(const char *root_path, int cfd_a, const char *man_a, int cfd_b, const char *man_b, int live_fd,
		  dev_t skip_dev, ino_t skip_ino, const struct rootexcl *excl, struct bdiff_list *out, ckpt_error *err)
{
	struct tar_manifest a = { 0 }, b = { 0 };
	struct bdiff_ent ea, eb;
	int q = tar_manifest_load(cfd_a, man_a, &a, err);
	if (q < 0)
		return q;
	if (cfd_b >= 0 && (q = tar_manifest_load(cfd_b, man_b, &b, err)) < 0) {
		tar_manifest_free(&a);
		return q;
	}
	for (size_t i = 0; i < a.n; i++)
		a.v[i].seen = false;
	if (cfd_b >= 0) {
		for (size_t i = 0; q >= 0 && i < b.n; i++) {
			struct tar_mentry *e = tar_manifest_find(&a, b.v[i].path);
			if (e)
				e->seen = true;
			tar_diff_ent(&a, e, &ea);
			tar_diff_ent(&b, &b.v[i], &eb);
			q = bdiff_compare(out, root_path, b.v[i].path, &ea, &eb);
		}
	} else {
		struct tar_dctx c = {
			.a = &a, .root = root_path, .skip_dev = skip_dev, .skip_ino = skip_ino, .excl = excl, .out = out
		};
		q = tar_diff_live(&c, live_fd);
	}
	memset(&eb, 0, sizeof(eb));
	for (size_t i = 0; q >= 0 && i < a.n; i++) {
		if (a.v[i].seen)
			continue;
		tar_diff_ent(&a, &a.v[i], &ea);
		q = bdiff_compare(out, root_path, a.v[i].path, &ea, &eb);
	}
	if (q < 0)
		err_set(err, -q, NULL, "compare '%s': %s", root_path, strerror(-q));
	tar_manifest_free(&a);
	tar_manifest_free(&b);
	return q < 0 ? q : 0;
}
