/* tar_extract.c: step 4 of an in-place restore (tar_restore.c): each
 * archive that holds a marked entry read once, from where its entries begin
 * when its frames say so, and those entries written. Regular files and
 * directories are written here, the rest by libarchive's disk writer. */
#include "backend/tar/tar_extract.h"

#include <archive.h>
#include <archive_entry.h>
#include <limits.h>
#include <sys/stat.h>

#include "backend/tar/tar_fs.h"
#include "backend/tar/tar_replace.h"
#include "backend/tar/tar_seek.h"

#define TAR_BLOCK (1 << 20)

int tar_extract_flags(void)
{
	return ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_XATTR |
		ARCHIVE_EXTRACT_UNLINK | ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
		ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS;
}

/* The archive entry must be one the manifest (already validated) lists,
 * with the same type; anything else means a tampered or corrupt checkpoint. */
static struct tar_mentry *check_entry(struct tar_rctx *c, struct archive_entry *ae, const char *src, bool *skip)
{
	const char *path = archive_entry_pathname(ae), *hl = archive_entry_hardlink(ae);
	struct tar_mentry *e;
	size_t len = path ? strlen(path) : 0;

	/* pax stores directories as "name/": compare without the slash */
	if (len > 1 && path[len - 1] == '/' && archive_entry_filetype(ae) == AE_IFDIR) {
		char buf[PATH_MAX];
		snprintf(buf, sizeof(buf), "%.*s", (int)(len - 1), path);
		archive_entry_copy_pathname(ae, buf);
		path = archive_entry_pathname(ae);
	}

	if (!tar_path_valid(path) || (hl && !tar_path_valid(hl))) {
		err_set(c->err, EBADMSG, "unsafe_path", "unsafe path in archive: '%s'", path ? path : "");
		return NULL;
	}
	e = tar_manifest_find(&c->m, path);
	/* An older archive of the chain holds much this checkpoint does not
	 * take from it: only entries the manifest names it for must match. */
	if (src && (!e || !e->src || strcmp(e->src, src))) {
		*skip = true;
		return e;
	}
	if (!src && e && e->src) { /* its data is elsewhere: not in this archive */
		err_set(c->err, EBADMSG, NULL, "archive entry '%s' is listed as stored in '%s'", path, e->src);
		return NULL;
	}
	if (!e || (e->type == 'h') != (hl != NULL) || (hl && strcmp(hl, e->link)) ||
	    (!hl && tar_type_of(archive_entry_filetype(ae)) != e->type)) {
		err_set(c->err, EBADMSG, NULL, "archive entry '%s' does not match the manifest", path);
		return NULL;
	}
	return e;
}

/* Failures count as failures: libarchive reports a failed write(2) of the
 * data as a mere ARCHIVE_WARN and then extends the file to its size with
 * ftruncate, leaving a hole where the content should be. */
static int disk_err(struct tar_rctx *c, struct archive *w, const char *what, const char *path)
{
	int e = tar_errno_norm(archive_errno(w));
	return err_set(c->err, e, NULL, "cannot %s '%s': %s", what, path, archive_error_string(w) ?: strerror(e));
}

static int sys_err(struct tar_rctx *c, int e, const char *what, const char *path)
{
	e = tar_errno_norm(e);
	return err_set(c->err, e, NULL, "cannot %s '%s': %s", what, path, strerror(e));
}

