/* xattr.h: extended attributes of an inode named either by an fd or by
 * (dirfd, name). O_PATH fds do not carry xattr calls and symlinks or device
 * nodes cannot be opened for them, so (dirfd, name) goes through
 * /proc/self/fd/<dirfd>/<name> with the l*xattr() calls: the directory is
 * pinned by its fd and a final symlink is never followed. */
#pragma once
#include <limits.h>
#include <sys/types.h>

/* Linux limits: a list or a value is at most 64 KiB. */
#define XATTR_LIST_BUF 65536
#define XATTR_VALUE_BUF 65536

struct xattr_ref {
	int fd; /* >= 0: use it; else proc */
	char proc[PATH_MAX];
};

/* fd >= 0 addresses fd itself; else name below dirfd (name NULL: dirfd). */
void xattr_ref_init(struct xattr_ref *x, int fd, int dirfd, const char *name);
/* As listxattr/getxattr/setxattr (flags 0): -1 with errno on failure. */
ssize_t xattr_list(const struct xattr_ref *x, char *buf, size_t n);
ssize_t xattr_get(const struct xattr_ref *x, const char *key, void *buf, size_t n);
int xattr_set(const struct xattr_ref *x, const char *key, const void *val, size_t n);
