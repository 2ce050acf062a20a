/* engine_oci.c: push a checkpoint to a registry as an OCI image, and pull
 * one back as a new checkpoint (docs/registry.md).
 *
 * Push: the image has a base layer (the roots as ckptd adopted them, unless
 * "base": false) and a checkpoint layer (what the checkpoint changed from
 * the base, whiteouts included), both made from the backend's read-only
 * views by oci_layer.c. Layers are kept by digest in <state>/oci/blobs, and
 * <state>/oci/keys names which blob a (base, checkpoint, compression) gave,
 * so a second push makes nothing and sends nothing the registry holds.
 * Each blob: HEAD, else a mount from another repository this daemon pushed
 * it to on the same registry, else a chunked upload; the manifest last.
 *
 * Pull: manifest (an index must have linux/amd64), config, then each layer
 * not already in <state>/oci/blobs is downloaded into <state>/xfer/<rnd>/,
 * checked for size and digest as it arrives, and kept by digest. The layers
 * are applied in order into one tree per root below the same temp dir,
 * which becomes a checkpoint as an import does. Until that commit nothing
 * but verified blobs in the cache is written, and the temp dir goes at
 * the next start if the daemon is killed. */
#include "engine/engine_oci.h"

#include <nettle/sha2.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>

#include "config.h"
#include "engine/engine_export.h"
#include "engine/engine_internal.h"
#include "engine/engine_xfer.h"
#include "engine/oci_layer.h"
#include "engine/oci_reg.h"

#define OCI_DIR "oci"
#define BLOBS_DIR "oci/blobs"
#define KEYS_DIR "oci/keys"
#define MOUNT_DIR "oci/mounts"
#define CONFIG_MAX (4u << 20)

static int oci_dirs(struct engine *e, ckpt_error *err)
{
	const char *d[] = { OCI_DIR, BLOBS_DIR, KEYS_DIR, MOUNT_DIR };
	for (size_t i = 0; i < ARRAY_SIZE(d); i++)
		if (mkdirat(e->state_fd, d[i], 0700) < 0 && errno != EEXIST)
			return err_set(err, errno, NULL, "create '%s/%s': %m", e->cfg->state_dir, d[i]);
	return 0;
}

static void blob_name(const char *digest, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%s", BLOBS_DIR, digest + 7);
}

/* Is blob digest in the cache with size bytes? */
static bool blob_held(struct engine *e, const char *digest, int64_t size)
{
	char p[200];
	struct stat st;
	blob_name(digest, p, sizeof(p));
	return fstatat(e->state_fd, p, &st, 0) == 0 && S_ISREG(st.st_mode) && (size < 0 || st.st_size == size);
}

