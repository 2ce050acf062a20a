/* tar_fs.h: filesystem helpers of the tar backend: xattrs, safe opening of
 * paths below a root, a thread-private working directory for libarchive. */
#pragma once
#include <stdatomic.h>
#include <sys/stat.h>
#include "backend/rootexcl.h"
#include "backend/tar/tar_manifest.h"
#include "lib/walk.h"

/* The xattrs of name below dirfd (not following symlinks), or of dirfd itself
 * when name is NULL. Sorted by name. */
int tar_xattrs_read(int dirfd, const char *name, struct tar_xattr **ret, size_t *ret_n);
/* The xattrs of name below dirfd (dirfd itself when NULL) hash to xhash
 * (tar_xattrs_hash); false when they cannot be read. */
bool tar_xattrs_match(int dirfd, const char *name, uint64_t xhash);
/* Make fd's xattrs exactly xa[] (n may be 0: remove all). */
int tar_xattrs_apply_fd(int fd, const struct tar_xattr *xa, size_t n);
/* Make fd's xattrs exactly those of an archive entry. opath: fd is an
 * O_PATH fd (a fifo or device, which must not be opened). */
struct archive_entry;
int tar_xattrs_apply_entry(int fd, struct archive_entry *ae, bool opath);
/* After libarchive's disk writer made leaf in pfd: its xattrs exactly ae's. */
int tar_xattrs_fix_made(int pfd, const char *leaf, struct archive_entry *ae);
/* archive_free for a cleanup attribute. */
struct archive;
void tar_archive_freep(struct archive **a);
#define _cleanup_archive_ _cleanup_(tar_archive_freep)

/* Open the directory holding path (relative to root_fd) component by
 * component with O_NOFOLLOW; *leaf points into path. */
int tar_open_parent(int root_fd, const char *path, const char **leaf);

/* libarchive's disk writer works relative to the working directory: give this
 * thread its own (unshare CLONE_FS) and enter dir_fd; leave returns to saved. */
int tar_cwd_enter(int dir_fd, int *ret_saved);
void tar_cwd_leave(int *saved);

/* A failure of walk_tree at e into err ("cannot stat 'a/b': ..."), for
 * the fail hooks of the tar backend's walks. */
int tar_walk_failed(ckpt_error *err, const struct walk_entry *e, int r);
/* walk_tree below dirfd for a walk whose hooks fill err: err also when the
 * root cannot be opened or memory runs out. */
int tar_walk_root(int dirfd, const struct walk_opts *o, ckpt_error *err);

/* A walk of a live tree whose hooks fill err; first in the walk's ctx, so
 * that tar_walk_fail_gone serves as its fail hook. */
struct tar_walk {
	ckpt_error *err;
	bool failed; /* a hook filled err (a pre hook sets it too) */
};
/* fail hook: an entry gone since it was listed is skipped; any other
 * failure fills err as tar_walk_failed words it. */
int tar_walk_fail_gone(void *ctx, const struct walk_entry *e, int err);
/* walk_tree of dirfd, whose path is rel (NULL: the root), paths below
 * PATH_MAX; err also when dirfd cannot be read or memory runs out. */
int tar_walk_below(int dirfd, const char *rel, struct walk_opts *o, struct tar_walk *w);

/* Files and regular-file bytes below dirfd, skipping the (dev, ino)
 * directory and what excl leaves out. */
void tar_count_tree(int dirfd, dev_t skip_dev, ino_t skip_ino, const struct rootexcl *excl, const atomic_bool *stop,
		    uint64_t *files, uint64_t *bytes);

/* An entry no walk of a root reads: the state dir, or one excl leaves out. */
static inline bool tar_skipped(const struct stat *st, dev_t skip_dev, ino_t skip_ino, const struct rootexcl *excl)
{
	return (st->st_dev == skip_dev && st->st_ino == skip_ino) || rootexcl_has(excl, st);
}

/* Inode ctimes come from the kernel's coarse clock: a change made within the
 * tick that stamped a recorded ctime would leave it unchanged. Return only
 * once CLOCK_REALTIME_COARSE is past t, so any later change shows. */
void tar_wait_past(struct timespec t);
void tar_ts_max(struct timespec *acc, struct timespec t);

/* errno -> the error creates report: ENOSPC and EDQUOT both become ENOSPC. */
static inline int tar_errno_norm(int e)
{
	e = e < 0 ? -e : e;
	return e == EDQUOT ? ENOSPC : (e ? e : EIO);
}
