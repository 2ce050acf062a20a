/* engine_oci.c: push a checkpoint to a registry as an OCI image
 * (docs/registry.md); engine_oci_pull.c pulls one back.
 *
 * Push: the image has a base layer (the roots as ckptd adopted them, unless
 * "base": false) and a checkpoint layer (what the checkpoint changed from
 * the base, whiteouts included), both made from the backend's read-only
 * views by oci_layer.c. Layers are kept by digest in <state>/oci/blobs, and
 * <state>/oci/keys names which blob a (base, checkpoint, compression) gave,
 * so a second push makes nothing and sends nothing the registry holds.
 * Each blob: HEAD, else a mount from another repository this daemon pushed
 * it to on the same registry, else a chunked upload; the manifest last. */
#include "engine/engine_oci.h"

#include <nettle/sha2.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>

#include "config.h"
#include "engine/engine_err.h"
#include "engine/engine_export.h"
#include "engine/engine_internal.h"
#include "engine/engine_xfer.h"
#include "engine/oci_cache.h"
#include "engine/oci_layer.h"
#include "engine/oci_reg.h"

#define MAX_ANC 62 /* ancestors made into layers; older ones merge into the first */

/* A read-only view of the base (id "") or a checkpoint, in a temp dir of
 * its own below <state>/xfer (where a restart's sweep detaches mounts). */
struct push_view {
	char id[32];
	char *tmp;
	char **dirs;
};

struct push {
	struct engine *e;
	const struct push_req *req;
	struct oci_ref ref;
	char id[32];
	json_t *rec; /* public record */
	json_t *data;
	char *tmp;
	struct push_view views[3]; /* the base, and two checkpoints */
	char anc[MAX_ANC][32];     /* ancestors still kept, oldest first */
	json_t *anc_data[MAX_ANC];
	size_t n_anc;
	char *prefixes[MAX_ROOTS];
	char base_id[80];
	struct oci_blob layers[MAX_ANC + 2];
	size_t n_layers;
	struct oci_blob config;
	uint64_t uploaded, reused;
	struct engine_op *op;
	ckpt_error *err;
};

static void push_view_close(struct push *p, struct push_view *v)
{
	if (v->dirs)
		p->e->backend->xfer->view_close(p->e->bst, TAKE_PTR(v->dirs));
	engine_xfer_rm(p->e, v->tmp);
	free(TAKE_PTR(v->tmp));
	v->id[0] = '\0';
}

static json_t *push_data_of(struct push *p, const char *id)
{
	if (!strcmp(id, p->id))
		return p->data;
	for (size_t i = 0; i < p->n_anc; i++)
		if (!strcmp(id, p->anc[i]))
			return p->anc_data[i];
	return NULL;
}

/* The view of id ("" the base), opened if need be; a checkpoint's view may
 * close the other one unless it is keep. */
static char **push_view(struct push *p, const char *id, const char *keep)
{
	struct engine *e = p->e;
	struct push_view *v = &p->views[0];
	if (id[0]) {
		v = NULL;
		for (size_t i = 1; i < 3 && !v; i++)
			if (p->views[i].dirs && !strcmp(p->views[i].id, id))
				return p->views[i].dirs;
		for (size_t i = 1; i < 3 && !v; i++)
			if (!p->views[i].dirs || strcmp(p->views[i].id, keep ? keep : ""))
				v = &p->views[i];
		push_view_close(p, v);
	} else if (v->dirs) {
		return v->dirs;
	}
	if (engine_xfer_tmp(e, &v->tmp, p->err) < 0)
		return NULL;
	pthread_mutex_lock(&e->op_lock); /* no restore or delete changes the layers meanwhile */
	int q = e->backend->xfer->view_open(e->bst, id[0] ? id : NULL, id[0] ? push_data_of(p, id) : NULL, v->tmp,
					    &v->dirs, p->err);
	pthread_mutex_unlock(&e->op_lock);
	snprintf(v->id, sizeof(v->id), "%s", id);
	return q < 0 ? NULL : v->dirs;
}

/* The layer of key, from the cache or made now: the whole tree of view
 * `to` (from NULL), or what differs from `from` to `to` ("" the base). */
