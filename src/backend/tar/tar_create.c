/* tar_create.c: walk a root with *at() calls and write a pax archive (zstd
 * when available) and its manifest in one pass. The walk is ours rather than
 * archive_read_disk's: it never follows a symlink, never looks up user or
 * group names, and yields the exact stat the manifest records. */
#include "backend/tar/tar_create.h"

#include <archive.h>
#include <archive_entry.h>
#include <limits.h>
#include <nettle/sha2.h>
#include <sys/stat.h>

#include "backend/tar/tar_fs.h"
#include "backend/tar/tar_seek.h"
#include "lib/devino.h"
#include "lib/walk.h"
#include "lib/failpoint.h"

#define TAR_BLOCK (1 << 20)
#define TAR_IO_BUF (1 << 20)

struct cctx {
	struct archive *a;
	FILE *mf;
	struct tar_create_opts *o;
	struct devino_map links; /* (dev, ino) -> first path archived */
	char *buf;
	ckpt_error *err;
};

static void entry_freep(struct archive_entry **e)
{
	if (*e)
		archive_entry_free(*e);
}
#define _cleanup_entry_ _cleanup_(entry_freep)

static int arch_err(struct cctx *c, const char *what, const char *path)
{
	int e = tar_errno_norm(archive_errno(c->a));
	if (e == ENOSPC)
		return err_set(c->err, ENOSPC, NULL,
			       "no space left in the state directory while writing the checkpoint (%s '%s')", what,
			       path);
	/* libarchive's own words ("Write error") do not say why: add the errno's */
	const char *msg = archive_error_string(c->a);
	if (msg && strstr(msg, strerror(e)))
		return err_set(c->err, e, NULL, "%s '%s': %s", what, path, msg);
	return err_set(c->err, e, NULL, "%s '%s': %s (%s)", what, path, msg ? msg : "error", strerror(e));
}

/* The first path seen for (dev, ino), or NULL after remembering path. */
static const char *links_first(struct cctx *c, const struct stat *st, const char *path, int *r)
{
	const char *first = devino_get(&c->links, st->st_dev, st->st_ino);
	*r = first ? 0 : devino_put(&c->links, st->st_dev, st->st_ino, path);
	return first;
}

static void add_sparse_map(struct archive_entry *ae, int fd, off_t size)
{
	off_t pos = 0;
	while (pos < size) {
		off_t data = lseek(fd, pos, SEEK_DATA);
		if (data < 0)
			break;
		off_t hole = lseek(fd, data, SEEK_HOLE);
		if (hole < 0)
			hole = size;
		archive_entry_sparse_add_entry(ae, data, hole - data);
		pos = hole;
	}
	lseek(fd, 0, SEEK_SET);
}

/* Count progress. The totals come from a walk beside the create: raised
 * first when done would pass them (before that walk ends, or when the tree
 * grew meanwhile), so done never passes total. One writer of done; the
 * total is raised to a maximum, as that walk raises it. */
static void add_done(_Atomic uint64_t *done, _Atomic uint64_t *total, uint64_t n)
{
	uint64_t d = atomic_load(done) + n, t = atomic_load(total);
	while (d > t && !atomic_compare_exchange_weak(total, &t, d))
		;
	atomic_store(done, d);
}

static void prog(struct cctx *c, uint64_t files, uint64_t bytes)
{
	struct progress *p = c->o->p;
	if (!p)
		return;
	if (files)
		add_done(&p->files_done, &p->files_total, files);
	if (bytes)
		add_done(&p->bytes_done, &p->bytes_total, bytes);
}

/* Archive the data and hash it for the manifest (what verify compares). */
static int copy_data(struct cctx *c, int fd, struct tar_mentry *me, const char *path)
{
	struct sha256_ctx h;
	uint64_t done = 0, size = me->size;

	sha256_init(&h);
	while (done < size) {
		size_t want = size - done < TAR_IO_BUF ? (size_t)(size - done) : TAR_IO_BUF;
		ssize_t n = read(fd, c->buf, want);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return err_set(c->err, errno, NULL, "cannot read '%s': %m", path);
		if (n == 0)
			break; /* shrank meanwhile: libarchive pads the entry */
		if (archive_write_data(c->a, c->buf, (size_t)n) < 0)
			return arch_err(c, "cannot write data of", path);
		sha256_update(&h, (size_t)n, (const uint8_t *)c->buf);
		done += (uint64_t)n;
		prog(c, 0, (uint64_t)n);
	}
	sha256_digest(&h, TAR_SHA256_LEN, me->sha256);
	me->has_sha256 = true;
	return 0;
}

