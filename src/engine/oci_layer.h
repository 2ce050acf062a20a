/* oci_layer.h: OCI image layers from checkpoint views, and back.
 * Private to src/engine (engine_oci.c uses it). */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include "lib/util.h"

struct oci_blob {
	char digest[80];  /* sha256 of the compressed bytes */
	char diff_id[80]; /* sha256 of the tar */
	uint64_t size;
};

/* Write one layer to out_fd: for each root i, the tree newdirs[i] under
 * the tar path prefixes[i] (the root's path without its leading '/').
 * With olddirs NULL, the whole trees (and the prefixes' parent
 * directories); else only what differs from olddirs[i], with OCI whiteouts
 * (".wh.NAME") for what is gone. zstd (gzip when gzip). Deterministic: the
 * same trees give the same bytes. Only the xattrs portable lets cross go
 * in (NULL: all). */
int oci_layer_write(int out_fd, bool gzip, char *const *prefixes, char *const *olddirs, char *const *newdirs, size_t n,
		    bool (*portable)(const char *name), struct oci_blob *ret, ckpt_error *err);

/* Who hears of the compressed bytes as they reach out_fd: on_out(arg, n),
 * on the compressing thread after each write, with n the bytes written so
 * far. A negative return stops the layer with that error. */
struct oci_layer_watch {
	int (*on_out)(void *arg, uint64_t n);
	void *arg;
};
/* oci_layer_write, watched (watch NULL: as oci_layer_write). */
int oci_layer_write_watched(int out_fd, bool gzip, char *const *prefixes, char *const *olddirs, char *const *newdirs,
			    size_t n, bool (*portable)(const char *name), const struct oci_layer_watch *watch,
			    struct oci_blob *ret, ckpt_error *err);

/* Where a layer's paths go: prefix (an image root, no leading '/') to the
 * directory named dir, relative to the working directory of the thread
 * that applies. */
struct oci_map {
	const char *prefix;
	const char *dir;
};

/* Apply the layer in fd (tar, gzip or zstd) over the dirs of map: entries
 * extracted with libarchive's secure flags, whiteouts and opaque markers
 * applied to what earlier layers left. Must run in a thread whose working
 * directory holds the dirs (unshare(CLONE_FS) + fchdir). *budget is the
 * bytes of file data still allowed; an entry outside every prefix and not
 * above one fails with root_unmapped; absolute paths, "..", escaping or
 * foreign hard links and device nodes fail with invalid_layer. */
int oci_layer_apply(int fd, const struct oci_map *map, size_t n, int64_t *budget, bool (*portable)(const char *name),
		    ckpt_error *err);
/* The same, from a reader: read(ctx, &buf) gives the next block of the
 * layer (>0 bytes, valid until the next call), 0 at its end, or -errno.
 * The layer's tar may end before its stream does: the caller reads the rest. */
typedef ssize_t (*oci_layer_read_fn)(void *ctx, const void **buf);
int oci_layer_apply_read(oci_layer_read_fn read, void *ctx, const struct oci_map *map, size_t n, int64_t *budget,
			 bool (*portable)(const char *name), ckpt_error *err);
