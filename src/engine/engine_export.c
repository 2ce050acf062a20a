/* engine_export.c: a checkpoint as one self-describing pax + zstd archive.
 *
 * Layout: manifest.json first, then for each root N the entry "roots/N" (the
 * root directory's own metadata) and "roots/N/<path>" for everything below,
 * as the checkpoint shows it (the backend's view: a read-only overlay of the
 * chain, or the tar checkpoint extracted). manifest.json lists every entry
 * with its type, and regular files with their size and sha256, so an import
 * can refuse anything the manifest does not announce.
 *
 * Export writes the archive from a worker thread into a socket pair that the
 * HTTP response reads, so memory stays flat whatever the size. Import reads a
 * spooled body, extracts into <state>/xfer/<random>/ with libarchive's secure
 * flags after checking each entry against the manifest, verifies every
 * digest, and only then hands the trees to the backend. */
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
#include "lib/walk.h"
#include "lib/xattr.h"

#define XFER_DIR "xfer"
#define FORMAT_NAME "ckptd-export"
#define FORMAT_VERSION 1
#define MANIFEST_MAX (64u << 20) /* read whole into memory: bounded */
#define BLOCK (64 * 1024)
#define BASE_HASH_MAX (64 * 1024) /* base files up to this size count by content */

/* ---- sorted walk ---------------------------------------------------- */

typedef int (*xw_fn)(void *ctx, int dirfd, const char *name, const char *rel, const struct stat *st);

static int xw_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* fn for every entry below dirfd in name order, a directory before its
 * contents; rel is the path below the root. */
