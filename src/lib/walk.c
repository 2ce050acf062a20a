/* walk.c: directory streams over fds, and the one bounded recursive walk. */
#include "lib/walk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int walk_open(int dirfd, const char *name, DIR **ret)
{
	int fd = openat(dirfd, name ? name : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		int e = errno;
		close(fd);
		return -e;
	}
	*ret = d;
	return 0;
}

struct dirent *walk_next(DIR *d)
{
	struct dirent *de;
	do {
		errno = 0;
		de = readdir(d);
	} while (de && (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")));
	return de;
}

int walk_each(int dirfd_, const char *name, walk_fn fn, void *ctx)
{
	DIR *d;
	struct dirent *de;
	int r = walk_open(dirfd_, name, &d);
	if (r < 0)
		return r;
	while ((de = walk_next(d)))
		if ((r = fn(ctx, dirfd(d), de->d_name)) < 0)
			break;
	if (!de && errno)
		r = -errno;
	closedir(d);
	return r < 0 ? r : 0;
}

struct walk_run {
	const struct walk_opts *o;
	int max_depth;
	char *path; /* the current entry's path; grows, so pointers into it go stale */
	size_t len, cap;
};

/* A name read ahead for sorting, with the type readdir gave. */
struct walk_name {
	unsigned char type;
	char name[];
};

static int walk_fail(struct walk_run *w, struct walk_entry *e, int err, enum walk_step step)
{
	e->step = step;
	return w->o->fail ? w->o->fail(w->o->ctx, e, err) : err;
}

/* A read error in directory e: e->err keeps it for post, should fail
 * answer WALK_SKIP (skip e: the rest of its entries are not walked). */
static int walk_fail_read(struct walk_run *w, struct walk_entry *e, int err)
{
	e->err = err;
	return walk_fail(w, e, err, WALK_AT_READ);
}

/* Append "/name" (or "name" at an empty path) to w->path. */
static int walk_path_push(struct walk_run *w, const char *name)
{
	size_t n = strlen(name), sep = w->len > 0, need = w->len + sep + n;
	if (w->o->path_max && need >= w->o->path_max)
		return -ENAMETOOLONG;
	if (need + 1 > w->cap) {
		size_t cap = w->cap ? w->cap : 256;
		while (cap < need + 1)
			cap *= 2;
		char *p = realloc(w->path, cap);
		if (!p)
			return -ENOMEM;
		w->path = p;
		w->cap = cap;
	}
	if (sep)
		w->path[w->len] = '/';
	memcpy(w->path + w->len + sep, name, n + 1);
	w->len = need;
	return 0;
}

static int walk_dir(struct walk_run *w, struct walk_entry *dir, DIR *d);

/* post for directory e: after its contents, or after it could not be
 * entered (err, e->fd -1), so what pre took is released either way. */
static int walk_post(struct walk_run *w, struct walk_entry *e, int err, int r)
{
	if (!w->o->post)
		return r;
	e->err = err;
	int p = w->o->post(w->o->ctx, e);
	return err == 0 && p != WALK_SKIP ? p : r;
}

/* Into directory e: bounded by depth, opened by fd, never through a link. */
static int walk_descend(struct walk_run *w, struct walk_entry *e)
{
	int fd = e->fd; /* what pre opened, if it did */
	e->fd = -1;
	if (e->depth > w->max_depth) {
		if (fd >= 0)
			close(fd);
		return walk_post(w, e, -ELOOP, walk_fail(w, e, -ELOOP, WALK_AT_DEPTH));
	}
	if (fd < 0)
		fd = openat(e->dirfd, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		int err = -errno;
		if (fd >= 0)
			close(fd);
		return walk_post(w, e, err, walk_fail(w, e, err, WALK_AT_OPEN));
	}
	e->fd = fd;
	int r = walk_dir(w, e, d);
	e->path = w->path;  /* the children may have moved the buffer */
	if (r == WALK_SKIP) /* fail skipped it at a read error */
		r = walk_post(w, e, e->err, 0);
	else
		r = walk_post(w, e, r, r);
	closedir(d);
	e->fd = -1;
	return r;
}

static int walk_one(struct walk_run *w, struct walk_entry *parent, const char *name, unsigned char type)
{
	const struct walk_opts *o = w->o;
	struct walk_entry e = { .parent = parent,
				.dirfd = parent->fd,
				.name = name,
				.path = w->path ? w->path : "", /* the parent's, until pushed */
				.path_len = w->len,
				.depth = parent->depth + 1,
				.type = type,
				.fd = -1 };
	if ((o->flags & WALK_DIRS) && type != DT_DIR && type != DT_UNKNOWN)
		return 0; /* before the path: a file's length is no failure here */
	size_t plen = w->len;
	int r = walk_path_push(w, name);
	if (r == -ENOMEM)
		return r;
	if (r < 0) /* WALK_SKIP too skips this name only, never its siblings */
		return (r = walk_fail(w, &e, r, WALK_AT_PATH)) == WALK_SKIP ? 0 : r;
	e.path = w->path;
	e.path_len = w->len;
	if ((o->flags & WALK_STAT) || type == DT_UNKNOWN) {
		if (fstatat(e.dirfd, name, &e.st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = walk_fail(w, &e, -errno, WALK_AT_STAT);
			goto out;
		}
		e.type = IFTODT(e.st.st_mode);
	}
	if ((o->flags & WALK_DIRS) && e.type != DT_DIR)
		goto out;
	r = o->pre ? o->pre(o->ctx, &e) : 0;
	if (r == 0 && e.type == DT_DIR)
		r = walk_descend(w, &e);
	else if (e.fd >= 0)
		close(e.fd); /* handed over by pre, not to be read */
out:
	w->len = plen;
	w->path[plen] = '\0';
	return r == WALK_SKIP ? 0 : r;
}

static int walk_name_cmp(const void *a, const void *b)
{
	return strcmp((*(struct walk_name *const *)a)->name, (*(struct walk_name *const *)b)->name);
}

/* Drop the repeats of a sorted v: readdir can give a name twice (tmpfs,
 * during a rename in the directory), and each name reaches the hooks
 * once. The new count. */
static size_t walk_names_unique(struct walk_name **v, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (k && !strcmp(v[k - 1]->name, v[i]->name))
			free(v[i]);
		else
			v[k++] = v[i];
	}
	return k;
}

/* Every name of d, sorted, each once: read whole first. 0, or -errno of
 * the read. */
static int walk_read_sorted(DIR *d, struct walk_name ***ret, size_t *ret_n)
{
	struct walk_name **v = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int r = 0;
	while ((de = walk_next(d))) {
		size_t len = strlen(de->d_name);
		if (n == cap) {
			struct walk_name **nv = realloc(v, (cap = cap ? cap * 2 : 64) * sizeof(*v));
			if (!nv) {
				r = -ENOMEM;
				break;
			}
			v = nv;
		}
		if (!(v[n] = malloc(sizeof(**v) + len + 1))) {
			r = -ENOMEM;
			break;
		}
		v[n]->type = de->d_type;
		memcpy(v[n++]->name, de->d_name, len + 1);
	}
	if (r == 0 && errno)
		r = -errno;
	if (n > 1)
		qsort(v, n, sizeof(*v), walk_name_cmp);
	*ret = v;
	*ret_n = walk_names_unique(v, n);
	return r;
}

static int walk_dir_sorted(struct walk_run *w, struct walk_entry *dir, DIR *d)
{
	struct walk_name **v;
	size_t n;
	int r = walk_read_sorted(d, &v, &n);
	if (r < 0 && r != -ENOMEM)
		r = walk_fail_read(w, dir, r); /* 0: go on with what was read */
	for (size_t i = 0; r == 0 && i < n; i++)
		r = walk_one(w, dir, v[i]->name, v[i]->type);
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
	return r;
}

static int walk_dir(struct walk_run *w, struct walk_entry *dir, DIR *d)
{
	if (w->o->flags & WALK_SORTED)
		return walk_dir_sorted(w, dir, d);
	struct dirent *de;
	int r = 0;
	while (r == 0 && (de = walk_next(d)))
		r = walk_one(w, dir, de->d_name, de->d_type);
	if (r == 0 && !de && errno)
		r = walk_fail_read(w, dir, -errno);
	return r;
}

int walk_tree(int dirfd_, const char *name, const struct walk_opts *o)
{
	struct walk_run w = { .o = o, .max_depth = o->max_depth > 0 ? o->max_depth : WALK_DEPTH_MAX };
	DIR *d;
	int r = walk_open(dirfd_, name, &d);
	if (r < 0)
		return r;
	if (o->prefix && *o->prefix && (r = walk_path_push(&w, o->prefix)) < 0) {
		closedir(d);
		return r;
	}
	struct walk_entry root = { .dirfd = dirfd_,
				   .name = name ? name : ".",
				   .path = w.path ? w.path : "",
				   .path_len = w.len,
				   .type = DT_DIR,
				   .fd = dirfd(d),
				   .data = o->data };
	r = walk_dir(&w, &root, d);
	closedir(d);
	free(w.path);
	return r == WALK_SKIP ? 0 : r; /* fail skipped the root at a read error */
}

int walk_fail_ignore(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	(void)err;
	return 0;
}

/* walk_merge: one directory's sorted names in one tree. */
struct wm_list {
	struct walk_name **v;
	size_t n, i;
};

struct wm_run {
	const struct walk_merge_opts *o;
	struct walk_opts po; /* the path bound, for walk_path_push */
	struct walk_run w;   /* the path */
	int max_depth;
};

static int wm_fail(struct wm_run *m, struct walk_merge_entry *e, int tree, int err, enum walk_step step)
{
	e->step = step;
	e->tree = tree;
	return m->o->fail ? m->o->fail(m->o->ctx, e, err) : err;
}

static int wm_post(struct wm_run *m, struct walk_merge_entry *e, int err, int r)
{
	if (!m->o->post)
		return r;
	e->err = err;
	int p = m->o->post(m->o->ctx, e);
	return err == 0 && p != WALK_SKIP ? p : r;
}

static int wm_list(struct wm_run *m, struct walk_merge_entry *dir, struct wm_list *l);

/* Open e in tree i and read its names. A root's failure is walk_merge's
 * answer; below, fail's: 0 goes on without tree i, WALK_SKIP skips e. */
static int wm_open(struct wm_run *m, struct walk_merge_entry *e, size_t i, DIR **d, struct wm_list *l)
{
	struct walk_merge_side *s = &e->side[i];
	int fd = openat(s->dirfd, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	*d = fd < 0 ? NULL : fdopendir(fd);
	if (!*d) {
		int err = -errno;
		if (fd >= 0)
			close(fd);
		if (!e->depth)
			return err;
		e->err = err;
		s->descend = false;
		return wm_fail(m, e, (int)i, err, WALK_AT_OPEN);
	}
	s->fd = fd;
	int r = walk_read_sorted(*d, &l->v, &l->n);
	if (r < 0 && r != -ENOMEM) {
		e->err = r;                                 /* what post sees if fail says skip */
		r = wm_fail(m, e, (int)i, r, WALK_AT_READ); /* 0: go on with what was read */
	}
	return r;
}

/* List e in each tree it descends into and walk the union; then post
 * (below the roots), while e's fds are still open. */
static int wm_enter(struct wm_run *m, struct walk_merge_entry *e)
{
	DIR **d = calloc(e->n ? e->n : 1, sizeof(*d));
	struct wm_list *l = calloc(e->n ? e->n : 1, sizeof(*l));
	int r = d && l ? 0 : -ENOMEM;
	for (size_t i = 0; r == 0 && i < e->n; i++)
		if (e->side[i].descend)
			r = wm_open(m, e, i, &d[i], &l[i]);
	if (r == 0)
		r = wm_list(m, e, l);
	e->path = m->w.path ? m->w.path : ""; /* the children may have moved the buffer */
	if (r == WALK_SKIP)                   /* fail said skip it; at the roots, the walk ends there with 0 */
		r = e->depth ? wm_post(m, e, e->err, 0) : 0;
	else if (e->depth)
		r = wm_post(m, e, r, r);
	for (size_t i = 0; d && l && i < e->n; i++) {
		for (size_t k = 0; k < l[i].n; k++)
			free(l[i].v[k]);
		free(l[i].v);
		if (d[i])
			closedir(d[i]);
		e->side[i].fd = -1;
	}
	free(d);
	free(l);
	return r;
}

/* Into directory e, bounded by depth. */
static int wm_descend(struct wm_run *m, struct walk_merge_entry *e)
{
	if (e->depth > m->max_depth)
		return wm_post(m, e, -ELOOP, wm_fail(m, e, -1, -ELOOP, WALK_AT_DEPTH));
	return wm_enter(m, e);
}

/* One name of dir, held by the trees c->side[i].held says. */
static int wm_one(struct wm_run *m, struct walk_merge_entry *c, const char *name)
{
	size_t plen = m->w.len;
	bool any = false, down = false;
	c->name = name;
	c->path = m->w.path ? m->w.path : "";
	c->path_len = plen;
	c->data = 0;
	c->tree = -1;
	int r = walk_path_push(&m->w, name);
	if (r == -ENOMEM)
		return r;
	if (r < 0) /* WALK_SKIP too skips this name only, never its siblings */
		return (r = wm_fail(m, c, -1, r, WALK_AT_PATH)) == WALK_SKIP ? 0 : r;
	c->path = m->w.path;
	c->path_len = m->w.len;
	for (size_t i = 0; r == 0 && i < c->n; i++) {
		struct walk_merge_side *s = &c->side[i];
		if (s->held && fstatat(s->dirfd, name, &s->st, AT_SYMLINK_NOFOLLOW) < 0) {
			s->held = false;
			r = wm_fail(m, c, (int)i, -errno, WALK_AT_STAT);
		}
		s->descend = s->held && S_ISDIR(s->st.st_mode);
		any |= s->held;
	}
	if (r == 0 && any && m->o->pre)
		r = m->o->pre(m->o->ctx, c);
	for (size_t i = 0; r == 0 && any && i < c->n; i++)
		down |= c->side[i].descend;
	if (r == 0 && any && down)
		r = wm_descend(m, c);
	m->w.len = plen;
	m->w.path[plen] = '\0';
	return r == WALK_SKIP ? 0 : r;
}

/* The smallest name not yet walked in any tree, or NULL at the end. */
static const char *wm_next(const struct wm_list *l, size_t n)
{
	const char *min = NULL;
	for (size_t i = 0; i < n; i++)
		if (l[i].i < l[i].n && (!min || strcmp(l[i].v[l[i].i]->name, min) < 0))
			min = l[i].v[l[i].i]->name;
	return min;
}

static int wm_list(struct wm_run *m, struct walk_merge_entry *dir, struct wm_list *l)
{
	struct walk_merge_side *side = calloc(dir->n ? dir->n : 1, sizeof(*side));
	struct walk_merge_entry c = { .parent = dir, .depth = dir->depth + 1, .n = dir->n, .side = side };
	const char *name;
	int r = side ? 0 : -ENOMEM;
	while (r == 0 && (name = wm_next(l, dir->n))) {
		for (size_t i = 0; i < dir->n; i++) {
			bool held = l[i].i < l[i].n && !strcmp(l[i].v[l[i].i]->name, name);
			side[i] = (struct walk_merge_side){ .dirfd = dir->side[i].fd, .held = held, .fd = -1 };
		}
		r = wm_one(m, &c, name);
		for (size_t i = 0; i < dir->n; i++) /* past it in each tree (name stays valid) */
			if (l[i].i < l[i].n && !strcmp(l[i].v[l[i].i]->name, name))
				l[i].i++;
	}
	free(side);
	return r;
}

int walk_merge(const int *roots, size_t n, const struct walk_merge_opts *o)
{
	struct wm_run m = { .o = o, .max_depth = o->max_depth > 0 ? o->max_depth : WALK_DEPTH_MAX };
	m.po.path_max = o->path_max;
	m.w.o = &m.po;
	struct walk_merge_side *side = calloc(n ? n : 1, sizeof(*side));
	int r = side ? 0 : -ENOMEM;
	if (r == 0 && o->prefix && *o->prefix)
		r = walk_path_push(&m.w, o->prefix);
	for (size_t i = 0; r == 0 && i < n; i++)
		side[i] = (struct walk_merge_side){
			.dirfd = roots[i], .held = roots[i] >= 0, .descend = roots[i] >= 0, .fd = -1
		};
	struct walk_merge_entry root = { .name = ".",
					 .path = m.w.path ? m.w.path : "",
					 .path_len = m.w.len,
					 .n = n,
					 .side = side,
					 .tree = -1,
					 .data = o->data };
	if (r == 0)
		r = wm_enter(&m, &root);
	free(side);
	free(m.w.path);
	return r;
}
