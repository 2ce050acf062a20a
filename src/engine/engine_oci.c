/* engine_oci.c: push a checkpoint to a registry as an OCI image
 * (docs/registry.md); engine_oci_pull.c pulls one back.
 *
 * Push: the image has a base layer (the roots as ckptd adopted them, unless
 * "base": false) and a checkpoint layer (what the checkpoint changed from
 * the base, whiteouts included), both made from the backend's read-only
 * views by oci_layer.c. Layers are kept by digest in <state>/oci/blobs, and
 * <state>/oci/keys names which blob a (base, checkpoint, compression) gave,
 * so a second push makes nothing and sends nothing the registry holds.
 * The base, and a layer made before: HEAD, else a mount from another
 * repository this daemon pushed it to on the same registry, else a chunked
 * upload from the cache. A checkpoint's layer not made before is sent
 * while it is made (oci_stream.c): one streamed upload reads the cache file
 * as the layer's writer grows it, so making and sending overlap. The
 * manifest goes last. */
#include "engine/engine_oci.h"

#include <nettle/sha2.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>

#include "config.h"
#include "engine/engine_err.h"
#include "engine/engine_export.h"
#include "engine/engine_internal.h"
#include "engine/engine_push_note.h"
#include "engine/engine_xfer.h"
#include "engine/oci_cache.h"
#include "engine/oci_layer.h"
#include "engine/oci_reg.h"
#include "engine/oci_stream.h"

#define MAX_ANC (PUSH_MAX_LAYERS - 2) /* ancestors made into layers; older ones merge into the first */

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
	struct ckpt_view view; /* the record, its progress and push before this one */
	json_t *data;
	char *tmp;
	struct push_view views[3]; /* the base, and two checkpoints */
	char anc[MAX_ANC][32];     /* ancestors still kept, oldest first */
	json_t *anc_data[MAX_ANC];
	size_t n_anc;
	char *prefixes[MAX_ROOTS];
	char base_id[80];
	struct oci_blob layers[PUSH_MAX_LAYERS];
	bool made[PUSH_MAX_LAYERS]; /* in the cache before this push */
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

/* The record's created_at, or NULL when it has none. */
static const char *push_created(const struct push *p)
{
	return p->view.rec->created_at[0] ? p->view.rec->created_at : NULL;
}

static json_t *push_config(struct push *p)
{
	json_t *diff = json_array();
	for (size_t i = 0; i < p->n_layers; i++)
		json_array_append_new(diff, json_string(p->layers[i].diff_id));
	return json_pack("{s:s, s:s, s:s?, s:{s:s, s:o}, s:{s:{s:s, s:s}}}", "architecture", "amd64", "os", "linux",
			 "created", push_created(p), "rootfs", "type", "layers", "diff_ids", diff, "config", "Labels",
			 "io.ckptd.checkpoint_id", p->id, "io.ckptd.backend", p->e->backend->name);
}

static json_t *push_annotations(struct push *p)
{
	json_t *roots = json_array();
	for (size_t i = 0; i < p->e->cfg->n_roots; i++)
		json_array_append_new(roots, json_string(p->e->cfg->roots[i]));
	_cleanup_free_ char *rs = json_dumps(roots, JSON_COMPACT);
	json_decref(roots);
	const char *name = p->view.rec->name, *created = push_created(p);
	return json_pack("{s:s, s:s?, s:s?, s:s?, s:s, s:s, s:s, s:s?}", "io.ckptd.checkpoint_id", p->id,
			 "io.ckptd.name", name, "io.ckptd.created_at", created, "io.ckptd.roots", rs, "io.ckptd.base",
			 p->base_id, "io.ckptd.base_layer", p->req->base ? "true" : "false", "io.ckptd.backend",
			 p->e->backend->name, "org.opencontainers.image.created", created);
}

/* bytes_done: blob bytes sent, or found in the registry. */
static void push_progress(void *arg, uint64_t n)
{
	struct push *p = arg;
	if (p->op)
		atomic_fetch_add(&p->op->progress.bytes_done, n);
}

/* bytes_total: the blob bytes known so far. A layer sent while it is made
 * adds its bytes as they are written, ahead of the sender: the total grows
 * until the last layer is made, and never falls below bytes_done. */
