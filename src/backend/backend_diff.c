/* backend_diff.c: comparing one entry's two sides and reporting it, and
 * the list of differences verify reports. */
#include "backend/backend_diff.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "lib/util.h"

void bdiff_from_stat(struct bdiff_ent *e, const struct stat *st)
{
	memset(e, 0, sizeof(*e));
	e->present = true;
	switch (st->st_mode & S_IFMT) {
	case S_IFDIR:
		e->type = 'd';
		break;
	case S_IFLNK:
		e->type = 'l';
		break;
	case S_IFIFO:
		e->type = 'p';
		break;
	case S_IFCHR:
		e->type = 'c';
		break;
	case S_IFBLK:
		e->type = 'b';
		break;
	case S_IFSOCK:
		e->type = 's';
		break;
	default:
		e->type = 'f';
		break;
	}
	e->mode = st->st_mode & 07777;
	e->uid = st->st_uid;
	e->gid = st->st_gid;
	e->size = e->type == 'd' ? 0 : (uint64_t)st->st_size;
	e->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
	e->rdev = st->st_rdev;
}

const char *bdiff_type_name(char t)
{
	switch (t) {
	case 'd':
		return "directory";
	case 'l':
		return "symlink";
	case 'p':
		return "fifo";
	case 'c':
		return "char_device";
	case 'b':
		return "block_device";
	case 's':
		return "socket";
	default:
		return "file";
	}
}

static bool bdiff_content_differs(const struct bdiff_ent *a, const struct bdiff_ent *b)
{
	if (a->type == 'd')
		return false;
	if (a->type == 'c' || a->type == 'b')
		return a->rdev != b->rdev;
	if (a->size != b->size)
		return true;
	if (a->has_sha && b->has_sha)
		return memcmp(a->sha, b->sha, sizeof(a->sha)) != 0;
	return a->mtime_ns != b->mtime_ns;
}

/* Fill c with what differs between a and b (both present); false when
 * nothing does. */
static bool bdiff_modified(struct bdiff_change *c, const struct bdiff_ent *a, const struct bdiff_ent *b)
{
	if (a->type != b->type) {
		c->what |= BDIFF_TYPE;
		c->old_type = bdiff_type_name(a->type);
	} else if (bdiff_content_differs(a, b)) {
		c->what |= BDIFF_CONTENT;
	}
	c->has_old_size = a->type != b->type || a->size != b->size;
	c->old_size = a->size;
	if (a->mode != b->mode && a->type != 'l') {
		c->what |= BDIFF_MODE;
		c->has_mode = true;
		c->old_mode = a->mode;
		c->mode = b->mode;
	}
	if (a->uid != b->uid || a->gid != b->gid) {
		c->what |= BDIFF_OWNER;
		c->old_uid = a->uid, c->uid = b->uid;
		c->old_gid = a->gid, c->gid = b->gid;
	}
	return c->what != 0;
}

int bdiff_compare(struct bdiff_list *out, const char *root, const char *rel, const struct bdiff_ent *a,
		  const struct bdiff_ent *b)
{
	if (!a->present && !b->present)
		return 0;
	const struct bdiff_ent *now = b->present ? b : a;
	struct bdiff_change c = { .type = bdiff_type_name(now->type), .size = now->size };
	if (!a->present || !b->present) {
		c.kind = a->present ? BDIFF_DELETED : BDIFF_ADDED;
		c.has_mode = true;
		c.mode = now->mode; /* deleted: the mode it had */
	} else if (!bdiff_modified(&c, a, b)) {
		return 0;
	} else {
		c.kind = BDIFF_MODIFIED;
	}
	struct bdiff_change *v = realloc(out->v, (out->n + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	out->v = v;
	if (!(c.path = path_join(root, rel)))
		return -ENOMEM;
	v[out->n++] = c;
	return 1;
}

static int bdiff_cmp(const void *x, const void *y)
{
	return strcmp(((const struct bdiff_change *)x)->path, ((const struct bdiff_change *)y)->path);
}

void bdiff_sort(struct bdiff_list *out)
{
	if (out->n > 1)
		qsort(out->v, out->n, sizeof(*out->v), bdiff_cmp);
}

void bdiff_list_free(struct bdiff_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i].path);
	free(l->v);
	*l = (struct bdiff_list){ 0 };
}

int verify_diffs_add(struct verify_diffs *d, const char *path, const char *reason)
{
	struct verify_diff *v = realloc(d->v, (d->n + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	d->v = v;
	v[d->n] = (struct verify_diff){ .path = strdup(path), .reason = strdup(reason) };
	if (!v[d->n].path || !v[d->n].reason) {
		free(v[d->n].path);
		free(v[d->n].reason);
		return -ENOMEM;
	}
	d->n++;
	return 0;
}

void verify_diffs_free(struct verify_diffs *d)
{
	for (size_t i = 0; i < d->n; i++) {
		free(d->v[i].path);
		free(d->v[i].reason);
	}
	free(d->v);
	*d = (struct verify_diffs){ 0 };
}
