/* pathindex.c: the index of paths (relpath -> inode, ctime, size) that lets
 * an overlay create hard-link files unchanged since the previous layer, and
 * the changed-directory lists of change tracking (pathindex.h). */
#include "backend/pathindex.h"
#include "lib/hash.h"
#include "lib/util.h"

#include <fcntl.h>
#include <limits.h>

#include <sys/stat.h>
#include "lib/failpoint.h"

struct ix_entry {
	char *path;
	uint64_t ino, size;
	int64_t ctime_sec;
	long ctime_nsec;
};

struct pathindex {
	struct ix_entry *v;
	size_t cap, n;
};

struct pathindex *pathindex_new(void)
{
	struct pathindex *ix = calloc(1, sizeof(*ix));
	if (!ix)
		return NULL;
	ix->cap = 64;
	ix->v = calloc(ix->cap, sizeof(*ix->v));
	if (!ix->v) {
		free(ix);
		return NULL;
	}
	return ix;
}

void pathindex_free(struct pathindex *ix)
{
	if (!ix)
		return;
	for (size_t i = 0; i < ix->cap; i++)
		free(ix->v[i].path);
	free(ix->v);
	free(ix);
}

size_t pathindex_count(const struct pathindex *ix)
{
	return ix ? ix->n : 0;
}

static struct ix_entry *pathindex_slot(struct ix_entry *v, size_t cap, const char *path)
{
	size_t i = hash_str(path) & (cap - 1);
	while (v[i].path && strcmp(v[i].path, path) != 0)
		i = (i + 1) & (cap - 1);
	return &v[i];
}

static int pathindex_grow(struct pathindex *ix)
{
	size_t cap = ix->cap * 2;
	struct ix_entry *v = calloc(cap, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < ix->cap; i++)
		if (ix->v[i].path)
			*pathindex_slot(v, cap, ix->v[i].path) = ix->v[i];
	free(ix->v);
	ix->v = v;
	ix->cap = cap;
	return 0;
}

static int pathindex_set(struct pathindex *ix, const char *path, uint64_t ino, uint64_t size, int64_t cs, long cns)
{
	if ((ix->n + 1) * 2 > ix->cap && pathindex_grow(ix) < 0)
		return -ENOMEM;
	struct ix_entry *e = pathindex_slot(ix->v, ix->cap, path);
	if (!e->path) {
		e->path = strdup(path);
		if (!e->path)
			return -ENOMEM;
		ix->n++;
	}
	e->ino = ino;
	e->size = size;
	e->ctime_sec = cs;
	e->ctime_nsec = cns;
	return 0;
}

int pathindex_put(struct pathindex *ix, const char *relpath, const struct stat *st)
{
	return pathindex_set(ix, relpath, st->st_ino, st->st_size, st->st_ctim.tv_sec, st->st_ctim.tv_nsec);
}

/* Added to ctime_nsec in an entry whose data must be compared
 * (pathindex_put_untrusted): no stat matches it. Saved and loaded as is. */
#define IX_UNTRUSTED 1000000000L

int pathindex_put_untrusted(struct pathindex *ix, const char *relpath, const struct stat *st)
{
	return pathindex_set(ix, relpath, st->st_ino, st->st_size, st->st_ctim.tv_sec,
			     st->st_ctim.tv_nsec + IX_UNTRUSTED);
}

bool pathindex_match_untrusted(const struct pathindex *ix, const char *relpath, const struct stat *st)
{
	if (!ix)
		return false;
	const struct ix_entry *e = pathindex_slot(ix->v, ix->cap, relpath);
	return e->path && e->ctime_nsec >= IX_UNTRUSTED && e->ino == (uint64_t)st->st_ino &&
		e->size == (uint64_t)st->st_size && e->ctime_sec == st->st_ctim.tv_sec &&
		e->ctime_nsec - IX_UNTRUSTED == st->st_ctim.tv_nsec;
}

bool pathindex_has(const struct pathindex *ix, const char *relpath)
{
	return ix && pathindex_slot(ix->v, ix->cap, relpath)->path != NULL;
}

bool pathindex_match(const struct pathindex *ix, const char *relpath, const struct stat *st)
{
	if (!ix)
		return false;
	const struct ix_entry *e = pathindex_slot(ix->v, ix->cap, relpath);
	return e->path && e->ino == (uint64_t)st->st_ino && e->size == (uint64_t)st->st_size &&
		e->ctime_sec == st->st_ctim.tv_sec && e->ctime_nsec == st->st_ctim.tv_nsec;
}

