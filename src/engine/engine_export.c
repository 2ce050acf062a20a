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
 * digest, and only then hands the trees to the backend (engine_import.c).
 * This file builds the manifest and runs the writer; the walk, digests and
 * temp dirs both sides use are in engine_xfer.c. */
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
	const char *link = engine_xfer_link_of(x->links, st, rel, true);
	const char *type = engine_xfer_type(st, link != NULL);
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
		int q = fd < 0 ? -errno : engine_xfer_sha256_fd(fd, sum, &len);
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

	const char *base_kind = e->backend->xfer->base_kind;
	if (base_kind && (q = engine_base_identity(e, base, err)) < 0)
		return q;
	json_auto_t *head =
		json_pack("{s:s, s:i, s:s, s:O, s:o}", "format", ENGINE_XFER_FORMAT_NAME, "version",
			  ENGINE_XFER_FORMAT_VERSION, "backend", e->backend->name, "checkpoint", x->rec, "base",
			  base[0] ? json_pack("{s:s, s:s}", "identity", base, "kind", base_kind) : json_null());
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
		q = engine_xfer_walk(fd, NULL, mf_entry, x);
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
	while ((k = read(fd, x->buf, ENGINE_XFER_BLOCK)) > 0)
		if (archive_write_data(x->a, x->buf, (size_t)k) != k)
			return ar_fail(x, "write archive data");
	return k < 0 ? err_set(&x->err, errno, NULL, "read: %m") : 0;
}

static int ar_entry(void *ctx, int dirfd, const char *name, const char *rel, const struct stat *st)
{
	struct engine_export *x = ctx;
	const char *link = engine_xfer_link_of(x->links, st, rel, true);
	char path[PATH_MAX + 32], t[PATH_MAX + 32]; /* "roots/N/" and a path of up to PATH_MAX - 1 */
	int q = 0;

	if (!engine_xfer_type(st, false))
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
	engine_xfer_xattrs(ae, dirfd, rel ? name : NULL, x->e->backend->xfer->xattr_portable);
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
	x->buf = malloc(ENGINE_XFER_BLOCK);
	if (!x->a || !x->buf)
		q = err_set(&x->err, ENOMEM, NULL, "out of memory");
	if (q == 0 &&
	    (archive_write_set_format_pax(x->a) != ARCHIVE_OK || archive_write_add_filter_zstd(x->a) != ARCHIVE_OK ||
	     archive_write_set_bytes_per_block(x->a, ENGINE_XFER_BLOCK) != ARCHIVE_OK ||
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
		if (q == 0 && (q = engine_xfer_walk(fd, NULL, ar_entry, x)) < 0 && !x->err.msg[0])
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
		x->e->backend->xfer->view_close(x->e->bst, TAKE_PTR(x->dirs));
	engine_xfer_rm(x->e, x->tmp);
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
	if (!e->backend->xfer)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "unsupported", "the %s backend cannot export",
				    e->backend->name);
	const struct ckpt_record *rec;
	int r = engine_resolve_active(e, id_or_name, &rec, err);
	if (r < 0)
		return r;
	struct engine_export *x = calloc(1, sizeof(*x));
	if (!x) {
		record_unref(rec);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	x->e = e;
	x->rfd = x->wfd = -1;
	x->links = json_object();
	json_t *data = json_incref(rec->backend_data);
	x->rec = record_json(rec, false); /* as the catalog keeps it, for the manifest */
	snprintf(x->id, sizeof(x->id), "%s", rec->id);
	record_unref(rec);
	int q = engine_xfer_tmp(e, &x->tmp, err);
	if (q == 0) {
		/* The view is made under the operation lock: no restore or
		 * delete changes the layers while it is being mounted. */
		pthread_mutex_lock(&e->op_lock);
		q = e->backend->xfer->view_open(e->bst, x->id, data, x->tmp, &x->dirs, err);
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
		return engine_err_classify(err, ENGINE_CTX_READ, q);
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
