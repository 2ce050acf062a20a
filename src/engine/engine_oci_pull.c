/* engine_oci_pull.c: pull an OCI image from a registry as a new checkpoint
 * (docs/registry.md).
 *
 * Manifest (an index must have linux/amd64) and config first. The trees
 * start empty, or linked from what this daemon holds (a checkpoint pulled
 * before, a tree kept below an image's last layer): that is how a layer
 * held by digest is not downloaded again. Then two threads: this one
 * downloads each other layer, checking size and digest as the bytes
 * arrive, and hands them through a few blocks of memory (oci_feed.c) to
 * one that applies the layers in order into one tree per root below
 * <state>/xfer/<rnd>/. The blob is never written: only its files are. A
 * layer the blob cache holds (a push made it here) applies from there. A
 * blob that fails its checks at its end fails the pull, tree and all: the
 * trees become a checkpoint, as an import does, only when every layer
 * verified and applied. A daemon killed meanwhile leaves only the temp
 * dir, which the next start removes. */
#include "engine/engine_oci.h"

#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>

#include "config.h"
#include "engine/engine_err.h"
#include "engine/engine_export.h"
#include "engine/engine_internal.h"
#include "engine/engine_xfer.h"
#include "engine/oci_cache.h"
#include "engine/oci_clone.h"
#include "engine/oci_feed.h"
#include "engine/oci_layer.h"
#include "engine/oci_reg.h"
#include "lib/failpoint.h"

#define CONFIG_MAX (4u << 20)
#define LAYERS_MAX 500