static int set_xattrs(struct archive_entry *ae, struct tar_mentry *me, int dirfd, const char *name, int fd)
{
	struct tar_xattr *xa = NULL;
	size_t n = 0;
	int r = fd >= 0 ? tar_xattrs_read(fd, NULL, &xa, &n) : tar_xattrs_read(dirfd, name, &xa, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++)
		archive_entry_xattr_add_entry(ae, xa[i].name, xa[i].value, xa[i].len);
	me->xhash = tar_xattrs_hash(xa, n);
	tar_xattrs_free(xa, n);
	return 0;
}

/* Fill ae and me for one entry; fd is open for regular files and dirs. */
static int describe(struct cctx *c, int dirfd, const char *name, const char *path, const struct stat *st, int fd,
		    struct archive_entry *ae, struct tar_mentry *me)
{
	int r;

	tar_mentry_from_stat(me, st);
	me->path = (char *)path;
	archive_entry_copy_stat(ae, st);
	archive_entry_unset_atime(ae);
	archive_entry_unset_ctime(ae);
	archive_entry_copy_pathname(ae, path);
	if (S_ISREG(st->st_mode) && st->st_nlink > 1) {
		const char *first = links_first(c, st, path, &r);
		if (r < 0)
			return err_set(c->err, r, NULL, "out of memory");
		if (first) {
			me->type = 'h';
			me->link = (char *)first;
			archive_entry_set_hardlink(ae, first);
			archive_entry_set_size(ae, 0);
		}
	}
	if (S_ISLNK(st->st_mode)) {
		ssize_t n = readlinkat(dirfd, name, c->buf, PATH_MAX);
		if (n < 0)
			return err_set(c->err, errno, NULL, "cannot read symlink '%s': %m", path);
		c->buf[n] = '\0';
		archive_entry_copy_symlink(ae, c->buf);
	}
	r = set_xattrs(ae, me, dirfd, name, fd);
	if (r < 0)
		return err_set(c->err, r, NULL, "cannot read xattrs of '%s': %s", path, strerror(-r));
	if (S_ISREG(st->st_mode) && me->type == 'f' && (off_t)st->st_blocks * 512 < st->st_size)
		add_sparse_map(ae, fd, st->st_size);
	return 0;
}

static int open_entry(int dirfd, const char *name, const struct stat *st)
{
	int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
	if (S_ISDIR(st->st_mode))
		flags |= O_DIRECTORY;
	else if (!S_ISREG(st->st_mode))
		return -1;
	int fd = openat(dirfd, name, flags | O_NOATIME);
	if (fd < 0 && errno == EPERM)
		fd = openat(dirfd, name, flags);
	return fd;
}

static int walk_dir(struct cctx *c, int dirfd, const char *rel);

