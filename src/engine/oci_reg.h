/* oci_reg.h: a client of the OCI distribution protocol (registries), over
 * libcurl. It knows references, blobs and manifests, Basic and Bearer auth;
 * nothing of checkpoints (engine_oci.c builds on it). Errors carry kinds and
 * codes a client can act on; credentials never appear in them. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include "lib/util.h"

struct config;
struct oci_reg;

struct oci_ref {
	char host[256];  /* HOST[:PORT] */
	char repo[256];  /* path below the host, lower case */
	char tag[129];   /* "" when absent */
	char digest[80]; /* "sha256:HEX" or "" */
};

#define OCI_MT_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define OCI_MT_INDEX "application/vnd.oci.image.index.v1+json"
#define OCI_MT_CONFIG "application/vnd.oci.image.config.v1+json"
#define OCI_MT_ZSTD "application/vnd.oci.image.layer.v1.tar+zstd"
#define OCI_MT_GZIP "application/vnd.oci.image.layer.v1.tar+gzip"
#define OCI_MT_TAR "application/vnd.oci.image.layer.v1.tar"
#define DOCKER_MT_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define DOCKER_MT_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define DOCKER_MT_GZIP "application/vnd.docker.image.rootfs.diff.tar.gzip"

/* "HOST[:PORT]/REPO[:TAG][@sha256:HEX]"; the host must hold a '.' or ':'
 * or be "localhost". */
int oci_ref_parse(const char *s, struct oci_ref *r, ckpt_error *err);
/* Is t a valid tag ([A-Za-z0-9_][A-Za-z0-9._-]{0,127})? */
bool oci_tag_valid(const char *t);

/* A session with one repository; scope "pull" or "pull,push". */
int oci_reg_open(const struct config *cfg, const struct oci_ref *ref, const char *scope, struct oci_reg **ret,
		 ckpt_error *err);
void oci_reg_free(struct oci_reg *r);

/* Does the repository hold blob digest (of size bytes)? */
int oci_reg_blob_exists(struct oci_reg *r, const char *digest, bool *ret, ckpt_error *err);
/* Mount blob digest from repository `from` of the same registry: *ret true
 * when the registry did (201), false when it asks for an upload. */
int oci_reg_blob_mount(struct oci_reg *r, const char *digest, const char *from, bool *ret, ckpt_error *err);
/* Upload the file at path as blob digest, in chunks (PATCH) read from disk;
 * on_bytes (may be NULL) hears each chunk sent. */
int oci_reg_blob_upload(struct oci_reg *r, const char *path, const char *digest, uint64_t size,
			void (*on_bytes)(void *arg, uint64_t n), void *arg, ckpt_error *err);
/* Open an upload session (POST); its URL into loc. */
int oci_reg_upload_open(struct oci_reg *r, char *loc, size_t cap, ckpt_error *err);
/* A blob still being written: read(arg, buf, cap) waits for its next bytes
 * and gives how many, 0 at its end, or -errno when its writing failed.
 * digest(arg), asked after the end, names the blob. */
struct oci_reg_source {
	ssize_t (*read)(void *arg, void *buf, size_t cap);
	void (*digest)(void *arg, char out[80]);
	void *arg;
};
/* Send src into the session at loc as it is written: one PATCH in chunked
 * transfer encoding, then PUT ?digest=. A failure closes the session, as
 * far as the registry lets it: a writer's failure ends the body early and
 * closes it; a cut connection leaves it to the registry's purge. */
int oci_reg_upload_stream(struct oci_reg *r, const char *loc, const struct oci_reg_source *src, ckpt_error *err);
/* Drop the session at loc, as far as the registry can be reached (one cut
 * off purges stale sessions itself). */
void oci_reg_upload_cancel(struct oci_reg *r, const char *loc);
/* PUT the manifest under reference (a tag or digest). */
int oci_reg_manifest_put(struct oci_reg *r, const char *reference, const char *media_type, const char *body, size_t len,
			 ckpt_error *err);
/* GET the manifest or index at reference: *body (NUL-terminated, caller
 * frees), its media type and its digest (sha256 of the bytes). Bodies
 * over 4 MiB are refused. */
int oci_reg_manifest_get(struct oci_reg *r, const char *reference, char **body, size_t *len, char media_type[128],
			 char digest[80], ckpt_error *err);
/* GET blob digest into fd, checking as it reads that it is size bytes
 * (when size >= 0) and no more than max, and that its sha256 matches. */
int oci_reg_blob_get(struct oci_reg *r, const char *digest, int64_t size, int64_t max, int fd,
		     void (*on_bytes)(void *arg, uint64_t n), void *arg, ckpt_error *err);
/* The same, handing the bytes to sink as they arrive (a pull applies them
 * while they come); the checks are done once the last byte went to sink.
 * A negative return from sink (-errno) stops the transfer. */
int oci_reg_blob_read(struct oci_reg *r, const char *digest, int64_t size, int64_t max,
		      int (*sink)(void *arg, const void *buf, size_t len), void *arg, ckpt_error *err);
