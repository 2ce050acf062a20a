/* walk.h: the one way ckptd lists a directory. Directories are opened
 * relative to a directory fd with O_NOFOLLOW; "." and ".." never reach the
 * caller; a read error is told apart from the end of the directory. */
#pragma once
#include <dirent.h>

/* A stream over name below dirfd (never following a final symlink), or over
 * dirfd itself when name is NULL: then through a new open file description, so
 * reading never moves dirfd's own offset. 0, or -errno. */
int walk_open(int dirfd, const char *name, DIR **ret);

/* The next entry other than "." and "..". NULL at the end with errno 0, or on
 * a read error with errno set. dirfd(d) names the directory for *at() calls. */
struct dirent *walk_next(DIR *d);

/* fn for each entry of name below dirfd (as walk_open): dirfd is the listed
 * directory. A negative return of fn stops the walk and is returned; a failure
 * to open or read gives -errno. */
typedef int (*walk_fn)(void *ctx, int dirfd, const char *name);
int walk_each(int dirfd, const char *name, walk_fn fn, void *ctx);
