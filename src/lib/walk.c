/* walk.c: directory streams over fds. */
#include "lib/walk.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

int walk_open(int dirfd, const char *name, DIR **ret)
{
	int fd = openat(dirfd, name ? name : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		int e = errno;
		close(fd);
		return -e;
	}
	*ret = d;
	return 0;
}

struct dirent *walk_next(DIR *d)
{
	struct dirent *de;
	do {
		errno = 0;
		de = readdir(d);
	} while (de && (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")));
	return de;
}

int walk_each(int dirfd_, const char *name, walk_fn fn, void *ctx)
{
	DIR *d;
	struct dirent *de;
	int r = walk_open(dirfd_, name, &d);
	if (r < 0)
		return r;
	while ((de = walk_next(d)))
		if ((r = fn(ctx, dirfd(d), de->d_name)) < 0)
			break;
	if (!de && errno)
		r = -errno;
	closedir(d);
	return r < 0 ? r : 0;
}