/* File format: "CKIX1\n<tag>\n", then per entry "ino size csec cnsec len\n<path>\n",
 * then "END <n>\n". */
int pathindex_save(const struct pathindex *ix, const char *tag, int dirfd, const char *name)
{
	char tmp[256];
	/* the temp file beside name: "idx/index" writes "idx/.index.tmp" */
	const char *slash = strrchr(name, '/');
	int dir_len = slash ? (int)(slash - name + 1) : 0;
	snprintf(tmp, sizeof(tmp), "%.*s.%s.tmp", dir_len, name, name + dir_len);
	int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	FILE *f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		return -ENOMEM;
	}
	fprintf(f, "CKIX1\n%s\n", tag);
	for (size_t i = 0; i < ix->cap; i++) {
		const struct ix_entry *e = &ix->v[i];
		if (e->path)
			fprintf(f, "%llu %llu %lld %ld %zu\n%s\n", (unsigned long long)e->ino,
				(unsigned long long)e->size, (long long)e->ctime_sec, e->ctime_nsec, strlen(e->path),
				e->path);
	}
	fprintf(f, "END %zu\n", ix->n);
	if (fclose(f) != 0) {
		unlinkat(dirfd, tmp, 0);
		return -EIO;
	}
	return FAILPOINT_AROUND("pathindex.save.rename", renameat(dirfd, tmp, dirfd, name)) < 0 ? -errno : 0;
}

static int pathindex_parse(FILE *f, struct pathindex *ix, char **ret_tag)
{
	char line[4096];
	unsigned long long ino, size;
	long long cs;
	long cns;
	size_t len, n;

	if (!fgets(line, sizeof(line), f) || strcmp(line, "CKIX1\n") != 0 || !fgets(line, sizeof(line), f))
		return -EBADMSG;
	line[strcspn(line, "\n")] = 0;
	*ret_tag = strdup(line);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "END %zu", &n) == 1)
			return n == ix->n ? 0 : -EBADMSG;
		if (sscanf(line, "%llu %llu %lld %ld %zu", &ino, &size, &cs, &cns, &len) != 5 || len >= 4096)
			return -EBADMSG;
		_cleanup_free_ char *p = malloc(len + 2);
		if (!p || fread(p, 1, len + 1, f) != len + 1 || p[len] != '\n')
			return -EBADMSG;
		p[len] = 0;
		if (pathindex_set(ix, p, ino, size, cs, cns) < 0)
			return -ENOMEM;
	}
	return -EBADMSG;
}

int pathindex_load(int dirfd, const char *name, struct pathindex **ret, char **ret_tag)
{
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	_cleanup_fclose_ FILE *f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return -ENOMEM;
	}
	struct pathindex *ix = pathindex_new();
	char *tag = NULL;
	if (!ix)
		return -ENOMEM;
	int r = pathindex_parse(f, ix, &tag);
	if (r < 0) {
		pathindex_free(ix);
		free(tag);
		return r;
	}
	*ret = ix;
	*ret_tag = tag;
	return 0;
}

struct pathindex *pathindex_copy(const struct pathindex *ix)
{
	struct pathindex *c = pathindex_new();
	for (size_t i = 0; c && ix && i < ix->cap; i++) {
		const struct ix_entry *e = &ix->v[i];
		if (e->path && pathindex_set(c, e->path, e->ino, e->size, e->ctime_sec, e->ctime_nsec) < 0) {
			pathindex_free(c);
			return NULL;
		}
	}
	return c;
}

int pathindex_each(const struct pathindex *ix, int (*fn)(void *ctx, const char *path), void *ctx)
{
	for (size_t i = 0; ix && i < ix->cap; i++) {
		int r = ix->v[i].path ? fn(ctx, ix->v[i].path) : 0;
		if (r < 0)
			return r;
	}
	return 0;
}

static int merge_one(void *ctx, const char *path)
{
	return pathindex_set(ctx, path, 0, 0, 0, 0);
}

int pathindex_merge(struct pathindex **dst, const struct pathindex *src)
{
	if (!pathindex_count(src))
		return 0;
	if (!*dst && !(*dst = pathindex_new()))
		return -ENOMEM;
	return pathindex_each(src, merge_one, *dst);
}

