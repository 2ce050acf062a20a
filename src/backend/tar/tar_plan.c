/* tar_plan.c: what a whole-root restore will change, said before it
 * changes anything (tar_plan.h). */
#include "backend/tar/tar_plan.h"

#include <limits.h>

#include "backend/tar/tar_fs.h"
#include "backend/tar/tar_replace.h"
#include "lib/failpoint.h"

void tar_plan_free(struct tar_plan *p)
{
	for (size_t i = 0; i < p->n; i++)
		free(p->removals[i]);
	free(p->removals);
	memset(p, 0, sizeof(*p));
}

static int plan_defer(struct tar_plan *p, const char *path, bool dir)
{
	if (p->n == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 64;
		char **v = realloc(p->removals, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		p->removals = v, p->cap = cap;
	}
	if (asprintf(&p->removals[p->n], "%s%s", path, dir ? "/" : "") < 0)
		return -ENOMEM;
	p->n++;
	return 0;
}

int tar_plan_extra(struct tar_plan *p, struct tar_restore_opts *o, int dirfd, const char *name, const struct stat *st,
		   const char *path)
{
	tar_replace_note(o, path, false);
	if (o->before_change)
		return plan_defer(p, path, S_ISDIR(st->st_mode));
	tar_gone_tree(o, dirfd, name, st, path);
	return FAILPOINT_AROUND("tar.restore.extra.remove", rm_rf_at(dirfd, name));
}

/* A removal's path without its trailing slash, in buf. */
static const char *plan_bare(const char *path, char *buf, size_t len)
{
	size_t n = strlen(path);
	snprintf(buf, len, "%.*s", (int)(n && path[n - 1] == '/' ? n - 1 : n), path);
	return buf;
}

/* The directory of the last removal, kept open: the removals of one
 * directory come in a row, and opening each one's walks from the root.
 * A removal never takes its own parent, so the fd stays good for the next
 * of the same directory. */
struct plan_parent {
	int fd; /* -1: none */
	char dir[PATH_MAX];
};

/* path's parent directory (owned by pp: not to be closed), and its leaf;
 * < 0 as tar_open_parent. */
static int plan_parent_open(struct plan_parent *pp, int root_fd, const char *path, const char **leaf)
{
	const char *slash = strrchr(path, '/');
	size_t len = slash ? (size_t)(slash - path) : 0;

	*leaf = slash ? slash + 1 : path;
	if (pp->fd >= 0 && !strncmp(pp->dir, path, len) && pp->dir[len] == '\0')
		return pp->fd;
	if (pp->fd >= 0)
		close(TAKE_FD(pp->fd));
	int fd = tar_open_parent(root_fd, path, leaf);
	if (fd >= 0 && len < sizeof(pp->dir)) {
		snprintf(pp->dir, sizeof(pp->dir), "%.*s", (int)len, path);
		pp->fd = fd;
	} else if (fd >= 0) { /* cannot be: path is below PATH_MAX */
		close(fd);
		fd = -ENAMETOOLONG;
	}
	return fd;
}

/* What goes, recorded while it is still there: the files of each removal
 * (subtrees whole) and the entries about to be replaced. */
static void plan_gone(struct tar_restore_opts *o, int root_fd, const struct tar_plan *p, const struct tar_manifest *m)
{
	char bare[PATH_MAX];
	struct plan_parent pp = { .fd = -1 };
	for (size_t i = 0; i < p->n; i++) {
		const char *path = plan_bare(p->removals[i], bare, sizeof(bare)), *leaf;
		struct stat st;
		int pfd = plan_parent_open(&pp, root_fd, path, &leaf);
		if (pfd >= 0 && fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0)
			tar_gone_tree(o, pfd, leaf, &st, path);
	}
	if (pp.fd >= 0)
		close(pp.fd);
	/* the manifest is sorted: the files of a directory come in a row */
	_cleanup_close_ int pfd = -1;
	size_t dlen = SIZE_MAX;
	const char *dir = NULL;
	for (size_t i = 0; i < m->n; i++) {
		const struct tar_mentry *e = &m->v[i];
		const char *slash = strrchr(e->path, '/'), *leaf = slash ? slash + 1 : e->path;
		size_t len = slash ? (size_t)(slash - e->path) : 0;
		if (!e->needed || !e->seen || e->type == 'd')
			continue;
		if (!dir || len != dlen || strncmp(dir, e->path, len)) {
			if (pfd >= 0)
				close(TAKE_FD(pfd));
			pfd = tar_open_parent(root_fd, e->path, &leaf);
			dir = e->path, dlen = len;
		}
		if (pfd >= 0)
			tar_gone_at(o, pfd, leaf, e->path);
	}
}

static int plan_remove(struct tar_plan *p, int root_fd, ckpt_error *err)
{
	char bare[PATH_MAX];
	struct plan_parent pp = { .fd = -1 };
	int ret = 0;
	for (size_t i = 0; ret == 0 && i < p->n; i++) {
		const char *path = plan_bare(p->removals[i], bare, sizeof(bare)), *leaf;
		int pfd = plan_parent_open(&pp, root_fd, path, &leaf);
		if (pfd == -ENOENT)
			continue; /* below a removal made already */
		int r = pfd < 0 ? pfd : FAILPOINT_AROUND("tar.restore.extra.remove", rm_rf_at(pfd, leaf));
		if (r < 0 && r != -ENOENT)
			ret = err_set(err, -r, NULL, "cannot remove '%s': %s", path, strerror(-r));
	}
	if (pp.fd >= 0)
		close(pp.fd);
	return ret;
}

int tar_plan_run(struct tar_restore_opts *o, int root_fd, struct tar_plan *p, const struct tar_manifest *m,
		 ckpt_error *err)
{
	size_t n = 0;
	_cleanup_free_ const char **paths = calloc(p->n + m->n + 1, sizeof(*paths));
	if (!paths)
		return err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; i < p->n; i++)
		paths[n++] = p->removals[i];
	for (size_t i = 0; i < m->n; i++) {
		if (!m->v[i].needed)
			continue;
		tar_replace_note(o, m->v[i].path, true);
		if (m->v[i].type != 'd')
			paths[n++] = m->v[i].path;
	}
	plan_gone(o, root_fd, p, m);
	struct restore_details planned = { .gone = o->gone,
					   .unit_files_changed = o->unit_files_changed,
					   .units_linked = o->units_linked ? *o->units_linked : (struct strv){ 0 } };
	/* planned borrows them: not freed here */
	if (o->before_change(o->before_change_ctx, paths, n, &planned) < 0) {
		o->held = true;
		return err_set(err, EBUSY, "units_busy", "a unit whose files the restore changes could not be stopped");
	}
	return plan_remove(p, root_fd, err);
}