static int copy_blocks(struct tar_rctx *c, struct archive *a, int fd, const char *path)
{
	const void *buf;
	size_t len;
	la_int64_t off;
	int r;

	while ((r = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK) {
		if ((r = pwrite_all(fd, buf, len, off)) < 0)
			return sys_err(c, -r, "write", path);
		c->st->bytes += len;
		if (c->o->p)
			atomic_fetch_add(&c->o->p->bytes_done, len);
	}
	if (r != ARCHIVE_EOF)
		return err_set(c->err, EBADMSG, NULL, "cannot read '%s' from the archive: %s", path,
			       archive_error_string(a));
	return 0;
}

/* Files of one directory come in a row in the archive: keep its fd. */
int tar_rctx_parent_fd(struct tar_rctx *c, int root_fd, const char *path, const char **leaf)
{
	const char *slash = strrchr(path, '/');
	size_t len = slash ? (size_t)(slash - path) : 0;

	if (c->pdir_fd >= 0 && strlen(c->pdir) == len && !strncmp(c->pdir, path, len)) {
		*leaf = slash ? slash + 1 : path;
		return c->pdir_fd;
	}
	if (c->pdir_fd >= 0)
		close(c->pdir_fd);
	c->pdir_fd = tar_open_parent(root_fd, path, leaf);
	snprintf(c->pdir, sizeof(c->pdir), "%.*s", (int)len, path);
	return c->pdir_fd;
}

/* A regular file is written here, not by libarchive, so that every step is
 * checked: data, chown, chmod, xattrs, times. by_rename: as dpkg does, beside
 * its name, then renamed over it (tar_replace.h). */
static int write_regular(struct tar_rctx *c, struct archive *a, int root_fd, struct archive_entry *ae)
{
	const char *path = archive_entry_pathname(ae), *leaf;
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
				  { archive_entry_mtime(ae), archive_entry_mtime_nsec(ae) } };
	int pfd = tar_rctx_parent_fd(c, root_fd, path, &leaf);
	char tmp[64];
	int fd, x, r = 0;

	if (pfd < 0)
		return err_set(c->err, -pfd, NULL, "cannot open the directory of '%s': %s", path, strerror(-pfd));
	fd = tar_new_open(pfd, leaf, c->o->by_rename, tmp, sizeof(tmp));
	if (fd < 0)
		return sys_err(c, -fd, "create", path);
	if (archive_entry_size(ae) > 0)
		r = copy_blocks(c, a, fd, path);
	if (r >= 0 && ftruncate(fd, archive_entry_size(ae)) < 0)
		r = sys_err(c, errno, "set the size of", path);
	if (r >= 0 &&
	    (fchown(fd, archive_entry_uid(ae), archive_entry_gid(ae)) < 0 ||
	     fchmod(fd, archive_entry_mode(ae) & 07777) < 0))
		r = sys_err(c, errno, "set the owner or mode of", path);
	if (r >= 0 && (x = tar_xattrs_apply_entry(fd, ae, false)) < 0)
		r = sys_err(c, -x, "set the xattrs of", path);
	if (r >= 0 && futimens(fd, ts) < 0)
		r = sys_err(c, errno, "set the times of", path);
	if (close(fd) < 0 && r >= 0)
		r = sys_err(c, errno, "close", path);
	if (r >= 0)
		tar_gone_at(c->o, pfd, leaf, path);
	if (r >= 0 && (x = tar_replace_commit(pfd, tmp, leaf)) < 0)
		r = sys_err(c, -x, "rename into place", path);
	if (r < 0 && tmp[0])
		unlinkat(pfd, tmp, 0);
	return r;
}

/* A directory is made here too: the disk writer's secure check stats every
 * component of an entry's path from the top, so a tree d/d/d... costs
 * O(depth) calls per directory and O(depth^2) in all (15 s for a view of the
 * deepest tree, 2,040 levels). parent_fd follows no symlink and never leaves
 * the root: the same guarantee in one call. Owner, mode and xattrs now (as
 * dir_direct for one that stays); times by fix_dir_times, after the
 * children. A directory there already is kept (prepare_one cleared its
 * xattrs); anything else in its way fails. */
static int write_dir(struct tar_rctx *c, int root_fd, struct archive_entry *ae)
{
	char path[PATH_MAX];
	const char *leaf;
	size_t len = strlen(archive_entry_pathname(ae));
	if (len >= sizeof(path))
		return sys_err(c, ENAMETOOLONG, "create", archive_entry_pathname(ae));
	memcpy(path, archive_entry_pathname(ae), len + 1);
	if (len > 1 && path[len - 1] == '/') /* pax's "name/" */
		path[len - 1] = 0;
	int pfd = tar_rctx_parent_fd(c, root_fd, path, &leaf);
	if (pfd < 0)
		return err_set(c->err, -pfd, NULL, "cannot open the directory of '%s': %s", path, strerror(-pfd));
	if (mkdirat(pfd, leaf, 0700) < 0 && errno != EEXIST)
		return sys_err(c, errno, "create", path);
	_cleanup_close_ int dfd = openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return sys_err(c, errno, "open", path);
	if (fchown(dfd, archive_entry_uid(ae), archive_entry_gid(ae)) < 0 ||
	    fchmod(dfd, archive_entry_mode(ae) & 07777) < 0)
		return sys_err(c, errno, "set the owner or mode of", path);
	int x = tar_xattrs_apply_entry(dfd, ae, false);
	return x < 0 ? sys_err(c, -x, "set the xattrs of", path) : 0;
}

