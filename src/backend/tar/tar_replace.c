/* tar_replace.c: replacing an entry by a rename over it, and the record of
 * the files a restore replaced or removed (tar_replace.h). */
#include "backend/tar/tar_replace.h"

#include <dirent.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>

#include "lib/failpoint.h"
#include "lib/walk.h"

#define TAR_NEW_TRIES 64

static atomic_uint tar_new_seq;

static void tar_new_name(char *tmp, size_t len)
{
	snprintf(tmp, len, ".ckptd-new.%ld.%u", (long)getpid(), atomic_fetch_add(&tar_new_seq, 1));
}

int tar_new_open(int pfd, const char *leaf, bool by_rename, char *tmp, size_t len)
{
	if (!by_rename) {
		tmp[0] = '\0';
		if (FAILPOINT_AROUND("tar.restore.file.unlink", unlinkat(pfd, leaf, 0)) < 0 && errno != ENOENT)
			return -errno;
		int fd = openat(pfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		return fd >= 0 ? fd : -errno;
	}
	for (int i = 0; i < TAR_NEW_TRIES; i++) {
		tar_new_name(tmp, len);
		int fd = openat(pfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0 || errno != EEXIST)
			return fd >= 0 ? fd : -errno;
	}
	return -EEXIST;
}

int tar_new_symlink(int pfd, const char *target, char *tmp, size_t len)
{
	for (int i = 0; i < TAR_NEW_TRIES; i++) {
		tar_new_name(tmp, len);
		if (symlinkat(target, pfd, tmp) == 0)
			return 0;
		if (errno != EEXIST)
			return -errno;
	}
	return -EEXIST;
}

int tar_replace_commit(int pfd, const char *tmp, const char *leaf)
{
	if (!tmp[0])
		return 0;
	return renameat(pfd, tmp, pfd, leaf) < 0 ? -errno : 0;
}

int tar_replace_symlink(int pfd, const char *leaf, const char *target, uid_t uid, gid_t gid, struct timespec mtime)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, mtime };
	char tmp[64];
	int r = tar_new_symlink(pfd, target, tmp, sizeof(tmp));

	if (r < 0)
		return r;
	if (fchownat(pfd, tmp, uid, gid, AT_SYMLINK_NOFOLLOW) < 0 || utimensat(pfd, tmp, ts, AT_SYMLINK_NOFOLLOW) < 0)
		r = -errno;
	if (r == 0)
		r = tar_replace_commit(pfd, tmp, leaf);
	if (r < 0)
		unlinkat(pfd, tmp, 0);
	return r;
}

/* Where systemd reads unit files (systemd.unit(5), system manager). */
static const char *const tar_unit_dirs[] = { "etc/systemd/system", "run/systemd/system", "lib/systemd/system",
					     "usr/lib/systemd/system", "usr/local/lib/systemd/system" };

static bool tar_under(const char *path, const char *dir)
{
	size_t n = strlen(dir);
	return !strncmp(path, dir, n) && path[n] == '/';
}

static bool tar_ends(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && !strcmp(s + a - b, suffix);
}

void tar_replace_note(struct tar_restore_opts *o, const char *path, bool written)
{
	if (!o->gone)
		return;
	for (size_t i = 0; i < ARRAY_SIZE(tar_unit_dirs); i++) {
		const char *d = tar_unit_dirs[i];
		if (!tar_under(path, d) && strcmp(path, d) && !tar_under(d, path))
			continue;
		o->unit_files_changed = true;
		const char *slash = strrchr(path, '/');
		if (written && o->units_linked && slash && tar_under(path, d) && tar_ends(path, ".service"))
			services_strv_add(o->units_linked, slash + 1);
		return;
	}
}

static void tar_gone_put(const struct tar_restore_opts *o, const struct stat *st, const char *path)
{
	char abs[PATH_MAX];
	const char *root = o->root_path ? o->root_path : "";
	if (!S_ISREG(st->st_mode))
		return; /* only regular files are mapped or held open as files */
	snprintf(abs, sizeof(abs), "%s%s%s", root, root[0] && strcmp(root, "/") ? "/" : "", path);
	if (devino_put(o->gone, st->st_dev, st->st_ino, abs) < 0)
		log_debug("tar: out of memory recording '%s' as replaced", abs);
}

void tar_gone_at(const struct tar_restore_opts *o, int pfd, const char *leaf, const char *path)
{
	struct stat st;
	if (o->gone && fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0)
		tar_gone_put(o, &st, path);
}

static int tar_gone_pre(void *ctx, struct walk_entry *e)
{
	tar_gone_put(ctx, &e->st, e->path);
	return 0;
}

void tar_gone_tree(const struct tar_restore_opts *o, int dirfd, const char *name, const struct stat *st,
		   const char *path)
{
	if (!o->gone)
		return;
	tar_gone_put(o, st, path);
	if (!S_ISDIR(st->st_mode))
		return;
	struct walk_opts wo = { .flags = WALK_STAT,
				.max_depth = 256,
				.prefix = path,
				.pre = tar_gone_pre,
				/* unreadable or deeper than 256: unrecorded, as it always was (best effort) */
				.fail = walk_fail_ignore,
				.ctx = (void *)o };
	walk_tree(dirfd, name, &wo);
}
