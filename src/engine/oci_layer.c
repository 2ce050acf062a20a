/* oci_layer.c: OCI image layers from checkpoint views, and back.
 *
 * Writing: libarchive writes a pax tar into lw_write, which hashes it (the
 * layer's diff_id) and hands it to a thread of its own (oci_pipe.c), which
 * compresses it with libzstd or zlib at fixed settings (gzip with no name
 * and mtime 0), hashing the compressed bytes (the blob's digest) as they go
 * to disk: two cores make a layer, each doing one SHA-256 pass. Entries come in name order, with numeric
 * owners only and no atime or ctime, so a tree gives the same bytes every
 * time. A delta layer walks the old and new views side by side: an entry
 * is written when its type, mode, owner, size, mtime or link target
 * differs (file data is not compared: an unchanged size and mtime to the
 * nanosecond count as unchanged, as the tar backend does); an entry gone
 * from the new view becomes ".wh.NAME". Views already resolve overlayfs
 * whiteouts, opaque directories and redirects.
 *
 * Applying: libarchive reads the layer; each entry is mapped below its
 * root's directory and written with the secure extraction flags. Before
 * ckptd touches a path itself (a whiteout, a replaced entry) it checks
 * that no directory on the way is a symlink, so a layer cannot reach out
 * through one an earlier layer planted. */
#include "engine/oci_layer.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <nettle/sha2.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "engine/engine_internal.h"
#include "engine/engine_xfer.h"
#include "engine/oci_pipe.h"
#include "lib/walk.h"

#define ZBUF (256 * 1024)
#define ZSTD_LEVEL_OCI 3
#define FLUSH_EVERY (8u << 20) /* start writeback of the blob as it grows */

struct lw {
	struct archive *a;
	int fd;
	bool gzip;
	ZSTD_CCtx *z;
	z_stream gz;
	bool gz_ready;
	struct sha256_ctx hd, hc;
	uint64_t size, flushed;
	unsigned char *out;
	char *buf;
	json_t *links;
	const char *prefix;                 /* the tar path of the root being walked */
	bool walk_failed;                   /* a hook of its walk filled err */
	bool (*portable)(const char *name); /* the xattrs that may cross */
	struct oci_pipe *pipe;              /* to the thread that compresses, hashes and writes */
	const struct oci_layer_watch *watch;
	int werr;
	ckpt_error *err;
};

