/* rootexcl.c: the entries a root's checkpoints leave out (rootexcl.h). */
#include "backend/rootexcl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/util.h"

static bool rootexcl_below(const char *path, const char *dir)
{
	size_t n = strlen(dir);
	if (!strcmp(dir, "/"))
		return path[0] == '/' && path[1];
	return !strncmp(path, dir, n) && path[n] == '/';
}

static int rootexcl_add(struct rootexcl *x, const char *path, const char *why)
{
	struct stat st;
	for (size_t i = 0; i < x->n; i++)
		if (!strcmp(x->v[i].path, path))
			return 0; /* the first reason stays */
	struct rootexcl_item *v = realloc(x->v, (x->n + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	x->v = v;
	struct rootexcl_item *it = &v[x->n];
	memset(it, 0, sizeof(*it));
	if (!(it->path = strdup(path)) || !(it->why = strdup(why))) {
		free(it->path);
		free(it->why);
		return -ENOMEM;
	}
	/* stat, not lstat: a mount point reads as the root of what is mounted
	 * there, which is what a walk of its parent meets */
	if (stat(path, &st) == 0) {
		it->present = true;
		it->dev = st.st_dev;
		it->ino = st.st_ino;
	}
	x->n++;
	return 0;
}

/* \ooo escapes of space, tab, newline and backslash (proc_pid_mountinfo(5)). */
static void rootexcl_unescape(char *s)
{
	char *o = s;
	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' &&
		    s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
}

int rootexcl_parse_mountinfo(const char *line, char *buf, size_t len, char *type, size_t type_len)
{
	const char *p = line, *sep = strstr(line, " - ");
	for (int field = 0; field < 4 && p; field++)
		p = (p = strchr(p, ' ')) ? p + 1 : NULL;
	if (!p || !sep || p > sep)
		return -EINVAL;
	size_t n = strcspn(p, " ");
	if (n == 0 || n >= len)
		return -EINVAL;
	memcpy(buf, p, n);
	buf[n] = '\0';
	rootexcl_unescape(buf);
	n = strcspn(sep + 3, " \n");
	if (n >= type_len)
		n = type_len - 1;
	memcpy(type, sep + 3, n);
	type[n] = '\0';
	return buf[0] == '/' ? 0 : -EINVAL;
}

static int rootexcl_mounts(struct rootexcl *x, const char *mountinfo)
{
	_cleanup_fclose_ FILE *f = fopen(mountinfo, "re");
	_cleanup_free_ char *line = NULL;
	size_t cap = 0;
	char path[PATH_MAX], type[64], why[128];
	int r = 0;

	if (!f)
		return -errno;
	while (r == 0 && getline(&line, &cap, f) > 0) {
		if (rootexcl_parse_mountinfo(line, path, sizeof(path), type, sizeof(type)) < 0 || !strcmp(path, "/"))
			continue;
		snprintf(why, sizeof(why), "mount point (%s)", type);
		r = rootexcl_add(x, path, why);
	}
	return r;
}

static void rootexcl_mark_nested(struct rootexcl *x)
{
	for (size_t i = 0; i < x->n; i++)
		for (size_t j = 0; j < x->n && !x->v[i].nested; j++)
			x->v[i].nested = j != i && rootexcl_below(x->v[i].path, x->v[j].path);
}

int rootexcl_build(struct rootexcl *x, bool whole, const char *state_dir, char *const *excludes, size_t n_excludes,
		   const char *mountinfo)
{
	struct stat st;
	int r = 0;

	memset(x, 0, sizeof(*x));
	if (state_dir)
		r = rootexcl_add(x, state_dir, "state dir");
	for (size_t i = 0; r == 0 && i < n_excludes; i++)
		r = rootexcl_add(x, excludes[i], "config exclude");
	if (r == 0 && whole) {
		r = rootexcl_add(x, "/tmp", "temporary files");
		if (r == 0 && (r = rootexcl_mounts(x, mountinfo)) == -ENOENT)
			r = 0; /* no proc: the one-filesystem rule still holds */
		if (r == 0 && stat("/", &st) == 0) {
			x->one_fs = true;
			x->root_dev = st.st_dev;
		}
	}
	if (r < 0) {
		rootexcl_free(x);
		return r;
	}
	rootexcl_mark_nested(x);
	return 0;
}

void rootexcl_free(struct rootexcl *x)
{
	for (size_t i = 0; x && i < x->n; i++) {
		free(x->v[i].path);
		free(x->v[i].why);
	}
	if (x) {
		free(x->v);
		memset(x, 0, sizeof(*x));
	}
}

bool rootexcl_has(const struct rootexcl *x, const struct stat *st)
{
	if (!x)
		return false;
	/* Only directories: on an overlay of several filesystems a file may
	 * report the device of the layer that holds it. */
	if (x->one_fs && S_ISDIR(st->st_mode) && st->st_dev != x->root_dev)
		return true;
	for (size_t i = 0; i < x->n; i++)
		if (x->v[i].present && x->v[i].ino == st->st_ino && x->v[i].dev == st->st_dev)
			return true;
	return false;
}