static int push_layer(struct push *p, const char *key, const char *from, const char *to, struct oci_blob *b)
{
	struct engine *e = p->e;
	if (oci_cache_key_read(e, key, b) == 0)
		return 0;
	char **old = from ? push_view(p, from, to) : NULL;
	char **new = (!from || old) ? push_view(p, to, from) : NULL;
	if (!new)
		return -p->err->errnum ?: -EIO;
	_cleanup_free_ char *f = path_join(p->tmp, key);
	_cleanup_close_ int fd = f ? open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
	if (fd < 0)
		return err_set(p->err, errno ? errno : ENOMEM, NULL, "create the layer file: %m");
	int q = oci_layer_write(fd, e->cfg->registry_gzip, p->prefixes, old, new, e->cfg->n_roots,
				e->backend->xfer->xattr_portable, b, p->err);
	if (q == 0)
		q = oci_cache_keep(e, f, b->digest, false, p->err);
	return q < 0 ? q : oci_cache_key_write(e, key, b, p->err);
}

static bool lineage_prefix(json_t *a, json_t *b)
{
	size_t n = json_array_size(a);
	if (n == 0 || n >= json_array_size(b))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!json_equal(json_array_get(a, i), json_array_get(b, i)))
			return false;
	return true;
}

/* The checkpoints this one was made on top of, oldest first: each becomes
 * a layer, so the next push of a descendant sends only its own. */
static void push_ancestors(struct push *p)
{
	struct engine *e = p->e;
	struct catalog_list all = { 0 };
	size_t lens[MAX_ANC];
	if (!e->backend->xfer->lineage || catalog_list(e->catalog, NULL, &all) < 0)
		return;
	pthread_mutex_lock(&e->op_lock);
	json_auto_t *mine = e->backend->xfer->lineage(e->bst, p->id, p->data);
	for (size_t i = 0; mine && i < all.n; i++) {
		const struct ckpt_record *rec = strcmp(all.v[i]->id, p->id) ? all.v[i] : NULL;
		const char *id = rec ? rec->id : NULL;
		json_auto_t *theirs = rec && rec->status == CKPT_ACTIVE
			? e->backend->xfer->lineage(e->bst, id, rec->backend_data)
			: NULL;
		if (theirs && lineage_prefix(theirs, mine)) {
			size_t len = json_array_size(theirs), k = p->n_anc;
			if (k == MAX_ANC) { /* keep the newest: drop the oldest */
				json_decref(p->anc_data[0]);
				memmove(&p->anc[0], &p->anc[1], sizeof(p->anc[0]) * (MAX_ANC - 1));
				memmove(&p->anc_data[0], &p->anc_data[1], sizeof(p->anc_data[0]) * (MAX_ANC - 1));
				memmove(&lens[0], &lens[1], sizeof(lens[0]) * (MAX_ANC - 1));
				k--;
			}
			while (k > 0 && lens[k - 1] > len) { /* insertion by lineage length */
				memcpy(p->anc[k], p->anc[k - 1], sizeof(p->anc[k]));
				p->anc_data[k] = p->anc_data[k - 1];
				lens[k] = lens[k - 1];
				k--;
			}
			snprintf(p->anc[k], sizeof(p->anc[k]), "%s", id);
			p->anc_data[k] = json_incref(rec->backend_data);
			lens[k] = len;
			p->n_anc = p->n_anc < MAX_ANC ? p->n_anc + 1 : MAX_ANC;
		}
	}
	pthread_mutex_unlock(&e->op_lock);
	catalog_list_free(&all);
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
			 "io.ckptd.name", name, "io.ckptd.created_at", created, "io.ckptd.roots", rs, "io.ckptd.base",
			 p->base_id, "io.ckptd.base_layer", p->req->base ? "true" : "false", "io.ckptd.backend",
			 p->e->backend->name, "org.opencontainers.image.created", created);
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
	json_object_foreach (j, k, v) {
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
	json_auto_t *j =
		read_file_at(p->e->state_fd, path, 64 << 10, &text, &len) == 0 ? json_loadb(text, len, 0, NULL) : NULL;
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
	if (oci_cache_held(p->e, p->config.digest, (int64_t)p->config.size))
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
	char key[240], tag[129];
	const char *mt = e->cfg->registry_gzip ? OCI_MT_GZIP : OCI_MT_ZSTD, *z = e->cfg->registry_gzip ? "gz" : "zst";
	int q = oci_cache_dirs(e, p->err);
	if (q == 0)
		q = engine_base_identity(e, p->base_id, p->err);
	if (q == 0 && p->req->base) {
		snprintf(key, sizeof(key), "base-%s-%s", p->base_id + 7, z);
		q = push_layer(p, key, NULL, "", &p->layers[p->n_layers++]);
	}
	if (q == 0)
		push_ancestors(p);
	for (size_t i = 0; q == 0 && i <= p->n_anc; i++) {
		const char *from = i ? p->anc[i - 1] : "", *to = i < p->n_anc ? p->anc[i] : p->id;
		snprintf(key, sizeof(key), "d-%s-%s-%s-%s", from[0] ? from : "base", to, p->base_id + 7, z);
		q = push_layer(p, key, from, to, &p->layers[p->n_layers++]);
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
	json_auto_t *man = json_pack("{s:i, s:s, s:o, s:o, s:o}", "schemaVersion", 2, "mediaType", OCI_MT_MANIFEST,
				     "config", push_descriptor(OCI_MT_CONFIG, &p->config), "layers", layers,
				     "annotations", push_annotations(p));
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
		json_array_append_new(out_layers,
				      json_pack("{s:s, s:s, s:I, s:b}", "digest", p->layers[i].digest, "media_type", mt,
						"size", (json_int_t)p->layers[i].size, "uploaded", sent));
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

/* Check the request and the checkpoint; fill p and register its progress. */
static int push_prepare(struct push *p, const char *id_or_name)
{
	struct engine *e = p->e;
	ckpt_error *err = p->err;
	if (!e->backend->xfer)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "unsupported", "the %s backend cannot push",
				    e->backend->name);
	int q = oci_ref_parse(p->req->ref, &p->ref, err);
	if (q == 0 && p->ref.digest[0])
		return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_ref",
				    "push to a tag (HOST/REPO[:TAG]), not to a digest");
	if (q < 0)
		return q;
	const struct ckpt_record *rec;
	if ((q = engine_resolve_active(e, id_or_name, &rec, err)) < 0)
		return q;
	snprintf(p->id, sizeof(p->id), "%s", rec->id);
	p->data = json_incref(rec->backend_data);
	p->rec = engine_public(e, rec);
	record_unref(rec);
	for (size_t i = 0; i < e->cfg->n_roots; i++)
		p->prefixes[i] = e->cfg->roots[i] + 1; /* the tar paths: the root's own path */
	p->op = engine_op_begin(e, p->id);
	return p->op ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
}