/* A symbolic link (without xattrs) is made beside its name and renamed
 * over it too: a library's soname link never goes missing. 1 when done, 0
 * when it is not one for here (the disk writer makes it). */
static int write_symlink(struct tar_rctx *c, int root_fd, struct archive_entry *ae)
{
	const char *path = archive_entry_pathname(ae), *target = archive_entry_symlink(ae), *leaf;
	struct timespec mtime = { archive_entry_mtime(ae), archive_entry_mtime_nsec(ae) };
	int pfd, r;

	if (!c->o->by_rename || archive_entry_filetype(ae) != AE_IFLNK || archive_entry_hardlink(ae) || !target ||
	    archive_entry_xattr_count(ae) > 0)
		return 0;
	if ((pfd = tar_rctx_parent_fd(c, root_fd, path, &leaf)) < 0)
		return err_set(c->err, -pfd, NULL, "cannot open the directory of '%s': %s", path, strerror(-pfd));
	r = tar_replace_symlink(pfd, leaf, target, archive_entry_uid(ae), archive_entry_gid(ae), mtime);
	return r < 0 ? sys_err(c, -r, "replace the link", path) : 1;
}

/* Everything else (hard links, devices, fifos) has no data:
 * the disk writer creates it; anything short of ARCHIVE_OK is a failure too. */
static int extract_one(struct tar_rctx *c, struct archive *a, struct archive *w, int root_fd, struct archive_entry *ae)
{
	const char *path = archive_entry_pathname(ae);
	int r;

	tar_replace_note(c->o, path, true);
	if (archive_entry_filetype(ae) == AE_IFREG && !archive_entry_hardlink(ae)) {
		if ((r = write_regular(c, a, root_fd, ae)) < 0)
			return r;
	} else if (archive_entry_filetype(ae) == AE_IFDIR && !archive_entry_hardlink(ae)) {
		if ((r = write_dir(c, root_fd, ae)) < 0)
			return r;
	} else if ((r = write_symlink(c, root_fd, ae)) < 0) {
		return r;
	} else if (r == 0) {
		if (archive_write_header(w, ae) != ARCHIVE_OK)
			return disk_err(c, w, "extract", path);
		if (archive_write_finish_entry(w) != ARCHIVE_OK)
			return disk_err(c, w, "finish", path);
		const char *leaf;
		int pfd = archive_entry_hardlink(ae) ? 0 : tar_rctx_parent_fd(c, root_fd, path, &leaf);
		if (!archive_entry_hardlink(ae) && (r = pfd < 0 ? pfd : tar_xattrs_fix_made(pfd, leaf, ae)) < 0)
			return sys_err(c, -r, "set the xattrs of", path);
	}
	c->st->rewritten++;
	if (c->o->p)
		atomic_fetch_add(&c->o->p->files_done, 1);
	return 0;
}

static int extract_loop(struct tar_rctx *c, struct archive *a, struct archive *w, int root_fd, const char *src,
			uint64_t total)
{
	struct archive_entry *ae;
	uint64_t done = 0;
	int r;

	while (done < total) {
		r = archive_read_next_header(a, &ae);
		if (r == ARCHIVE_EOF)
			return err_set(c->err, EBADMSG, NULL, "archive ends before %llu entries were found",
				       (unsigned long long)(total - done));
		if (r < ARCHIVE_WARN)
			return err_set(c->err, EBADMSG, NULL, "cannot read archive: %s", archive_error_string(a));
		bool skip = false;
		struct tar_mentry *e = check_entry(c, ae, src, &skip);
		if (!e && !skip)
			return -EBADMSG;
		if (skip || !e->needed || e->direct) {
			if (archive_read_data_skip(a) < ARCHIVE_WARN)
				return err_set(c->err, EBADMSG, NULL, "cannot read archive: %s",
					       archive_error_string(a));
			continue;
		}
		if ((r = extract_one(c, a, w, root_fd, ae)) < 0)
			return r;
		done++;
	}
	return 0;
}

