/* oci_cache.c: layers and configs kept by digest under <state>/oci, so a
 * push makes and sends a layer once and a pull fetches it once.
 *
 * <state>/oci/blobs/HEX     a blob, published by rename once verified
 * <state>/oci/keys/KEY      which blob a (base or checkpoint, compression) gave
 * <state>/oci/mounts/HEX    the repositories this daemon pushed the blob to */
#include "engine/oci_cache.h"

#include <nettle/sha2.h>
#include <sys/stat.h>

#include "config.h"
#include "engine/engine_internal.h"
#include "engine/engine_xfer.h"
#include "lib/failpoint.h"

/* Push and pull keep blobs the same way; each gets its own crash points. */
#define KEEP_STEP(pull, step, call) \
	((pull) ? FAILPOINT_AROUND("pull.blob." step, call) : FAILPOINT_AROUND("push.blob." step, call))

int oci_cache_dirs(struct engine *e, ckpt_error *err)
{
	const char *d[] = { OCI_DIR, BLOBS_DIR, KEYS_DIR, MOUNT_DIR, TREES_DIR };
	for (size_t i = 0; i < ARRAY_SIZE(d); i++)
		if (mkdirat(e->state_fd, d[i], 0700) < 0 && errno != EEXIST)
			return err_set(err, errno, NULL, "create '%s/%s': %m", e->cfg->state_dir, d[i]);
	return 0;
}

void oci_cache_sweep(struct engine *e)
{
	const char *d[] = { BLOBS_DIR, KEYS_DIR, MOUNT_DIR };
	for (size_t i = 0; i < ARRAY_SIZE(d); i++) {
		_cleanup_close_ int fd = openat(e->state_fd, d[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0)
			write_file_atomic_sweep(fd);
	}
}

void oci_cache_blob_name(const char *digest, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%s", BLOBS_DIR, digest + 7);
}

/* Is blob digest in the cache with size bytes? */
bool oci_cache_held(struct engine *e, const char *digest, int64_t size)
{
	char p[200];
	struct stat st;
	oci_cache_blob_name(digest, p, sizeof(p));
	return fstatat(e->state_fd, p, &st, 0) == 0 && S_ISREG(st.st_mode) && (size < 0 || st.st_size == size);
}

/* Move the verified file tmp (absolute, below the state dir) into the cache.
 * pull says whose crash points these are. */
int oci_cache_keep(struct engine *e, const char *tmp, const char *digest, bool pull, ckpt_error *err)
{
	char p[200];
	_cleanup_close_ int fd = open(tmp, O_RDONLY | O_CLOEXEC);
	oci_cache_blob_name(digest, p, sizeof(p));
	if (fd < 0 || KEEP_STEP(pull, "fsync", fsync(fd)) < 0)
		return err_set(err, errno, NULL, "sync '%s': %m", tmp);
	struct stat st;
	if (fstat(fd, &st) < 0 || KEEP_STEP(pull, "rename", renameat(AT_FDCWD, tmp, e->state_fd, p)) < 0)
		return err_set(err, errno, NULL, "keep blob %s: %m", digest);
	atomic_fetch_add(&e->oci_bytes, (uint64_t)st.st_blocks * 512);
	_cleanup_close_ int dfd = openat(e->state_fd, BLOBS_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || KEEP_STEP(pull, "dirsync", fsync_dirfd(dfd)) < 0)
		return err_set(err, errno, NULL, "sync the blob cache: %m");
	return 0;
}

int oci_cache_key_read(struct engine *e, const char *key, struct oci_blob *b)
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
	    !oci_cache_held(e, d, size))
		return -ENOENT;
	snprintf(b->digest, sizeof(b->digest), "%s", d);
	snprintf(b->diff_id, sizeof(b->diff_id), "%s", di);
	b->size = (uint64_t)size;
	return 0;
}

int oci_cache_key_write(struct engine *e, const char *key, const struct oci_blob *b, ckpt_error *err)
{
	json_auto_t *j =
		json_pack("{s:s, s:s, s:I}", "digest", b->digest, "diff_id", b->diff_id, "size", (json_int_t)b->size);
	_cleanup_free_ char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	_cleanup_close_ int dfd = openat(e->state_fd, KEYS_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = !s ? -ENOMEM : dfd < 0 ? -errno : 0;
	if (q == 0)
		q = FAILPOINT_AROUND("push.key.write", write_file_atomic(dfd, key, s, strlen(s), 0600));
	return q < 0 ? err_set(err, -q, NULL, "record layer %s: %s", key, strerror(-q)) : 0;
}

/* The mapping as the key hashes it: a JSON object, compact, keys sorted. */
static char *oci_cache_mapping_text(const struct pull_root *mapping, size_t n)
{
	json_auto_t *o = json_object();
	for (size_t i = 0; o && i < n; i++)
		json_object_set_new(o, mapping[i].image, json_string(mapping[i].local));
	return o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
}

void oci_cache_tree_key(const struct pull_root *mapping, size_t n, json_t *annotations, json_t *layers, size_t k,
			char out[65])
{
	struct sha256_ctx h;
	uint8_t d[SHA256_DIGEST_SIZE];
	_cleanup_free_ char *m = oci_cache_mapping_text(mapping, n);
	const char *parts[] = { m ? m : "", json_string_value(json_object_get(annotations, "io.ckptd.base")) ?: "",
				json_string_value(json_object_get(annotations, "io.ckptd.base_layer")) ?: "" };
	sha256_init(&h);
	for (size_t i = 0; i < ARRAY_SIZE(parts); i++)
		sha256_update(&h, strlen(parts[i]) + 1, (const uint8_t *)parts[i]); /* with its NUL */
	for (size_t i = 0; i < k; i++) {
		const char *dg = json_string_value(json_object_get(json_array_get(layers, i), "digest")) ?: "";
		sha256_update(&h, strlen(dg) + 1, (const uint8_t *)dg);
	}
	sha256_digest(&h, sizeof(d), d);
	engine_xfer_hex(d, sizeof(d), out);
}