static int dirty_cmp(const void *a, const void *b)
{
	const struct pathindex_dirty *x = a, *y = b;
	int c = strcmp(x->path, y->path);
	return c ? c : (int)y->deep - (int)x->deep; /* deep first: it is the one kept */
}

void pathindex_dirty_unname(struct pathindex_dirty *d)
{
	for (size_t i = 0; i < d->n_names; i++)
		free(d->names[i]);
	free(d->names);
	d->names = NULL, d->n_names = 0, d->named = false;
}

/* The names of b (the same directory) join a's; a stays named only while
 * both are and the names fit. b's names that a took are NULL then. */
static void dirty_merge(struct pathindex_dirty *a, struct pathindex_dirty *b)
{
	if (!a->named)
		return;
	if (!b->named || b->deep) {
		pathindex_dirty_unname(a);
		return;
	}
	for (size_t i = 0; i < b->n_names; i++) {
		bool have = false;
		for (size_t k = 0; k < a->n_names && !have; k++)
			have = !strcmp(a->names[k], b->names[i]);
		if (have)
			continue;
		char **v = a->n_names < PATHINDEX_DIRTY_NAMES ? realloc(a->names, (a->n_names + 1) * sizeof(*v)) : NULL;
		if (!v) { /* too many to be worth it, or out of memory: all compared */
			pathindex_dirty_unname(a);
			return;
		}
		a->names = v;
		a->names[a->n_names++] = TAKE_PTR(b->names[i]);
	}
}

static int dirty_name_sort(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void pathindex_dirty_dedup(struct pathindex_dirty *v, size_t *n)
{
	if (*n)
		qsort(v, *n, sizeof(*v), dirty_cmp);
	size_t k = 0;
	for (size_t i = 0; i < *n; i++) {
		if (k && !strcmp(v[k - 1].path, v[i].path)) {
			dirty_merge(&v[k - 1], &v[i]);
			v[k - 1].kept &= v[i].kept; /* kept only when every reason is */
			/* known only while every deep reason is */
			v[k - 1].known = (v[k - 1].known || !v[k - 1].deep) && (v[i].known || !v[i].deep);
			pathindex_dirty_unname(&v[i]); /* what a did not take */
			free(v[i].path);
			continue;
		}
		v[k++] = v[i];
		if (v[k - 1].deep) /* its whole subtree is read */
			pathindex_dirty_unname(&v[k - 1]);
	}
	*n = k;
	for (size_t i = 0; i < k; i++)
		if (v[i].n_names > 1)
			qsort(v[i].names, v[i].n_names, sizeof(*v[i].names), dirty_name_sort);
}

void pathindex_dirty_free(struct pathindex_dirty *v, size_t n)
{
	for (size_t i = 0; v && i < n; i++) {
		free(v[i].path);
		for (size_t k = 0; k < v[i].n_names; k++)
			free(v[i].names[k]);
		free(v[i].names);
	}
	free(v);
}

static int dirty_name_cmp(const void *key, const void *elem)
{
	return strcmp(key, *(char *const *)elem);
}

bool pathindex_dirty_named(const struct pathindex_dirty *d, const char *name)
{
	return d->named && d->n_names && bsearch(name, d->names, d->n_names, sizeof(*d->names), dirty_name_cmp);
}

static int dirty_cmp_key(const void *key, const void *elem)
{
	return strcmp(key, ((const struct pathindex_dirty *)elem)->path);
}

const struct pathindex_dirty *pathindex_dirty_find(const struct pathindex_dirty *v, size_t n, const char *path)
{
	return n ? bsearch(path, v, n, sizeof(*v), dirty_cmp_key) : NULL;
}

bool pathindex_dirty_below_deep(const struct pathindex_dirty *v, size_t n, const char *path)
{
	char buf[PATH_MAX];
	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
		return true;
	while (buf[0]) {
		char *slash = strrchr(buf, '/');
		if (slash)
			*slash = '\0';
		else
			buf[0] = '\0';
		const struct pathindex_dirty *d = pathindex_dirty_find(v, n, buf);
		if (d && d->deep)
			return true;
	}
	return false;
}

bool pathindex_dirty_covers(const struct pathindex_dirty *v, size_t n, const char *dir)
{
	return pathindex_dirty_find(v, n, dir) || pathindex_dirty_below_deep(v, n, dir);
}
