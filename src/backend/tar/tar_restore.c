/* tar_restore.c: incremental in-place restore of one root.
 * 1. walk the live root: remove what the manifest does not list (or lists
 *    with another type), mark what changed since the checkpoint;
 * 2. close the set: missing entries, whole hardlink groups, and the parent
 *    directory of anything touched (its times must be set again);
 * 3. remove the live entries about to be rewritten;
 * 4. read the archive once, extracting the marked entries and skipping the
 *    rest (files and directories written here, the others by libarchive);
 *    directory times are set after their children (fix_dir_times);
 *    an incremental checkpoint's manifest names older archives holding the
 *    data of unchanged files: each one that holds a marked entry is read
 *    after the checkpoint's own (which has every directory);
 * 5. set the root directory's own metadata. */
#include "backend/tar/tar_restore.h"
#include "backend/tar/tar_extract.h"

#include <archive.h>
#include <archive_entry.h>
#include <limits.h>
#include <sys/stat.h>

#include "backend/tar/tar_fs.h"
#include "backend/tar/tar_plan.h"
#include "backend/tar/tar_replace.h"

static bool ts_eq(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* The same inode as captured, or as a past restore wrote it, untouched since. */
static bool unchanged(const struct tar_mentry *e, const struct stat *st)
{
	bool same = (e->ino == (uint64_t)st->st_ino && ts_eq(e->ctime, st->st_ctim)) ||
		(e->has_alias && e->alias_ino == (uint64_t)st->st_ino && ts_eq(e->alias_ctime, st->st_ctim));
	return same && (e->type == 'd' || !S_ISREG(st->st_mode) || e->size == (uint64_t)st->st_size);
}

/* unchanged, and where a setxattr leaves ctime (gVisor), with the xattrs
 * the checkpoint holds (name below dirfd, or dirfd itself when NULL). */
static bool kept_as_is(const struct tar_rctx *c, const struct tar_mentry *e, const struct stat *st, int dirfd,
		       const char *name)
{
	return unchanged(e, st) && (!c->o->xattrs_blind || tar_xattrs_match(dirfd, name, e->xhash));
}

static void mark_parent_of(struct tar_rctx *c, const char *path)
{
	struct tar_mentry *p = tar_manifest_parent(&c->m, path);
	if (p)
		p->needed = true;
}

static bool suspect(const struct tar_rctx *c, const char *path)
{
	return c->o->suspects && pathindex_has(c->o->suspects, path);
}

/* One live entry: removed when the checkpoint does not list it (or lists
 * another type), else marked seen, and needed when it changed. 1: a
 * directory that stays. */
static int live_entry(struct tar_rctx *c, int dirfd, const char *name, const char *path, const struct stat *st_)
{
	const struct stat st = *st_;
	struct tar_mentry *e;

	if (tar_skipped(&st, c->o->skip_dev, c->o->skip_ino, c->o->excl))
		return 0; /* never captured: never removed */
	e = tar_manifest_find(&c->m, path);
	if (!e || !tar_type_matches(e, &st)) {
		int r = tar_plan_extra(&c->plan, c->o, dirfd, name, &st, path);
		if (r < 0)
			return err_set(c->err, -r, NULL, "cannot remove '%s': %s", path, strerror(-r));
		c->st->removed++;
		mark_parent_of(c, path);
		return 0;
	}
	e->seen = true;
	if (c->o->trust_nothing || !kept_as_is(c, e, &st, dirfd, name) || suspect(c, path))
		e->needed = true;
	return S_ISDIR(st.st_mode) ? 1 : 0;
}

struct live_walk_ctx {
	struct tar_walk tw; /* first: tar_walk_fail_gone's */
	struct tar_rctx *c;
	bool deep; /* below the directories listed too */
};

/* An entry is removed while its directory is read (unless before_change
 * defers it): the walk never goes below what it removed. An entry gone
 * since its directory was listed is no longer there to remove. */
static int live_pre(void *ctx, struct walk_entry *e)
{
	struct live_walk_ctx *w = ctx;
	int r = live_entry(w->c, e->dirfd, e->name, e->path, &e->st);
	w->tw.failed |= r < 0;
	return r < 0 ? r : r == 1 && w->deep ? 0 : WALK_SKIP;
}

/* The live entries below dirfd (whose path is rel, NULL at the root): each
 * directory with its subtree when deep, else only the entries of dirfd. */
static int live_walk(struct tar_rctx *c, int dirfd, const char *rel, bool deep)
{
	struct live_walk_ctx w = { .tw = { .err = c->err }, .c = c, .deep = deep };
	struct walk_opts o = { .flags = WALK_STAT, .pre = live_pre, .ctx = &w };
	return tar_walk_below(dirfd, rel, &o, &w.tw);
}

static const struct pathindex_dirty *dirty_find(const struct tar_restore_opts *o, const char *dir)
{
	return pathindex_dirty_find(o->dirty, o->n_dirty, dir);
}

/* A changed directory whose events all named the entries they changed
 * (pathindex.h): only those are compared there. NULL: all of them. */
static const struct pathindex_dirty *named_dir(const struct tar_rctx *c, const char *dir)
{
	const struct pathindex_dirty *d = dirty_find(c->o, dir);
	return d && d->named && !d->deep && !pathindex_dirty_below_deep(c->o->dirty, c->o->n_dirty, dir) ? d : NULL;
}

/* The entries a named directory's events named, as live_walk compares
 * each entry; one gone is not there to remove (its line stays unseen). */
static int named_walk(struct tar_rctx *c, int dfd, const struct pathindex_dirty *d)
{
	char path[PATH_MAX];
	for (size_t i = 0; i < d->n_names; i++) {
		const char *name = d->names[i];
		struct stat st;
		if (snprintf(path, sizeof(path), "%s%s%s", d->path, d->path[0] ? "/" : "", name) >= (int)sizeof(path))
			return err_set(c->err, ENAMETOOLONG, NULL, "path too long below '%s'", d->path);
		if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue;
			return err_set(c->err, errno, NULL, "cannot stat '%s': %m", path);
		}
		int r = live_entry(c, dfd, name, path, &st);
		if (r < 0)
			return r;
	}
	return 0;
}