static bool ts_eq(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

static bool ts_before(struct timespec a, struct timespec b)
{
	return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

/* Does the file's content hash to sha? (A file that cannot be read: no.) */
static bool same_content(struct cctx *c, int dirfd, const char *name, const unsigned char *sha)
{
	_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	unsigned char d[TAR_SHA256_LEN];
	struct sha256_ctx h;
	ssize_t n;

	if (fd < 0)
		return false;
	sha256_init(&h);
	while ((n = read(fd, c->buf, TAR_IO_BUF)) > 0)
		sha256_update(&h, (size_t)n, (const uint8_t *)c->buf);
	if (n < 0)
		return false;
	sha256_digest(&h, TAR_SHA256_LEN, d);
	return !memcmp(d, sha, TAR_SHA256_LEN);
}

/* Where a setxattr leaves ctime (gVisor), the file's xattrs are the
 * entry's too. (One that cannot be read: no.) */
static bool same_xattrs(struct cctx *c, int dirfd, const char *name, const struct tar_mentry *e)
{
	return !c->o->xattrs_blind || tar_xattrs_match(dirfd, name, e->xhash);
}

/* The parent's entry for a file that has not changed since it was captured:
 * any write moves ctime, and so do chmod, chown and xattr changes; the
 * caller's final tar_wait_past makes sure a change right after the capture
 * cannot keep the recorded ctime.
 * A file of several links is archived again each time, whole group, so
 * that a hardlink group lives in one archive. Taking only its first member
 * from the parent is not sound: a restore reads the checkpoint's own
 * archive before the older ones, and so does a compaction, so a link line
 * would be made before its target's data, or to the live inode about to be
 * replaced. Taking the whole group from the parent would be sound in
 * principle, but it needs a source on a link line ("h"): the manifest of
 * every ckptd so far refuses one (tar_manifest.c, parse_entry), and a
 * whole-root restore can bring back such an older ckptd, which could then
 * not read the newer checkpoints. It also needs each member looked up: a
 * directory renamed above a link moves it without a new ctime. */
static const struct tar_mentry *reusable(struct cctx *c, int dirfd, const char *name, const char *path,
					 const struct stat *st, bool *differs)
{
	const struct tar_mentry *e;

	if (!c->o->parent || !S_ISREG(st->st_mode) || st->st_nlink != 1 ||
	    (c->o->suspects && pathindex_has(c->o->suspects, path)))
		return NULL;
	e = tar_manifest_find(c->o->parent, path);
	if (!e || e->type != 'f' || e->group >= 0 || e->nlink != 1 || !e->has_sha256 ||
	    e->size != (uint64_t)st->st_size || !ts_eq(e->mtime, st->st_mtim))
		return NULL;
	/* what a restore wrote: recorded once written, after the clock moved on */
	if (e->has_alias && e->alias_ino == (uint64_t)st->st_ino && ts_eq(e->alias_ctime, st->st_ctim))
		return e;
	if (e->ino != (uint64_t)st->st_ino || !ts_eq(e->ctime, st->st_ctim))
		return NULL;
	/* unsure: changed while (or right before) the parent read it; data
	 * unlike the parent's under its (inode, ctime): *differs */
	if (!ts_before(st->st_ctim, c->o->parent_started) && !same_content(c, dirfd, name, e->sha256))
		return *differs = true, NULL;
	return same_xattrs(c, dirfd, name, e) ? e : NULL;
}

/* A manifest line only: the data stays where the parent found it. me holds
 * the live entry's description (from its stat, or the parent's line). */
static int reuse_entry(struct cctx *c, const struct tar_mentry *pe, struct tar_mentry me)
{
	me.xhash = pe->xhash;
	me.has_sha256 = true;
	memcpy(me.sha256, pe->sha256, TAR_SHA256_LEN);
	me.src = pe->src ? pe->src : (char *)c->o->parent_name;
	me.off = pe->off; /* in that archive */
	size_t k = 0;
	while (k < c->o->n_srcs && strcmp(c->o->srcs[k], me.src))
		k++;
	if (k == c->o->n_srcs) {
		char **n = realloc(c->o->srcs, (k + 1) * sizeof(*n));
		if (!n || !(n[k] = strdup(me.src))) {
			if (n)
				c->o->srcs = n;
			return err_set(c->err, ENOMEM, NULL, "out of memory");
		}
		c->o->srcs = n;
		c->o->n_srcs++;
	}
	tar_ts_max(&c->o->max_ctime, me.ctime);
	if (tar_manifest_write_entry(c->mf, &me) < 0)
		return err_set(c->err, tar_errno_norm(errno), NULL, "cannot write manifest line for '%s'", me.path);
	c->o->reused++;
	prog(c, 1, me.size);
	return 0;
}

static int reuse_one(struct cctx *c, const struct tar_mentry *pe, const char *path, const struct stat *st)
{
	struct tar_mentry me = { 0 };

	tar_mentry_from_stat(&me, st);
	me.path = (char *)path;
	return reuse_entry(c, pe, me);
}

/* A file of a directory the journal says did not change, taken from the
 * parent's line without a stat: only a plain file of one link that the
 * parent captured for sure (not while it changed, not through a restore's
 * alias) and that nothing maps for writing. */
static bool taken_as_is(struct cctx *c, const struct tar_mentry *e)
{
	return e->type == 'f' && e->group < 0 && e->nlink == 1 && e->has_sha256 && !e->has_alias &&
		ts_before(e->ctime, c->o->parent_started) &&
		!(c->o->suspects && pathindex_has(c->o->suspects, e->path));
}

static int take_one(struct cctx *c, const struct tar_mentry *pe)
{
	struct tar_mentry me = { 0 };

	me.path = pe->path;
	me.type = 'f';
	me.mode = pe->mode;
	me.uid = pe->uid;
	me.gid = pe->gid;
	me.size = pe->size;
	me.mtime = pe->mtime;
	me.ctime = pe->ctime;
	me.ino = pe->ino;
	me.nlink = 1;
	me.group = -1;
	return reuse_entry(c, pe, me);
}

/* A suspect, where a write through a mapping leaves ctime (gVisor; and
 * anywhere, a store into a page already dirty), or a file whose data the
 * parent holds otherwise under the same (inode, ctime): its data may differ
 * from what an older capture read under that identity. A chmod to its own
 * mode moves ctime and nothing else a checkpoint holds, so every older
 * manifest's line stops matching it. (A later write
 * through a mapping makes it a suspect again: mapped at a collect, or closed
 * since.) *st is stat-ed again. */
static int new_ctime(int fd, struct stat *st)
{
	struct timespec was = st->st_ctim;
	for (int tries = 0; tries < 2; tries++) {
		if (fchmod(fd, st->st_mode & 07777) < 0)
			return errno == EROFS ? 0 : -errno; /* nothing writes it there */
		if (fstat(fd, st) < 0)
			return -errno;
		if (!ts_eq(st->st_ctim, was))
			return 0;
		tar_wait_past(was); /* in the tick that stamped it: once more */
	}
	return -EAGAIN;
}

/* One entry (its stat st) into the archive and the manifest. A
 * directory's own fd, in *ret_dir, for the caller to go below it through. */
static int archive_one_st(struct cctx *c, int dirfd, const char *name, const char *path, const struct stat *st_,
			  int *ret_dir)
{
	_cleanup_entry_ struct archive_entry *ae = archive_entry_new();
	_cleanup_close_ int fd = -1;
	struct tar_mentry me = { 0 };
	struct stat st = *st_;
	int r;

	if (!ae)
		return err_set(c->err, ENOMEM, NULL, "out of memory");
	if (!tar_type_of(st.st_mode) || tar_skipped(&st, c->o->skip_dev, c->o->skip_ino, c->o->excl))
		return 0; /* sockets cannot be archived; the state dir and exclusions are not content */
	bool differs = false;
	const struct tar_mentry *pe = reusable(c, dirfd, name, path, &st, &differs);
	if (pe)
		return reuse_one(c, pe, path, &st);
	fd = open_entry(dirfd, name, &st);
	if (fd < 0 && errno == ENOENT)
		return 0; /* removed since readdir */
	if ((S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) && (fd < 0 || fstat(fd, &st) < 0))
		return err_set(c->err, errno, NULL, "cannot open '%s': %m", path);
	bool suspect = c->o->suspects && pathindex_has(c->o->suspects, path);
	if (S_ISREG(st.st_mode) &&
	    (differs ||
	     (suspect &&
	      (c->o->mapped_blind || pathindex_has(c->o->mapped_now, path) ||
	       pathindex_has(c->o->mapped_last, path)))) &&
	    (r = new_ctime(fd, &st)) < 0)
		return err_set(c->err, -r, NULL, "cannot give '%s' a new ctime: %s", path, strerror(-r));
	r = describe(c, dirfd, name, path, &st, fd, ae, &me);
	if (r < 0)
		return r;
	me.off = tar_writer_offset(c->a);
	if (archive_write_header(c->a, ae) < ARCHIVE_WARN)
		return arch_err(c, "cannot write header of", path);
	if (me.type == 'f' && (r = copy_data(c, fd, &me, path)) < 0)
		return r;
	if (me.type == 'h') /* counted by the tree walk, but no data to copy */
		prog(c, 0, me.size);
	if (archive_write_finish_entry(c->a) < ARCHIVE_WARN)
		return arch_err(c, "cannot finish", path);
	tar_ts_max(&c->o->max_ctime, me.ctime);
	if (tar_manifest_write_entry(c->mf, &me) < 0)
		return err_set(c->err, tar_errno_norm(errno), NULL, "cannot write manifest line for '%s'", path);
	prog(c, 1, 0);
	if (S_ISDIR(st.st_mode))
		*ret_dir = TAKE_FD(fd);
	return 0;
}

static int archive_one(struct cctx *c, int dirfd, const char *name, const char *path, int *ret_dir)
{
	struct stat st;
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : err_set(c->err, errno, NULL, "cannot stat '%s': %m", path);
	return archive_one_st(c, dirfd, name, path, &st, ret_dir);
}

/* Did the journal see the directory rel ("" the root) change: itself, or
 * below a directory made, moved or removed (deep)? */
static bool dir_dirty(const struct tar_create_opts *o, const char *rel)
{
	return strlen(rel) >= PATH_MAX || pathindex_dirty_covers(o->dirty, o->n_dirty, rel);
}

static bool below(const char *path, const char *dir, size_t len)
{
	return !strncmp(path, dir, len) && path[len] == '/';
}

/* A directory the journal saw no change in: its entries are the parent's
 * lines, in the parent's order (each directory's subtree follows its line).
 * first: the index of the line after the directory's own (0 for the root). */
static int walk_taken(struct cctx *c, int dirfd, const char *rel, size_t first)
{
	const struct tar_manifest *pm = c->o->parent;
	size_t len = rel ? strlen(rel) : 0;

	for (size_t i = first; i < pm->n && (!rel || below(pm->v[i].path, rel, len));) {
		const struct tar_mentry *e = &pm->v[i];
		const char *name = rel ? e->path + len + 1 : e->path;
		_cleanup_close_ int sub = -1;
		int r = taken_as_is(c, e) ? take_one(c, e) : archive_one(c, dirfd, name, e->path, &sub);
		if (r == 0 && sub >= 0)
			r = walk_dir(c, sub, e->path);
		if (r < 0)
			return r;
		size_t elen = strlen(e->path);
		for (i++; e->type == 'd' && i < pm->n && below(pm->v[i].path, e->path, elen); i++)
			; /* its subtree: archive_one went through it */
	}
	return 0;
}

/* A directory the journal saw no change in: -1 when it changed (or is not
 * the parent's directory), else the index of the line after its own (0
 * for the root). */
static ssize_t taken_first(struct cctx *c, const char *rel)
{
	if (!c->o->journal || !c->o->parent || dir_dirty(c->o, rel ? rel : ""))
		return -1;
	if (!rel)
		return 0;
	const struct tar_mentry *e = tar_manifest_find(c->o->parent, rel);
	return e && e->type == 'd' ? (ssize_t)(e - c->o->parent->v) + 1 : -1;
}

struct create_walk {
	struct tar_walk tw; /* first: tar_walk_fail_gone's */
	struct cctx *c;
};

/* walk_tree's part of a create: each entry archived as it is listed, a
 * directory's subtree right after it (the archive's and the manifest's
 * order). A directory the journal saw no change in is listed from the
 * parent's manifest instead; one that changed is read through the fd
 * archive_one opened, so the walk lists the inode it archived. */
static int create_pre(void *ctx, struct walk_entry *e)
{
	struct create_walk *w = ctx;
	struct cctx *c = w->c;
	int sub = -1;
	int r = archive_one_st(c, e->dirfd, e->name, e->path, &e->st, &sub);
	if (r >= 0 && sub >= 0) {
		ssize_t first = taken_first(c, e->path);
		if (first < 0) {
			c->o->dirs_read++;
			e->type = DT_DIR; /* what archive_one's stat saw decides */
			e->fd = sub;
			return 0;
		}
		r = walk_taken(c, sub, e->path, (size_t)first);
		close(sub);
	}
	w->tw.failed |= r < 0;
	return r < 0 ? r : WALK_SKIP;
}

/* Below directory dirfd (rel its path, NULL at the root). The nesting of
 * walk_taken and walk_tree is bounded by the length of a path (PATH_MAX). */
static int walk_dir(struct cctx *c, int dirfd, const char *rel)
{
	ssize_t first = taken_first(c, rel);
	if (first >= 0)
		return walk_taken(c, dirfd, rel, (size_t)first);
	c->o->dirs_read++;
	struct create_walk w = { .tw = { .err = c->err }, .c = c };
	struct walk_opts o = { .flags = WALK_STAT, .pre = create_pre, .ctx = &w };
	return tar_walk_below(dirfd, rel, &o, &w.tw); /* an entry gone since listed: not archived */
}

bool tar_create_count_journal(int root_fd, const struct tar_create_opts *o, uint64_t *files, uint64_t *bytes)
{
	const struct tar_manifest *pm = o->parent;
	char dir[PATH_MAX];

	for (size_t i = 0; pm && i < pm->n; i++) { /* what the clean directories hold */
		const struct tar_mentry *e = &pm->v[i];
		const char *slash = strrchr(e->path, '/');
		snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - e->path) : 0, e->path);
		if (dir_dirty(o, dir))
			continue;
		(*files)++;
		*bytes += e->type == 'f' ? e->size : 0;
	}
	for (size_t i = 0; i < o->n_dirty; i++) { /* and the others, read */
		if (pathindex_dirty_below_deep(o->dirty, o->n_dirty, o->dirty[i].path))
			continue; /* counted with its deep ancestor */
		const char *leaf;
		_cleanup_close_ int pfd = o->dirty[i].path[0] ? tar_open_parent(root_fd, o->dirty[i].path, &leaf) : -1;
		_cleanup_close_ int dfd = o->dirty[i].path[0]
			? (pfd < 0 ? -1 : openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC))
			: fcntl(root_fd, F_DUPFD_CLOEXEC, 3);
		_cleanup_closedir_ DIR *d = NULL;
		struct dirent *de;
		struct stat st;
		if (dfd >= 0 && o->dirty[i].deep) { /* made or moved: its subtree, all of it */
			tar_count_tree(dfd, o->skip_dev, o->skip_ino, o->excl, NULL, files, bytes);
			continue;
		}
		if (dfd < 0 || walk_open(dfd, NULL, &d) < 0)
			continue;
		while ((de = walk_next(d)))
			if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    !tar_skipped(&st, o->skip_dev, o->skip_ino, o->excl)) {
				(*files)++;
				*bytes += S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
			}
	}
	return true;
}

