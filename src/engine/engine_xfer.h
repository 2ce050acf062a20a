/* engine_xfer.h: what export and import share, private to src/engine: the
 * archive format's names and limits (the format is described at the top of
 * engine_export.c), a sorted walk, a file's sha256, and the temp dirs below
 * <state>/xfer. The base identity is engine_base_id.c's. */
#pragma once
#include <nettle/sha2.h>
#include <stdint.h>
#include <sys/stat.h>
#include "engine/engine_internal.h"

#define ENGINE_XFER_DIR "xfer"
#define ENGINE_XFER_FORMAT_NAME "ckptd-export"
#define ENGINE_XFER_FORMAT_VERSION 1
#define ENGINE_XFER_MANIFEST_MAX (64u << 20) /* read whole into memory: bounded */
#define ENGINE_XFER_BLOCK (64 * 1024)
#define ENGINE_XFER_BASE_HASH_MAX (64 * 1024) /* base files up to this size count by content */

typedef int (*engine_xfer_walk_fn)(void *ctx, int dirfd, const char *name, const char *rel, const struct stat *st);

/* engine_xfer.c */
int engine_xfer_walk(int dirfd, const char *rel, engine_xfer_walk_fn fn, void *ctx);
const char *engine_xfer_type(const struct stat *st, bool hardlink);
const char *engine_xfer_link_of(json_t *links, const struct stat *st, const char *rel, bool remember);
void engine_xfer_hex(const uint8_t *d, size_t n, char *out);
int engine_xfer_sha256_fd(int fd, char out[2 * SHA256_DIGEST_SIZE + 1], uint64_t *ret_len);
int engine_xfer_tmp(struct engine *e, char **ret, ckpt_error *err);
void engine_xfer_rm(struct engine *e, const char *tmp);
struct archive_entry;
void engine_xfer_xattrs(struct archive_entry *ae, int dirfd, const char *name, bool (*portable)(const char *name));
void engine_xfer_xattr_filter(struct archive_entry *ae, bool (*portable)(const char *name));
/* After libarchive's disk writer made path: its ACLs exactly ae's; -errno. */
int engine_xfer_acls(const char *path, struct archive_entry *ae);
bool engine_xfer_rel_valid(const char *p);
bool engine_xfer_link_stays(const char *rel, const char *target);

/* engine_import.c */
struct ckpt_extra;
int engine_import_trees(struct engine *e, const char *tmp, const char *name, json_t *labels, struct ckpt_extra *origin,
			struct ckpt_record **ret_rec, ckpt_error *err);
