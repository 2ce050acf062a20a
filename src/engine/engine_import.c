/* engine_import.c: import an export archive (format: engine_export.c) as a
 * new checkpoint. The spooled body is read twice: the manifest first, then
 * each entry, checked against it, is extracted below <state>/xfer/<random>/
 * with libarchive's secure flags; every digest is verified before the trees
 * go to the backend. A hostile or damaged archive changes nothing. */
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
#include "lib/strset.h"
#include "lib/walk.h"
#include "lib/xattr.h"
#include "lib/failpoint.h"

struct import_ctx {
	struct engine *e;
	int fd;
	char *tmp;
	json_t *manifest;
	json_t *expect;     /* "N/path" -> manifest entry (read only) */
	struct strset seen; /* the keys of expect the archive held so far */
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
	if (*end == '/' && len >= sizeof(c->rel))
		return bad(c, "entry '%.200s...' has a path of %zu bytes: a root takes them shorter than %d", name, len,
			   PATH_MAX);
	if (*end != '/' || len == 0)
		return bad(c, "entry '%.200s' has an absolute, empty or '..' path", name);
	memcpy(c->rel, end + 1, len + 1);
	if (c->rel[len - 1] == '/')
		c->rel[len - 1] = '\0';
	if (!engine_xfer_rel_valid(c->rel))
		return bad(c, "entry '%.200s' has an absolute, empty or '..' path", name);
	*rel = c->rel;
	return 0;
}