struct jcheck {
	struct tar_manifest m;
	struct timespec since;
	dev_t skip_dev;
	ino_t skip_ino;
	const struct rootexcl *excl;
	ckpt_error *err;
};

static int jcheck_one(void *ctx, struct walk_entry *e)
{
	struct jcheck *j = ctx;
	const struct stat *st = &e->st;

	if (!tar_type_of(st->st_mode) || tar_skipped(st, j->skip_dev, j->skip_ino, j->excl))
		return WALK_SKIP;
	const struct tar_mentry *m = tar_manifest_find(&j->m, e->path);
	/* changed since the create began: either way is right */
	bool settled = ts_before(st->st_ctim, j->since);
	if (settled &&
	    (!m || !tar_type_matches(m, st) ||
	     (!S_ISDIR(st->st_mode) &&
	      (m->ino != (uint64_t)st->st_ino || !ts_eq(m->ctime, st->st_ctim) ||
	       (S_ISREG(st->st_mode) && m->size != (uint64_t)st->st_size)))))
		return err_set(j->err, EIO, NULL, "change tracking missed '%s' (track_check)", e->path);
	return 0;
}

/* An entry gone (ENOENT, at a read too: a directory removed while it is
 * listed) or replaced by a file (ENOTDIR) since listed is the writer's
 * business, not a miss. Any other failure (EMFILE, EACCES, EIO) ends the
 * check with its errno: a subtree left unread is one the check never
 * compared, and its ok would be no promise. */
