/* oci_cache.h: the blob cache of push and pull (oci_cache.c). Private to
 * src/engine. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include "engine/oci_layer.h"
#include "lib/util.h"

struct engine;

#define OCI_DIR "oci"
#define BLOBS_DIR "oci/blobs"
#define KEYS_DIR "oci/keys"
#define MOUNT_DIR "oci/mounts"
#define TREES_DIR "oci/trees" /* a pull's trees below an image's last layer */

int oci_cache_dirs(struct engine *e, ckpt_error *err);
/* Remove the temp files a killed push or pull left in the cache (at start). */
void oci_cache_sweep(struct engine *e);
/* "oci/blobs/HEX" for digest "sha256:HEX", relative to the state dir. */
void oci_cache_blob_name(const char *digest, char *out, size_t cap);
/* Is blob digest in the cache, with size bytes (size < 0: any)? */
bool oci_cache_held(struct engine *e, const char *digest, int64_t size);
/* Publish the verified file tmp (absolute, below the state dir) as blob digest. */
int oci_cache_keep(struct engine *e, const char *tmp, const char *digest, bool pull, ckpt_error *err);
/* The blob a key names: -ENOENT when absent or its blob is gone. */
int oci_cache_key_read(struct engine *e, const char *key, struct oci_blob *b);
int oci_cache_key_write(struct engine *e, const char *key, const struct oci_blob *b, ckpt_error *err);
/* Drop from <state>/oci what no checkpoint needs and count what stays
 * (oci_trim.c): at start, and from the sweeper. */
void oci_trim(struct engine *e);
/* The name in TREES_DIR of the tree a pull has after an image's first k
 * layers: a digest of the roots' mapping ({"/image/root": "/local/root"}),
 * the image's base annotations and those layers' digests. */
struct pull_root;
void oci_cache_tree_key(const struct pull_root *mapping, size_t n, json_t *annotations, json_t *layers, size_t k,
			char out[65]);