static int cmp_off(const void *a, const void *b)
{
	int64_t x = (*(struct tar_mentry *const *)a)->off, y = (*(struct tar_mentry *const *)b)->off;
	return x < y ? -1 : x > y;
}

/* The frames of an archive (tar_seek.h), beside it: in the checkpoint's
 * directory, or in the older one's (or its .keep/ place). */
static bool frames_of(struct tar_rctx *c, int ckpt_dirfd, const char *archive, const char *src, int afd,
		      struct tar_frames *fr)
{
	char name[PATH_MAX];
	snprintf(name, sizeof(name), "%s.frames", archive);
	_cleanup_close_ int ffd = !src ? openat(ckpt_dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
		: c->o->store_fd >= 0  ? tar_source_open(c->o->store_fd, src, name)
				       : -1;
	return ffd >= 0 && tar_frames_load_fd(ffd, afd, fr);
}

/* The needed entries of one archive, each read where the manifest says it
 * begins: from the frame holding it, not from the start of the archive.
 * 1 when done; 0 when the archive cannot be entered so (no offsets, no
 * frames, too many entries to be worth it, or an entry not where its
 * offset says: then the caller reads it from the start, which rewrites
 * what this wrote again); < 0 on a failure to write. */
static int extract_seek(struct tar_rctx *c, int afd, int ckpt_dirfd, const char *archive, const char *src,
			uint64_t total, int root_fd, struct archive *w)
{
	size_t len = strlen(archive);
	bool zst = len > 4 && !strcmp(archive + len - 4, ".zst");
	struct tar_frames fr = { 0 };
	int r = 0;

	if (total == 0 || (zst && !frames_of(c, ckpt_dirfd, archive, src, afd, &fr)))
		return 0;
	/* each entry costs half a frame on average: past that, read it all */
	if (zst && total > fr.n / 2) {
		tar_frames_free(&fr);
		return 0;
	}
	_cleanup_free_ struct tar_mentry **v = calloc(total, sizeof(*v));
	size_t n = 0;
	for (size_t i = 0; v && i < c->m.n && n < total; i++) {
		struct tar_mentry *e = &c->m.v[i];
		if (e->needed && !e->direct && (src ? e->src && !strcmp(e->src, src) : !e->src))
			v[n++] = e;
	}
	for (size_t i = 0; v && i < n; i++)
		if (v[i]->off < 0)
			n = 0; /* one without an offset (an older manifest): read it all */
	if (!v || n != total) {
		tar_frames_free(&fr);
		return 0;
	}
	qsort(v, n, sizeof(*v), cmp_off);
	struct archive *a = NULL;
	int64_t base = 0; /* where a began in the tar stream */
	for (size_t i = 0; r == 0 && i < n; i++) {
		if (a && !tar_seek_reuse(a, base, v[i]->off)) {
			archive_read_free(a);
			a = NULL;
		}
		if (!a)
			a = tar_seek_reader(afd, zst ? &fr : NULL, base = v[i]->off);
		struct archive_entry *ae;
		bool skip = false;
		ckpt_error quiet = { 0 }, *saved = c->err;
		c->err = &quiet; /* a mismatch is not an error: the caller reads all */
		struct tar_mentry *e =
			a && tar_seek_header(a, base, v[i]->off, &ae) ? check_entry(c, ae, src, &skip) : NULL;
		c->err = saved;
		if (!e || skip || e != v[i]) {
			log_warn("tar: '%s' is not where the manifest says in archive '%s'%s%s: reading it whole",
				 v[i]->path, archive, src ? " of " : "", src ? src : "");
			r = 1;
		} else if ((r = extract_one(c, a, w, root_fd, ae)) == 0) {
			c->st->entered++;
		}
	}
	if (a)
		archive_read_free(a);
	tar_frames_free(&fr);
	return r < 0 ? r : r == 1 ? 0 : 1;
}

/* The archive afd read from its start (its needed entries not entered
 * where they begin): extract_loop. */
static int extract_whole(struct tar_rctx *c, int afd, const char *archive, const char *src, uint64_t total, int root_fd,
			 struct archive *w)
{
	_cleanup_archive_ struct archive *a = archive_read_new();
	if (!a)
		return err_set(c->err, ENOMEM, NULL, "out of memory");
	archive_read_support_format_tar(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_none(a);
	if (archive_read_open_fd(a, afd, TAR_BLOCK) != ARCHIVE_OK)
		return err_set(c->err, EBADMSG, NULL, "cannot open archive '%s': %s", archive, archive_error_string(a));
	return extract_loop(c, a, w, root_fd, src, total);
}

/* Read one archive: the checkpoint's own (src NULL) or an older one. The
 * whole-archive reader is opened only when entering it where the entries
 * begin cannot be done (opening one reads and decompresses its first MiB). */
static int extract(struct tar_rctx *c, int root_fd, int ckpt_dirfd, const char *archive, const char *src,
		   uint64_t total)
{
	_cleanup_archive_ struct archive *w = archive_write_disk_new();
	_cleanup_close_ int afd = -1;
	int saved = -1, r;

	if (!src)
		afd = openat(ckpt_dirfd, archive, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	else if (c->o->store_fd < 0)
		errno = ENOENT;
	else if ((afd = tar_source_open(c->o->store_fd, src, archive)) < 0)
		errno = -afd;
	if (afd < 0)
		return err_set(c->err, errno, NULL, "cannot open archive '%s' of '%s': %m", archive, src ? src : "");
	c->st->archives++;
	if (!w)
		return err_set(c->err, ENOMEM, NULL, "out of memory");
	archive_write_disk_set_options(w, tar_extract_flags());
	r = tar_cwd_enter(root_fd, &saved);
	if (r < 0)
		return err_set(c->err, r, NULL, "cannot enter the root: %s", strerror(-r));
	r = extract_seek(c, afd, ckpt_dirfd, archive, src, total, root_fd, w);
	if (r == 0) /* extract_seek reads with pread: afd is still at its start */
		r = extract_whole(c, afd, archive, src, total, root_fd, w);
	else if (r > 0)
		r = 0;
	if (c->pdir_fd >= 0)
		close(TAKE_FD(c->pdir_fd));
	if (archive_write_close(w) != ARCHIVE_OK && r >= 0)
		r = disk_err(c, w, "finish extraction in", ".");
	tar_cwd_leave(&saved);
	return r;
}

/* The checkpoint's own archive first (directories, links and changed
 * files), then each older archive that holds a marked entry, once. */
int tar_extract_chain(struct tar_rctx *c, int root_fd, int ckpt_dirfd, const char *archive)
{
	/* sources in the order met, with their needed counts; chains are short */
	_cleanup_free_ const char **src = calloc(c->m.n + 1, sizeof(*src));
	_cleanup_free_ uint64_t *cnt = calloc(c->m.n + 1, sizeof(*cnt));
	size_t n_src = 1; /* [0]: the checkpoint's own archive */
	int r = 0;

	if (!src || !cnt)
		return err_set(c->err, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; i < c->m.n; i++) {
		const struct tar_mentry *e = &c->m.v[i];
		size_t k = 0;
		if (!e->needed || e->direct)
			continue;
		if (e->src) {
			for (k = 1; k < n_src && strcmp(src[k], e->src); k++)
				;
			if (k == n_src)
				src[n_src++] = e->src;
		}
		cnt[k]++;
	}
	for (size_t k = 0; r >= 0 && k < n_src; k++)
		if (cnt[k] > 0)
			r = extract(c, root_fd, ckpt_dirfd, archive, src[k], cnt[k]);
	return r;
}