static int jcheck_fail(void *ctx, const struct walk_entry *e, int r)
{
	struct jcheck *j = ctx;
	return r == -ENOENT || r == -ENOTDIR ? 0 : tar_walk_failed(j->err, e, r);
}

int tar_create_check(int root_fd, int out_dirfd, const char *manifest, const struct tar_create_opts *o,
		     struct timespec since, ckpt_error *err)
{
	struct jcheck j = {
		.since = since, .skip_dev = o->skip_dev, .skip_ino = o->skip_ino, .excl = o->excl, .err = err
	};
	struct walk_opts wo = {
		.flags = WALK_STAT, .path_max = PATH_MAX, .pre = jcheck_one, .fail = jcheck_fail, .ctx = &j
	};
	int r = tar_manifest_load(out_dirfd, manifest, &j.m, err);
	if (r >= 0)
		r = tar_walk_root(root_fd, &wo, err);
	tar_manifest_free(&j.m);
	return r;
}

struct archive *tar_writer_new(void)
{
	struct archive *a = archive_write_new();
	if (!a)
		return NULL;
	if (archive_write_set_format_pax(a) != ARCHIVE_OK || archive_write_add_filter_none(a) != ARCHIVE_OK ||
	    archive_write_set_bytes_per_block(a, TAR_BLOCK) != ARCHIVE_OK ||
	    archive_write_set_bytes_in_last_block(a, 1) != ARCHIVE_OK) {
		archive_write_free(a);
		return NULL;
	}
	return a;
}

