/* engine_base_id.c: the base identity of this daemon, a digest of what the
 * roots held when ckptd adopted them: an overlay checkpoint imports only
 * over the same base. Computed once, then kept in the engine. */
#include "engine/engine_export.h"

#include <archive.h>
#include <archive_entry.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "config.h"
#include "engine/engine_internal.h"
#include "engine/engine_xfer.h"
#include "lib/walk.h"
#include "lib/xattr.h"

struct base_ctx {
	struct sha256_ctx h;
};

static int base_line(void *ctx, int dirfd, const char *name, const char *rel, const struct stat *st)
{
	struct base_ctx *b = ctx;
	char line[PATH_MAX * 2 + 256], link[PATH_MAX] = "", sum[2 * SHA256_DIGEST_SIZE + 1] = "-";
	if (S_ISLNK(st->st_mode)) {
		ssize_t k = readlinkat(dirfd, name, link, sizeof(link) - 1);
		link[k > 0 ? k : 0] = '\0';
	}
	if (S_ISREG(st->st_mode) && st->st_size <= ENGINE_XFER_BASE_HASH_MAX) { /* small files by content too */
		uint64_t len;
		_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || engine_xfer_sha256_fd(fd, sum, &len) < 0)
			return -errno;
	}
	int n = snprintf(line, sizeof(line), "%s\t%o\t%u\t%u\t%llu\t%lld.%09ld\t%s\t%s\n", rel, (unsigned)st->st_mode,
			 (unsigned)st->st_uid, (unsigned)st->st_gid,
			 S_ISDIR(st->st_mode) ? 0ULL : (unsigned long long)st->st_size,
			 S_ISDIR(st->st_mode) ? 0LL : (long long)st->st_mtim.tv_sec,
			 S_ISDIR(st->st_mode) ? 0L : st->st_mtim.tv_nsec, link, sum);
	sha256_update(&b->h, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1, (uint8_t *)line);
	return 0;
}

/* "sha256:<hex>" over the base's tree listing (names, types, modes, owners,
 * sizes, mtimes of non-directories, symlink targets, and the content of files
 * up to 64 KiB, in name order). The base never changes
 * while ckptd manages it, so it is computed once per daemon. */
int engine_base_identity(struct engine *e, char out[80], ckpt_error *err)
{
	pthread_mutex_lock(&e->state_lock);
	bool have = e->base_id[0];
	if (have)
		snprintf(out, 80, "%s", e->base_id);
	pthread_mutex_unlock(&e->state_lock);
	if (have)
		return 0;
	_cleanup_free_ char *tmp = NULL;
	char **dirs = NULL;
	struct base_ctx b;
	uint8_t d[SHA256_DIGEST_SIZE];
	int q = engine_xfer_tmp(e, &tmp, err);
	if (q < 0)
		return q;
	q = e->backend->xfer->view_open(e->bst, NULL, NULL, tmp, &dirs, err);
	sha256_init(&b.h);
	for (size_t i = 0; q == 0 && i < e->cfg->n_roots; i++) {
		char hdr[32];
		int n = snprintf(hdr, sizeof(hdr), "root %zu\n", i);
		sha256_update(&b.h, (size_t)n, (uint8_t *)hdr);
		_cleanup_close_ int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		q = fd < 0 ? -errno : engine_xfer_walk(fd, NULL, base_line, &b);
		if (q < 0)
			err_set(err, -q, NULL, "list the base: %s", strerror(-q));
	}
	if (dirs)
		e->backend->xfer->view_close(e->bst, dirs);
	rm_rf_at(e->state_fd, tmp + strlen(e->cfg->state_dir) + 1);
	if (q < 0)
		return q;
	sha256_digest(&b.h, sizeof(d), d);
	strcpy(out, "sha256:");
	engine_xfer_hex(d, sizeof(d), out + 7);
	pthread_mutex_lock(&e->state_lock);
	snprintf(e->base_id, sizeof(e->base_id), "%s", out);
	pthread_mutex_unlock(&e->state_lock);
	return 0;
}