/* Move the verified file tmp (absolute, below the state dir) into the cache. */
static int blob_keep(struct engine *e, const char *tmp, const char *digest, ckpt_error *err)
{
	char p[200];
	_cleanup_close_ int fd = open(tmp, O_RDONLY | O_CLOEXEC);
	blob_name(digest, p, sizeof(p));
	if (fd < 0 || fsync(fd) < 0)
		return err_set(err, errno, NULL, "sync '%s': %m", tmp);
	if (renameat(AT_FDCWD, tmp, e->state_fd, p) < 0)
		return err_set(err, errno, NULL, "keep blob %s: %m", digest);
	_cleanup_close_ int dfd = openat(e->state_fd, BLOBS_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return dfd < 0 || fsync_dirfd(dfd) < 0 ? err_set(err, errno, NULL, "sync the blob cache: %m") : 0;
}

static int key_read(struct engine *e, const char *key, struct oci_blob *b)
{
	char p[300];
	_cleanup_free_ char *text = NULL;
	size_t len;
	snprintf(p, sizeof(p), "%s/%s", KEYS_DIR, key);
	if (read_file_at(e->state_fd, p, 4096, &text, &len) < 0)
		return -ENOENT;
	json_auto_t *j = json_loadb(text, len, 0, NULL);
	const char *d = json_string_value(json_object_get(j, "digest")),
		   *di = json_string_value(json_object_get(j, "diff_id"));
	json_int_t size = json_integer_value(json_object_get(j, "size"));
	if (!d || !di || strlen(d) >= sizeof(b->digest) || strlen(di) >= sizeof(b->diff_id) ||
	    !blob_held(e, d, size))
		return -ENOENT;
	snprintf(b->digest, sizeof(b->digest), "%s", d);
	snprintf(b->diff_id, sizeof(b->diff_id), "%s", di);
	b->size = (uint64_t)size;
	return 0;
}

static int key_write(struct engine *e, const char *key, const struct oci_blob *b, ckpt_error *err)
{
	json_auto_t *j = json_pack("{s:s, s:s, s:I}", "digest", b->digest, "diff_id", b->diff_id, "size",
				   (json_int_t)b->size);
	_cleanup_free_ char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	_cleanup_close_ int dfd = openat(e->state_fd, KEYS_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = !s ? -ENOMEM : dfd < 0 ? -errno : write_file_atomic(dfd, key, s, strlen(s), 0600);
	return q < 0 ? err_set(err, -q, NULL, "record layer %s: %s", key, strerror(-q)) : 0;
}

/* ---------------- push ---------------- */

struct push {
	struct engine *e;
	const struct push_req *req;
	struct oci_ref ref;
	char id[32];
	json_t *rec; /* public record */
	json_t *data;
	char *tmp;
	char **cdirs, **bdirs; /* views: the checkpoint, the base */
	char *prefixes[MAX_ROOTS];
	char base_id[80];
	struct oci_blob layers[2];
	size_t n_layers;
	struct oci_blob config;
	uint64_t uploaded, reused;
	struct engine_op *op;
	ckpt_error *err;
};

static int push_views(struct push *p)
{
	struct engine *e = p->e;
	if (p->cdirs)
		return 0;
	_cleanup_free_ char *c = path_join(p->tmp, "c"), *b = path_join(p->tmp, "b");
	if (!c || !b || mkdir(c, 0700) < 0 || mkdir(b, 0700) < 0)
		return err_set(p->err, errno ? errno : ENOMEM, NULL, "create the views' dirs: %m");
	pthread_mutex_lock(&e->op_lock); /* no restore or delete changes the layers meanwhile */
	int q = e->backend->view_open(e->bst, p->id, p->data, c, &p->cdirs, p->err);
	if (q == 0)
		q = e->backend->view_open(e->bst, NULL, NULL, b, &p->bdirs, p->err);
	pthread_mutex_unlock(&e->op_lock);
	return q;
}

/* The layer of key, from the cache or made now from the views. */
static int push_layer(struct push *p, const char *key, bool whole, struct oci_blob *b)
{
	struct engine *e = p->e;
	if (key_read(e, key, b) == 0)
		return 0;
	int q = push_views(p);
	_cleanup_free_ char *f = path_join(p->tmp, key);
	_cleanup_close_ int fd = q < 0 || !f ? -1 : open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (q < 0)
		return q;
	if (fd < 0)
		return err_set(p->err, errno ? errno : ENOMEM, NULL, "create the layer file: %m");
	q = oci_layer_write(fd, e->cfg->registry_gzip, p->prefixes, whole ? NULL : p->bdirs,
			    whole ? p->bdirs : p->cdirs, e->cfg->n_roots, b, p->err);
	if (q == 0)
		q = blob_keep(e, f, b->digest, p->err);
	return q < 0 ? q : key_write(e, key, b, p->err);
}

static json_t *push_config(struct push *p)
{
	json_t *diff = json_array();
	for (size_t i = 0; i < p->n_layers; i++)
		json_array_append_new(diff, json_string(p->layers[i].diff_id));
	return json_pack("{s:s, s:s, s:s?, s:{s:s, s:o}, s:{s:{s:s, s:s}}}", "architecture", "amd64", "os", "linux",
			 "created", json_string_value(json_object_get(p->rec, "created_at")), "rootfs", "type",
			 "layers", "diff_ids", diff, "config", "Labels", "io.ckptd.checkpoint_id", p->id,
			 "io.ckptd.backend", p->e->backend->name);
}

static json_t *push_annotations(struct push *p)
{
	json_t *roots = json_array();
	for (size_t i = 0; i < p->e->cfg->n_roots; i++)
		json_array_append_new(roots, json_string(p->e->cfg->roots[i]));
	_cleanup_free_ char *rs = json_dumps(roots, JSON_COMPACT);
	json_decref(roots);
	const char *name = json_string_value(json_object_get(p->rec, "name")),
		   *created = json_string_value(json_object_get(p->rec, "created_at"));
	return json_pack("{s:s, s:s?, s:s?, s:s?, s:s, s:s, s:s, s:s?}", "io.ckptd.checkpoint_id", p->id,
			 "io.ckptd.name", name, "io.ckptd.created_at", created, "io.ckptd.roots", rs,
			 "io.ckptd.base", p->base_id, "io.ckptd.base_layer", p->req->base ? "true" : "false",
			 "io.ckptd.backend", p->e->backend->name, "org.opencontainers.image.created", created);
}

static void push_progress(void *arg, uint64_t n)
{
	struct push *p = arg;
	if (p->op)
		atomic_fetch_add(&p->op->progress.bytes_done, n);
}

/* Another repository on the same registry this daemon sent digest to. */
static bool push_mount_from(struct push *p, const char *digest, char *from, size_t cap)
{
	char path[200], *text = NULL;
	size_t len;
	snprintf(path, sizeof(path), "%s/%s", MOUNT_DIR, digest + 7);
	if (read_file_at(p->e->state_fd, path, 1024, &text, &len) < 0)
		return false;
	json_auto_t *j = json_loadb(text, len, 0, NULL);
	free(text);
	const char *k;
	json_t *v;
	json_object_foreach(j, k, v)
	{
		const char *slash = strchr(k, '/');
		if (slash && (size_t)(slash - k) == strlen(p->ref.host) && !strncmp(k, p->ref.host, slash - k) &&
		    strcmp(slash + 1, p->ref.repo)) {
			snprintf(from, cap, "%s", slash + 1);
			return true;
		}
	}
	return false;
}

static void push_mount_note(struct push *p, const char *digest)
{
	char path[200], where[600], *text = NULL;
	size_t len;
	snprintf(path, sizeof(path), "%s/%s", MOUNT_DIR, digest + 7);
	json_auto_t *j = read_file_at(p->e->state_fd, path, 64 << 10, &text, &len) == 0
				 ? json_loadb(text, len, 0, NULL)
				 : NULL;
	free(text);
	if (!json_is_object(j))
		json_decref(j), j = json_object();
	snprintf(where, sizeof(where), "%s/%s", p->ref.host, p->ref.repo);
	if (json_object_get(j, where) || json_object_size(j) > 64)
		return;
	json_object_set_new(j, where, json_true());
	_cleanup_free_ char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	_cleanup_close_ int dfd = openat(p->e->state_fd, MOUNT_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s && dfd >= 0)
		write_file_atomic(dfd, digest + 7, s, strlen(s), 0600);
}

static int push_blob(struct push *p, struct oci_reg *r, const struct oci_blob *b, bool *sent)
{
	char path[PATH_MAX], from[300];
	bool have = false;
	int q = oci_reg_blob_exists(r, b->digest, &have, p->err);
	if (q == 0 && !have && push_mount_from(p, b->digest, from, sizeof(from)))
		q = oci_reg_blob_mount(r, b->digest, from, &have, p->err);
	*sent = q == 0 && !have;
	if (q == 0 && !have) {
		snprintf(path, sizeof(path), "%s/%s/%s", p->e->cfg->state_dir, BLOBS_DIR, b->digest + 7);
		q = oci_reg_blob_upload(r, path, b->digest, b->size, push_progress, p, p->err);
	} else if (q == 0) {
		push_progress(p, b->size);
	}
	if (q == 0) {
		if (*sent)
			p->uploaded += b->size;
		else
			p->reused += b->size;
		push_mount_note(p, b->digest);
	}
	return q;
}

/* The config as a blob in the cache (so it uploads like a layer). */
static int push_config_blob(struct push *p, const char *text)
{
	struct sha256_ctx h;
	uint8_t d[SHA256_DIGEST_SIZE];
	sha256_init(&h);
	sha256_update(&h, strlen(text), (const uint8_t *)text);
	sha256_digest(&h, sizeof(d), d);
	strcpy(p->config.digest, "sha256:");
	engine_xfer_hex(d, sizeof(d), p->config.digest + 7);
	p->config.size = strlen(text);
	if (blob_held(p->e, p->config.digest, (int64_t)p->config.size))
		return 0;
	_cleanup_close_ int dfd = openat(p->e->state_fd, BLOBS_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = dfd < 0 ? -errno : write_file_atomic(dfd, p->config.digest + 7, text, strlen(text), 0600);
	return q < 0 ? err_set(p->err, -q, NULL, "write the image config: %s", strerror(-q)) : 0;
}

static json_t *push_descriptor(const char *mt, const struct oci_blob *b)
{
	return json_pack("{s:s, s:s, s:I}", "mediaType", mt, "digest", b->digest, "size", (json_int_t)b->size);
}

static int push_run(struct push *p, json_t **ret)
{
	struct engine *e = p->e;
	char key[200], tag[129];
	const char *mt = e->cfg->registry_gzip ? OCI_MT_GZIP : OCI_MT_ZSTD, *z = e->cfg->registry_gzip ? "gz" : "zst";
	int q = oci_dirs(e, p->err);
	if (q == 0)
		q = engine_base_identity(e, p->base_id, p->err);
	if (q == 0 && p->req->base) {
		snprintf(key, sizeof(key), "base-%s-%s", p->base_id + 7, z);
		q = push_layer(p, key, true, &p->layers[p->n_layers++]);
	}
	if (q == 0) {
		snprintf(key, sizeof(key), "ckpt-%s-%s-%s", p->id, p->base_id + 7, z);
		q = push_layer(p, key, false, &p->layers[p->n_layers++]);
	}
	if (q < 0)
		return q;
	json_auto_t *cfg = push_config(p);
	_cleanup_free_ char *cs = cfg ? json_dumps(cfg, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	if (!cs || (q = push_config_blob(p, cs)) < 0)
		return q < 0 ? q : err_set(p->err, ENOMEM, NULL, "out of memory");
	json_t *layers = json_array(), *out_layers = json_array();
	for (size_t i = 0; i < p->n_layers; i++)
		json_array_append_new(layers, push_descriptor(mt, &p->layers[i]));
	json_auto_t *man =
		json_pack("{s:i, s:s, s:o, s:o, s:o}", "schemaVersion", 2, "mediaType", OCI_MT_MANIFEST, "config",
			  push_descriptor(OCI_MT_CONFIG, &p->config), "layers", layers, "annotations", push_annotations(p));
	_cleanup_free_ char *ms = man ? json_dumps(man, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	if (!ms) {
		json_decref(out_layers);
		return err_set(p->err, ENOMEM, NULL, "out of memory");
	}
	if (p->op) {
		uint64_t total = p->config.size;
		for (size_t i = 0; i < p->n_layers; i++)
			total += p->layers[i].size;
		atomic_store(&p->op->progress.bytes_total, total);
	}
	snprintf(tag, sizeof(tag), "%s", p->ref.tag);
	if (!tag[0]) {
		const char *nm = json_string_value(json_object_get(p->rec, "name"));
		snprintf(tag, sizeof(tag), "%s", nm && oci_tag_valid(nm) ? nm : p->id);
	}
	struct oci_reg *r = NULL;
	bool sent;
	q = oci_reg_open(e->cfg, &p->ref, "pull,push", &r, p->err);
	for (size_t i = 0; q == 0 && i < p->n_layers; i++) {
		q = push_blob(p, r, &p->layers[i], &sent);
		json_array_append_new(out_layers, json_pack("{s:s, s:s, s:I, s:b}", "digest", p->layers[i].digest,
							     "media_type", mt, "size", (json_int_t)p->layers[i].size,
							     "uploaded", sent));
	}
	if (q == 0)
		q = push_blob(p, r, &p->config, &sent);
	if (q == 0)
		q = oci_reg_manifest_put(r, tag, OCI_MT_MANIFEST, ms, strlen(ms), p->err);
	oci_reg_free(r);
	if (q < 0) {
		json_decref(out_layers);
		return q;
	}
	struct sha256_ctx h;
	uint8_t d[SHA256_DIGEST_SIZE];
	char digest[80] = "sha256:", ref[700];
	sha256_init(&h);
	sha256_update(&h, strlen(ms), (const uint8_t *)ms);
	sha256_digest(&h, sizeof(d), d);
	engine_xfer_hex(d, sizeof(d), digest + 7);
	snprintf(ref, sizeof(ref), "%s/%s:%s", p->ref.host, p->ref.repo, tag);
	*ret = json_pack("{s:s, s:s, s:s, s:o, s:I, s:I}", "checkpoint_id", p->id, "ref", ref, "digest", digest,
			 "layers", out_layers, "uploaded_bytes", (json_int_t)p->uploaded, "reused_bytes",
			 (json_int_t)p->reused);
	log_event(LOG_INFO_, &(struct log_fields){ "push", p->id, NULL, -1 },
		  "pushed %s as %s (%s): %llu bytes sent, %llu reused", p->id, ref, digest,
		  (unsigned long long)p->uploaded, (unsigned long long)p->reused);
	return *ret ? 0 : err_set(p->err, ENOMEM, NULL, "out of memory");
}

int engine_push(struct engine *e, const char *id_or_name, const struct push_req *req, json_t **ret,
		ckpt_error *err)
{
	struct push p = { .e = e, .req = req, .err = err };
	if (!e->backend->view_open)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "unsupported", "the %s backend cannot push",
				    e->backend->name);
	int q = oci_ref_parse(req->ref, &p.ref, err);
	if (q == 0 && p.ref.digest[0])
		return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_ref",
				    "push to a tag (HOST/REPO[:TAG]), not to a digest");
	if (q < 0)
		return q;
	const struct ckpt_record *rec = engine_resolve(e, id_or_name);
	if (!rec)
		return err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint '%s'", id_or_name);
	if (rec->status != CKPT_ACTIVE) {
		record_unref(rec);
		return err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict",
				    "checkpoint '%s' is not active (being created or deleted)", id_or_name);
	}
	snprintf(p.id, sizeof(p.id), "%s", rec->id);
	p.data = json_incref(rec->backend_data);
	p.rec = engine_public(e, rec);
	record_unref(rec);
	for (size_t i = 0; i < e->cfg->n_roots; i++)
		p.prefixes[i] = e->cfg->roots[i] + 1; /* the tar paths: the root's own path */
	p.op = engine_op_begin(e, p.id);
	q = engine_xfer_tmp(e, &p.tmp, err);
	if (q == 0)
		q = push_run(&p, ret);
	if (p.cdirs)
		e->backend->view_close(e->bst, p.cdirs);
	if (p.bdirs)
		e->backend->view_close(e->bst, p.bdirs);
	engine_xfer_rm(e, p.tmp);
	free(p.tmp);
	if (p.op)
		engine_op_end(e, p.op);
	json_decref(p.rec);
	json_decref(p.data);
	if (q < 0) {
		log_event(LOG_WARN_, &(struct log_fields){ "push", p.id, NULL, -1 }, "push refused: %s", err->msg);
		if (!err->kind)
			q = engine_storage_err(err, q);
	}
	return q;
}

/* ---------------- pull ---------------- */

struct pull {
	struct engine *e;
	const struct pull_req *req;
	struct oci_ref ref;
	struct oci_reg *r;
	char *tmp;
	char digest[80];
	json_t *manifest, *layers, *annotations;
	const char *image_roots[MAX_ROOTS]; /* image root mapped to local root i */
	struct oci_map map[MAX_ROOTS];
	char dirs[MAX_ROOTS][16];
	int64_t budget;
	ckpt_error *err;
	int status;
};

static bool mt_is(const char *mt, const char *a, const char *b)
{
	return mt && (!strcmp(mt, a) || (b && !strcmp(mt, b)));
}

static int unsupported(struct pull *p, const char *what)
{
	return err_set_kind(p->err, ERR_INVALID, ENOTSUP, "unsupported_image", "%s is not a ckptd can pull: %s",
			    p->req->ref, what);
}

/* The manifest at the ref; through an index, the linux/amd64 one. */
static int pull_manifest(struct pull *p)
{
	char mt[128], digest[80];
	_cleanup_free_ char *body = NULL;
	size_t len;
	const char *reference = p->ref.digest[0] ? p->ref.digest : p->ref.tag[0] ? p->ref.tag : "latest";
	int q = oci_reg_manifest_get(p->r, reference, &body, &len, mt, digest, p->err);
	if (q < 0)
		return q;
	if (p->ref.digest[0] && strcmp(digest, p->ref.digest))
		return err_set_kind(p->err, ERR_UPSTREAM, EBADMSG, "digest_mismatch",
				    "the manifest sent for %s has digest %s", p->ref.digest, digest);
	json_auto_t *j = json_loadb(body, len, 0, NULL);
	if (!json_is_object(j))
		return unsupported(p, "its manifest is not JSON");
	const char *jmt = json_string_value(json_object_get(j, "mediaType"));
	if (!mt[0] || !strcmp(mt, "application/json") || !strcmp(mt, "text/plain"))
		snprintf(mt, sizeof(mt), "%s", jmt ? jmt : OCI_MT_MANIFEST);
	if (mt_is(mt, OCI_MT_INDEX, DOCKER_MT_LIST)) {
		json_t *m;
		size_t i;
		const char *pick = NULL;
		json_array_foreach(json_object_get(j, "manifests"), i, m)
		{
			json_t *pl = json_object_get(m, "platform");
			if (!pick && !strcmp(json_string_value(json_object_get(pl, "os")) ?: "", "linux") &&
			    !strcmp(json_string_value(json_object_get(pl, "architecture")) ?: "", "amd64"))
				pick = json_string_value(json_object_get(m, "digest"));
		}
		if (!pick || strlen(pick) >= sizeof(p->ref.digest))
			return unsupported(p, "its image index has no linux/amd64 entry");
		snprintf(p->ref.digest, sizeof(p->ref.digest), "%s", pick);
		free(TAKE_PTR(body));
		if ((q = oci_reg_manifest_get(p->r, pick, &body, &len, mt, digest, p->err)) < 0)
			return q;
		if (strcmp(digest, pick))
			return err_set_kind(p->err, ERR_UPSTREAM, EBADMSG, "digest_mismatch",
					    "the manifest sent for %s has digest %s", pick, digest);
		json_decref(j);
		j = json_loadb(body, len, 0, NULL);
		jmt = json_string_value(json_object_get(j, "mediaType"));
		if (!mt[0] || !strcmp(mt, "application/json"))
			snprintf(mt, sizeof(mt), "%s", jmt ? jmt : OCI_MT_MANIFEST);
	}
	if (!mt_is(mt, OCI_MT_MANIFEST, DOCKER_MT_MANIFEST))
		return unsupported(p, "its manifest has media type %s");
	snprintf(p->digest, sizeof(p->digest), "%s", digest);
	p->manifest = TAKE_PTR(j);
	p->layers = json_object_get(p->manifest, "layers");
	p->annotations = json_object_get(p->manifest, "annotations");
	if (!json_is_array(p->layers) || json_array_size(p->layers) == 0 || json_array_size(p->layers) > 500)
		return unsupported(p, "it has no layers, or more than 500");
	json_t *l;
	size_t i;
	int64_t total = 0;
	json_array_foreach(p->layers, i, l)
	{
		const char *lmt = json_string_value(json_object_get(l, "mediaType")),
			   *d = json_string_value(json_object_get(l, "digest"));
		json_t *sz = json_object_get(l, "size");
		if (!mt_is(lmt, OCI_MT_ZSTD, OCI_MT_GZIP) && !mt_is(lmt, OCI_MT_TAR, DOCKER_MT_GZIP))
			return err_set_kind(p->err, ERR_INVALID, ENOTSUP, "unsupported_image",
					    "layer %zu has media type %s: ckptd reads tar, tar+gzip and tar+zstd", i,
					    lmt ? lmt : "(none)");
		if (!d || strncmp(d, "sha256:", 7) || strlen(d) != 71 || !json_is_integer(sz) ||
		    json_integer_value(sz) < 0)
			return unsupported(p, "a layer descriptor lacks a sha256 digest or a size");
		total += json_integer_value(sz);
	}
	if (total > p->e->cfg->max_import_bytes)
		return err_set_kind(p->err, ERR_LIMIT, EFBIG, "too_large",
				    "the image's layers are %lld bytes, over max_import_bytes (%lld)",
				    (long long)total, (long long)p->e->cfg->max_import_bytes);
	return 0;
}

static int unmapped(struct pull *p, const char *fmt, const char *what, json_t *image_roots)
{
	_cleanup_free_ char *ir = json_dumps(image_roots, JSON_COMPACT);
	char msg[300];
	snprintf(msg, sizeof(msg), fmt, what);
	return err_set_kind(p->err, ERR_CONFLICT, ENOENT, "root_unmapped",
			    "%s: the image's roots are %s; give \"roots\": {\"/path/in/image\": \"/local/root\"}",
			    msg, ir ? ir : "?");
}

/* Which image root fills each local root: by path, or as "roots" says. */
static int pull_roots(struct pull *p, json_t *image_roots)
{
	const struct config *cfg = p->e->cfg;
	const char *k;
	json_t *v;
	size_t i;
	json_object_foreach(p->req->roots, k, v)
	{
		bool known = false, local = false;
		json_t *ir;
		json_array_foreach(image_roots, i, ir) known |= !strcmp(json_string_value(ir) ?: "", k);
		for (i = 0; i < cfg->n_roots; i++)
			local |= json_is_string(v) && !strcmp(cfg->roots[i], json_string_value(v));
		if (!known)
			return err_set_kind(p->err, ERR_INVALID, EINVAL, "bad_request",
					    "roots: the image has no root '%.200s'", k);
		if (!local)
			return err_set_kind(p->err, ERR_INVALID, EINVAL, "bad_request",
					    "roots: '%.200s' must map to one of this daemon's roots", k);
	}
	json_t *ir;
	size_t j;
	json_array_foreach(image_roots, j, ir)
	{
		const char *path = json_string_value(ir), *to = path;
		if (!path || path[0] != '/' || !engine_xfer_rel_valid(path + 1))
			return unsupported(p, "its io.ckptd.roots annotation is not a list of absolute paths");
		if ((v = json_object_get(p->req->roots, path)))
			to = json_string_value(v);
		for (i = 0; i < cfg->n_roots && strcmp(cfg->roots[i], to); i++)
			;
		if (i == cfg->n_roots)
			return unmapped(p, "the image's root %s has no root here", path, image_roots);
		if (p->image_roots[i])
			return unmapped(p, "two of the image's roots map to %s", cfg->roots[i], image_roots);
		p->image_roots[i] = path;
	}
	for (i = 0; i < cfg->n_roots; i++) {
		if (!p->image_roots[i])
			return unmapped(p, "no root of the image maps to %s", cfg->roots[i], image_roots);
		snprintf(p->dirs[i], sizeof(p->dirs[i]), "%zu", i);
		p->map[i] = (struct oci_map){ .prefix = p->image_roots[i] + 1, .dir = p->dirs[i] };
	}
	return 0;
}

/* Every layer (and the config) in the cache, downloaded where missing. */
static void pull_progress(void *arg, uint64_t n)
{
	(void)arg;
	(void)n;
}

static int pull_blob(struct pull *p, const char *digest, int64_t size, size_t n)
{
	char name[64];
	if (blob_held(p->e, digest, size))
		return 0;
	snprintf(name, sizeof(name), "blob.%zu", n);
	_cleanup_free_ char *f = path_join(p->tmp, name);
	_cleanup_close_ int fd = f ? open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
	if (fd < 0)
		return err_set(p->err, errno ? errno : ENOMEM, NULL, "create '%s': %m", name);
	int q = oci_reg_blob_get(p->r, digest, size, p->e->cfg->max_import_bytes, fd, pull_progress, p, p->err);
	return q < 0 ? q : blob_keep(p->e, f, digest, p->err);
}

static int pull_config(struct pull *p)
{
	json_t *c = json_object_get(p->manifest, "config");
	const char *d = json_string_value(json_object_get(c, "digest"));
	json_int_t size = json_integer_value(json_object_get(c, "size"));
	char path[200];
	_cleanup_free_ char *text = NULL;
	size_t len;
	if (!d || strncmp(d, "sha256:", 7) || strlen(d) != 71 || size <= 0 || size > CONFIG_MAX)
		return unsupported(p, "its config descriptor is missing or too large");
	int q = pull_blob(p, d, size, 9999);
	blob_name(d, path, sizeof(path));
	if (q == 0 && read_file_at(p->e->state_fd, path, CONFIG_MAX, &text, &len) < 0)
		q = err_set(p->err, errno, NULL, "read the image config: %m");
	if (q < 0)
		return q;
	json_auto_t *j = json_loadb(text, len, 0, NULL);
	const char *os = json_string_value(json_object_get(j, "os"));
	if (!json_is_object(j) || (os && strcmp(os, "linux")))
		return unsupported(p, "its config is not JSON for os linux");
	return 0;
}

static int pull_apply_one(struct pull *p, const char *digest)
{
	char path[200];
	blob_name(digest, path, sizeof(path));
	_cleanup_close_ int fd = openat(p->e->state_fd, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return err_set(p->err, errno, NULL, "open blob %s: %m", digest);
	return oci_layer_apply(fd, p->map, p->e->cfg->n_roots, &p->budget, p->err);
}

/* Without a base layer the image needs this daemon's base below it: the
 * base view, written as a layer to the temp dir and applied first. */
static int pull_local_base(struct pull *p)
{
	struct engine *e = p->e;
	char have[80], **dirs = NULL, *prefixes[MAX_ROOTS];
	struct oci_map map[MAX_ROOTS];
	struct oci_blob b;
	const char *need = json_string_value(json_object_get(p->annotations, "io.ckptd.base"));
	int q = engine_base_identity(e, have, p->err);
	if (q < 0)
		return q;
	if (!need || strcmp(need, have))
		return err_set_kind(p->err, ERR_CONFLICT, EXDEV, "base_mismatch",
				    "the image has no base layer and was pushed over base %s, but this daemon's base "
				    "is %s: push it again with its base (\"base\": true), or pull it where the base is "
				    "the same",
				    need ? need : "(none)", have);
	_cleanup_free_ char *vdir = path_join(p->tmp, "basev"), *f = path_join(p->tmp, "base.layer");
	if (!vdir || !f || mkdir(vdir, 0700) < 0)
		return err_set(p->err, errno ? errno : ENOMEM, NULL, "create the base view dir: %m");
	pthread_mutex_lock(&e->op_lock);
	q = e->backend->view_open(e->bst, NULL, NULL, vdir, &dirs, p->err);
	pthread_mutex_unlock(&e->op_lock);
	_cleanup_close_ int fd = q < 0 ? -1 : open(f, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (q == 0 && fd < 0)
		q = err_set(p->err, errno, NULL, "create the base layer: %m");
	for (size_t i = 0; i < e->cfg->n_roots; i++) {
		prefixes[i] = e->cfg->roots[i] + 1;
		map[i] = (struct oci_map){ .prefix = prefixes[i], .dir = p->dirs[i] };
	}
	if (q == 0)
		q = oci_layer_write(fd, false, prefixes, NULL, dirs, e->cfg->n_roots, &b, p->err);
	if (dirs)
		e->backend->view_close(e->bst, dirs);
	int64_t unlimited = INT64_MAX;
	if (q == 0 && lseek(fd, 0, SEEK_SET) == 0)
		q = oci_layer_apply(fd, map, e->cfg->n_roots, &unlimited, p->err);
	return q;
}

static void *pull_apply_main(void *arg)
{
	struct pull *p = arg;
	_cleanup_close_ int dfd = open(p->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = dfd < 0 ? err_set(p->err, errno, NULL, "open '%s': %m", p->tmp) : 0;
	/* libarchive extracts relative to the working directory: this thread's own */
	if (q == 0 && (unshare(CLONE_FS) < 0 || fchdir(dfd) < 0))
		q = err_set(p->err, errno, NULL, "enter '%s': %m", p->tmp);
	for (size_t i = 0; q == 0 && i < p->e->cfg->n_roots; i++)
		if (mkdir(p->dirs[i], 0755) < 0)
			q = err_set(p->err, errno, NULL, "create '%s': %m", p->dirs[i]);
	const char *bl = json_string_value(json_object_get(p->annotations, "io.ckptd.base_layer"));
	if (q == 0 && bl && !strcmp(bl, "false"))
		q = pull_local_base(p);
	json_t *l;
	size_t i;
	json_array_foreach(p->layers, i, l)
	{
		if (q == 0)
			q = pull_apply_one(p, json_string_value(json_object_get(l, "digest")));
	}
	p->status = q;
	return NULL;
}

static int pull_run(struct pull *p, json_t **ret_record)
{
	struct engine *e = p->e;
	int q = oci_dirs(e, p->err);
	if (q == 0)
		q = oci_reg_open(e->cfg, &p->ref, "pull", &p->r, p->err);
	if (q == 0)
		q = pull_manifest(p);
	if (q < 0)
		return q;
	json_auto_t *image_roots = NULL;
	const char *ra = json_string_value(json_object_get(p->annotations, "io.ckptd.roots"));
	if (ra) {
		image_roots = json_loads(ra, 0, NULL);
	} else { /* an image ckptd did not make: its roots are where ours are, or as "roots" says */
		image_roots = json_array();
		const char *k;
		json_t *v;
		json_object_foreach(p->req->roots, k, v) json_array_append_new(image_roots, json_string(k));
		for (size_t i = 0; i < e->cfg->n_roots; i++) {
			bool taken = false;
			json_object_foreach(p->req->roots, k, v) taken |= !strcmp(json_string_value(v) ?: "", e->cfg->roots[i]);
			if (!taken)
				json_array_append_new(image_roots, json_string(e->cfg->roots[i]));
		}
	}
	if (!json_is_array(image_roots))
		return unsupported(p, "its io.ckptd.roots annotation is not a JSON list");
	if ((q = pull_roots(p, image_roots)) < 0 || (q = pull_config(p)) < 0)
		return q;
	json_t *l;
	size_t i;
	json_array_foreach(p->layers, i, l)
	{
		if (q == 0)
			q = pull_blob(p, json_string_value(json_object_get(l, "digest")),
				      json_integer_value(json_object_get(l, "size")), i);
	}
	if (q < 0)
		return q;
	pthread_t t;
	p->budget = e->cfg->max_import_bytes;
	if ((q = pthread_create(&t, NULL, pull_apply_main, p)) != 0)
		return err_set(p->err, q, NULL, "start the pull: %s", strerror(q));
	pthread_join(t, NULL);
	if ((q = p->status) < 0)
		return q;
	char ref[700];
	if (p->ref.tag[0] || !p->ref.digest[0])
		snprintf(ref, sizeof(ref), "%s/%s:%s", p->ref.host, p->ref.repo, p->ref.tag[0] ? p->ref.tag : "latest");
	else
		snprintf(ref, sizeof(ref), "%s/%s@%s", p->ref.host, p->ref.repo, p->ref.digest);
	const char *nm = json_string_value(json_object_get(p->annotations, "io.ckptd.name"));
	struct ckpt_record *rec = NULL;
	q = engine_import_trees(e, p->tmp, nm && name_valid(nm) ? nm : "pulled", NULL, "pull_of",
				json_pack("{s:s, s:s}", "ref", ref, "digest", p->digest), &rec, p->err);
	if (q < 0)
		return q;
	log_event(LOG_INFO_, &(struct log_fields){ "pull", rec->id, NULL, -1 }, "pulled %s (%s) as %s", ref,
		  p->digest, rec->id);
	*ret_record = engine_public(e, rec);
	record_unref(rec);
	return 0;
}

int engine_pull(struct engine *e, const struct pull_req *req, json_t **ret_record, ckpt_error *err)
{
	struct pull p = { .e = e, .req = req, .err = err };
	if (!e->backend->import)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "unsupported", "the %s backend cannot import",
				    e->backend->name);
	int q = oci_ref_parse(req->ref, &p.ref, err);
	if (q == 0 && req->roots && !json_is_object(req->roots))
		q = err_set_kind(err, ERR_INVALID, EINVAL, "bad_request", "roots must be an object");
	if (q == 0 && (q = engine_xfer_tmp(e, &p.tmp, err)) == 0)
		q = pull_run(&p, ret_record);
	oci_reg_free(p.r);
	engine_xfer_rm(e, p.tmp);
	free(p.tmp);
	json_decref(p.manifest);
	if (q < 0) {
		log_event(LOG_WARN_, &(struct log_fields){ "pull", NULL, NULL, -1 }, "pull refused: %s", err->msg);
		if (!err->kind)
			q = engine_storage_err(err, q);
	}
	return q;
}