bool tar_create_zstd_available(void)
{
	struct archive *a = archive_write_new();
	bool ok = a && archive_write_add_filter_zstd(a) == ARCHIVE_OK;
	if (a)
		archive_write_free(a);
	return ok;
}

static int write_root_header(struct cctx *c, int root_fd)
{
	struct tar_mentry root = { 0 };
	struct tar_xattr *xa = NULL;
	size_t n = 0;
	struct stat st;

	if (fstat(root_fd, &st) < 0)
		return err_set(c->err, errno, NULL, "cannot stat root: %m");
	tar_mentry_from_stat(&root, &st);
	root.path = (char *)".";
	root.off = -1;
	int r = tar_xattrs_read(root_fd, NULL, &xa, &n);
	if (r < 0)
		return err_set(c->err, r, NULL, "cannot read the root's xattrs: %s", strerror(-r));
	root.xhash = tar_xattrs_hash(xa, n);
	r = tar_manifest_write_header(c->mf, &root, xa, n);
	tar_xattrs_free(xa, n);
	return r < 0 ? err_set(c->err, tar_errno_norm(errno), NULL, "cannot write manifest") : 0;
}

static int finish_files(struct cctx *c, int afd)
{
	if (archive_write_close(c->a) != ARCHIVE_OK)
		return arch_err(c, "cannot close", "archive");
	if (fflush(c->mf) != 0 ||
	    FAILPOINT_AROUND("tar.create.files.fsync", fsync(fileno(c->mf)) < 0 || fsync(afd) < 0)) {
		int e = tar_errno_norm(errno);
		return err_set(c->err, e, NULL, "cannot write checkpoint files: %s", strerror(e));
	}
	return 0;
}

