/* overlay_rebase.c: the deltas over a full layer folded into one. After
 * OVL_DELTA_MAX deltas the next create made a full layer, which links every
 * file of the upper again: 3.3-3.6 s at 100k files (2026-11-29), every
 * seventeenth create of an agent's loop. Instead that create makes its
 * delta over the full layer alone, holding everything that changed since
 * it: the directories the deltas hold are dirty in it, besides what the
 * tracker names since the last create. What a delta holds is a directory
 * of the upper and the entries that changed in it (a whiteout for one
 * gone, a directory made since copied whole); compared again with the
 * upper now, relative to the full layer, each gives the same result a
 * full copy would. Its cost is what changed since the full layer, not the
 * upper's size; when that is much of the upper, a full layer it is. */
#include "backend/overlay/overlay_internal.h"
#include "lib/walk.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

struct rb {
	struct pathindex_dirty *v; /* a directory of the deltas each, in the order walked */
	size_t n, cap;
	size_t names; /* the entries the deltas hold, directories included */
};

static int rb_dir_add(struct rb *b, const char *path)
{
	if (b->n == b->cap) {
		size_t cap = b->cap ? 2 * b->cap : 64;
		struct pathindex_dirty *v = realloc(b->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		b->v = v;
		b->cap = cap;
	}
	char *p = strdup(path);
	if (!p)
		return -ENOMEM;
	/* kept and named until a whiteout in it says a name left */
	b->v[b->n++] = (struct pathindex_dirty){ .path = p, .kept = true, .named = true };
	return 0;
}

static int rb_name_add(struct pathindex_dirty *d, const char *name)
{
	char **v = realloc(d->names, (d->n_names + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	d->names = v;
	if (!(v[d->n_names] = strdup(name)))
		return -ENOMEM;
	d->n_names++;
	return 0;
}

/* Each entry of the deltas (their union, names in strcmp order per
 * directory: sorted as pathindex_dirty's are): a name of its directory; a
 * directory of its own. data: the directory's index in b->v, plus one. */
static int rb_pre(void *ctx, struct walk_merge_entry *e)
{
	struct rb *b = ctx;
	bool dir = false, gone = false;
	for (size_t i = 0; i < e->n; i++) {
		const struct walk_merge_side *s = &e->side[i];
		if (!s->held)
			continue;
		dir |= S_ISDIR(s->st.st_mode);
		gone |= treecopy_is_whiteout(&s->st);
	}
	struct pathindex_dirty *parent = &b->v[e->parent->data - 1];
	int r = rb_name_add(parent, e->name);
	if (r < 0)
		return r;
	parent->kept &= !gone;
	b->names++;
	if (!dir)
		return 0;
	if ((r = rb_dir_add(b, e->path)) < 0)
		return r;
	e->data = (intptr_t)b->n;
	return 0;
}

/* A dirty directory the full layer lacks was made since it: copied whole
 * (deep), and its directories are in r->ddirs already (known). One with a
 * name gone, or more names than a directory keeps, reads every name. */
static void rb_finish(struct rb *b, int full)
{
	for (size_t i = 0; i < b->n; i++) {
		struct pathindex_dirty *d = &b->v[i];
		struct stat st;
		if (*d->path && (fstatat(full, d->path, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode)))
			d->deep = d->known = true;
		if (!d->kept || d->n_names > PATHINDEX_DIRTY_NAMES)
			pathindex_dirty_unname(d);
	}
	pathindex_dirty_dedup(b->v, &b->n); /* each path once already: sorted */
}

/* The union of the deltas stack[0 .. n-1) (the last one is the full
 * layer) as dirty directories, sorted by path. */
static int rb_read(int l, const struct ovl_chain *stack, struct rb *b)
{
	size_t n = stack->n - 1;
	int fds[OVL_DELTA_MAX + 1];
	int r = 0;
	for (size_t i = 0; i < n; i++)
		if ((fds[i] = openat(l, stack->v[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 && r == 0)
			r = -errno;
	_cleanup_close_ int full = openat(l, stack->v[n], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (r == 0 && full < 0)
		r = -errno;
	if (r == 0)
		r = rb_dir_add(b, "");
	struct walk_merge_opts o = { .path_max = PATH_MAX - 1, .data = 1, .pre = rb_pre, .ctx = b };
	if (r == 0)
		r = walk_merge(fds, n, &o);
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (r == 0)
		rb_finish(b, full);
	return r;
}

/* Whether folding costs well under a full layer. A full layer reads every
 * directory of the upper and links each of its files. A fold compares the
 * entries the deltas hold, and reads every entry of a directory one of them
 * removed a name from (at the mean size of a directory). A directory a
 * delta holds with none of its entries costs little: it stands for one
 * whose parent changed, or for its own metadata. */
static size_t rb_cost(const struct ovl_root *r, const struct rb *b)
{
	size_t files = pathindex_count(r->ix), dirs = r->ddirs.n ? r->ddirs.n : 1, cost = b->names + b->n;
	for (size_t i = 0; i < b->n; i++)
		if (!b->v[i].named && !b->v[i].deep)
			cost += files / dirs + 1;
	return cost;
}

static bool rb_worth_it(const struct ovl_root *r, const struct rb *b, size_t *cost, size_t *full)
{
	*cost = rb_cost(r, b);
	*full = pathindex_count(r->ix) + r->ddirs.n;
	return 2 * *cost <= *full;
}

bool overlay_rebase_due(const struct ovl_root *r)
{
	return r->stack.n == OVL_DELTA_MAX + 1 && r->dix && r->ix && r->ddirs.n && chg_track_armed(&r->trk) &&
		!r->rebase;
}

int overlay_rebase(struct ovl_root *r, int l)
{
	size_t n = r->stack.n;
	if (!overlay_rebase_due(r))
		return 0;
	int64_t t0 = mono_us();
	struct rb b = { 0 };
	size_t cost = 0, full = 0;
	int q = rb_read(l, &r->stack, &b);
	if (q < 0 || !rb_worth_it(r, &b, &cost, &full)) {
		if (q < 0)
			log_info("create: '%s' gets a full layer: cannot read its deltas: %s", r->path, strerror(-q));
		else
			log_info("create: '%s' gets a full layer: folding its %zu deltas would compare about %zu "
				 "entries "
				 "(%zu directories), a full layer about %zu",
				 r->path, n - 1, cost, b.n, full);
		pathindex_dirty_free(b.v, b.n);
		return q;
	}
	struct pathindex *dix = pathindex_new();
	if (!dix) {
		pathindex_dirty_free(b.v, b.n);
		return -ENOMEM;
	}
	pathindex_free(r->dix);
	r->dix = dix; /* nothing is copied over the full layer yet */
	memmove(r->stack.v[0], r->stack.v[n - 1], sizeof(r->stack.v[0]));
	r->stack.n = 1;
	r->rebase = b.v;
	r->n_rebase = b.n;
	log_info("create: '%s' folds its %zu deltas into the next, over its full layer: about %zu entries to compare "
		 "(%zu directories) against %zu for a full layer, read in %.2f ms",
		 r->path, n - 1, cost, b.n, full, (mono_us() - t0) / 1e3);
	return 1;
}

int overlay_rebase_merge(struct ovl_root *r, struct pathindex_dirty **dirty, size_t *n)
{
	size_t na = r->n_rebase, nb = *n;
	struct pathindex_dirty *v = realloc(*dirty, (na + nb + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM; /* both as they were: the caller frees its own */
	memcpy(v + nb, r->rebase, na * sizeof(*v));
	free(TAKE_PTR(r->rebase));
	r->n_rebase = 0;
	*n = na + nb;
	pathindex_dirty_dedup(v, n);
	*dirty = v;
	return 0;
}
