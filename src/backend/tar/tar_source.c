/* tar_source.c: what a restore reads besides its own checkpoint's
 * archive: an older checkpoint's archive (tar_source_open), and the
 * manifest, parsed, as the last restore of the root left it or from disk
 * (tar_mcache). */
#include "backend/tar/tar_restore.h"

#include <limits.h>
#include <sys/stat.h>

int tar_source_open(int store_fd, const char *src, const char *archive)
{
	char alt[64], path[PATH_MAX];
	const char *dirs[] = { "", ".keep/" }, *names[] = { archive, alt };
	size_t len = strlen(archive);
	int e = ENOENT;

	if (len > 4 && !strcmp(archive + len - 4, ".zst"))
		snprintf(alt, sizeof(alt), "%.*s", (int)(len - 4), archive);
	else
		snprintf(alt, sizeof(alt), "%s.zst", archive);
	for (size_t d = 0; d < 2; d++)
		for (size_t n = 0; n < 2; n++) {
			snprintf(path, sizeof(path), "%s%s/%s", dirs[d], src, names[n]);
			int fd = openat(store_fd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
			if (fd >= 0)
				return fd;
			if (errno != ENOENT)
				e = errno;
		}
	return -e;
}

void tar_mcache_free(struct tar_mcache *mc)
{
	if (mc->valid)
		tar_manifest_free(&mc->m);
	memset(mc, 0, sizeof(*mc));
}

static bool ts_eq(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
		ts_eq(a->st_mtim, b->st_mtim) && ts_eq(a->st_ctim, b->st_ctim);
}

/* The manifest with its aliases: the cached one when its files are the
 * ones it was read from (its per-restore marks cleared), else read. */
int tar_mcache_get(struct tar_mcache *mc, int ckpt_dirfd, const char *manifest, const char *alias,
		   struct tar_manifest *m, ckpt_error *err)
{
	struct stat man, al = { 0 };
	bool known = mc && fstatat(ckpt_dirfd, manifest, &man, AT_SYMLINK_NOFOLLOW) == 0;
	if (known && fstatat(ckpt_dirfd, alias, &al, AT_SYMLINK_NOFOLLOW) < 0)
		memset(&al, 0, sizeof(al));
	if (known && mc->valid && same_file(&man, &mc->man) && same_file(&al, &mc->alias)) {
		*m = mc->m;
		mc->valid = false; /* the restore's own until it puts it back */
		for (size_t i = 0; i < m->n; i++)
			m->v[i].seen = m->v[i].needed = m->v[i].direct = false;
		return 0;
	}
	if (mc)
		tar_mcache_free(mc);
	int r = tar_manifest_load(ckpt_dirfd, manifest, m, err);
	if (r < 0)
		return r;
	tar_manifest_alias_load(ckpt_dirfd, alias, m);
	if (mc && known)
		mc->man = man, mc->alias = al;
	return 0;
}

/* After a restore that succeeded: the manifest is kept, as its alias file
 * now says (the identities tar_mcache_get compares). */
void tar_mcache_put(struct tar_mcache *mc, int ckpt_dirfd, const char *manifest, const char *alias,
		    struct tar_manifest *m)
{
	struct stat man, al = { 0 };
	if (!mc || fstatat(ckpt_dirfd, manifest, &man, AT_SYMLINK_NOFOLLOW) < 0) {
		tar_manifest_free(m);
		return;
	}
	if (fstatat(ckpt_dirfd, alias, &al, AT_SYMLINK_NOFOLLOW) < 0)
		memset(&al, 0, sizeof(al));
	tar_mcache_free(mc);
	mc->man = man, mc->alias = al, mc->m = *m, mc->valid = true;
	memset(m, 0, sizeof(*m));
}
