/* testlib.h: the temporary-directory fixture the unit tests share.
 * testlib_mkdir makes /tmp/ckptd-<tag>-XXXXXX; testlib_rmdir detaches every
 * mount left below it (newest first) and removes the tree with rm_rf_at. */
#pragma once
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>

#include "lib/util.h"

#define TESTLIB_DIR_LEN 64

static inline int testlib_mkdir(char dir[TESTLIB_DIR_LEN], const char *tag)
{
	snprintf(dir, TESTLIB_DIR_LEN, "/tmp/ckptd-%s-XXXXXX", tag);
	return mkdtemp(dir) ? 0 : -errno;
}

/* Mount points at or below dir, from /proc/self/mountinfo (field 5), newest
 * first so a mount is detached before the one below it. */
static inline void testlib_detach_mounts(const char *dir)
{
	size_t n = strlen(dir), cap = 0;
	_cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
	_cleanup_free_ char *line = NULL;
	char **v = NULL;
	size_t nv = 0;

	while (f && getline(&line, &cap, f) > 0) {
		char mnt[4096];
		if (sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 || strncmp(mnt, dir, n) ||
		    (mnt[n] != '\0' && mnt[n] != '/'))
			continue;
		char **nvv = realloc(v, (nv + 1) * sizeof(*v));
		if (!nvv)
			break;
		v = nvv;
		if ((v[nv] = strdup(mnt)))
			nv++;
	}
	while (nv > 0) {
		umount2(v[--nv], MNT_DETACH);
		free(v[nv]);
	}
	free(v);
}

static inline void testlib_rmdir(const char *dir)
{
	if (!dir || !dir[0])
		return;
	testlib_detach_mounts(dir);
	rm_rf_at(AT_FDCWD, dir);
}