static void push_total(struct push *p, uint64_t n)
{
	if (p->op)
		atomic_fetch_add(&p->op->progress.bytes_total, n);
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

/* Layer i: its key in the cache, and the views it is made from: the whole
 * tree of `to` (from NULL), or what differs from `from` to `to` ("" names
 * the base). */
static void push_key(struct push *p, size_t i, char *key, size_t cap, const char **from, const char **to)
{
	const char *z = p->e->cfg->registry_gzip ? "gz" : "zst";
	if (p->req->base && i == 0) {
		*from = NULL;
		*to = "";
		snprintf(key, cap, "base-%s-%s", p->base_id + 7, z);
		return;
	}
	size_t j = i - (p->req->base ? 1 : 0);
	*from = j ? p->anc[j - 1] : "";
	*to = j < p->n_anc ? p->anc[j] : p->id;
	snprintf(key, cap, "d-%s-%s-%s-%s", (*from)[0] ? *from : "base", *to, p->base_id + 7, z);
}

/* Which layers the cache holds: their bytes count in the total at once. */
static void push_plan(struct push *p)
{
	char key[240];
	const char *from, *to;
	p->n_layers = (p->req->base ? 1 : 0) + p->n_anc + 1;
	for (size_t i = 0; i < p->n_layers; i++) {
		push_key(p, i, key, sizeof(key), &from, &to);
		p->made[i] = oci_cache_key_read(p->e, key, &p->layers[i]) == 0;
		if (p->made[i])
			push_total(p, p->layers[i].size);
	}
}

/* The sender of a layer sent while it is made, on the stream's thread. */
struct push_send {
	struct push *p;
	struct oci_reg *r;
	struct oci_stream *s;
	char loc[2100]; /* the upload session */
};

static ssize_t push_send_read(void *arg, void *buf, size_t cap)
{
	struct push_send *ps = arg;
	ssize_t k = oci_stream_read(ps->s, buf, cap);
	if (k > 0)
		push_progress(ps->p, (uint64_t)k);
	return k;
}

static void push_send_digest(void *arg, char out[80])
{
	struct push_send *ps = arg;
	oci_stream_digest(ps->s, out);
}

/* The upload (a failed one closes its session). */
static int push_send(void *ctx, struct oci_stream *s, ckpt_error *err)
{
	struct push_send *ps = ctx;
	ps->s = s;
	struct oci_reg_source src = { push_send_read, push_send_digest, ps };
	return oci_reg_upload_stream(ps->r, ps->loc, &src, err);
}

/* The writer's side: the compressing thread wrote n bytes. */
struct push_made {
	struct push *p;
	struct oci_stream *s; /* the sender, or NULL */
	uint64_t seen;
};

static int push_made_grew(void *arg, uint64_t n)
{
	struct push_made *m = arg;
	push_total(m->p, n - m->seen); /* before the sender may read them */
	m->seen = n;
	return m->s ? oci_stream_grew(m->s, n) : 0;
}

/* Open the upload session and the sender that reads the file f as it grows. */
static int push_send_start(struct push_send *ps, const char *f, struct oci_stream **ret)
{
	int rfd = open(f, O_RDONLY | O_CLOEXEC);
	if (rfd < 0)
		return err_set(ps->p->err, errno, NULL, "open the layer file: %m");
	int q = oci_reg_upload_open(ps->r, ps->loc, sizeof(ps->loc), ps->p->err);
	if (q < 0) {
		close(rfd);
		return q;
	}
	if ((q = oci_stream_start(rfd, push_send, ps, ret)) < 0) {
		oci_reg_upload_cancel(ps->r, ps->loc);
		return err_set(ps->p->err, -q, NULL, "start the upload: %s", strerror(-q));
	}
	return 0;
}

/* Make layer key into the cache; with r, send it while it is made. The
 * registry is not asked first whether it holds such a layer: asking needs
 * the digest, which is known only at the end (docs/registry.md). */
static int push_make(struct push *p, struct oci_reg *r, const char *key, const char *from, const char *to,
		     struct oci_blob *b)
{
	struct engine *e = p->e;
	char **old = from ? push_view(p, from, to) : NULL;
	char **new = (!from || old) ? push_view(p, to, from) : NULL;
	if (!new)
		return -p->err->errnum ?: -EIO;
	_cleanup_free_ char *f = path_join(p->tmp, key);
	_cleanup_close_ int fd = f ? open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
	if (fd < 0)
		return err_set(p->err, errno ? errno : ENOMEM, NULL, "create the layer file: %m");
	struct push_send ps = { .p = p, .r = r };
	struct push_made m = { .p = p };
	int q = r ? push_send_start(&ps, f, &m.s) : 0;
	if (q < 0)
		return q;
	struct oci_layer_watch w = { push_made_grew, &m };
	q = oci_layer_write_watched(fd, e->cfg->registry_gzip, p->prefixes, old, new, e->cfg->n_roots,
				    e->backend->xfer->xattr_portable, &w, b, p->err);
	if (m.s)
		oci_stream_end(m.s, q, b->size, b->digest);
	if (q == 0 && b->size > m.seen)
		push_total(p, b->size - m.seen);
	if (q == 0) /* kept while the upload ends */
		q = oci_cache_keep(e, f, b->digest, false, p->err);
	if (q == 0)
		q = oci_cache_key_write(e, key, b, p->err);
	ckpt_error up = { 0 };
	int u = m.s ? oci_stream_wait(m.s, &up) : 0;
	if (u < 0) /* the upload's own failure stopped the writer, or came after it */
		*p->err = up;
	return u < 0 ? u : q;
}

/* Layer i into the registry. The base, and any layer made before: made
 * (if need be), then HEAD, mount or upload, so a base that other machines
 * made the same is sent once. A checkpoint's layer not made before is
 * unique to this machine: sent while it is made. */
static int push_layer(struct push *p, struct oci_reg *r, size_t i, bool *sent)
{
	char key[240];
	const char *from, *to;
	bool base = p->req->base && i == 0;
	int q = 0;
	if (!p->made[i]) {
		push_key(p, i, key, sizeof(key), &from, &to);
		q = push_make(p, base ? NULL : r, key, from, to, &p->layers[i]);
	}
	if (q < 0 || p->made[i] || base)
		return q < 0 ? q : push_blob(p, r, &p->layers[i], sent);
	*sent = true;
	p->uploaded += p->layers[i].size;
	push_mount_note(p, p->layers[i].digest);
	return 0;
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

/* The manifest's text, once every layer and the config are known. */
static char *push_manifest(struct push *p, const char *mt)
{
	json_t *layers = json_array();
	for (size_t i = 0; i < p->n_layers; i++)
		json_array_append_new(layers, push_descriptor(mt, &p->layers[i]));
	json_auto_t *man = json_pack("{s:i, s:s, s:o, s:o, s:o}", "schemaVersion", 2, "mediaType", OCI_MT_MANIFEST,
				     "config", push_descriptor(OCI_MT_CONFIG, &p->config), "layers", layers,
				     "annotations", push_annotations(p));
	return man ? json_dumps(man, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
}

/* The config, then the manifest under tag; ret gets the manifest's digest. */
static int push_finish(struct push *p, struct oci_reg *r, const char *tag, struct push_result *ret)
{
	const char *mt = p->e->cfg->registry_gzip ? OCI_MT_GZIP : OCI_MT_ZSTD;
	json_auto_t *cfg = push_config(p);
	_cleanup_free_ char *cs = cfg ? json_dumps(cfg, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	int q = 0;
	if (!cs || (q = push_config_blob(p, cs)) < 0)
		return cs ? q : err_set(p->err, ENOMEM, NULL, "out of memory");
	_cleanup_free_ char *ms = push_manifest(p, mt);
	if (!ms)
		return err_set(p->err, ENOMEM, NULL, "out of memory");
	bool sent;
	push_total(p, p->config.size);
	q = push_blob(p, r, &p->config, &sent);
	if (q == 0)
		q = oci_reg_manifest_put(r, tag, OCI_MT_MANIFEST, ms, strlen(ms), p->err);
	if (q < 0)
		return q;
	struct sha256_ctx h;
	uint8_t d[SHA256_DIGEST_SIZE];
	sha256_init(&h);
	sha256_update(&h, strlen(ms), (const uint8_t *)ms);
	sha256_digest(&h, sizeof(d), d);
	strcpy(ret->digest, "sha256:");
	engine_xfer_hex(d, sizeof(d), ret->digest + 7);
	return 0;
}

/* The tag: the ref's, else the checkpoint's name where that is a valid tag,
 * else its id. */
static void push_tag(struct push *p, char tag[129])
{
	snprintf(tag, 129, "%s", p->ref.tag);
	if (!tag[0]) {
		const char *nm = p->view.rec->name;
		snprintf(tag, 129, "%s", nm && oci_tag_valid(nm) ? nm : p->id);
	}
}

static int push_run(struct push *p, struct push_result *ret)
{
	struct engine *e = p->e;
	const char *mt = e->cfg->registry_gzip ? OCI_MT_GZIP : OCI_MT_ZSTD;
	char tag[129];
	int q = oci_cache_dirs(e, p->err);
	if (q == 0)
		q = engine_base_identity(e, p->base_id, p->err);
	if (q < 0)
		return q;
	push_ancestors(p);
	push_plan(p);
	push_tag(p, tag);
	struct oci_reg *r = NULL;
	q = oci_reg_open(e->cfg, &p->ref, "pull,push", &r, p->err);
	for (size_t i = 0; q == 0 && i < p->n_layers; i++) {
		struct push_result_layer *l = &ret->layers[i];
		q = push_layer(p, r, i, &l->uploaded);
		snprintf(l->digest, sizeof(l->digest), "%s", p->layers[i].digest);
		l->media_type = mt;
		l->size = p->layers[i].size;
	}
	ret->n_layers = p->n_layers;
	if (q == 0)
		q = push_finish(p, r, tag, ret);
	oci_reg_free(r);
	if (q < 0)
		return q;
	snprintf(ret->checkpoint_id, sizeof(ret->checkpoint_id), "%s", p->id);
	snprintf(ret->ref, sizeof(ret->ref), "%s/%s:%s", p->ref.host, p->ref.repo, tag);
	ret->uploaded_bytes = p->uploaded;
	ret->reused_bytes = p->reused;
	log_event(LOG_INFO_, &(struct log_fields){ "push", p->id, NULL, -1 },
		  "pushed %s as %s (%s): %llu bytes sent, %llu reused", p->id, ret->ref, ret->digest,
		  (unsigned long long)p->uploaded, (unsigned long long)p->reused);
	return 0;
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
	engine_view(e, rec, &p->view);
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
	ckpt_view_free(&p->view);
	json_decref(p->data);
}

static int push_exec(struct push *p, struct push_result *ret)
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

int engine_push(struct engine *e, const char *id_or_name, const struct push_req *req, struct push_result *ret,
		ckpt_error *err)
{
	struct push p = { .e = e, .req = req, .err = err };
	int q = push_prepare(&p, id_or_name);
	if (q < 0) {
		push_cleanup(&p);
		return q;
	}
	return push_exec(&p, ret);
}

/* ---- async: the outcome shows as "push" on the record (engine_push_note.c) ---- */

struct push_async {
	struct push p;
	struct push_req req;
	struct push_result res;
	ckpt_error err;
};

static void *push_async_main(void *arg)
{
	struct push_async *a = arg;
	struct engine *e = a->p.e;
	char id[32];
	snprintf(id, sizeof(id), "%s", a->p.id);
	struct push_outcome o = engine_push_outcome_of(a->req.ref, NULL, NULL);
	engine_push_persist(e, id, &o);
	bool ok = push_exec(&a->p, &a->res) == 0;
	o = engine_push_outcome_of(a->req.ref, ok ? &a->res : NULL, ok ? NULL : &a->err);
	engine_push_note(e, id, &o, true);
	free((char *)a->req.ref);
	free(a);
	pthread_mutex_lock(&e->state_lock);
	e->pending_async--;
	pthread_cond_broadcast(&e->sweep_cond);
	pthread_mutex_unlock(&e->state_lock);
	return NULL;
}

int engine_push_async(struct engine *e, const char *id_or_name, const struct push_req *req, struct ckpt_view *ret,
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
	bool busy = q == 0 && engine_push_running_locked(e, a->p.id);
	if (q == 0 && !busy)
		e->pending_async++;
	pthread_mutex_unlock(&e->state_lock);
	if (busy)
		q = err_set_kind(&a->err, ERR_CONFLICT, EBUSY, "conflict", "a push of %s still runs", a->p.id);
	pthread_t t;
	pthread_attr_t attr;
	struct push_outcome o = engine_push_outcome_of(req->ref, NULL, NULL);
	if (q == 0) {
		engine_push_note(e, a->p.id, &o, false);
		*ret = a->p.view; /* a copy with its own reference and push: the worker keeps p.view */
		record_ref(ret->rec);
		if ((ret->push = malloc(sizeof(o))))
			*ret->push = o;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		int r = pthread_create(&t, &attr, push_async_main, a);
		pthread_attr_destroy(&attr);
		if (r == 0)
			return 0;
		ckpt_view_free(ret);
		o.state = PUSH_FAILED;
		engine_push_note(e, a->p.id, &o, false);
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
