/* testlib_readdir.h: readdir as the code under test calls it (the test
 * binary's own definition wins over libc's): the real one, save that a
 * test may have it give a name twice (as tmpfs may during a rename in the
 * directory), or fail with EIO at a call. Include in one file of a test. */
#pragma once
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static const char *rd_twice; /* the next listing of this name comes twice */
static int rd_fail;          /* > 0: the rd_fail-th call from now fails */
static bool rd_again;
static struct {
	struct dirent de;
	char room[256];
} rd_copy;

struct dirent *readdir(DIR *d)
{
	static struct dirent *(*real)(DIR *);
	if (!real)
		real = (struct dirent * (*)(DIR *)) dlsym(RTLD_NEXT, "readdir");
	if (rd_fail > 0 && --rd_fail == 0) {
		errno = EIO;
		return NULL;
	}
	if (rd_again) {
		rd_again = false;
		return &rd_copy.de;
	}
	struct dirent *de = real(d);
	if (de && rd_twice && !strcmp(de->d_name, rd_twice)) {
		memcpy(&rd_copy.de, de, offsetof(struct dirent, d_name) + strlen(de->d_name) + 1);
		rd_again = true;
		rd_twice = NULL;
	}
	return de;
}
