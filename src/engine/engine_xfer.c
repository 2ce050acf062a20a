/* engine_xfer.c: what export and import share: a sorted walk of a tree
 * (so two runs list the same entries in the same order), entry types and
 * link targets as the manifest names them, a file's sha256, and the temp
 * dirs below <state>/xfer with their sweep at start. */
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
#include <sys/xattr.h>

#include "config.h"
#include "engine/engine_internal.h"
#include "engine/engine_xfer.h"
#include "lib/walk.h"
#include "lib/xattr.h"

struct engine_xfer_walker {
	engine_xfer_walk_fn fn;
	void *ctx;
};

static int engine_xfer_walk_pre(void *ctx, struct walk_entry *e)
{
	struct engine_xfer_walker *w = ctx;
	return w->fn(w->ctx, e->dirfd, e->name, e->path, &e->st);
}

/* fn for every entry below dirfd in name order, a directory before its
 * contents; rel is the path below the root. Any failure to stat, open or
 * read ends the walk: a listing with a hole would not be the tree. */
int engine_xfer_walk(int dirfd, const char *rel, engine_xfer_walk_fn fn, void *ctx)
{
	struct engine_xfer_walker w = { .fn = fn, .ctx = ctx };
	struct walk_opts o = { .flags = WALK_SORTED | WALK_STAT, .prefix = rel, .pre = engine_xfer_walk_pre, .ctx = &w };
	return walk_tree(dirfd, NULL, &o);
}

const char *engine_xfer_type(const struct stat *st, bool hardlink)
{
	if (S_ISREG(st->st_mode))
		return hardlink ? "hardlink" : "file";
	if (S_ISDIR(st->st_mode))
		return "dir";
	if (S_ISLNK(st->st_mode))
		return "symlink";
	if (S_ISFIFO(st->st_mode))
		return "fifo";
	return NULL; /* devices and sockets are not exported */
}

/* Hard links: the first path of each (dev, ino) with more than one link. */
const char *engine_xfer_link_of(json_t *links, const struct stat *st, const char *rel, bool remember)
{
	char key[64];
	if (!S_ISREG(st->st_mode) || st->st_nlink < 2)
		return NULL;
	snprintf(key, sizeof(key), "%llu:%llu", (unsigned long long)st->st_dev, (unsigned long long)st->st_ino);
	json_t *v = json_object_get(links, key);
	if (v)
		return json_string_value(v);
	if (remember)
		json_object_set_new(links, key, json_string(rel));
	return NULL;
}