static void cctx_free(struct cctx *c)
{
	if (c->a)
		archive_write_free(c->a);
	if (c->mf)
		fclose(c->mf);
	devino_free(&c->links);
	free(c->buf);
}

int tar_create_root(int root_fd, int out_dirfd, const char *archive, const char *manifest, struct tar_create_opts *o,
		    ckpt_error *err)
{
	struct cctx c = { .o = o, .err = err };
	_cleanup_close_ int afd = -1;
	int r, mfd;

	afd = openat(out_dirfd, archive, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	mfd = openat(out_dirfd, manifest, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (afd < 0 || mfd < 0) {
		r = err_set(err, tar_errno_norm(errno), NULL, "cannot create checkpoint files: %m");
		if (mfd >= 0)
			close(mfd);
		return r;
	}
	c.mf = fdopen(mfd, "w");
	c.buf = malloc(TAR_IO_BUF > PATH_MAX ? TAR_IO_BUF : PATH_MAX + 1);
	c.a = tar_writer_new();
	if (!c.mf || !c.buf || !c.a) {
		if (!c.mf)
			close(mfd);
		cctx_free(&c);
		return err_set(err, ENOMEM, NULL, "cannot set up the archive writer");
	}
	setvbuf(c.mf, NULL, _IOFBF, 1 << 16);
	struct tar_frames fr = { 0 };
	r = tar_writer_open(c.a, afd, o->zstd ? &fr : NULL) != ARCHIVE_OK ? arch_err(&c, "cannot open", archive) : 0;
	if (r >= 0)
		r = write_root_header(&c, root_fd);
	if (r >= 0)
		r = walk_dir(&c, root_fd, NULL);
	if (r >= 0)
		r = finish_files(&c, afd);
	if (r >= 0 && o->zstd && (r = tar_frames_save_for(out_dirfd, archive, &fr)) < 0)
		err_set(err, -r, NULL, "cannot write the frames of '%s': %s", archive, strerror(-r));
	cctx_free(&c); /* closes the writer, if not yet: it may still add frames */
	tar_frames_free(&fr);
	return r;
}
