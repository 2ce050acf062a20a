/* tar_manifest.h: the per-root manifest of a tar checkpoint. One line per
 * entry records what restore compares the live tree with: (inode, ctime,
 * size) say whether an entry is still the one the checkpoint captured.
 * Every path is validated on load, so nothing read back can leave its root. */
#pragma once
#include <sys/stat.h>
#include "lib/util.h"

#define TAR_MANIFEST_MAGIC "ckptd-tar-manifest 4"
/* Version 1 lacks the content hash, version 2 the data source, version 3
 * the offset; all are still read (every entry's data then is in the
 * checkpoint's own archive; with no offset it is found by reading). */
#define TAR_MANIFEST_MAGIC_V3 "ckptd-tar-manifest 3"
#define TAR_MANIFEST_MAGIC_V2 "ckptd-tar-manifest 2"
#define TAR_MANIFEST_MAGIC_V1 "ckptd-tar-manifest 1"
#define TAR_SHA256_LEN 32

/* Entry types: f regular, h hardlink to an earlier f, d dir, l symlink,
 * p fifo, c char device, b block device. */
struct tar_mentry {
	char *path; /* relative, validated; "." only for the root line */
	char *link; /* hardlink target (type h) or NULL */
	/* Incremental checkpoints: the checkpoint directory whose archive (of
	 * the same root) holds this regular file's data, NULL for the
	 * checkpoint's own archive. Always a checkpoint id or "base". */
	char *src;
	/* Where the entry's headers begin in that archive, counted in its
	 * uncompressed stream (tar_seek.h); -1 when not known. */
	int64_t off;
	char type;
	mode_t mode; /* permission bits only */
	uid_t uid;
	gid_t gid;
	uint64_t size;
	struct timespec mtime, ctime;
	uint64_t ino;
	uint32_t nlink;
	uint64_t xhash;  /* 0 = no xattrs */
	bool has_sha256; /* regular files of a version 2 manifest */
	unsigned char sha256[TAR_SHA256_LEN];
	int32_t group;     /* index of the hardlink group's first member, or -1 */
	bool seen, needed; /* restore's bookkeeping */
	bool direct;       /* restore: set from this line, not read from an archive */
	/* Identity of the copy a past restore wrote (the "seen" file): a live
	 * entry still matching it holds the checkpoint's content too. */
	bool has_alias;
	uint64_t alias_ino;
	struct timespec alias_ctime;
};

struct tar_xattr {
	char *name;
	void *value;
	size_t len;
};

struct tar_manifest {
	/* the text loaded: the entries' path, link and src point into it
	 * (a manifest has a line per file: no copy of each) */
	char *text;
	struct tar_mentry root; /* the root directory's own metadata */
	struct tar_xattr *root_xattrs;
	size_t n_root_xattrs;
	struct tar_mentry *v;
	size_t n, cap;
	int32_t *slots; /* open-addressing index into v */
	size_t n_slots;
};

/* A path that may name an entry below a root: relative, no empty, "." or ".."
 * components, no leading or trailing '/', bounded length. */
bool tar_path_valid(const char *path);

char tar_type_of(mode_t mode);
/* Does the live st have the type the manifest recorded? */
bool tar_type_matches(const struct tar_mentry *e, const struct stat *st);

void tar_mentry_from_stat(struct tar_mentry *e, const struct stat *st);

/* Writing: header, then the root line, then entries in archive order. */
int tar_manifest_write_header(FILE *f, const struct tar_mentry *root, const struct tar_xattr *xa, size_t n_xa);
int tar_manifest_write_entry(FILE *f, const struct tar_mentry *e);

/* Load and validate <dirfd>/<name>. */
int tar_manifest_load(int dirfd, const char *name, struct tar_manifest *m, ckpt_error *err);
void tar_manifest_free(struct tar_manifest *m);
struct tar_mentry *tar_manifest_find(const struct tar_manifest *m, const char *path);
/* One of the n inodes (of the root's filesystem, named outside the root) is
 * an entry's, captured or written by a restore, and the entry's path below
 * root_fd still names that inode: the first such entry, or NULL. An entry
 * whose path names another inode now, or none, no longer holds it: removed
 * (and the number given to another file since) or moved within the root,
 * where its directory's events name it. */
const struct tar_mentry *tar_manifest_holds_ino(const struct tar_manifest *m, int root_fd, const ino_t *inos, size_t n);
/* The manifest entry of path's parent directory, NULL for top-level entries. */
struct tar_mentry *tar_manifest_parent(const struct tar_manifest *m, const char *path);

/* The aliases file beside a manifest: "index ino ctime" lines. Loading
 * ignores a missing or damaged file (it is only a cache); saving is atomic. */
void tar_manifest_alias_load(int dirfd, const char *name, struct tar_manifest *m);
int tar_manifest_alias_save(int dirfd, const char *name, const struct tar_manifest *m);

void tar_xattrs_free(struct tar_xattr *xa, size_t n);
/* FNV-1a over the names and values; 0 when there are none. */
uint64_t tar_xattrs_hash(const struct tar_xattr *xa, size_t n);