void engine_xfer_hex(const uint8_t *d, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

int engine_xfer_sha256_fd(int fd, char out[2 * SHA256_DIGEST_SIZE + 1], uint64_t *ret_len)
{
	struct sha256_ctx h;
	uint8_t d[SHA256_DIGEST_SIZE];
	_cleanup_free_ char *buf = malloc(ENGINE_XFER_BLOCK);
	uint64_t len = 0;
	ssize_t k;
	if (!buf)
		return -ENOMEM;
	sha256_init(&h);
	while ((k = read(fd, buf, ENGINE_XFER_BLOCK)) > 0) {
		sha256_update(&h, (size_t)k, (uint8_t *)buf);
		len += (uint64_t)k;
	}
	if (k < 0)
		return -errno;
	sha256_digest(&h, sizeof(d), d);
	engine_xfer_hex(d, sizeof(d), out);
	*ret_len = len;
	return 0;
}

/* A fresh empty <state>/xfer/<random>; ret is absolute. */
int engine_xfer_tmp(struct engine *e, char **ret, ckpt_error *err)
{
	char rnd[17];
	if (mkdirat(e->state_fd, ENGINE_XFER_DIR, 0700) < 0 && errno != EEXIST)
		return err_set(err, errno, NULL, "create '%s/%s': %m", e->cfg->state_dir, ENGINE_XFER_DIR);
	if (random_hex(rnd, 8) < 0 || asprintf(ret, "%s/%s/%s", e->cfg->state_dir, ENGINE_XFER_DIR, rnd) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (mkdir(*ret, 0700) < 0) {
		int q = err_set(err, errno, NULL, "create '%s': %m", *ret);
		free(TAKE_PTR(*ret));
		return q;
	}
	return 0;
}

void engine_xfer_rm(struct engine *e, const char *tmp)
{
	if (tmp && strlen(tmp) > strlen(e->cfg->state_dir) + 1)
		rm_rf_at(e->state_fd, tmp + strlen(e->cfg->state_dir) + 1);
}

/* A killed daemon may have left views mounted (xfer/<rnd>/v<N>): detach
 * them first, since the removal never crosses into a mount. */
void engine_xfer_sweep(struct engine *e)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	if (walk_open(e->state_fd, ENGINE_XFER_DIR, &d) == 0) {
		while ((de = walk_next(d))) {
			for (size_t i = 0; i < e->cfg->n_roots; i++) {
				char p[PATH_MAX];
				snprintf(p, sizeof(p), "%s/%s/%s/v%zu", e->cfg->state_dir, ENGINE_XFER_DIR, de->d_name,
					 i);
				if (umount2(p, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
					log_info("detached a view a killed export left at %s", p);
			}
		}
	}
	rm_rf_at(e->state_fd, ENGINE_XFER_DIR);
}

/* The xattrs of an entry into ae, those portable lets cross (NULL: all). */
void engine_xfer_xattrs(struct archive_entry *ae, int dirfd, const char *name, bool (*portable)(const char *name))
{
	struct xattr_ref xr;
	_cleanup_free_ char *list = malloc(XATTR_LIST_BUF), *val = malloc(XATTR_VALUE_BUF);
	if (!list || !val)
		return;
	xattr_ref_init(&xr, -1, dirfd, name);
	ssize_t n = xattr_list(&xr, list, XATTR_LIST_BUF);
	for (ssize_t off = 0; n > 0 && off < n; off += (ssize_t)strlen(list + off) + 1) {
		const char *k = list + off;
		if (portable && !portable(k))
			continue;
		ssize_t vl = xattr_get(&xr, k, val, XATTR_VALUE_BUF);
		if (vl >= 0)
			archive_entry_xattr_add_entry(ae, k, val, (size_t)vl);
	}
}

/* A name for path that the kernel takes whatever its length: path itself,
 * or "/proc/self/fd/<parent>/<leaf>" with *parent_fd its parent opened a
 * component at a time (libarchive's disk writer makes paths of PATH_MAX
 * bytes and more, below a root deep enough). */
static int xfer_short_path(const char *path_in, char *buf, size_t size, int *parent_fd)
{
	*parent_fd = -1;
	if (strlen(path_in) < size) {
		snprintf(buf, size, "%s", path_in);
		return 0;
	}
	_cleanup_free_ char *path = strdup(path_in);
	if (!path)
		return -ENOMEM;
	for (size_t n = strlen(path); n > 1 && path[n - 1] == '/';)
		path[--n] = '\0';
	char *leaf = strrchr(path, '/');
	if (!leaf || strlen(leaf + 1) > NAME_MAX)
		return -ENAMETOOLONG;
	*leaf++ = '\0';
	int fd = open(*path_in == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	for (char *p = path, *next; fd >= 0 && *p; p = next) {
		next = p + strcspn(p, "/");
		if (*next)
			*next++ = '\0';
		if (!*p)
			continue;
		int c = openat(fd, p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		int e = errno;
		close(fd);
		fd = c;
		errno = e;
	}
	if (fd < 0)
		return -errno;
	*parent_fd = fd;
	snprintf(buf, size, "/proc/self/fd/%d/%s", fd, leaf);
	return 0;
}

/* libarchive's disk writer sets no system.posix_acl_* xattr (it leaves ACLs
 * to ARCHIVE_EXTRACT_ACL), and an entry made in a directory with a default
 * ACL inherits ACLs: path's two ACL xattrs are made exactly ae's here. */
int engine_xfer_acls(const char *path_in, struct archive_entry *ae)
{
	static const char *const acl[] = { "system.posix_acl_access", "system.posix_acl_default" };
	char path[PATH_MAX];
	_cleanup_close_ int parent = -1;
	int q = xfer_short_path(path_in, path, sizeof(path), &parent);
	if (q < 0)
		return q;
	for (size_t i = 0; i < sizeof(acl) / sizeof(acl[0]); i++) {
		const char *n;
		const void *v = NULL;
		size_t len = 0;
		bool found = false;
		archive_entry_xattr_reset(ae);
		while (!found && archive_entry_xattr_next(ae, &n, &v, &len) == ARCHIVE_OK)
			found = !strcmp(n, acl[i]);
		int r = found ? lsetxattr(path, acl[i], v, len, 0) : lremovexattr(path, acl[i]);
		if (r < 0 && (found || (errno != ENODATA && errno != ENOTSUP)))
			return -errno;
	}
	return 0;
}

/* Drop the xattrs portable does not let cross from an entry read from an
 * archive (NULL: keep all). */
void engine_xfer_xattr_filter(struct archive_entry *ae, bool (*portable)(const char *name))
{
	const char *k;
	const void *v;
	size_t n;
	struct keep {
		char *k;
		void *v;
		size_t n;
	} keep[64];
	size_t nk = 0;
	if (!portable)
		return;
	archive_entry_xattr_reset(ae);
	while (archive_entry_xattr_next(ae, &k, &v, &n) == ARCHIVE_OK && nk < ARRAY_SIZE(keep)) {
		if (!portable(k))
			continue;
		keep[nk].k = strdup(k);
		keep[nk].v = malloc(n ? n : 1);
		if (keep[nk].v)
			memcpy(keep[nk].v, v, n);
		keep[nk++].n = n;
	}
	archive_entry_xattr_clear(ae);
	for (size_t i = 0; i < nk; i++) {
		if (keep[i].k && keep[i].v)
			archive_entry_xattr_add_entry(ae, keep[i].k, keep[i].v, keep[i].n);
		free(keep[i].k);
		free(keep[i].v);
	}
}

/* A path below a root: relative, no empty, "." or ".." components. */
bool engine_xfer_rel_valid(const char *p)
{
	if (!*p || *p == '/' || strlen(p) >= PATH_MAX)
		return false;
	for (const char *s = p; *s;) {
		const char *e = strchrnul(s, '/');
		size_t n = (size_t)(e - s);
		if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return false;
		s = *e ? e + 1 : e;
	}
	return true;
}

/* Does a relative symlink target, read from the directory of rel, stay in
 * the root? Absolute targets are left alone: they name paths inside the
 * sandbox, and extraction never follows symlinks. */
bool engine_xfer_link_stays(const char *rel, const char *target)
{
	int depth = 0;
	if (target[0] == '/')
		return true;
	for (const char *s = rel; (s = strchr(s, '/')); s++)
		depth++;
	for (const char *s = target; *s;) {
		const char *e = strchrnul(s, '/');
		size_t n = (size_t)(e - s);
		if (n == 2 && s[0] == '.' && s[1] == '.') {
			if (--depth < 0)
				return false;
		} else if (n && !(n == 1 && s[0] == '.')) {
			depth++;
		}
		s = *e ? e + 1 : e;
	}
	return true;
}