static void push_cleanup(struct push *p)
{
	struct engine *e = p->e;
	for (size_t i = 0; i < 3; i++)
		push_view_close(p, &p->views[i]);
	for (size_t i = 0; i < p->n_anc; i++)
		json_decref(p->anc_data[i]);
	engine_xfer_rm(e, p->tmp);
	free(p->tmp);
	if (p->op)
		engine_op_end(e, p->op);
	json_decref(p->rec);
	json_decref(p->data);
}

static int push_exec(struct push *p, json_t **ret)
{
	struct engine *e = p->e;
	pthread_rwlock_rdlock(&e->oci_lock); /* no trim of the cache meanwhile */
	int q = engine_xfer_tmp(e, &p->tmp, p->err);
	if (q == 0)
		q = push_run(p, ret);
	push_cleanup(p);
	pthread_rwlock_unlock(&e->oci_lock);
	engine_kick_maintenance(e); /* count what it added */
	if (q < 0) {
		log_event(LOG_WARN_, &(struct log_fields){ "push", p->id, NULL, -1 }, "push refused: %s", p->err->msg);
		if (!p->err->kind)
			q = engine_err_classify(p->err, ENGINE_CTX_READ, q);
	}
	return q;
}

int engine_push(struct engine *e, const char *id_or_name, const struct push_req *req, json_t **ret, ckpt_error *err)
{
	struct push p = { .e = e, .req = req, .err = err };
	int q = push_prepare(&p, id_or_name);
	if (q < 0) {
		push_cleanup(&p);
		return q;
	}
	return push_exec(&p, ret);
}

/* ---- async: the outcome shows as "push" on the record ----
 * In memory (e->pushes) from the 202 on, and on the record file itself
 * (its "push" member) once the worker runs: a restart still shows how the
 * last push ended, and one it cut short as failed. */

struct push_async {
	struct push p;
	struct push_req req;
	ckpt_error err;
};

/* Write v as the record's "push", durably (catalog_put: temp, fsync,
 * rename); under the operation lock, as every change of a record is. */
static void push_persist(struct engine *e, const char *id, json_t *v)
{
	ckpt_error err = { 0 };
	pthread_mutex_lock(&e->op_lock);
	const struct ckpt_record *cur = catalog_get(e->catalog, id);
	struct ckpt_record *r = cur && cur->status == CKPT_ACTIVE ? record_dup(cur) : NULL;
	if (r && !r->extra)
		r->extra = json_object();
	if (r && r->extra && json_object_set(r->extra, "push", v) == 0 && catalog_put(e->catalog, r, &err) < 0)
		log_warn("push: cannot record the outcome on %s: %s", id, err.msg);
	if (r)
		record_unref(r);
	if (cur)
		record_unref(cur);
	pthread_mutex_unlock(&e->op_lock);
}