static int lw_sink(struct lw *w, const unsigned char *p, size_t n)
{
	sha256_update(&w->hc, n, p);
	w->size += n;
	if (w->size - w->flushed >= FLUSH_EVERY) { /* the fsync before keeping it waits less */
		sync_file_range(w->fd, (off_t)w->flushed, (off_t)(w->size - w->flushed), SYNC_FILE_RANGE_WRITE);
		w->flushed = w->size;
	}
	while (n) {
		ssize_t k = write(w->fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		p += k;
		n -= (size_t)k;
	}
	return w->watch ? w->watch->on_out(w->watch->arg, w->size) : 0;
}

static int lw_compress(struct lw *w, const void *buf, size_t len, bool end)
{
	int q = 0;
	if (w->gzip) {
		w->gz.next_in = (unsigned char *)buf;
		w->gz.avail_in = (uInt)len;
		int zr;
		do {
			w->gz.next_out = w->out;
			w->gz.avail_out = ZBUF;
			zr = deflate(&w->gz, end ? Z_FINISH : Z_NO_FLUSH);
			if (zr == Z_STREAM_ERROR)
				return -EIO;
			q = lw_sink(w, w->out, ZBUF - w->gz.avail_out);
		} while (q == 0 && (w->gz.avail_out == 0 || (end && zr != Z_STREAM_END)));
		return q;
	}
	ZSTD_inBuffer in = { buf, len, 0 };
	size_t left;
	do {
		ZSTD_outBuffer o = { w->out, ZBUF, 0 };
		left = ZSTD_compressStream2(w->z, &o, &in, end ? ZSTD_e_end : ZSTD_e_continue);
		if (ZSTD_isError(left))
			return -EIO;
		q = lw_sink(w, w->out, o.pos);
	} while (q == 0 && (in.pos < in.size || (end && left)));
	return q;
}

/* The pipe's thread: compress, hash, write. */
static int lw_consume(void *ctx, const void *buf, size_t len, bool end)
{
	return lw_compress(ctx, buf, len, end);
}

static la_ssize_t lw_write(struct archive *a, void *cls, const void *buf, size_t len)
{
	struct lw *w = cls;
	if (!w->pipe) { /* archive_write_free after a failure flushes here, the pipe gone */
		archive_set_error(a, ECANCELED, "the layer was stopped");
		return -1;
	}
	sha256_update(&w->hd, len, buf);
	int q = oci_pipe_put(w->pipe, buf, len);
	if (q < 0) {
		w->werr = -q;
		archive_set_error(a, -q, "write the layer: %s", strerror(-q));
		return -1;
	}
	return (la_ssize_t)len;
}

static int lw_fail(struct lw *w, const char *what)
{
	int e = w->werr ? w->werr : archive_errno(w->a) > 0 ? archive_errno(w->a) : EIO;
	return err_set(w->err, e, NULL, "%s: %s", what, archive_error_string(w->a) ?: strerror(e));
}

static int lw_copy(struct lw *w, int dirfd, const char *name, const char *path)
{
	_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	ssize_t k;
	if (fd < 0)
		return err_set(w->err, errno, NULL, "open '%s': %m", path);
	while ((k = read(fd, w->buf, ENGINE_XFER_BLOCK)) > 0)
		if (archive_write_data(w->a, w->buf, (size_t)k) != k)
			return lw_fail(w, "write layer data");
	return k < 0 ? err_set(w->err, errno, NULL, "read '%s': %m", path) : 0;
}

/* One entry: name below dirfd (NULL: dirfd itself) as tar path `path`. */
static int lw_entry(struct lw *w, int dirfd, const char *name, const char *path, const struct stat *st)
{
	char t[PATH_MAX], key[64];
	const char *link = NULL;
	int q = 0;

	if (!engine_xfer_type(st, false))
		return 0; /* devices and sockets are not checkpointed data */
	if (S_ISREG(st->st_mode) && st->st_nlink > 1) {
		snprintf(key, sizeof(key), "%llu:%llu", (unsigned long long)st->st_dev, (unsigned long long)st->st_ino);
		link = json_string_value(json_object_get(w->links, key));
		if (!link)
			json_object_set_new(w->links, key, json_string(path));
	}
	struct archive_entry *ae = archive_entry_new();
	if (!ae)
		return err_set(w->err, ENOMEM, NULL, "out of memory");
	archive_entry_copy_stat(ae, st);
	archive_entry_unset_atime(ae);
	archive_entry_unset_ctime(ae);
	archive_entry_unset_birthtime(ae);
	archive_entry_set_ino64(ae, 0);
	archive_entry_set_dev(ae, 0);
	archive_entry_set_nlink(ae, 1);
	archive_entry_set_pathname(ae, path);
	if (link) {
		archive_entry_set_hardlink(ae, link);
	} else if (S_ISLNK(st->st_mode)) {
		ssize_t k = readlinkat(dirfd, name ? name : "", t, sizeof(t) - 1);
		t[k > 0 ? k : 0] = '\0';
		archive_entry_set_symlink(ae, t);
	}
	if (!S_ISREG(st->st_mode) || link)
		archive_entry_set_size(ae, 0);
	if (dirfd != AT_FDCWD) /* not a made-up entry (a whiteout, a parent) */
		engine_xfer_xattrs(ae, dirfd, name, w->portable);
	if (archive_write_header(w->a, ae) != ARCHIVE_OK)
		q = lw_fail(w, "write layer header");
	if (q == 0 && S_ISREG(st->st_mode) && !link && st->st_size > 0)
		q = lw_copy(w, dirfd, name, path);
	archive_entry_free(ae);
	return q;
}

static int lw_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory's names, sorted. */
static int lw_names(int fd, char ***ret, size_t *ret_n)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	char **v = NULL;
	size_t n = 0, cap = 0;
	int q = fd < 0 ? 0 : walk_open(fd, NULL, &d);
	while (q == 0 && d && (de = walk_next(d))) {
		if (n == cap) {
			char **nv = realloc(v, (cap = cap ? cap * 2 : 32) * sizeof(*v));
			if (!nv) {
				q = -ENOMEM;
				break;
			}
			v = nv;
		}
		if (!(v[n] = strdup(de->d_name)))
			q = -ENOMEM;
		else
			n++;
	}
	if (n > 1)
		qsort(v, n, sizeof(*v), lw_cmp);
	*ret = v;
	*ret_n = n;
	return q;
}