struct pull {
	struct engine *e;
	const struct pull_req *req;
	struct oci_ref ref;
	struct oci_reg *r;
	char *tmp;
	char digest[80];
	json_t *manifest, *layers, *annotations;
	char *mtext; /* the manifest's bytes, kept in the cache by digest */
	size_t mlen;
	struct pull_root mapping[MAX_ROOTS]; /* image root -> local root, as pull_of records it */
	size_t n_mapping;
	/* Where the trees start: a checkpoint pulled before from an image whose
	 * layers are this one's first ones, or a tree kept in the cache after
	 * this image's first skip layers; linked, then only the layers from
	 * skip on apply. */
	char held_id[32];
	char held_tree[80];
	size_t skip;
	bool keep_prefix;                   /* keep the tree below the last layer for the next pull */
	const char *image_roots[MAX_ROOTS]; /* image root mapped to local root i */
	struct oci_map map[MAX_ROOTS];
	char dirs[MAX_ROOTS][24]; /* "0", "1", ...: the trees below tmp */
	int tmp_fd;
	bool fetch[LAYERS_MAX]; /* downloaded and fed; else applied from the cache */
	struct oci_feed *feed;  /* from the download to the thread that applies */
	uint64_t fetched;       /* bytes downloaded */
	int64_t budget;
	ckpt_error *err; /* the caller's: the apply thread's errors */
	ckpt_error ferr; /* the download's: it wins, its blob failed first */
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
		json_array_foreach (json_object_get(j, "manifests"), i, m) {
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
	p->mtext = TAKE_PTR(body);
	p->mlen = len;
	p->layers = json_object_get(p->manifest, "layers");
	p->annotations = json_object_get(p->manifest, "annotations");
	if (!json_is_array(p->layers) || json_array_size(p->layers) == 0 || json_array_size(p->layers) > LAYERS_MAX)
		return unsupported(p, "it has no layers, or more than 500");
	json_t *l;
	size_t i;
	int64_t total = 0;
	json_array_foreach (p->layers, i, l) {
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
				    "the image's layers are %lld bytes, over max_import_bytes (%lld)", (long long)total,
				    (long long)p->e->cfg->max_import_bytes);
	return 0;
}

static int unmapped(struct pull *p, const char *fmt, const char *what, json_t *image_roots)
{
	_cleanup_free_ char *ir = json_dumps(image_roots, JSON_COMPACT);
	char msg[300];
	snprintf(msg, sizeof(msg), fmt, what);
	return err_set_kind(p->err, ERR_CONFLICT, ENOENT, "root_unmapped",
			    "%s: the image's roots are %s; give \"roots\": {\"/path/in/image\": \"/local/root\"}", msg,
			    ir ? ir : "?");
}

/* Which image root fills each local root: by path, or as "roots" says. */
static int pull_roots(struct pull *p, json_t *image_roots)
{
	const struct config *cfg = p->e->cfg;
	size_t i;
	for (size_t r = 0; r < p->req->n_roots; r++) {
		const char *k = p->req->roots[r].image;
		bool known = false, local = false;
		json_t *ir;
		json_array_foreach (image_roots, i, ir)
			known |= !strcmp(json_string_value(ir) ?: "", k);
		for (i = 0; i < cfg->n_roots; i++)
			local |= !strcmp(cfg->roots[i], p->req->roots[r].local);
		if (!known)
			return err_set_kind(p->err, ERR_INVALID, EINVAL, "bad_request",
					    "roots: the image has no root '%.200s'", k);
		if (!local)
			return err_set_kind(p->err, ERR_INVALID, EINVAL, "bad_request",
					    "roots: '%.200s' must map to one of this daemon's roots", k);
	}
	json_t *ir;
	size_t j;
	json_array_foreach (image_roots, j, ir) {
		const char *path = json_string_value(ir), *to = path;
		if (!path || path[0] != '/' || !engine_xfer_rel_valid(path + 1))
			return unsupported(p, "its io.ckptd.roots annotation is not a list of absolute paths");
		for (i = 0; i < p->req->n_roots; i++)
			if (!strcmp(p->req->roots[i].image, path))
				to = p->req->roots[i].local;
		for (i = 0; i < cfg->n_roots && strcmp(cfg->roots[i], to); i++)
			;
		if (i == cfg->n_roots)
			return unmapped(p, "the image's root %s has no root here", path, image_roots);
		if (p->image_roots[i])
			return unmapped(p, "two of the image's roots map to %s", cfg->roots[i], image_roots);
		p->image_roots[i] = path;
		p->mapping[p->n_mapping++] = (struct pull_root){ .image = path, .local = cfg->roots[i] };
	}
	for (i = 0; i < cfg->n_roots; i++) {
		if (!p->image_roots[i])
			return unmapped(p, "no root of the image maps to %s", cfg->roots[i], image_roots);
		snprintf(p->dirs[i], sizeof(p->dirs[i]), "%zu", i);
		p->map[i] = (struct oci_map){ .prefix = p->image_roots[i] + 1, .dir = p->dirs[i] };
	}
	return 0;
}

/* The config into the cache, downloaded when missing. */
static int pull_config_blob(struct pull *p, const char *digest, int64_t size)
{
	if (oci_cache_held(p->e, digest, size))
		return 0;
	_cleanup_free_ char *f = path_join(p->tmp, "config.blob");
	_cleanup_close_ int fd = f ? open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
	if (fd < 0)
		return err_set(p->err, errno ? errno : ENOMEM, NULL, "create the config's file: %m");
	int q = oci_reg_blob_get(p->r, digest, size, CONFIG_MAX, fd, NULL, NULL, p->err);
	return q < 0 ? q : oci_cache_keep(p->e, f, digest, true, p->err);
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
	int q = pull_config_blob(p, d, size);
	oci_cache_blob_name(d, path, sizeof(path));
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
	oci_cache_blob_name(digest, path, sizeof(path));
	_cleanup_close_ int fd = openat(p->e->state_fd, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return err_set(p->err, errno, NULL, "open blob %s: %m", digest);
	return oci_layer_apply(fd, p->map, p->e->cfg->n_roots, &p->budget, p->e->backend->xfer->xattr_portable, p->err);
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
	/* the view in a temp dir of its own: a restart's sweep detaches mounts there */
	_cleanup_free_ char *vdir = NULL, *f = path_join(p->tmp, "base.layer");
	if (!f || (q = engine_xfer_tmp(e, &vdir, p->err)) < 0)
		return q < 0 ? q : err_set(p->err, ENOMEM, NULL, "out of memory");
	pthread_mutex_lock(&e->op_lock);
	q = e->backend->xfer->view_open(e->bst, NULL, NULL, vdir, &dirs, p->err);
	pthread_mutex_unlock(&e->op_lock);
	_cleanup_close_ int fd = q < 0 ? -1 : open(f, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (q == 0 && fd < 0)
		q = err_set(p->err, errno, NULL, "create the base layer: %m");
	for (size_t i = 0; i < e->cfg->n_roots; i++) {
		prefixes[i] = e->cfg->roots[i] + 1;
		map[i] = (struct oci_map){ .prefix = prefixes[i], .dir = p->dirs[i] };
	}
	if (q == 0)
		q = oci_layer_write(fd, false, prefixes, NULL, dirs, e->cfg->n_roots, e->backend->xfer->xattr_portable,
				    &b, p->err);
	if (dirs)
		e->backend->xfer->view_close(e->bst, dirs);
	engine_xfer_rm(e, vdir);
	int64_t unlimited = INT64_MAX;
	if (q == 0 && lseek(fd, 0, SEEK_SET) == 0)
		q = oci_layer_apply(fd, map, e->cfg->n_roots, &unlimited, e->backend->xfer->xattr_portable, p->err);
	return q;
}

/* The manifest, kept by digest: a later pull compares its layers. */
static int pull_keep_manifest(struct pull *p)
{
	_cleanup_close_ int dfd = openat(p->e->state_fd, BLOBS_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = dfd < 0 ? -errno : 0;
	if (q == 0 && !oci_cache_held(p->e, p->digest, (int64_t)p->mlen))
		q = write_file_atomic(dfd, p->digest + 7, p->mtext, p->mlen, 0600);
	return q < 0 ? err_set(p->err, -q, NULL, "keep the manifest: %s", strerror(-q)) : 0;
}

/* Does the pull that made a checkpoint map the roots as this one does? */
static bool pull_same_mapping(const struct pull *p, const struct ckpt_pull_of *of)
{
	size_t same = 0;
	for (size_t i = 0; i < p->n_mapping; i++)
		for (size_t j = 0; j < of->n_roots; j++)
			same += !strcmp(p->mapping[i].image, of->roots[j].image) &&
				!strcmp(p->mapping[i].local, of->roots[j].local);
	return same == p->n_mapping && of->n_roots == p->n_mapping;
}

/* How many of this image's first layers the pull that made rec applied,
 * with the same roots and base: 0 when it is no such pull. */
static size_t pull_held_layers(struct pull *p, const struct ckpt_record *rec)
{
	const struct ckpt_pull_of *of = rec->extra.pull_of;
	const char *d = of ? of->digest : NULL;
	char path[200];
	_cleanup_free_ char *text = NULL;
	size_t len, n = 0;
	if (rec->status != CKPT_ACTIVE || !d || strlen(d) != 71 || strncmp(d, "sha256:", 7) ||
	    !pull_same_mapping(p, of))
		return 0;
	oci_cache_blob_name(d, path, sizeof(path));
	if (read_file_at(p->e->state_fd, path, 4u << 20, &text, &len) < 0)
		return 0;
	json_auto_t *m = json_loadb(text, len, 0, NULL);
	json_t *layers = json_object_get(m, "layers"), *an = json_object_get(m, "annotations");
	const char *keys[] = { "io.ckptd.base", "io.ckptd.base_layer" };
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
		if (!json_equal(json_object_get(an, keys[i]) ?: json_null(),
				json_object_get(p->annotations, keys[i]) ?: json_null()))
			return 0;
	if (json_array_size(layers) > json_array_size(p->layers))
		return 0;
	for (; n < json_array_size(layers); n++)
		if (!json_equal(json_object_get(json_array_get(layers, n), "digest"),
				json_object_get(json_array_get(p->layers, n), "digest")))
			return 0;
	return n;
}

static void pull_tree_key(struct pull *p, size_t k, char out[2 * SHA256_DIGEST_SIZE + 1])
{
	oci_cache_tree_key(p->mapping, p->n_mapping, p->annotations, p->layers, k, out);
}

static bool pull_tree_held(struct pull *p, const char *key)
{
	char path[200];
	struct stat st;
	snprintf(path, sizeof(path), "%s/%s", TREES_DIR, key);
	return fstatat(p->e->state_fd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

/* Whether to keep the tree below the image's last layer for the next pull. */
static void pull_keep_decide(struct pull *p)
{
	size_t n = json_array_size(p->layers);
	char key[2 * SHA256_DIGEST_SIZE + 1];
	pull_tree_key(p, n - 1, key);
	p->keep_prefix = n >= 2 && p->skip < n && !pull_tree_held(p, key);
}

/* Where the trees start: the checkpoint or kept tree that holds the most of
 * this image's first layers; and whether to keep the tree below its last. */
static void pull_start(struct pull *p)
{
	struct catalog_list all = { 0 };
	size_t n = json_array_size(p->layers);
	char key[2 * SHA256_DIGEST_SIZE + 1];
	if (catalog_list(p->e->catalog, NULL, &all) < 0)
		all.n = 0;
	for (size_t i = 0; i < all.n; i++) {
		size_t k = pull_held_layers(p, all.v[i]);
		if (k > p->skip) {
			p->skip = k;
			snprintf(p->held_id, sizeof(p->held_id), "%s", all.v[i]->id);
		}
	}
	catalog_list_free(&all);
	for (size_t k = n - 1; k > p->skip && k > 0; k--) {
		pull_tree_key(p, k, key);
		if (pull_tree_held(p, key)) {
			p->skip = k;
			p->held_id[0] = '\0';
			snprintf(p->held_tree, sizeof(p->held_tree), "%s", key);
			break;
		}
	}
	pull_keep_decide(p);
}

/* Each root's tree where the pull starts, linked into the temp dir. Under
 * the operation lock: no delete or trim removes those files meanwhile. The
 * checkpoint is looked up again there: a delete since it was chosen. */
static int pull_link_start(struct pull *p, ckpt_error *err)
{
	struct engine *e = p->e;
	char **dirs = NULL, src[PATH_MAX];
	_cleanup_free_ char *vdir = NULL;
	int q = p->held_id[0] ? engine_xfer_tmp(e, &vdir, err) : 0;
	if (q < 0)
		return q;
	pthread_mutex_lock(&e->op_lock);
	if (p->held_id[0]) {
		const struct ckpt_record *rec = catalog_get(e->catalog, p->held_id);
		q = rec && rec->status == CKPT_ACTIVE
			? e->backend->xfer->view_open(e->bst, rec->id, rec->backend_data, vdir, &dirs, err)
			: err_set(err, ENOENT, NULL, "it was deleted");
		if (rec)
			record_unref(rec);
	}
	for (size_t i = 0; q == 0 && i < e->cfg->n_roots; i++) {
		_cleanup_close_ int dfd = openat(p->tmp_fd, p->dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		snprintf(src, sizeof(src), "%s/%s/%s/%zu", e->cfg->state_dir, TREES_DIR, p->held_tree, i);
		q = dfd < 0 ? err_set(err, errno, NULL, "open '%s': %m", p->dirs[i])
			    : oci_clone_tree(dirs ? dirs[i] : src, dfd, err);
	}
	if (dirs)
		e->backend->xfer->view_close(e->bst, dirs);
	pthread_mutex_unlock(&e->op_lock);
	engine_xfer_rm(e, vdir);
	return q;
}

static int pull_mkdirs(struct pull *p)
{
	for (size_t i = 0; i < p->e->cfg->n_roots; i++)
		if (mkdirat(p->tmp_fd, p->dirs[i], 0755) < 0)
			return err_set(p->err, errno, NULL, "create '%s/%s': %m", p->tmp, p->dirs[i]);
	return 0;
}

/* The trees where the pull starts, before anything downloads: a start
 * that cannot be linked (its checkpoint deleted since pull_start chose it)
 * costs the shortcut only, and the pull fetches and applies every layer. */
static int pull_setup(struct pull *p)
{
	ckpt_error lerr = { 0 };
	int q = pull_mkdirs(p);
	if (q < 0 || (!p->held_id[0] && !p->held_tree[0]) || pull_link_start(p, &lerr) == 0)
		return q;
	log_info("pull: cannot start from %s %s (%s): applying every layer", p->held_id[0] ? "checkpoint" : "kept tree",
		 p->held_id[0] ? p->held_id : p->held_tree, lerr.msg);
	for (size_t i = 0; i < p->e->cfg->n_roots; i++)
		if ((q = rm_rf_at(p->tmp_fd, p->dirs[i])) < 0)
			return err_set(p->err, -q, NULL, "empty '%s/%s': %s", p->tmp, p->dirs[i], strerror(-q));
	p->skip = 0;
	p->held_id[0] = p->held_tree[0] = '\0';
	pull_keep_decide(p);
	return pull_mkdirs(p);
}

/* Which layers to download: from the start on, those the cache lacks. */
static void pull_plan(struct pull *p)
{
	json_t *l;
	size_t i;
	json_array_foreach (p->layers, i, l)
		p->fetch[i] = i >= p->skip &&
			!oci_cache_held(p->e, json_string_value(json_object_get(l, "digest")),
					json_integer_value(json_object_get(l, "size")));
}

/* The trees before the last layer, linked aside ("pre/N") to be kept. */
static int pull_link_prefix(struct pull *p)
{
	char d[64];
	int q = mkdir("pre", 0700) < 0 ? err_set(p->err, errno, NULL, "create '%s/pre': %m", p->tmp) : 0;
	for (size_t i = 0; q == 0 && i < p->e->cfg->n_roots; i++) {
		snprintf(d, sizeof(d), "pre/%zu", i);
		_cleanup_close_ int dfd = mkdir(d, 0700) < 0 ? -1 : open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		q = dfd < 0 ? err_set(p->err, errno, NULL, "create '%s/%s': %m", p->tmp, d)
			    : oci_clone_tree(p->dirs[i], dfd, p->err);
	}
	return q;
}

/* Keep "pre" in the cache, durable before it is named: a cache only, so a
 * failure costs the next pull its shortcut and nothing else. */
static void pull_keep_prefix(struct pull *p)
{
	char key[2 * SHA256_DIGEST_SIZE + 1], to[200];
	_cleanup_free_ char *pre = path_join(p->tmp, "pre");
	_cleanup_close_ int fd = pre ? open(pre, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	_cleanup_close_ int tfd = openat(p->e->state_fd, TREES_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	pull_tree_key(p, json_array_size(p->layers) - 1, key);
	snprintf(to, sizeof(to), "%s/%s", TREES_DIR, key);
	if (fd < 0 || tfd < 0 || syncfs(fd) < 0 || renameat(AT_FDCWD, pre, p->e->state_fd, to) < 0 ||
	    fsync_dirfd(tfd) < 0)
		log_info("pull: the tree below the last layer is not kept: %m");
}

static ssize_t pull_feed_read(void *ctx, const void **buf)
{
	return oci_feed_read(ctx, buf);
}

/* Layer i, as it downloads or from the cache. A downloaded one has applied
 * only once its blob verified: its end in the feed says so. */
static int pull_apply_layer(struct pull *p, size_t i)
{
	const char *digest = json_string_value(json_object_get(json_array_get(p->layers, i), "digest"));
	bool (*portable)(const char *) = p->e->backend->xfer->xattr_portable;
	if (!p->fetch[i])
		return pull_apply_one(p, digest);
	int q = oci_layer_apply_read(pull_feed_read, p->feed, p->map, p->e->cfg->n_roots, &p->budget, portable, p->err);
	int st = q < 0 ? 0 : oci_feed_skip(p->feed); /* what follows the tar's end, then the blob's checks */
	if (st < 0)
		q = err_set(p->err, -st, NULL, "blob %s failed: %s", digest, strerror(-st));
	oci_feed_next(p->feed);
	return q;
}

static void *pull_apply_main(void *arg)
{
	struct pull *p = arg;
	size_t n = json_array_size(p->layers);
	int q = 0;
	/* libarchive extracts relative to the working directory: this thread's own */
	if (unshare(CLONE_FS) < 0 || fchdir(p->tmp_fd) < 0)
		q = err_set(p->err, errno, NULL, "enter '%s': %m", p->tmp);
	const char *bl = json_string_value(json_object_get(p->annotations, "io.ckptd.base_layer"));
	if (q == 0 && p->skip == 0 && bl && !strcmp(bl, "false"))
		q = pull_local_base(p);
	for (size_t i = p->skip; q == 0 && i < n; i++) {
		if (p->keep_prefix && i + 1 == n)
			q = pull_link_prefix(p);
		if (q == 0)
			q = pull_apply_layer(p, i);
	}
	if (q < 0) /* the download stops at the end of its blob */
		oci_feed_cancel(p->feed);
	p->status = q;
	return NULL;
}

static int pull_sink(void *arg, const void *buf, size_t len)
{
	oci_feed_put(arg, buf, len);
	return 0;
}

/* Layer i into the feed, then its end with the checks' outcome. The blob
 * itself is not kept: the trees a pull keeps serve the next pull. */
static int pull_fetch(struct pull *p, const char *digest, int64_t size)
{
	int q = oci_reg_blob_read(p->r, digest, size, p->e->cfg->max_import_bytes, pull_sink, p->feed, &p->ferr);
	oci_feed_end(p->feed, q);
	return q;
}

/* Download, in order, the layers the apply thread reads from the feed.
 * After the apply thread gave up, the blob under way is still read to its
 * end: a blob that fails its digest answers digest_mismatch, whatever its
 * bytes did to the layer's tar. */
static int pull_download(struct pull *p)
{
	json_t *l;
	size_t i;
	int q = 0;
	json_array_foreach (p->layers, i, l) {
		int64_t size = json_integer_value(json_object_get(l, "size"));
		if (!p->fetch[i] || q < 0 || oci_feed_cancelled(p->feed))
			continue;
		q = pull_fetch(p, json_string_value(json_object_get(l, "digest")), size);
		if (q == 0)
			p->fetched += (uint64_t)size;
	}
	if (q < 0) /* the apply thread stops at once */
		oci_feed_cancel(p->feed);
	return q;
}

/* The layers applied while they download, on two threads. */
static int pull_layers(struct pull *p)
{
	pthread_t t;
	int q = oci_feed_new(&p->feed);
	if (q < 0)
		return err_set(p->err, -q, NULL, "start the pull: %s", strerror(-q));
	p->budget = p->e->cfg->max_import_bytes;
	if ((q = pthread_create(&t, NULL, pull_apply_main, p)) != 0)
		return err_set(p->err, q, NULL, "start the pull: %s", strerror(q));
	q = pull_download(p);
	pthread_join(t, NULL);
	if (q < 0) {
		*p->err = p->ferr;
		return q;
	}
	return p->status;
}

/* The image's roots: as its annotation says, or, for an image ckptd did
 * not make, where ours are, or as "roots" says. */
static json_t *pull_image_roots(struct pull *p)
{
	const char *ra = json_string_value(json_object_get(p->annotations, "io.ckptd.roots"));
	const struct pull_req *req = p->req;
	json_t *image_roots;
	if (ra)
		return json_loads(ra, 0, NULL);
	image_roots = json_array();
	for (size_t r = 0; r < req->n_roots; r++)
		json_array_append_new(image_roots, json_string(req->roots[r].image));
	for (size_t i = 0; i < p->e->cfg->n_roots; i++) {
		bool taken = false;
		for (size_t r = 0; r < req->n_roots; r++)
			taken |= !strcmp(req->roots[r].local, p->e->cfg->roots[i]);
		if (!taken)
			json_array_append_new(image_roots, json_string(p->e->cfg->roots[i]));
	}
	return image_roots;
}

/* The checkpoint the trees become, with pull_of {ref, digest, roots}. */
static int pull_commit(struct pull *p, struct ckpt_record **ret_rec, char *ref, size_t cap)
{
	if (p->ref.tag[0] || !p->ref.digest[0])
		snprintf(ref, cap, "%s/%s:%s", p->ref.host, p->ref.repo, p->ref.tag[0] ? p->ref.tag : "latest");
	else
		snprintf(ref, cap, "%s/%s@%s", p->ref.host, p->ref.repo, p->ref.digest);
	const char *nm = json_string_value(json_object_get(p->annotations, "io.ckptd.name"));
	int q = pull_keep_manifest(p);
	struct ckpt_pull_of *of = q == 0 ? calloc(1, sizeof(*of)) : NULL;
	bool ok = of && (of->ref = strdup(ref)) && (of->digest = strdup(p->digest)) &&
		(of->roots = calloc(p->n_mapping + 1, sizeof(*of->roots)));
	for (size_t i = 0; ok && i < p->n_mapping; i++, of->n_roots++)
		ok = (of->roots[i].image = strdup(p->mapping[i].image)) &&
			(of->roots[i].local = strdup(p->mapping[i].local));
	if (q == 0 && !ok)
		q = err_set(p->err, ENOMEM, NULL, "out of memory");
	struct ckpt_extra origin = { .pull_of = TAKE_PTR(of) };
	if (q == 0)
		q = FAILPOINT_AROUND("pull.import",
				     engine_import_trees(p->e, p->tmp, nm && name_valid(nm) ? nm : "pulled", NULL,
							 &origin, ret_rec, p->err));
	ckpt_extra_free(&origin);
	return q;
}

static int pull_run(struct pull *p, struct ckpt_view *ret)
{
	struct engine *e = p->e;
	int q = oci_cache_dirs(e, p->err);
	if (q == 0)
		q = oci_reg_open(e->cfg, &p->ref, "pull", &p->r, p->err);
	if (q == 0)
		q = pull_manifest(p);
	if (q < 0)
		return q;
	json_auto_t *image_roots = pull_image_roots(p);
	if (!json_is_array(image_roots))
		return unsupported(p, "its io.ckptd.roots annotation is not a JSON list");
	if ((q = pull_roots(p, image_roots)) < 0 || (q = pull_config(p)) < 0)
		return q;
	pull_start(p);
	if ((q = pull_setup(p)) < 0)
		return q;
	pull_plan(p);
	if ((q = pull_layers(p)) < 0)
		return q;
	char ref[700];
	struct ckpt_record *rec = NULL;
	if ((q = pull_commit(p, &rec, ref, sizeof(ref))) < 0)
		return q;
	if (p->keep_prefix)
		pull_keep_prefix(p);
	log_event(LOG_INFO_, &(struct log_fields){ "pull", rec->id, NULL, -1 },
		  "pulled %s (%s) as %s: %zu of %zu layers applied over %s%s, %llu bytes fetched", ref, p->digest,
		  rec->id, json_array_size(p->layers) - p->skip, json_array_size(p->layers),
		  p->held_id[0]             ? "checkpoint "
			  : p->held_tree[0] ? "kept tree "
					    : "nothing",
		  p->held_id[0] ? p->held_id : p->held_tree, (unsigned long long)p->fetched);
	engine_view(e, rec, ret);
	record_unref(rec);
	return 0;
}

int engine_pull(struct engine *e, const struct pull_req *req, struct ckpt_view *ret, ckpt_error *err)
{
	struct pull p = { .e = e, .req = req, .err = err, .tmp_fd = -1 };
	if (!e->backend->xfer)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "unsupported", "the %s backend cannot import",
				    e->backend->name);
	int q = oci_ref_parse(req->ref, &p.ref, err);
	pthread_rwlock_rdlock(&e->oci_lock); /* no trim of the cache meanwhile */
	if (q == 0 && (q = engine_xfer_tmp(e, &p.tmp, err)) == 0 &&
	    (p.tmp_fd = open(p.tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		q = err_set(err, errno, NULL, "open '%s': %m", p.tmp);
	if (q == 0)
		q = pull_run(&p, ret);
	oci_reg_free(p.r);
	oci_feed_free(p.feed);
	if (p.tmp_fd >= 0)
		close(p.tmp_fd);
	engine_xfer_rm(e, p.tmp);
	pthread_rwlock_unlock(&e->oci_lock);
	engine_kick_maintenance(e); /* trim what a failed pull left, count what it added */
	free(p.tmp);
	json_decref(p.manifest);
	free(p.mtext);
	if (q < 0) {
		log_event(LOG_WARN_, &(struct log_fields){ "pull", NULL, NULL, -1 }, "pull refused: %s", err->msg);
		if (!err->kind)
			q = engine_err_classify(err, ENGINE_CTX_CREATE, q);
	}
	return q;
}
