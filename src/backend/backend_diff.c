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

int bdiff_compare(json_t *out, const char *root, const char *rel, const struct bdiff_ent *a, const struct bdiff_ent *b)
{
	if (!a->present && !b->present)
		return 0;
	const struct bdiff_ent *now = b->present ? b : a;
	_cleanup_free_ char *path = path_join(root, rel);
	json_t *o = path ? json_pack("{s:s, s:s, s:I}", "path", path, "type", bdiff_type_name(now->type), "size",
				     (json_int_t)now->size)
			 : NULL;
	if (!o)
		return -ENOMEM;
	if (!a->present || !b->present) {
		json_object_set_new(o, "change", json_string(a->present ? "deleted" : "added"));
		if (!b->present) /* deleted: the mode it had */
			json_object_set_new(o, "mode", json_sprintf("%04o", a->mode));
		else
			json_object_set_new(o, "mode", json_sprintf("%04o", b->mode));
		json_array_append_new(out, o);
		return 1;
	}
	json_t *what = json_array();
	if (a->type != b->type) {
		json_array_append_new(what, json_string("type"));
		json_object_set_new(o, "old_type", json_string(bdiff_type_name(a->type)));
	} else if (bdiff_content_differs(a, b)) {
		json_array_append_new(what, json_string("content"));
	}
	if (a->type != b->type || a->size != b->size)
		json_object_set_new(o, "old_size", json_integer((json_int_t)a->size));
	if (a->mode != b->mode && a->type != 'l') {
		json_array_append_new(what, json_string("mode"));
		json_object_set_new(o, "old_mode", json_sprintf("%04o", a->mode));
		json_object_set_new(o, "mode", json_sprintf("%04o", b->mode));
	}
	if (a->uid != b->uid || a->gid != b->gid) {
		json_array_append_new(what, json_string("owner"));
		json_object_set_new(o, "old_uid", json_integer(a->uid));
		json_object_set_new(o, "uid", json_integer(b->uid));
		json_object_set_new(o, "old_gid", json_integer(a->gid));
		json_object_set_new(o, "gid", json_integer(b->gid));
	}
	if (json_array_size(what) == 0) {
		json_decref(what);
		json_decref(o);
		return 0;
	}
	json_object_set_new(o, "change", json_string("modified"));
	json_object_set_new(o, "changes", what);
	json_array_append_new(out, o);
	return 1;
}

static int bdiff_cmp(const void *x, const void *y)
{
	json_t *a = *(json_t *const *)x, *b = *(json_t *const *)y;
	return strcmp(json_string_value(json_object_get(a, "path")), json_string_value(json_object_get(b, "path")));
}

void bdiff_sort(json_t *out)
{
	size_t n = json_array_size(out);
	json_t **v = calloc(n ? n : 1, sizeof(*v));
	if (!v)
		return;
	for (size_t i = 0; i < n; i++)
		v[i] = json_incref(json_array_get(out, i));
	qsort(v, n, sizeof(*v), bdiff_cmp);
	json_array_clear(out);
	for (size_t i = 0; i < n; i++)
		json_array_append_new(out, v[i]);
	free(v);
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