/* With the journal: only the changed directories are read, as live_walk
 * reads them (a deep one with its subtree), and each of them is compared
 * itself; in a named one (named_dir), only the entries its events named.
 * The checkpoint's entries there count as unseen until found; those of
 * every other directory are as the checkpoint captured them. */
static int journal_walk(struct tar_rctx *c, int root_fd)
{
	char dir[PATH_MAX];
	const char *last = NULL; /* the last entry's directory: they come in a row */
	size_t last_len = 0;
	bool changed = false;
	const struct pathindex_dirty *named = NULL;
	for (size_t i = 0; i < c->m.n; i++) {
		struct tar_mentry *e = &c->m.v[i];
		const char *slash = strrchr(e->path, '/');
		size_t len = slash ? (size_t)(slash - e->path) : 0;
		if (!last || len != last_len || strncmp(e->path, last, len)) {
			snprintf(dir, sizeof(dir), "%.*s", (int)len, e->path);
			changed = pathindex_dirty_covers(c->o->dirty, c->o->n_dirty, dir);
			named = changed ? named_dir(c, dir) : NULL;
			last = e->path;
			last_len = len;
		}
		/* in a named directory, an entry not named is as captured
		 * (a suspect is named too: its close or its mapping is an event) */
		bool here = changed &&
			(!named || pathindex_dirty_named(named, slash ? slash + 1 : e->path) || suspect(c, e->path));
		e->seen = !here && !(e->type == 'd' && c->o->n_dirty && dirty_find(c->o, e->path));
		/* a file of several names may be written through one outside
		 * the root, which no event of the root shows: looked at always */
		if (e->seen && (e->type == 'h' || (e->type == 'f' && e->nlink > 1))) {
			const char *leaf;
			struct stat st;
			int pfd = tar_rctx_parent_fd(c, root_fd, e->path, &leaf);
			if (pfd < 0 || fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0 || !tar_type_matches(e, &st))
				e->seen = false; /* gone or replaced: its directory changed too, and is read */
			else if (c->o->trust_nothing || !kept_as_is(c, e, &st, pfd, leaf) || suspect(c, e->path))
				e->needed = true;
		}
	}
	if (c->pdir_fd >= 0)
		close(TAKE_FD(c->pdir_fd));
	for (size_t k = 0; k < c->o->n_dirty; k++) {
		const struct pathindex_dirty *d = &c->o->dirty[k];
		if (pathindex_dirty_below_deep(c->o->dirty, c->o->n_dirty, d->path))
			continue; /* read already, with its deep ancestor */
		const char *leaf;
		struct stat st;
		_cleanup_close_ int pfd = d->path[0] ? tar_open_parent(root_fd, d->path, &leaf) : -1;
		_cleanup_close_ int dfd = !d->path[0]
			? fcntl(root_fd, F_DUPFD_CLOEXEC, 3)
			: (pfd < 0 ? -1 : openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
		struct tar_mentry *de = d->path[0] ? tar_manifest_find(&c->m, d->path) : NULL;
		if (dfd < 0 || (d->path[0] && (!de || de->type != 'd')))
			continue; /* gone, or not the checkpoint's: its parent changed too, and is read */
		if (de && fstat(dfd, &st) == 0) {
			de->seen = true;
			if (c->o->trust_nothing || !kept_as_is(c, de, &st, dfd, NULL))
				de->needed = true;
		}
		int r = named_dir(c, d->path) ? named_walk(c, dfd, d)
					      : live_walk(c, dfd, d->path[0] ? d->path : NULL, d->deep);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Missing entries come back; a hardlink group is rewritten as a whole so its
 * members end up sharing one inode; a touched entry's directory gets its
 * metadata (times above all) set again after its children. */
static void close_needed(struct tar_rctx *c)
{
	struct tar_mentry *v = c->m.v;
	size_t n = c->m.n;

	for (size_t i = 0; i < n; i++) {
		if (!v[i].seen)
			v[i].needed = true;
		if (v[i].needed && v[i].group >= 0)
			v[v[i].group].needed = true;
	}
	for (size_t i = 0; i < n; i++)
		if (v[i].group >= 0 && v[v[i].group].needed)
			v[i].needed = true;
	for (size_t i = 0; i < n; i++)
		if (v[i].needed && (!v[i].seen || v[i].type != 'd'))
			mark_parent_of(c, v[i].path);
}

/* A directory that stays, with the checkpoint's xattrs: owner and mode from
 * its manifest line, times by fix_dir_times; its header adds nothing. */
static int dir_direct(struct tar_rctx *c, int dfd, struct tar_mentry *e)
{
	if (fchown(dfd, e->uid, e->gid) < 0 || fchmod(dfd, e->mode) < 0)
		return err_set(c->err, errno, NULL, "cannot set the owner or mode of '%s': %m", e->path);
	tar_replace_note(c->o, e->path, true);
	e->direct = true;
	c->n_direct++;
	c->st->rewritten++;
	return 0;
}

/* Clear the way for the rewrite: a non-directory is unlinked (a hardlink never
 * writes through to a shared inode); a directory that stays loses its xattrs. */
static int prepare_one(struct tar_rctx *c, int root_fd, struct tar_mentry *e)
{
	const char *leaf;
	_cleanup_close_ int pfd = tar_open_parent(root_fd, e->path, &leaf);
	int r;

	if (pfd < 0)
		return err_set(c->err, pfd, NULL, "cannot open the directory of '%s': %s", e->path, strerror(-pfd));
	if (c->o->by_rename && (e->type == 'f' || e->type == 'l'))
		return 0; /* replaced by a rename over it (write_regular, write_symlink) */
	if (e->type != 'd') {
		tar_gone_at(c->o, pfd, leaf, e->path);
		if (unlinkat(pfd, leaf, 0) < 0 && errno != ENOENT)
			return err_set(c->err, errno, NULL, "cannot remove '%s': %m", e->path);
		return 0;
	}
	_cleanup_close_ int dfd = openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return err_set(c->err, errno, NULL, "cannot open '%s': %m", e->path);
	if (!c->o->trust_nothing && tar_xattrs_match(dfd, NULL, e->xhash))
		return dir_direct(c, dfd, e);
	r = tar_xattrs_apply_fd(dfd, NULL, 0);
	return r < 0 ? err_set(c->err, r, NULL, "cannot clear xattrs of '%s': %s", e->path, strerror(-r)) : 0;
}

static int prepare(struct tar_rctx *c, int root_fd, uint64_t *ret_files, uint64_t *ret_bytes)
{
	*ret_files = *ret_bytes = 0;
	for (size_t i = 0; i < c->m.n; i++) {
		struct tar_mentry *e = &c->m.v[i];
		if (!e->needed) {
			c->st->kept++;
			continue;
		}
		if (!e->seen) {
			(*ret_files)++;
			*ret_bytes += e->type == 'f' ? e->size : 0;
			continue;
		}
		int r = prepare_one(c, root_fd, e);
		if (r < 0)
			return r;
		if (!e->direct) {
			(*ret_files)++;
			*ret_bytes += e->type == 'f' ? e->size : 0;
		}
	}
	return 0;
}

/* After a restore: remember the identity of what was written (only what
 * was: a walk of the whole root would cost as much as the restore's own). */
static void record_written(struct tar_rctx *c, int root_fd)
{
	for (size_t i = 0; i < c->m.n; i++) {
		struct tar_mentry *e = &c->m.v[i];
		const char *leaf;
		struct stat st;
		if (!e->needed)
			continue;
		int pfd = tar_rctx_parent_fd(c, root_fd, e->path, &leaf);
		if (pfd < 0 || fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0 || !tar_type_matches(e, &st))
			continue;
		e->has_alias = true;
		e->alias_ino = st.st_ino;
		e->alias_ctime = st.st_ctim;
		tar_ts_max(&c->o->max_ctime, st.st_ctim);
	}
	if (c->pdir_fd >= 0)
		close(TAKE_FD(c->pdir_fd));
}

/* libarchive defers the times of directories it creates, but sets those of
 * a directory that already exists at once, before its children change it:
 * set every rewritten directory's mtime again, deepest first. */
static int fix_dir_times(struct tar_rctx *c, int root_fd)
{
	for (size_t i = c->m.n; i-- > 0;) {
		struct tar_mentry *e = &c->m.v[i];
		const char *leaf;
		if (!e->needed || e->type != 'd')
			continue;
		struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, e->mtime };
		_cleanup_close_ int pfd = tar_open_parent(root_fd, e->path, &leaf);
		if (pfd < 0 || utimensat(pfd, leaf, ts, AT_SYMLINK_NOFOLLOW) < 0)
			return err_set(c->err, pfd < 0 ? -pfd : errno, NULL, "cannot set the times of '%s': %m",
				       e->path);
	}
	return 0;
}

static int apply_root(struct tar_rctx *c, int root_fd)
{
	const struct tar_mentry *e = &c->m.root;
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, e->mtime };
	int r;

	if (fchown(root_fd, e->uid, e->gid) < 0 || fchmod(root_fd, e->mode) < 0)
		return err_set(c->err, errno, NULL, "cannot set the root's owner or mode: %m");
	r = tar_xattrs_apply_fd(root_fd, c->m.root_xattrs, c->m.n_root_xattrs);
	if (r < 0)
		return err_set(c->err, r, NULL, "cannot set the root's xattrs: %s", strerror(-r));
	if (futimens(root_fd, ts) < 0)
		return err_set(c->err, errno, NULL, "cannot set the root's times: %m");
	return 0;
}

int tar_restore_root(int root_fd, int ckpt_dirfd, const char *archive, const char *manifest, struct tar_restore_opts *o,
		     struct tar_restore_stats *stats, ckpt_error *err)
{
	struct tar_rctx c = { .o = o, .st = stats, .err = err, .pdir_fd = -1 };
	uint64_t files, bytes;
	int r;

	memset(stats, 0, sizeof(*stats));
	char alias[PATH_MAX];
	snprintf(alias, sizeof(alias), "%s.alias", manifest);
	r = tar_mcache_get(o->mcache, ckpt_dirfd, manifest, alias, &c.m, err);
	if (r < 0)
		return r;
	bool journal = o->journal && !o->trust_nothing &&
		!tar_manifest_holds_ino(&c.m, root_fd, o->outside_inos, o->n_outside_inos);
	stats->tracked = journal;
	r = journal ? journal_walk(&c, root_fd) : live_walk(&c, root_fd, NULL, true);
	if (r >= 0)
		close_needed(&c);
	if (r >= 0 && o->before_change) /* the whole root: what changes is said first */
		r = tar_plan_run(o, root_fd, &c.plan, &c.m, err);
	tar_plan_free(&c.plan);
	if (r >= 0)
		r = prepare(&c, root_fd, &files, &bytes);
	if (r >= 0 && o->p) {
		atomic_fetch_add(&o->p->files_total, files);
		atomic_fetch_add(&o->p->bytes_total, bytes);
	}
	if (r >= 0 && files > 0)
		r = tar_extract_chain(&c, root_fd, ckpt_dirfd, archive);
	if (r >= 0 && (files > 0 || c.n_direct > 0))
		r = fix_dir_times(&c, root_fd);
	if (r >= 0)
		r = apply_root(&c, root_fd);
	/* Only a cache: without it the next restore rewrites more, nothing worse. */
	if (r >= 0 && (files > 0 || c.n_direct > 0) && !o->no_alias) {
		record_written(&c, root_fd);
		tar_manifest_alias_save(ckpt_dirfd, alias, &c.m);
	}
	if (r >= 0)
		tar_mcache_put(o->mcache, ckpt_dirfd, manifest, alias, &c.m);
	else
		tar_manifest_free(&c.m);
	return r;
}
