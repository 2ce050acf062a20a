/* xattr.c: xattr calls through an fd or through /proc/self/fd. */
#include "lib/xattr.h"

#include <stdio.h>
#include <sys/xattr.h>

void xattr_ref_init(struct xattr_ref *x, int fd, int dirfd, const char *name)
{
	x->fd = fd >= 0 ? fd : name ? -1 : dirfd;
	x->proc[0] = '\0';
	if (x->fd < 0)
		snprintf(x->proc, sizeof(x->proc), "/proc/self/fd/%d/%s", dirfd, name);
}

ssize_t xattr_list(const struct xattr_ref *x, char *buf, size_t n)
{
	return x->fd >= 0 ? flistxattr(x->fd, buf, n) : llistxattr(x->proc, buf, n);
}

ssize_t xattr_get(const struct xattr_ref *x, const char *key, void *buf, size_t n)
{
	return x->fd >= 0 ? fgetxattr(x->fd, key, buf, n) : lgetxattr(x->proc, key, buf, n);
}

int xattr_set(const struct xattr_ref *x, const char *key, const void *val, size_t n)
{
	return x->fd >= 0 ? fsetxattr(x->fd, key, val, n, 0) : lsetxattr(x->proc, key, val, n, 0);
}