static int xw_walk(int dirfd, const char *rel, xw_fn fn, void *ctx)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int q = walk_open(dirfd, NULL, &d);

	while (q == 0 && (de = walk_next(d))) {
		if (n == cap) {
			char **nn = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof(*names));
			if (!nn) {
				q = -ENOMEM;
				break;
			}
			names = nn;
		}
		if (!(names[n] = strdup(de->d_name)))
			q = -ENOMEM;
		else
			n++;
	}
	if (q == 0 && errno)
		q = -errno;
	if (q == 0 && n > 1) /* names is NULL for an empty directory */
		qsort(names, n, sizeof(*names), xw_cmp);
	for (size_t i = 0; q == 0 && i < n; i++) {
		struct stat st;
		_cleanup_free_ char *r = rel ? path_join(rel, names[i]) : strdup(names[i]);
		if (!r) {
			q = -ENOMEM;
			break;
		}
		if (fstatat(dirfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
			q = -errno;
			break;
		}
		q = fn(ctx, dirfd, names[i], r, &st);
		if (q == 0 && S_ISDIR(st.st_mode)) {
			_cleanup_close_ int sub =
				openat(dirfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			q = sub < 0 ? -errno : xw_walk(sub, r, fn, ctx);
		}
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return q;
}

static const char *xw_type(const struct stat *st, bool hardlink)
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
static const char *xw_link_of(json_t *links, const struct stat *st, const char *rel, bool remember)
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

static void hex(const uint8_t *d, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static int sha256_fd(int fd, char out[2 * SHA256_DIGEST_SIZE + 1], uint64_t *ret_len)
{
	struct sha256_ctx h;
	uint8_t d[SHA256_DIGEST_SIZE];
	_cleanup_free_ char *buf = malloc(BLOCK);
	uint64_t len = 0;
	ssize_t k;
	if (!buf)
		return -ENOMEM;
	sha256_init(&h);
	while ((k = read(fd, buf, BLOCK)) > 0) {
		sha256_update(&h, (size_t)k, (uint8_t *)buf);
		len += (uint64_t)k;
	}
	if (k < 0)
		return -errno;
	sha256_digest(&h, sizeof(d), d);
	hex(d, sizeof(d), out);
	*ret_len = len;
	return 0;
}

/* ---- base identity -------------------------------------------------- */

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
	if (S_ISREG(st->st_mode) && st->st_size <= BASE_HASH_MAX) { /* small files by content too */
		uint64_t len;
		_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || sha256_fd(fd, sum, &len) < 0)
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

static pthread_mutex_t base_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct engine *base_engine;
static char base_cached[80];

static int xfer_tmp(struct engine *e, char **ret, ckpt_error *err);

/* "sha256:<hex>" over the base's tree listing (names, types, modes, owners,
 * sizes, mtimes of non-directories, symlink targets, and the content of files
 * up to 64 KiB, in name order). The base never changes
 * while ckptd manages it, so it is computed once per daemon. */
int engine_base_identity(struct engine *e, char out[80], ckpt_error *err)
{
	pthread_mutex_lock(&base_lock);
	bool have = base_engine == e && base_cached[0];
	if (have)
		snprintf(out, 80, "%s", base_cached);
	pthread_mutex_unlock(&base_lock);
	if (have)
		return 0;
	_cleanup_free_ char *tmp = NULL;
	char **dirs = NULL;
	struct base_ctx b;
	uint8_t d[SHA256_DIGEST_SIZE];
	int q = xfer_tmp(e, &tmp, err);
	if (q < 0)
		return q;
	q = e->backend->view_open(e->bst, NULL, NULL, tmp, &dirs, err);
	sha256_init(&b.h);
	for (size_t i = 0; q == 0 && i < e->cfg->n_roots; i++) {
		char hdr[32];
		int n = snprintf(hdr, sizeof(hdr), "root %zu\n", i);
		sha256_update(&b.h, (size_t)n, (uint8_t *)hdr);
		_cleanup_close_ int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		q = fd < 0 ? -errno : xw_walk(fd, NULL, base_line, &b);
		if (q < 0)
			err_set(err, -q, NULL, "list the base: %s", strerror(-q));
	}
	if (dirs)
		e->backend->view_close(e->bst, dirs);
	rm_rf_at(e->state_fd, tmp + strlen(e->cfg->state_dir) + 1);
	if (q < 0)
		return q;
	sha256_digest(&b.h, sizeof(d), d);
	strcpy(out, "sha256:");
	hex(d, sizeof(d), out + 7);
	pthread_mutex_lock(&base_lock);
	base_engine = e;
	snprintf(base_cached, sizeof(base_cached), "%s", out);
	pthread_mutex_unlock(&base_lock);
	return 0;
}

/* ---- temp dirs ------------------------------------------------------ */

/* A fresh empty <state>/xfer/<random>; ret is absolute. */
static int xfer_tmp(struct engine *e, char **ret, ckpt_error *err)
{
	char rnd[17];
	if (mkdirat(e->state_fd, XFER_DIR, 0700) < 0 && errno != EEXIST)
		return err_set(err, errno, NULL, "create '%s/%s': %m", e->cfg->state_dir, XFER_DIR);
	if (random_hex(rnd, 8) < 0 || asprintf(ret, "%s/%s/%s", e->cfg->state_dir, XFER_DIR, rnd) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (mkdir(*ret, 0700) < 0) {
		int q = err_set(err, errno, NULL, "create '%s': %m", *ret);
		free(TAKE_PTR(*ret));
		return q;
	}
	return 0;
}

static void xfer_rm(struct engine *e, const char *tmp)
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
	if (walk_open(e->state_fd, XFER_DIR, &d) == 0) {
		while ((de = walk_next(d))) {
			for (size_t i = 0; i < e->cfg->n_roots; i++) {
				char p[PATH_MAX];
				snprintf(p, sizeof(p), "%s/%s/%s/v%zu", e->cfg->state_dir, XFER_DIR, de->d_name, i);
				if (umount2(p, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
					log_info("detached a view a killed export left at %s", p);
			}
		}
	}
	rm_rf_at(e->state_fd, XFER_DIR);
}

/* ---- export --------------------------------------------------------- */

struct engine_export {
	struct engine *e;
	struct engine_op *op; /* its progress shows in the record while streaming */
	char id[32];
	uint64_t files_total, bytes_total;
	int rfd, wfd;
	pthread_t thread;
	bool started;
	char *tmp;
	char **dirs;
	json_t *rec;
	int status; /* of the writer; read after join */
	ckpt_error err;
	json_t *links;
	FILE *mf;    /* manifest being written (pass 1) */
	size_t root; /* root being walked */
	struct archive *a;
	char *buf;
};

static int mf_entry(void *ctx, int dirfd, const char *name, const char *rel, const struct stat *st)
{
	struct engine_export *x = ctx;
	const char *link = xw_link_of(x->links, st, rel, true);
	const char *type = xw_type(st, link != NULL);
	if (!type) {
		log_warn("export: skipping '%s' (a device or socket)", rel);
		return 0;
	}
	json_auto_t *o = json_pack("{s:s, s:s, s:i}", "path", rel, "type", type, "mode", (int)(st->st_mode & 07777));
	if (!o)
		return -ENOMEM;
	if (!strcmp(type, "file")) {
		char sum[2 * SHA256_DIGEST_SIZE + 1];
		uint64_t len = 0;
		_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		int q = fd < 0 ? -errno : sha256_fd(fd, sum, &len);
		if (q < 0)
			return q;
		if (len != (uint64_t)st->st_size)
			return -EAGAIN; /* changed while read: the view is not stable */
		json_object_set_new(o, "size", json_integer((json_int_t)len));
		json_object_set_new(o, "sha256", json_string(sum));
		x->bytes_total += len;
	} else if (link) {
		json_object_set_new(o, "link", json_string(link));
	} else if (!strcmp(type, "symlink")) {
		char t[PATH_MAX];
		ssize_t k = readlinkat(dirfd, name, t, sizeof(t) - 1);
		if (k < 0)
			return -errno;
		t[k] = '\0';
		json_object_set_new(o, "link", json_string(t));
	}
	_cleanup_free_ char *s = json_dumps(o, JSON_COMPACT);
	if (!s)
		return -ENOMEM;
	x->files_total++;
	fprintf(x->mf, ",\n%s", s);
	return ferror(x->mf) ? -EIO : 0;
}

/* Pass 1: manifest.json into tmp/manifest.json. */
static int export_manifest(struct engine_export *x, ckpt_error *err)
{
	struct engine *e = x->e;
	char base[80] = "";
	_cleanup_free_ char *p = path_join(x->tmp, "manifest.json");
	int q = 0;

	if (!strcmp(e->backend->name, "overlay") && (q = engine_base_identity(e, base, err)) < 0)
		return q;
	json_auto_t *head =
		json_pack("{s:s, s:i, s:s, s:O, s:o}", "format", FORMAT_NAME, "version", FORMAT_VERSION, "backend",
			  e->backend->name, "checkpoint", x->rec, "base",
			  base[0] ? json_pack("{s:s, s:s}", "identity", base, "kind", "overlay-base") : json_null());
	_cleanup_free_ char *hs = head ? json_dumps(head, JSON_COMPACT) : NULL;
	if (!p || !hs || !(x->mf = fopen(p, "we")))
		return err_set(err, p && hs ? errno : ENOMEM, NULL, "write the export manifest: %m");
	hs[strlen(hs) - 1] = '\0'; /* reopen the object to add "roots" */
	fprintf(x->mf, "%s, \"roots\": [", hs);
	for (size_t i = 0; q == 0 && i < e->cfg->n_roots; i++) {
		struct stat st;
		_cleanup_close_ int fd = open(x->dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &st) < 0) {
			q = -errno;
			break;
		}
		json_auto_t *r = json_pack("{s:s, s:i, s:i, s:i}", "path", e->cfg->roots[i], "mode",
					   (int)(st.st_mode & 07777), "uid", (int)st.st_uid, "gid", (int)st.st_gid);
		_cleanup_free_ char *rs = r ? json_dumps(r, JSON_COMPACT) : NULL;
		if (!rs) {
			q = -ENOMEM;
			break;
		}
		rs[strlen(rs) - 1] = '\0';
		fprintf(x->mf, "%s%s, \"entries\": [{\"path\":\".\",\"type\":\"dir\"}", i ? ",\n" : "\n", rs);
		x->root = i;
		q = xw_walk(fd, NULL, mf_entry, x);
		fputs("]}", x->mf);
	}
	fputs("\n]}\n", x->mf);
	if (fclose(TAKE_PTR(x->mf)) != 0 && q == 0)
		q = -errno;
	json_object_clear(x->links);
	return q < 0 ? err_set(err, -q, NULL, "build the export manifest: %s", strerror(-q)) : 0;
}

static la_ssize_t sock_write(struct archive *a, void *cls, const void *buf, size_t len)
{
	struct engine_export *x = cls;
	size_t done = 0;
	while (done < len) {
		ssize_t k = send(x->wfd, (const char *)buf + done, len - done, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			archive_set_error(a, errno, "the reader went away");
			return -1;
		}
		done += (size_t)k;
	}
	return (la_ssize_t)len;
}

static int ar_fail(struct engine_export *x, const char *what)
{
	return err_set(&x->err, archive_errno(x->a) > 0 ? archive_errno(x->a) : EIO, NULL, "%s: %s", what,
		       archive_error_string(x->a) ?: "archive error");
}

static int ar_copy_fd(struct engine_export *x, int fd)
{
	ssize_t k;
	while ((k = read(fd, x->buf, BLOCK)) > 0)
		if (archive_write_data(x->a, x->buf, (size_t)k) != k)
			return ar_fail(x, "write archive data");
	return k < 0 ? err_set(&x->err, errno, NULL, "read: %m") : 0;
}

static void ar_xattrs(struct archive_entry *ae, int dirfd, const char *name)
{
	struct xattr_ref xr;
	_cleanup_free_ char *list = malloc(XATTR_LIST_BUF), *val = malloc(XATTR_VALUE_BUF);
	if (!list || !val)
		return;
	xattr_ref_init(&xr, -1, dirfd, name);
	ssize_t n = xattr_list(&xr, list, XATTR_LIST_BUF);
	for (ssize_t off = 0; n > 0 && off < n; off += (ssize_t)strlen(list + off) + 1) {
		const char *k = list + off;
		if (!strncmp(k, "trusted.overlay.", 16))
			continue;
		ssize_t vl = xattr_get(&xr, k, val, XATTR_VALUE_BUF);
		if (vl >= 0)
			archive_entry_xattr_add_entry(ae, k, val, (size_t)vl);
	}
}

static int ar_entry(void *ctx, int dirfd, const char *name, const char *rel, const struct stat *st)
{
	struct engine_export *x = ctx;
	const char *link = xw_link_of(x->links, st, rel, true);
	char path[PATH_MAX + 32], t[PATH_MAX];
	int q = 0;

	if (!xw_type(st, false))
		return 0;
	if (x->op && rel)
		atomic_fetch_add(&x->op->progress.files_done, 1);
	struct archive_entry *ae = archive_entry_new();
	if (!ae)
		return -ENOMEM;
	if (rel)
		snprintf(path, sizeof(path), "roots/%zu/%s", x->root, rel);
	else
		snprintf(path, sizeof(path), "roots/%zu", x->root);
	archive_entry_copy_stat(ae, st);
	archive_entry_set_pathname(ae, path);
	archive_entry_set_uname(ae, NULL);
	archive_entry_set_gname(ae, NULL);
	if (link) {
		snprintf(t, sizeof(t), "roots/%zu/%s", x->root, link);
		archive_entry_set_hardlink(ae, t);
		archive_entry_set_size(ae, 0);
	} else if (S_ISLNK(st->st_mode)) {
		ssize_t k = readlinkat(dirfd, name, t, sizeof(t) - 1);
		t[k > 0 ? k : 0] = '\0';
		archive_entry_set_symlink(ae, t);
	}
	if (!S_ISREG(st->st_mode) || link)
		archive_entry_set_size(ae, 0);
	ar_xattrs(ae, dirfd, rel ? name : NULL);
	if (archive_write_header(x->a, ae) != ARCHIVE_OK)
		q = ar_fail(x, "write archive header");
	if (q == 0 && S_ISREG(st->st_mode) && !link) {
		_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		q = fd < 0 ? err_set(&x->err, errno, NULL, "open '%s': %m", rel) : ar_copy_fd(x, fd);
		if (x->op)
			atomic_fetch_add(&x->op->progress.bytes_done, (uint64_t)st->st_size);
	}
	archive_entry_free(ae);
	return q;
}

static void *export_main(void *arg)
{
	struct engine_export *x = arg;
	struct engine *e = x->e;
	int q = 0;

	x->a = archive_write_new();
	x->buf = malloc(BLOCK);
	if (!x->a || !x->buf)
		q = err_set(&x->err, ENOMEM, NULL, "out of memory");
	if (q == 0 &&
	    (archive_write_set_format_pax(x->a) != ARCHIVE_OK || archive_write_add_filter_zstd(x->a) != ARCHIVE_OK ||
	     archive_write_set_bytes_per_block(x->a, BLOCK) != ARCHIVE_OK ||
	     archive_write_set_bytes_in_last_block(x->a, 1) != ARCHIVE_OK ||
	     archive_write_open(x->a, x, NULL, sock_write, NULL) != ARCHIVE_OK))
		q = ar_fail(x, "start the archive");
	if (q == 0) { /* manifest.json */
		_cleanup_free_ char *p = path_join(x->tmp, "manifest.json");
		_cleanup_close_ int fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1;
		struct stat st;
		struct archive_entry *ae = archive_entry_new();
		if (fd < 0 || fstat(fd, &st) < 0 || !ae) {
			q = err_set(&x->err, errno ? errno : ENOMEM, NULL, "read the manifest: %m");
		} else {
			archive_entry_set_pathname(ae, "manifest.json");
			archive_entry_set_filetype(ae, AE_IFREG);
			archive_entry_set_perm(ae, 0644);
			archive_entry_set_size(ae, st.st_size);
			archive_entry_set_mtime(ae, st.st_mtime, 0);
			q = archive_write_header(x->a, ae) != ARCHIVE_OK ? ar_fail(x, "write archive header")
									 : ar_copy_fd(x, fd);
		}
		archive_entry_free(ae);
	}
	for (size_t i = 0; q == 0 && i < e->cfg->n_roots; i++) {
		struct stat st;
		_cleanup_close_ int fd = open(x->dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		x->root = i;
		if (fd < 0 || fstat(fd, &st) < 0)
			q = err_set(&x->err, errno, NULL, "open the view of root %zu: %m", i);
		if (q == 0)
			q = ar_entry(x, fd, NULL, NULL, &st);
		if (q == 0 && (q = xw_walk(fd, NULL, ar_entry, x)) < 0 && !x->err.msg[0])
			err_set(&x->err, -q, NULL, "walk root %zu: %s", i, strerror(-q));
	}
	if (q == 0 && archive_write_close(x->a) != ARCHIVE_OK)
		q = ar_fail(x, "finish the archive");
	if (q < 0)
		log_warn("export of %s failed: %s", x->id, x->err.msg);
	archive_write_free(TAKE_PTR(x->a));
	free(TAKE_PTR(x->buf));
	shutdown(x->wfd, SHUT_WR);
	x->status = q;
	return NULL;
}

static void export_cleanup(struct engine_export *x)
{
	if (x->dirs)
		x->e->backend->view_close(x->e->bst, TAKE_PTR(x->dirs));
	xfer_rm(x->e, x->tmp);
}

void engine_export_free(struct engine_export *x)
{
	if (!x)
		return;
	if (x->rfd >= 0)
		close(x->rfd); /* a writer still sending gets EPIPE and stops */
	if (x->started)
		pthread_join(x->thread, NULL);
	if (x->wfd >= 0)
		close(x->wfd);
	export_cleanup(x);
	if (x->op)
		engine_op_end(x->e, x->op);
	free(x->tmp);
	json_decref(x->rec);
	json_decref(x->links);
	free(x);
}

int engine_export_open(struct engine *e, const char *id_or_name, struct engine_export **ret, ckpt_error *err)
{
	int sv[2];
	if (!e->backend->view_open)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "unsupported", "the %s backend cannot export",
				    e->backend->name);
	const struct ckpt_record *rec = engine_resolve(e, id_or_name);
	if (!rec)
		return err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint '%s'", id_or_name);
	if (rec->status != CKPT_ACTIVE) {
		record_unref(rec);
		return err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict",
				    "checkpoint '%s' is not active (being created or deleted)", id_or_name);
	}
	struct engine_export *x = calloc(1, sizeof(*x));
	if (!x) {
		record_unref(rec);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	x->e = e;
	x->rfd = x->wfd = -1;
	x->links = json_object();
	json_t *data = json_incref(rec->backend_data);
	x->rec = engine_public(e, rec);
	snprintf(x->id, sizeof(x->id), "%s", rec->id);
	record_unref(rec);
	int q = xfer_tmp(e, &x->tmp, err);
	if (q == 0) {
		/* The view is made under the operation lock: no restore or
		 * delete changes the layers while it is being mounted. */
		pthread_mutex_lock(&e->op_lock);
		q = e->backend->view_open(e->bst, x->id, data, x->tmp, &x->dirs, err);
		pthread_mutex_unlock(&e->op_lock);
	}
	json_decref(data);
	if (q == 0)
		q = export_manifest(x, err);
	if (q == 0 && (x->op = engine_op_begin(e, x->id))) {
		atomic_store(&x->op->progress.files_total, x->files_total);
		atomic_store(&x->op->progress.bytes_total, x->bytes_total);
	}
	if (q == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		q = err_set(err, errno, NULL, "socketpair: %m");
	if (q == 0) {
		x->rfd = sv[0], x->wfd = sv[1];
		shutdown(x->rfd, SHUT_WR);
		int r = pthread_create(&x->thread, NULL, export_main, x);
		if (r)
			q = err_set(err, r, NULL, "start the export writer: %s", strerror(r));
		x->started = r == 0;
	}
	if (q < 0) {
		engine_export_free(x);
		return engine_storage_err(err, q);
	}
	log_event(LOG_INFO_, &(struct log_fields){ "export", x->id, NULL, -1 }, "exporting %s", x->id);
	*ret = x;
	return 0;
}

ssize_t engine_export_read(struct engine_export *x, char *buf, size_t max)
{
	for (;;) {
		ssize_t k = read(x->rfd, buf, max);
		if (k < 0 && errno == EINTR)
			continue;
		if (k != 0)
			return k < 0 ? -errno : k;
		/* end: the writer is done; its status says whether all went out */
		if (x->started) {
			pthread_join(x->thread, NULL);
			x->started = false;
		}
		return x->status < 0 ? x->status : 0;
	}
}

/* ---- import --------------------------------------------------------- */

struct import_ctx {
	struct engine *e;
	int fd;
	char *tmp;
	json_t *manifest;
	json_t *expect; /* "N/path" -> manifest entry */
	ckpt_error *err;
	int status;
	char rel[PATH_MAX]; /* split_name's answer */
};

static int bad(struct import_ctx *c, const char *fmt, ...) _printf_(2, 3);
static int bad(struct import_ctx *c, const char *fmt, ...)
{
	va_list ap;
	char msg[400];
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return err_set_kind(c->err, ERR_INVALID, EBADMSG, "invalid_archive", "invalid archive: %s", msg);
}

/* A path below a root: relative, no empty, "." or ".." components. */
static bool rel_valid(const char *p)
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
static bool link_stays(const char *rel, const char *target)
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

/* "roots/N[/rel]" -> root N and rel ("." for the root). */
static int split_name(struct import_ctx *c, const char *name, size_t *root, const char **rel)
{
	char *end;
	if (strncmp(name, "roots/", 6) || !(name[6] >= '0' && name[6] <= '9'))
		return bad(c, "entry '%.200s' is not below roots/", name);
	unsigned long n = strtoul(name + 6, &end, 10);
	if (n >= c->e->cfg->n_roots)
		return bad(c, "entry '%.200s' names a root this daemon does not have", name);
	*root = n;
	if (!*end || !strcmp(end, "/")) {
		*rel = ".";
		return 0;
	}
	/* a directory's name may end in one '/' (pax writers add it) */
	size_t len = strlen(end + 1);
	if (*end != '/' || len == 0 || len >= sizeof(c->rel))
		return bad(c, "entry '%.200s' has an absolute, empty or '..' path", name);
	memcpy(c->rel, end + 1, len + 1);
	if (c->rel[len - 1] == '/')
		c->rel[len - 1] = '\0';
	if (!rel_valid(c->rel))
		return bad(c, "entry '%.200s' has an absolute, empty or '..' path", name);
	*rel = c->rel;
	return 0;
}

static int import_manifest(struct import_ctx *c, struct archive *a, struct archive_entry *ae)
{
	if (strcmp(archive_entry_pathname(ae) ?: "", "manifest.json") || archive_entry_filetype(ae) != AE_IFREG)
		return bad(c, "the first entry must be manifest.json");
	la_int64_t size = archive_entry_size(ae);
	if (size <= 0 || size > MANIFEST_MAX)
		return bad(c, "manifest.json of %lld bytes", (long long)size);
	_cleanup_free_ char *text = malloc((size_t)size + 1);
	if (!text)
		return err_set(c->err, ENOMEM, NULL, "out of memory");
	la_ssize_t got = 0, k;
	while (got < size && (k = archive_read_data(a, text + got, (size_t)(size - got))) > 0)
		got += k;
	if (got != size)
		return bad(c, "manifest.json is truncated");
	text[size] = '\0';
	json_error_t je;
	c->manifest = json_loads(text, JSON_REJECT_DUPLICATES, &je);
	json_t *m = c->manifest, *roots = json_object_get(m, "roots");
	if (!json_is_object(m) || strcmp(json_string_value(json_object_get(m, "format")) ?: "", FORMAT_NAME))
		return bad(c, "manifest.json is not a ckptd export manifest");
	if (json_integer_value(json_object_get(m, "version")) != FORMAT_VERSION)
		return bad(c, "manifest format version %lld, this daemon reads %d",
			   (long long)json_integer_value(json_object_get(m, "version")), FORMAT_VERSION);
	if (!json_is_object(json_object_get(m, "checkpoint")) || !json_is_array(roots))
		return bad(c, "manifest.json lacks the checkpoint or its roots");
	if (json_array_size(roots) != c->e->cfg->n_roots)
		return err_set_kind(c->err, ERR_CONFLICT, EXDEV, "roots_mismatch",
				    "the archive holds %zu roots, this daemon manages %zu", json_array_size(roots),
				    c->e->cfg->n_roots);
	c->expect = json_object();
	uint64_t unpacked = 0;
	size_t i, j;
	json_t *r, *en;
	json_array_foreach(roots, i, r)
	{
		json_array_foreach(json_object_get(r, "entries"), j, en)
		{
			const char *p = json_string_value(json_object_get(en, "path"));
			const char *t = json_string_value(json_object_get(en, "type"));
			char key[PATH_MAX + 32];
			if (!p || !t || (strcmp(p, ".") && !rel_valid(p)))
				return bad(c, "manifest entry with an invalid path");
			snprintf(key, sizeof(key), "%zu/%s", i, p);
			if (json_object_get(c->expect, key))
				return bad(c, "manifest lists '%.200s' twice", p);
			json_object_set(c->expect, key, en);
			json_int_t sz = json_integer_value(json_object_get(en, "size"));
			if (!strcmp(t, "file") && (sz < 0 || (unpacked += (uint64_t)sz) < (uint64_t)sz))
				return bad(c, "manifest entry '%.200s' has an invalid size", p);
		}
	}
	/* A few KB of zstd can unpack to terabytes of zeros: every entry is held
	 * to its manifest size, so the manifest's total is what extraction can
	 * write. Refuse it up front when the state dir cannot hold it. */
	struct statvfs sv;
	if (fstatvfs(c->e->state_fd, &sv) == 0) {
		uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
		if (unpacked > avail - avail / 20)
			return err_set_kind(c->err, ERR_NO_SPACE, ENOSPC, "insufficient_storage",
					    "the archive unpacks to %llu bytes; the state dir has %llu free",
					    (unsigned long long)unpacked, (unsigned long long)avail);
	}
	return 0;
}

/* Overlay checkpoints are only taken where their base is. */
static int import_base_check(struct import_ctx *c)
{
	json_t *m = c->manifest;
	const char *from = json_string_value(json_object_get(m, "backend"));
	const char *need = json_string_value(json_object_get(json_object_get(m, "base"), "identity"));
	char have[80];
	if (!from || strcmp(from, "overlay") || strcmp(c->e->backend->name, "overlay"))
		return 0;
	if (!need)
		return bad(c, "an overlay export without a base identity");
	int q = engine_base_identity(c->e, have, c->err);
	if (q < 0)
		return q;
	if (strcmp(have, need))
		return err_set_kind(c->err, ERR_CONFLICT, EXDEV, "base_mismatch",
				    "the checkpoint was taken over base %s but this daemon's base is %s: import it "
				    "on a daemon that adopted the same base (the same image contents), or export it "
				    "from there and restore it there",
				    need, have);
	return 0;
}

static void strip_overlay_xattrs(struct archive_entry *ae)
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
	archive_entry_xattr_reset(ae);
	while (archive_entry_xattr_next(ae, &k, &v, &n) == ARCHIVE_OK && nk < ARRAY_SIZE(keep)) {
		if (!strncmp(k, "trusted.overlay.", 16))
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

static int import_entry(struct import_ctx *c, struct archive *a, struct archive *w, struct archive_entry *ae, char *buf)
{
	/* a copy: the entry's own name is replaced by the extraction path below */
	_cleanup_free_ char *name = archive_entry_pathname(ae) ? strdup(archive_entry_pathname(ae)) : NULL;
	const char *rel, *want;
	size_t root;
	char key[PATH_MAX + 32];
	int q;

	if (!name)
		return bad(c, "an entry without a name");
	if ((q = split_name(c, name, &root, &rel)) < 0)
		return q;
	snprintf(key, sizeof(key), "%zu/%s", root, rel);
	json_t *m = json_object_get(c->expect, key);
	if (!m)
		return bad(c, "entry '%.200s' is not in the manifest", name);
	if (json_is_true(json_object_get(m, "_seen")))
		return bad(c, "entry '%.200s' appears twice", name);
	json_object_set_new(m, "_seen", json_true());
	want = json_string_value(json_object_get(m, "type"));
	const char *hl = archive_entry_hardlink(ae);
	mode_t ft = archive_entry_filetype(ae);
	const char *got = hl     ? "hardlink"
		: ft == AE_IFREG ? "file"
		: ft == AE_IFDIR ? "dir"
		: ft == AE_IFLNK ? "symlink"
		: ft == AE_IFIFO ? "fifo"
				 : NULL;
	if (!got)
		return bad(c, "entry '%.200s' is a device node or socket", name);
	if (strcmp(got, want))
		return bad(c, "entry '%.200s' is a %s, the manifest says %s", name, got, want);
	if (!strcmp(rel, ".") && strcmp(got, "dir"))
		return bad(c, "root entry '%.200s' is not a directory", name);
	/* A sparse entry names gigabytes of holes in a few bytes, which would be
	 * written out whole, past max_import_bytes; export never writes one. */
	if (archive_entry_sparse_count(ae) > 0)
		return bad(c, "entry '%.200s' is a sparse file (export never writes one)", name);
	if (hl) {
		size_t lroot;
		const char *lrel;
		char lkey[PATH_MAX + 32];
		if ((q = split_name(c, hl, &lroot, &lrel)) < 0)
			return q;
		snprintf(lkey, sizeof(lkey), "%zu/%s", lroot, lrel);
		json_t *t = json_object_get(c->expect, lkey);
		if (lroot != root || !t || strcmp(json_string_value(json_object_get(t, "type")) ?: "", "file") ||
		    !json_is_true(json_object_get(t, "_seen")))
			return bad(c, "hard link '%.200s' leaves the tree or names no earlier file", name);
		/* as a symlink's target: what the manifest announces is what comes */
		if (strcmp(lrel, json_string_value(json_object_get(m, "link")) ?: ""))
			return bad(c, "hard link '%.200s' differs from the manifest", name);
		archive_entry_copy_hardlink(ae, lkey);
		archive_entry_set_size(ae, 0);
	}
	if (!strcmp(got, "symlink")) {
		const char *t = archive_entry_symlink(ae);
		if (!t || strcmp(t, json_string_value(json_object_get(m, "link")) ?: ""))
			return bad(c, "symlink '%.200s' differs from the manifest", name);
		if (!link_stays(rel, t))
			return bad(c, "symlink '%.200s' points outside its root", name);
	}
	la_int64_t size = archive_entry_size(ae);
	json_int_t msize = json_integer_value(json_object_get(m, "size"));
	if (!strcmp(got, "file") && size != msize)
		return bad(c, "entry '%.200s' holds %lld bytes, the manifest says %lld", name, (long long)size,
			   (long long)msize);
	if (strcmp(got, "file") && size > 0)
		archive_entry_set_size(ae, 0);
	archive_entry_copy_pathname(ae, key);
	strip_overlay_xattrs(ae);
	if (archive_write_header(w, ae) != ARCHIVE_OK)
		return bad(c, "cannot extract '%.200s': %s", name, archive_error_string(w));
	if (!strcmp(got, "file")) {
		struct sha256_ctx h;
		uint8_t d[SHA256_DIGEST_SIZE];
		char sum[2 * SHA256_DIGEST_SIZE + 1];
		la_int64_t total = 0;
		la_ssize_t k;
		sha256_init(&h);
		while ((k = archive_read_data(a, buf, BLOCK)) > 0) {
			sha256_update(&h, (size_t)k, (uint8_t *)buf);
			total += k;
			if (archive_write_data(w, buf, (size_t)k) != k)
				return err_set(c->err, archive_errno(w) > 0 ? archive_errno(w) : EIO, NULL,
					       "write '%s': %s", key, archive_error_string(w));
		}
		if (k < 0 || total != size)
			return bad(c, "entry '%.200s' is truncated", name);
		sha256_digest(&h, sizeof(d), d);
		hex(d, sizeof(d), sum);
		if (strcmp(sum, json_string_value(json_object_get(m, "sha256")) ?: ""))
			return bad(c, "entry '%.200s' does not match its sha256 digest", name);
	}
	if (archive_write_finish_entry(w) != ARCHIVE_OK)
		return bad(c, "cannot extract '%.200s': %s", name, archive_error_string(w));
	return 0;
}

static int import_extract(struct import_ctx *c)
{
	struct archive *a = archive_read_new(), *w = archive_write_disk_new();
	struct archive_entry *ae;
	_cleanup_free_ char *buf = malloc(BLOCK);
	int q = a && w && buf ? 0 : err_set(c->err, ENOMEM, NULL, "out of memory"), r;
	bool first = true;

	if (q == 0) {
		archive_read_support_format_tar(a);
		archive_read_support_filter_zstd(a);
		archive_write_disk_set_options(
			w,
			ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_XATTR |
				ARCHIVE_EXTRACT_NO_OVERWRITE | ARCHIVE_EXTRACT_SECURE_NODOTDOT |
				ARCHIVE_EXTRACT_SECURE_SYMLINKS | ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS);
		if (archive_read_open_fd(a, c->fd, BLOCK) != ARCHIVE_OK)
			q = bad(c, "not a tar archive: %s", archive_error_string(a));
	}
	while (q == 0 && (r = archive_read_next_header(a, &ae)) != ARCHIVE_EOF) {
		if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
			q = bad(c, "truncated or corrupt: %s", archive_error_string(a));
			break;
		}
		if (first) {
			first = false;
			if ((q = import_manifest(c, a, ae)) == 0)
				q = import_base_check(c);
		} else {
			q = import_entry(c, a, w, ae, buf);
		}
	}
	if (q == 0 && first)
		q = bad(c, "the archive is empty");
	if (q == 0 && archive_write_close(w) != ARCHIVE_OK)
		q = bad(c, "cannot finish extraction: %s", archive_error_string(w));
	const char *k;
	json_t *v;
	json_object_foreach(c->expect, k, v)
	{
		if (q == 0 && !json_is_true(json_object_get(v, "_seen")))
			q = bad(c, "'%.200s' is in the manifest but not in the archive (truncated?)", k);
	}
	archive_read_free(a);
	archive_write_free(w);
	return q;
}

static void *import_main(void *arg)
{
	struct import_ctx *c = arg;
	_cleanup_close_ int dfd = open(c->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = dfd < 0 ? err_set(c->err, errno, NULL, "open '%s': %m", c->tmp) : 0;
	/* libarchive extracts relative to the working directory: this thread's own */
	if (q == 0 && (unshare(CLONE_FS) < 0 || fchdir(dfd) < 0))
		q = err_set(c->err, errno, NULL, "enter '%s': %m", c->tmp);
	if (q == 0)
		q = import_extract(c);
	c->status = q;
	return NULL;
}

int engine_import(struct engine *e, int fd, json_t **ret_record, ckpt_error *err)
{
	struct import_ctx c = { .e = e, .fd = fd, .err = err };
	pthread_t t;
	char id[32];
	int q;

	if (!e->backend->import)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "unsupported", "the %s backend cannot import",
				    e->backend->name);
	if ((q = xfer_tmp(e, &c.tmp, err)) < 0)
		return engine_storage_err(err, q);
	if ((q = pthread_create(&t, NULL, import_main, &c)) != 0) {
		q = err_set(err, q, NULL, "start the import: %s", strerror(q));
	} else {
		pthread_join(t, NULL);
		q = c.status;
	}
	struct ckpt_record *rec = NULL;
	char oid[32] = "";
	if (q == 0 && (q = id_generate(id, sizeof(id))) < 0)
		err_set(err, -q, NULL, "generate an id");
	if (q == 0) {
		json_t *orig = json_object_get(c.manifest, "checkpoint");
		const char *nm = json_string_value(json_object_get(orig, "name"));
		json_t *labels = json_object_get(orig, "labels");
		struct create_req cr = { .name = nm && name_valid(nm) ? nm : "imported",
					 .labels = json_is_object(labels) ? labels : NULL };
		rec = create_record(e, &cr, id);
		snprintf(oid, sizeof(oid), "%s", json_string_value(json_object_get(orig, "checkpoint_id")) ?: "");
		if (rec && !rec->extra) /* kept as is in the record file and answers */
			rec->extra = json_object();
		if (rec)
			json_object_set_new(rec->extra, "import_of", id_valid(oid) ? json_string(oid) : json_null());
		char **dirs = calloc(e->cfg->n_roots + 1, sizeof(*dirs));
		for (size_t i = 0; dirs && i < e->cfg->n_roots; i++)
			if (asprintf(&dirs[i], "%s/%zu", c.tmp, i) < 0)
				dirs[i] = NULL;
		json_t *data = NULL;
		uint64_t size = 0;
		int64_t t0 = mono_ms();
		bool admitted = (q = rec ? create_admit(e, rec, err) : -ENOMEM) == 0;
		pthread_mutex_lock(&e->op_lock);
		engine_set_status(e, "importing", id);
		if (q == 0)
			q = engine_check_managed(e, err);
		if (q == 0)
			q = dirs ? e->backend->import(e->bst, id, dirs, &data, &size, err) : -ENOMEM;
		if (q == 0) {
			json_decref(rec->backend_data);
			rec->backend_data = data ? data : json_object();
			rec->size_bytes = (int64_t)size;
			rec->duration_ms = mono_ms() - t0;
			rec->status = CKPT_ACTIVE;
			if ((q = catalog_put(e->catalog, rec, err)) < 0)
				e->backend->remove(e->bst, id, rec->backend_data, NULL);
		}
		if (q < 0 && admitted)
			catalog_remove(e->catalog, id, NULL);
		engine_set_status(e, NULL, NULL);
		pthread_mutex_unlock(&e->op_lock);
		for (size_t i = 0; dirs && i < e->cfg->n_roots; i++)
			free(dirs[i]);
		free(dirs);
		if (q < 0 && !err->kind) /* a limit keeps its own kind (EDQUOT is not a full disk) */
			q = engine_storage_err(err, q);
	}
	xfer_rm(e, c.tmp);
	free(c.tmp);
	json_decref(c.manifest);
	json_decref(c.expect);
	if (q < 0) {
		log_event(LOG_WARN_, &(struct log_fields){ "import", NULL, NULL, -1 }, "import refused: %s", err->msg);
		if (rec)
			record_unref(rec);
		return q;
	}
	log_event(LOG_INFO_, &(struct log_fields){ "import", id, NULL, -1 }, "imported %s as %s", oid[0] ? oid : "?",
		  id);
	*ret_record = engine_public(e, rec);
	record_unref(rec);
	return 0;
}