static int import_manifest(struct import_ctx *c, struct archive *a, struct archive_entry *ae)
{
	if (strcmp(archive_entry_pathname(ae) ?: "", "manifest.json") || archive_entry_filetype(ae) != AE_IFREG)
		return bad(c, "the first entry must be manifest.json");
	la_int64_t size = archive_entry_size(ae);
	if (size <= 0 || size > ENGINE_XFER_MANIFEST_MAX)
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
	if (!json_is_object(m) ||
	    strcmp(json_string_value(json_object_get(m, "format")) ?: "", ENGINE_XFER_FORMAT_NAME))
		return bad(c, "manifest.json is not a ckptd export manifest");
	if (json_integer_value(json_object_get(m, "version")) != ENGINE_XFER_FORMAT_VERSION)
		return bad(c, "manifest format version %lld, this daemon reads %d",
			   (long long)json_integer_value(json_object_get(m, "version")), ENGINE_XFER_FORMAT_VERSION);
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
	json_array_foreach (roots, i, r) {
		json_array_foreach (json_object_get(r, "entries"), j, en) {
			const char *p = json_string_value(json_object_get(en, "path"));
			const char *t = json_string_value(json_object_get(en, "type"));
			char key[PATH_MAX + 32];
			if (p && strlen(p) >= PATH_MAX)
				return bad(c,
					   "manifest entry '%.200s...' has a path of %zu bytes: a root takes them "
					   "shorter than %d",
					   p, strlen(p), PATH_MAX);
			if (!p || !t || (strcmp(p, ".") && !engine_xfer_rel_valid(p)))
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

/* A checkpoint of layers over a base (the backend has a base_kind) imports
 * only where that base is; an export by a backend of the same name names it. */
static int import_base_check(struct import_ctx *c)
{
	json_t *m = c->manifest;
	const char *from = json_string_value(json_object_get(m, "backend"));
	const char *need = json_string_value(json_object_get(json_object_get(m, "base"), "identity"));
	char have[80];
	if (!c->e->backend->xfer->base_kind || !from || strcmp(from, c->e->backend->name))
		return 0;
	if (!need)
		return bad(c, "an %s export without a base identity", from);
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
	if ((q = strset_add(&c->seen, key)) == 0)
		return bad(c, "entry '%.200s' appears twice", name);
	if (q < 0)
		return err_set(c->err, ENOMEM, NULL, "out of memory");
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
		    !strset_has(&c->seen, lkey))
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
		if (!engine_xfer_link_stays(rel, t))
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
	engine_xfer_xattr_filter(ae, c->e->backend->xfer->xattr_portable);
	if (archive_write_header(w, ae) != ARCHIVE_OK)
		return bad(c, "cannot extract '%.200s': %s", name, archive_error_string(w));
	if (!strcmp(got, "file")) {
		struct sha256_ctx h;
		uint8_t d[SHA256_DIGEST_SIZE];
		char sum[2 * SHA256_DIGEST_SIZE + 1];
		la_int64_t total = 0;
		la_ssize_t k;
		sha256_init(&h);
		while ((k = archive_read_data(a, buf, ENGINE_XFER_BLOCK)) > 0) {
			sha256_update(&h, (size_t)k, (uint8_t *)buf);
			total += k;
			if (archive_write_data(w, buf, (size_t)k) != k)
				return err_set(c->err, archive_errno(w) > 0 ? archive_errno(w) : EIO, NULL,
					       "write '%s': %s", key, archive_error_string(w));
		}
		if (k < 0 || total != size)
			return bad(c, "entry '%.200s' is truncated", name);
		sha256_digest(&h, sizeof(d), d);
		engine_xfer_hex(d, sizeof(d), sum);
		if (strcmp(sum, json_string_value(json_object_get(m, "sha256")) ?: ""))
			return bad(c, "entry '%.200s' does not match its sha256 digest", name);
	}
	if (archive_write_finish_entry(w) != ARCHIVE_OK)
		return bad(c, "cannot extract '%.200s': %s", name, archive_error_string(w));
	if (hl || !strcmp(got, "symlink") || (q = engine_xfer_acls(key, ae)) == 0)
		return 0;
	return err_set(c->err, -q, NULL, "cannot set the ACLs of '%s': %s", key, strerror(-q));
}

static int import_extract(struct import_ctx *c)
{
	struct archive *a = archive_read_new(), *w = archive_write_disk_new();
	struct archive_entry *ae;
	_cleanup_free_ char *buf = malloc(ENGINE_XFER_BLOCK);
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
		if (archive_read_open_fd(a, c->fd, ENGINE_XFER_BLOCK) != ARCHIVE_OK)
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
	json_object_foreach (c->expect, k, v) {
		if (q == 0 && !strset_has(&c->seen, k))
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

/* Make a checkpoint of the trees tmp/0 .. tmp/N-1 (one per root), named
 * name, whose record says where it came from: origin's members (taken:
 * *origin is empty after). The commit half of an import, shared with pull
 * (engine_oci_pull.c). Errors come back unclassified: the caller classifies
 * them at its boundary. */
int engine_import_trees(struct engine *e, const char *tmp, const char *name, json_t *labels, struct ckpt_extra *origin,
			struct ckpt_record **ret_rec, ckpt_error *err)
{
	struct ckpt_record *rec = NULL;
	char id[32];
	int q;
	if ((q = id_generate(id, sizeof(id))) < 0) {
		ckpt_extra_free(origin);
		return err_set(err, -q, NULL, "generate an id");
	}
	struct create_req cr = { .name = name && name_valid(name) ? name : "imported",
				 .labels = json_is_object(labels) ? labels : NULL };
	rec = create_record(e, &cr, id);
	if (rec) {
		ckpt_extra_free(&rec->extra);
		rec->extra = *origin;
		*origin = (struct ckpt_extra){ 0 };
	}
	ckpt_extra_free(origin);
	char **dirs = calloc(e->cfg->n_roots + 1, sizeof(*dirs));
	for (size_t i = 0; dirs && i < e->cfg->n_roots; i++)
		if (asprintf(&dirs[i], "%s/%zu", tmp, i) < 0)
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
		q = dirs ? e->backend->xfer->import(e->bst, id, dirs, &data, &size, err) : -ENOMEM;
	if (q == 0) {
		json_decref(rec->backend_data);
		rec->backend_data = data ? data : json_object();
		rec->size_bytes = (int64_t)size;
		rec->duration_ms = mono_ms() - t0;
		rec->status = CKPT_ACTIVE;
		if ((q = FAILPOINT_AROUND("import.record.write", catalog_put(e->catalog, rec, err))) < 0)
			e->backend->remove(e->bst, id, rec->backend_data, NULL);
	}
	if (q < 0 && admitted)
		catalog_remove(e->catalog, id, NULL);
	engine_set_status(e, NULL, NULL);
	pthread_mutex_unlock(&e->op_lock);
	for (size_t i = 0; dirs && i < e->cfg->n_roots; i++)
		free(dirs[i]);
	free(dirs);
	if (q < 0) {
		if (rec)
			record_unref(rec);
		return q;
	}
	*ret_rec = rec;
	return 0;
}

int engine_import(struct engine *e, int fd, const struct ckpt_idem *idem, struct ckpt_view *ret, ckpt_error *err)
{
	struct import_ctx c = { .e = e, .fd = fd, .err = err };
	pthread_t t;
	int q;

	if (!e->backend->xfer)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "unsupported", "the %s backend cannot import",
				    e->backend->name);
	if ((q = engine_xfer_tmp(e, &c.tmp, err)) < 0)
		return engine_err_classify(err, ENGINE_CTX_CREATE, q);
	if ((q = pthread_create(&t, NULL, import_main, &c)) != 0) {
		q = err_set(err, q, NULL, "start the import: %s", strerror(q));
	} else {
		pthread_join(t, NULL);
		q = c.status;
	}
	struct ckpt_record *rec = NULL;
	char oid[32] = "";
	if (q == 0) {
		json_t *orig = json_object_get(c.manifest, "checkpoint");
		snprintf(oid, sizeof(oid), "%s", json_string_value(json_object_get(orig, "checkpoint_id")) ?: "");
		struct ckpt_extra origin = { .has_import_of = true };
		if (idem && (origin.idem = malloc(sizeof(*origin.idem))))
			*origin.idem = *idem;
		if (id_valid(oid))
			snprintf(origin.import_of, sizeof(origin.import_of), "%s", oid);
		q = idem && !origin.idem
			? err_set(err, ENOMEM, NULL, "out of memory")
			: engine_import_trees(e, c.tmp, json_string_value(json_object_get(orig, "name")),
					      json_object_get(orig, "labels"), &origin, &rec, err);
	}
	engine_xfer_rm(e, c.tmp);
	free(c.tmp);
	json_decref(c.manifest);
	json_decref(c.expect);
	strset_free(&c.seen);
	if ((q = engine_err_classify(err, ENGINE_CTX_CREATE, q)) < 0) {
		log_event(LOG_WARN_, &(struct log_fields){ "import", NULL, NULL, -1 }, "import refused: %s", err->msg);
		return q;
	}
	log_event(LOG_INFO_, &(struct log_fields){ "import", rec->id, NULL, -1 }, "imported %s as %s",
		  oid[0] ? oid : "?", rec->id);
	engine_view(e, rec, ret);
	record_unref(rec);
	return 0;
}