static void lw_names_free(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static bool lw_same(int ofd, const char *name, const struct stat *a, int nfd, const struct stat *b)
{
	if ((a->st_mode & S_IFMT) != (b->st_mode & S_IFMT) || (a->st_mode & 07777) != (b->st_mode & 07777) ||
	    a->st_uid != b->st_uid || a->st_gid != b->st_gid || a->st_mtim.tv_sec != b->st_mtim.tv_sec ||
	    a->st_mtim.tv_nsec != b->st_mtim.tv_nsec)
		return false;
	if (!S_ISDIR(a->st_mode) && a->st_size != b->st_size)
		return false;
	if (S_ISLNK(a->st_mode)) {
		char x[PATH_MAX], y[PATH_MAX];
		ssize_t k = readlinkat(ofd, name, x, sizeof(x)), l = readlinkat(nfd, name, y, sizeof(y));
		return k == l && k >= 0 && !memcmp(x, y, (size_t)k);
	}
	return true;
}

static int lw_whiteout(struct lw *w, const char *prefix, const char *name)
{
	char path[PATH_MAX];
	struct stat st = { .st_mode = S_IFREG | 0644, .st_nlink = 1 };
	if (snprintf(path, sizeof(path), "%s/.wh.%s", prefix, name) >= (int)sizeof(path))
		return err_set(w->err, ENAMETOOLONG, NULL, "path too long below '%s'", prefix);
	return lw_entry(w, AT_FDCWD, NULL, path, &st);
}

/* The tar path of e: the walk's path below a root's prefix, or "/name..."
 * for the whole root (prefix ""), as the layer has always named them. */
static const char *lw_path(const struct lw *w, const struct walk_merge_entry *e, char buf[PATH_MAX])
{
	if (*w->prefix)
		return e->path;
	snprintf(buf, PATH_MAX, "/%s", e->path);
	return buf;
}

/* One name of a directory of the union: in the old view (tree 0), the new
 * (tree 1), or both. The walk goes below a directory of the new view, and
 * below the old one's only where that is a directory too. */
static int lw_pre(void *ctx, struct walk_merge_entry *e)
{
	struct lw *w = ctx;
	struct walk_merge_side *o = &e->side[0], *n = &e->side[1];
	char buf[PATH_MAX], parent[PATH_MAX];
	const char *path = lw_path(w, e, buf);
	size_t plen = strlen(path) - strlen(e->name) - 1;
	snprintf(parent, sizeof(parent), "%.*s", (int)plen, path);
	int q = 0;
	if (!n->held) {
		q = engine_xfer_type(&o->st, false) ? lw_whiteout(w, parent, e->name) : 0;
		w->walk_failed |= q < 0;
		return q < 0 ? q : WALK_SKIP;
	}
	bool same_type = o->held && (o->st.st_mode & S_IFMT) == (n->st.st_mode & S_IFMT);
	if (o->held && !same_type && engine_xfer_type(&o->st, false))
		q = lw_whiteout(w, parent, e->name); /* a new type replaces, it does not merge */
	if (q == 0 && !(same_type && lw_same(o->dirfd, e->name, &o->st, n->dirfd, &n->st)))
		q = lw_entry(w, n->dirfd, e->name, path, &n->st);
	o->descend = o->descend && same_type;
	w->walk_failed |= q < 0;
	return q;
}

static int lw_walk_fail(void *ctx, const struct walk_merge_entry *e, int err)
{
	struct lw *w = ctx;
	char buf[PATH_MAX];
	const char *path = lw_path(w, e, buf);
	w->walk_failed = true;
	switch (e->step) {
	case WALK_AT_PATH: /* e->path is still the parent's */
		return err_set(w->err, ENAMETOOLONG, NULL, "path too long: '%s/%s'", path, e->name);
	case WALK_AT_STAT:
		return err_set(w->err, -err, NULL, "stat '%s': %s", path, strerror(-err));
	case WALK_AT_DEPTH:
		return err_set(w->err, ELOOP, NULL, "'%s' is more than %d directories deep", path, WALK_DEPTH_MAX);
	case WALK_AT_OPEN:
		return err_set(w->err, -err, NULL, "open '%s': %s", path, strerror(-err));
	default:
		return err_set(w->err, -err, NULL, "list '%s': %s", path, strerror(-err));
	}
}

/* The union of the old view ofd (-1: none) and the new one nfd, below
 * their root whose tar path is prefix. */
static int lw_tree(struct lw *w, int ofd, int nfd, const char *prefix)
{
	int roots[2] = { ofd, nfd };
	struct walk_merge_opts o = {
		.path_max = PATH_MAX - !*prefix, .prefix = prefix, .pre = lw_pre, .fail = lw_walk_fail, .ctx = w
	};
	w->prefix = prefix;
	w->walk_failed = false;
	int q = walk_merge(roots, 2, &o);
	if (q >= 0 || w->walk_failed)
		return q;
	return err_set(w->err, -q, NULL, "list '%s': %s", prefix, strerror(-q)); /* a root, or memory */
}

/* The parents of a root's prefix ("srv" for "srv/data"), for a whole layer. */
static int lw_parents(struct lw *w, const char *prefix, json_t *done)
{
	char p[PATH_MAX];
	struct stat st = { .st_mode = S_IFDIR | 0755, .st_nlink = 1 };
	snprintf(p, sizeof(p), "%s", prefix);
	for (char *s = p; (s = strchr(s, '/')); *s++ = '/') {
		*s = '\0';
		if (json_object_get(done, p))
			continue;
		json_object_set_new(done, p, json_true());
		int q = lw_entry(w, AT_FDCWD, NULL, p, &st);
		if (q < 0)
			return q;
	}
	return 0;
}

static int lw_root(struct lw *w, const char *prefix, const char *olddir, const char *newdir, json_t *parents)
{
	_cleanup_close_ int n = open(newdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int o = olddir ? open(olddir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	struct stat ns, os;
	if (n < 0 || fstat(n, &ns) < 0 || (olddir && (o < 0 || fstat(o, &os) < 0)))
		return err_set(w->err, errno, NULL, "open the view of '/%s': %m", prefix);
	int q = olddir ? 0 : lw_parents(w, prefix, parents);
	if (q == 0 && !(olddir && lw_same(o, ".", &os, n, &ns)))
		q = lw_entry(w, n, NULL, prefix, &ns);
	return q < 0 ? q : lw_tree(w, o, n, prefix);
}

static int lw_start(struct lw *w)
{
	if (!(w->a = archive_write_new()) || !(w->out = malloc(ZBUF)) || !(w->buf = malloc(ENGINE_XFER_BLOCK)) ||
	    !(w->links = json_object()))
		return err_set(w->err, ENOMEM, NULL, "out of memory");
	sha256_init(&w->hd);
	sha256_init(&w->hc);
	if (w->gzip) {
		/* windowBits 31: a gzip header with no name and mtime 0 */
		if (deflateInit2(&w->gz, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK)
			return err_set(w->err, ENOMEM, NULL, "start gzip");
		w->gz_ready = true;
	} else if (!(w->z = ZSTD_createCCtx()) ||
		   ZSTD_isError(ZSTD_CCtx_setParameter(w->z, ZSTD_c_compressionLevel, ZSTD_LEVEL_OCI)) ||
		   ZSTD_isError(ZSTD_CCtx_setParameter(w->z, ZSTD_c_checksumFlag, 1))) {
		return err_set(w->err, ENOMEM, NULL, "start zstd");
	}
	if (archive_write_set_format_pax(w->a) != ARCHIVE_OK ||
	    archive_write_set_bytes_per_block(w->a, ENGINE_XFER_BLOCK) != ARCHIVE_OK ||
	    archive_write_set_bytes_in_last_block(w->a, 1) != ARCHIVE_OK ||
	    archive_write_open(w->a, w, NULL, lw_write, NULL) != ARCHIVE_OK)
		return lw_fail(w, "start the layer");
	return 0;
}

static void lw_end(struct lw *w)
{
	if (w->a)
		archive_write_free(w->a);
	if (w->gz_ready)
		deflateEnd(&w->gz);
	ZSTD_freeCCtx(w->z);
	free(w->out);
	free(w->buf);
	json_decref(w->links);
}

static void lw_digest(struct sha256_ctx *h, char out[80])
{
	uint8_t d[SHA256_DIGEST_SIZE];
	sha256_digest(h, sizeof(d), d);
	strcpy(out, "sha256:");
	engine_xfer_hex(d, sizeof(d), out + 7);
}

int oci_layer_write(int out_fd, bool gzip, char *const *prefixes, char *const *olddirs, char *const *newdirs, size_t n,
		    bool (*portable)(const char *name), struct oci_blob *ret, ckpt_error *err)
{
	return oci_layer_write_watched(out_fd, gzip, prefixes, olddirs, newdirs, n, portable, NULL, ret, err);
}

int oci_layer_write_watched(int out_fd, bool gzip, char *const *prefixes, char *const *olddirs, char *const *newdirs,
			    size_t n, bool (*portable)(const char *name), const struct oci_layer_watch *watch,
			    struct oci_blob *ret, ckpt_error *err)
{
	struct lw w = { .fd = out_fd, .gzip = gzip, .portable = portable, .watch = watch, .err = err };
	json_auto_t *parents = json_object();
	int q = !parents ? -ENOMEM : oci_pipe_start(lw_consume, &w, &w.pipe);
	if (q < 0)
		return err_set(err, -q, NULL, "start the layer: %s", strerror(-q));
	q = lw_start(&w);
	for (size_t i = 0; q == 0 && i < n; i++)
		q = lw_root(&w, prefixes[i], olddirs ? olddirs[i] : NULL, newdirs[i], parents);
	if (q == 0 && archive_write_close(w.a) != ARCHIVE_OK)
		q = lw_fail(&w, "finish the layer");
	int pq = oci_pipe_finish(TAKE_PTR(w.pipe), q < 0); /* the compressed end, or the pipe's error */
	if (q == 0 && pq < 0)
		q = err_set(err, -pq, NULL, "finish the layer: %s", strerror(-pq));
	if (q == 0) {
		lw_digest(&w.hd, ret->diff_id);
		lw_digest(&w.hc, ret->digest);
		ret->size = w.size;
	}
	lw_end(&w);
	return q;
}

/* ---- applying ---- */

struct la {
	const struct oci_map *map;
	size_t n;
	int64_t *budget;
	json_t *written; /* paths this layer wrote: its whiteouts spare them */
	json_t *touched; /* parent dirs changed, not in the layer: their times */
	bool (*portable)(const char *name);
	ckpt_error *err;
	char *buf;
};

static int hostile(struct la *l, const char *fmt, ...) _printf_(2, 3);

static int hostile(struct la *l, const char *fmt, ...)
{
	va_list ap;
	char msg[400];
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return err_set_kind(l->err, ERR_INVALID, EBADMSG, "invalid_layer", "refused layer: %s", msg);
}

/* name -> out ("DIR/rest" or "DIR"); 1 mapped, 0 to skip (a parent of a
 * root, or "."), <0 error. *root is the map index. */
static int la_map(struct la *l, const char *name, char *out, size_t cap, size_t *root, const char **rest)
{
	char n[PATH_MAX];
	while (name[0] == '.' && name[1] == '/')
		name += 2;
	if (name[0] == '/')
		return hostile(l, "absolute path '%.200s'", name);
	size_t len = strlen(name);
	if (len >= sizeof(n))
		return hostile(l, "path too long");
	memcpy(n, name, len + 1);
	while (len && n[len - 1] == '/')
		n[--len] = '\0';
	if (!len || !strcmp(n, "."))
		return 0;
	if (!engine_xfer_rel_valid(n))
		return hostile(l, "path '%.200s' has '..' or empty parts", name);
	for (size_t i = 0; i < l->n; i++) {
		size_t pl = strlen(l->map[i].prefix);
		if (strncmp(n, l->map[i].prefix, pl) || (n[pl] && n[pl] != '/'))
			continue;
		*root = i;
		*rest = n[pl] ? name + pl + 1 : ".";
		if (snprintf(out, cap, "%s%s%s", l->map[i].dir, n[pl] ? "/" : "", n[pl] ? n + pl + 1 : "") >= (int)cap)
			return hostile(l, "path too long");
		return 1;
	}
	for (size_t i = 0; i < l->n; i++) { /* a parent of a root: its own metadata is not kept */
		const char *p = l->map[i].prefix;
		if (!strncmp(p, n, len) && p[len] == '/')
			return 0;
	}
	return err_set_kind(l->err, ERR_CONFLICT, ENOENT, "root_unmapped",
			    "the image holds '/%.200s', which is in no root this pull maps: map the image's root "
			    "onto one of this daemon's roots with \"roots\"",
			    n);
}

/* No directory on the way to p (below its root dir) may be a symlink. */
static int la_safe(struct la *l, const char *p)
{
	char b[PATH_MAX];
	struct stat st;
	snprintf(b, sizeof(b), "%s", p);
	char *first = strchr(b, '/'); /* the root's own dir is ours */
	for (char *s = first ? strchr(first + 1, '/') : NULL; s; s = strchr(s + 1, '/')) {
		*s = '\0';
		if (lstat(b, &st) < 0)
			return 0;
		if (S_ISLNK(st.st_mode))
			return hostile(l, "'%.200s' goes through a symlink", p);
		*s = '/';
	}
	return 0;
}

/* Keep the times of p's parent, unless this layer sets them itself. */
static void la_touch(struct la *l, const char *p)
{
	char parent[PATH_MAX];
	struct stat st;
	snprintf(parent, sizeof(parent), "%s", p);
	char *s = strrchr(parent, '/');
	if (!s)
		return;
	*s = '\0';
	if (json_object_get(l->written, parent) || json_object_get(l->touched, parent) || lstat(parent, &st) < 0 ||
	    !S_ISDIR(st.st_mode))
		return;
	json_object_set_new(l->touched, parent,
			    json_pack("[I,I,I,I]", (json_int_t)st.st_atim.tv_sec, (json_int_t)st.st_atim.tv_nsec,
				      (json_int_t)st.st_mtim.tv_sec, (json_int_t)st.st_mtim.tv_nsec));
}

static int la_remove(struct la *l, const char *p)
{
	int q = la_safe(l, p);
	if (q < 0 || json_object_get(l->written, p))
		return q; /* a whiteout hides lower layers only */
	la_touch(l, p);
	q = rm_rf_at(AT_FDCWD, p);
	return q < 0 ? err_set(l->err, -q, NULL, "remove '%s': %s", p, strerror(-q)) : 0;
}

static int la_opaque(struct la *l, const char *dir)
{
	char **names = NULL, p[PATH_MAX];
	size_t n = 0;
	int q = la_safe(l, dir);
	_cleanup_close_ int fd = q < 0 ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return q;
	q = lw_names(fd, &names, &n);
	for (size_t i = 0; q == 0 && i < n; i++) {
		if (snprintf(p, sizeof(p), "%s/%s", dir, names[i]) >= (int)sizeof(p))
			q = hostile(l, "path too long below '%.200s'", dir);
		else
			q = la_remove(l, p);
	}
	lw_names_free(names, n);
	return q;
}

/* A whiteout entry: 1 when it was one (applied), 0 when not. */
static int la_whiteout(struct la *l, const char *name)
{
	const char *base = strrchr(name, '/');
	base = base ? base + 1 : name;
	if (strncmp(base, ".wh.", 4))
		return 0;
	char parent[PATH_MAX], mapped[PATH_MAX], target[PATH_MAX];
	size_t root;
	const char *rest;
	/* cut short, a whiteout would name another entry: a prefix of its own */
	if (strlen(name) >= sizeof(target))
		return hostile(l, "path too long ('%.200s...')", name);
	snprintf(parent, sizeof(parent), "%.*s", (int)(base - name), name);
	if (!strcmp(base, ".wh..wh..opq")) {
		int q = la_map(l, parent[0] ? parent : ".", mapped, sizeof(mapped), &root, &rest);
		return q <= 0 ? q : la_opaque(l, mapped) < 0 ? -1 : 1;
	}
	if (!strncmp(base, ".wh..wh.", 8))
		return 1; /* aufs bookkeeping: nothing to apply */
	snprintf(target, sizeof(target), "%s%s", parent, base + 4);
	int q = la_map(l, target, mapped, sizeof(mapped), &root, &rest);
	if (q <= 0)
		return q < 0 ? q : 1;
	if (!strchr(mapped, '/'))
		return hostile(l, "a whiteout of a root itself ('%.200s')", name);
	return la_remove(l, mapped) < 0 ? -1 : 1;
}

static int la_data(struct la *l, struct archive *a, struct archive *w, const char *p)
{
	const void *blk;
	size_t len;
	la_int64_t off;
	int r;
	while ((r = archive_read_data_block(a, &blk, &len, &off)) == ARCHIVE_OK)
		if (archive_write_data_block(w, blk, len, off) != ARCHIVE_OK)
			return err_set(l->err, archive_errno(w) > 0 ? archive_errno(w) : EIO, NULL, "write '%s': %s", p,
				       archive_error_string(w));
	return r == ARCHIVE_EOF ? 0 : hostile(l, "'%.200s' is truncated: %s", p, archive_error_string(a));
}

static int la_entry(struct la *l, struct archive *a, struct archive *w, struct archive_entry *ae)
{
	const char *name = archive_entry_pathname(ae) ?: "", *rest, *lrest;
	char p[PATH_MAX], lp[PATH_MAX];
	size_t root, lroot;
	mode_t type = archive_entry_filetype(ae);
	int q = la_whiteout(l, name);
	if (q != 0)
		return q < 0 ? q : 0;
	if ((q = la_map(l, name, p, sizeof(p), &root, &rest)) <= 0)
		return q;
	if (type == AE_IFCHR || type == AE_IFBLK || type == AE_IFSOCK)
		return hostile(l, "'%.200s' is a device node", name);
	const char *hl = archive_entry_hardlink(ae), *sl = archive_entry_symlink(ae);
	if (hl) {
		ckpt_error *keep = l->err, quiet = { 0 };
		l->err = &quiet; /* a target outside every root is hostile, not unmapped */
		q = la_map(l, hl, lp, sizeof(lp), &lroot, &lrest);
		l->err = keep;
		if (q <= 0 || lroot != root)
			return hostile(l, "hard link '%.200s' leaves its root", name);
		archive_entry_copy_hardlink(ae, lp);
		/* no data or metadata through a link: its target may be a file a
		 * pull linked from a checkpoint (oci_clone.c), never to change */
		archive_entry_set_size(ae, 0);
	}
	if (type == AE_IFLNK && sl && !engine_xfer_link_stays(rest, sl))
		return hostile(l, "symlink '%.200s' points out of its root", name);
	if (type == AE_IFREG && !hl) {
		int64_t size = archive_entry_size(ae);
		if (size > *l->budget)
			return err_set_kind(l->err, ERR_LIMIT, EFBIG, "too_large",
					    "the image's files are over max_import_bytes");
		*l->budget -= size;
	}
	if ((q = la_safe(l, p)) < 0)
		return q;
	if (!strcmp(rest, ".") && type != AE_IFDIR)
		return hostile(l, "the root '%.200s' is not a directory", name);
	struct stat st;
	int lr = lstat(p, &st);
	if (lr == 0 && !(S_ISDIR(st.st_mode) && type == AE_IFDIR)) {
		la_touch(l, p);
		if ((q = rm_rf_at(AT_FDCWD, p)) < 0)
			return err_set(l->err, -q, NULL, "replace '%s': %s", p, strerror(-q));
	} else if (lr < 0) {
		la_touch(l, p);
	}
	archive_entry_copy_pathname(ae, p);
	engine_xfer_xattr_filter(ae, l->portable);
	if (archive_write_header(w, ae) != ARCHIVE_OK)
		return hostile(l, "cannot extract '%.200s': %s", name, archive_error_string(w));
	json_object_set_new(l->written, p, json_true());
	if (type == AE_IFREG && archive_entry_size(ae) > 0 && (q = la_data(l, a, w, p)) < 0)
		return q;
	if (archive_write_finish_entry(w) != ARCHIVE_OK)
		return hostile(l, "cannot extract '%.200s': %s", name, archive_error_string(w));
	if (hl || type == AE_IFLNK || (q = engine_xfer_acls(p, ae)) == 0)
		return 0;
	return err_set(l->err, -q, NULL, "cannot set the ACLs of '%s': %s", p, strerror(-q));
}

static void la_restore_times(struct la *l)
{
	const char *k;
	json_t *v;
	json_object_foreach (l->touched, k, v) {
		struct timespec ts[2] = {
			{ (time_t)json_integer_value(json_array_get(v, 0)),
			  (long)json_integer_value(json_array_get(v, 1)) },
			{ (time_t)json_integer_value(json_array_get(v, 2)),
			  (long)json_integer_value(json_array_get(v, 3)) },
		};
		utimensat(AT_FDCWD, k, ts, AT_SYMLINK_NOFOLLOW);
	}
}

/* Where a layer's bytes come from: a file, or a reader's blocks. */
struct la_src {
	int fd;
	oci_layer_read_fn read;
	void *ctx;
};

static la_ssize_t la_read(struct archive *a, void *cls, const void **buf)
{
	const struct la_src *src = cls;
	ssize_t k = src->read(src->ctx, buf);
	if (k < 0)
		archive_set_error(a, (int)-k, "the layer's stream broke: %s", strerror((int)-k));
	return k < 0 ? ARCHIVE_FATAL : (la_ssize_t)k;
}

static int la_open(struct la *l, struct archive *a, struct la_src *src)
{
	archive_read_support_format_tar(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_gzip(a);
	int r = src->read ? archive_read_open(a, src, NULL, la_read, NULL)
			  : archive_read_open_fd(a, src->fd, ENGINE_XFER_BLOCK);
	return r == ARCHIVE_OK ? 0 : hostile(l, "not a tar layer: %s", archive_error_string(a));
}

static int la_apply(struct la_src *src, const struct oci_map *map, size_t n, int64_t *budget,
		    bool (*portable)(const char *name), ckpt_error *err)
{
	struct la l = { .map = map, .n = n, .budget = budget, .portable = portable, .err = err };
	struct archive *a = archive_read_new(), *w = archive_write_disk_new();
	struct archive_entry *ae;
	int q = 0, r;
	l.written = json_object();
	l.touched = json_object();
	if (!a || !w || !l.written || !l.touched)
		q = err_set(err, ENOMEM, NULL, "out of memory");
	if (q == 0) {
		archive_write_disk_set_options(w,
					       ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME |
						       ARCHIVE_EXTRACT_XATTR | ARCHIVE_EXTRACT_SECURE_NODOTDOT |
						       ARCHIVE_EXTRACT_SECURE_SYMLINKS |
						       ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS);
		q = la_open(&l, a, src);
	}
	while (q == 0 && (r = archive_read_next_header(a, &ae)) != ARCHIVE_EOF) {
		if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
			q = hostile(&l, "truncated or corrupt: %s", archive_error_string(a));
			break;
		}
		q = la_entry(&l, a, w, ae);
	}
	if (q == 0 && archive_write_close(w) != ARCHIVE_OK)
		q = hostile(&l, "cannot finish extraction: %s", archive_error_string(w));
	if (q == 0)
		la_restore_times(&l);
	archive_read_free(a);
	archive_write_free(w);
	json_decref(l.written);
	json_decref(l.touched);
	return q;
}

int oci_layer_apply(int fd, const struct oci_map *map, size_t n, int64_t *budget, bool (*portable)(const char *name),
		    ckpt_error *err)
{
	struct la_src src = { .fd = fd };
	return la_apply(&src, map, n, budget, portable, err);
}

int oci_layer_apply_read(oci_layer_read_fn read, void *ctx, const struct oci_map *map, size_t n, int64_t *budget,
			 bool (*portable)(const char *name), ckpt_error *err)
{
	struct la_src src = { .fd = -1, .read = read, .ctx = ctx };
	return la_apply(&src, map, n, budget, portable, err);
}