static void push_note(struct engine *e, const char *id, json_t *v, bool durable)
{
	if (durable)
		push_persist(e, id, v);
	pthread_mutex_lock(&e->state_lock);
	if (!e->pushes)
		e->pushes = json_object();
	json_object_set_new(e->pushes, id, v);
	pthread_mutex_unlock(&e->state_lock);
}

void engine_push_recover(struct engine *e)
{
	struct catalog_list all = { 0 };
	if (catalog_list(e->catalog, NULL, &all) < 0)
		return;
	for (size_t i = 0; i < all.n; i++) {
		json_t *push = json_object_get(all.v[i]->extra, "push");
		if (strcmp(json_string_value(json_object_get(push, "status")) ?: "", "pushing"))
			continue;
		json_auto_t *v = json_pack("{s:O?, s:s, s:{s:s, s:s}}", "ref", json_object_get(push, "ref"), "status",
					   "failed", "error", "code", "interrupted", "detail",
					   "ckptd stopped before the push ended: push again");
		push_persist(e, all.v[i]->id, v);
	}
	catalog_list_free(&all);
}

static void *push_async_main(void *arg)
{
	struct push_async *a = arg;
	struct engine *e = a->p.e;
	char id[32], ref[700];
	json_t *out = NULL;
	snprintf(id, sizeof(id), "%s", a->p.id);
	snprintf(ref, sizeof(ref), "%s", a->req.ref);
	json_auto_t *pushing = json_pack("{s:s, s:s}", "ref", ref, "status", "pushing");
	push_persist(e, id, pushing);
	if (push_exec(&a->p, &out) == 0) {
		json_object_set_new(out, "status", json_string("done"));
		json_object_del(out, "checkpoint_id");
		json_object_del(out, "layers");
		push_note(e, id, out, true);
	} else {
		push_note(e, id,
			  json_pack("{s:s, s:s, s:{s:s, s:s}}", "ref", ref, "status", "failed", "error", "code",
				    a->err.code ? a->err.code : "internal", "detail", a->err.msg),
			  true);
	}
	free((char *)a->req.ref);
	free(a);
	pthread_mutex_lock(&e->state_lock);
	e->pending_async--;
	pthread_cond_broadcast(&e->sweep_cond);
	pthread_mutex_unlock(&e->state_lock);
	return NULL;
}

int engine_push_async(struct engine *e, const char *id_or_name, const struct push_req *req, json_t **ret_record,
		      ckpt_error *err)
{
	struct push_async *a = calloc(1, sizeof(*a));
	if (!a || !(a->req.ref = strdup(req->ref))) {
		free(a);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	a->req.base = req->base;
	a->p = (struct push){ .e = e, .req = &a->req, .err = &a->err };
	int q = push_prepare(&a->p, id_or_name);
	pthread_mutex_lock(&e->state_lock);
	json_t *cur = json_object_get(e->pushes, a->p.id);
	bool busy = q == 0 && !strcmp(json_string_value(json_object_get(cur, "status")) ?: "", "pushing");
	if (q == 0 && !busy)
		e->pending_async++;
	pthread_mutex_unlock(&e->state_lock);
	if (busy)
		q = err_set_kind(&a->err, ERR_CONFLICT, EBUSY, "conflict", "a push of %s still runs", a->p.id);
	pthread_t t;
	pthread_attr_t attr;
	if (q == 0) {
		push_note(e, a->p.id, json_pack("{s:s, s:s}", "ref", req->ref, "status", "pushing"), false);
		*ret_record = json_deep_copy(a->p.rec); /* the worker reads p.rec */
		json_object_set_new(*ret_record, "push", json_pack("{s:s, s:s}", "ref", req->ref, "status", "pushing"));
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		int r = pthread_create(&t, &attr, push_async_main, a);
		pthread_attr_destroy(&attr);
		if (r == 0)
			return 0;
		json_decref(TAKE_PTR(*ret_record));
		push_note(e, a->p.id, json_pack("{s:s, s:s}", "ref", req->ref, "status", "failed"), false);
		pthread_mutex_lock(&e->state_lock);
		e->pending_async--;
		pthread_mutex_unlock(&e->state_lock);
		q = err_set(&a->err, r, NULL, "cannot start the push worker");
	}
	*err = a->err;
	push_cleanup(&a->p);
	free((char *)a->req.ref);
	free(a);
	return q;
}
