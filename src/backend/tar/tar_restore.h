/* tar_restore.h: make one root equal to its archive and manifest, rewriting
 * only the entries whose (inode, ctime, size) no longer match. */
#pragma once
#include "backend/pathindex.h"
#include "backend/rootexcl.h"
#include "lib/devino.h"
#include <stdatomic.h>
#include "backend/backend.h"
#include "backend/tar/tar_manifest.h"

/* The manifest a restore of one root read last, as parsed, with its aliases
 * as it left them: a restore of the same checkpoint again (a retry loop)
 * reads no file. Known by the identity of the manifest file and of its
 * alias file, so a checkpoint compacted or restored elsewhere is read
 * again. */
struct tar_mcache {
	bool valid;
	struct stat man, alias;
	struct tar_manifest m;
};
void tar_mcache_free(struct tar_mcache *mc);
/* The manifest and its aliases into *m: mc's when its files are the ones
 * it was read from (mc may be NULL), else read from ckpt_dirfd. */
int tar_mcache_get(struct tar_mcache *mc, int ckpt_dirfd, const char *manifest, const char *alias,
		   struct tar_manifest *m, ckpt_error *err);
/* After a restore that succeeded: *m kept in mc (or freed when mc is NULL). */
void tar_mcache_put(struct tar_mcache *mc, int ckpt_dirfd, const char *manifest, const char *alias,
		    struct tar_manifest *m);

struct tar_restore_opts {
	dev_t skip_dev; /* a directory never touched (the state dir) */
	ino_t skip_ino;
	const struct rootexcl *excl; /* what else is never touched (NULL: nothing) */
	struct progress *p;          /* may be NULL; totals are added to */
	bool trust_nothing;          /* rewrite every entry: a past restore failed */
	bool no_alias;               /* not the root (a fork): keep the alias cache as it is */
	struct timespec max_ctime;   /* out: newest ctime remembered as an alias */
	/* Where the checkpoints an incremental manifest names as data sources
	 * live (<store>/<src>/ or, once deleted, <store>/.keep/<src>/); -1 when
	 * the manifest must be self-contained. */
	int store_fd;
	/* Change tracking: the roots were this checkpoint (made or restored by
	 * this process), and these are the directories that changed since
	 * (sorted; deep: the whole subtree). Only they are read: an entry of
	 * another directory is the one the checkpoint captured. journal false:
	 * the whole root is walked. */
	bool journal;
	const struct pathindex_dirty *dirty;
	size_t n_dirty;
	/* Files a process maps shared and writable, or closed after a write
	 * (NULL: none known): their data may have changed with no new ctime,
	 * so they are rewritten, never trusted. */
	const struct pathindex *suspects;
	/* A setxattr leaves ctime on this filesystem (gVisor, tar_probe.c): an
	 * entry is kept only when its xattrs are the checkpoint's too. */
	bool xattrs_blind;
	/* Inodes changed where no event of the root shows (change_track.h):
	 * one the checkpoint holds makes the restore walk the whole root. */
	const ino_t *outside_inos;
	size_t n_outside_inos;
	/* Out, when not NULL: the files the restore replaced or removed, by
	 * (dev, ino), each with its path below root_path (what a process that
	 * maps or holds one still uses: tar_gone.h). */
	struct devino_map *gone;
	const char *root_path;
	/* Write each regular file and symlink beside its name and rename it
	 * over (tar_replace.h), not unlink then create: the whole root. */
	bool by_rename;
	/* Out, with gone: a unit file (a path below a systemd unit directory)
	 * was written or removed; and the .service names of the unit files and
	 * enablement links it wrote (NULL: not collected). */
	bool unit_files_changed;
	struct strv *units_linked;
	/* With gone (may be NULL): restore_details' before_change, called with
	 * the plan before anything changes; held (out) when it refused. */
	int (*before_change)(void *ctx, const char *const *paths, size_t n, const struct restore_details *planned);
	void *before_change_ctx;
	bool held;
	struct tar_mcache *mcache; /* may be NULL: read the manifest each time */
};

struct tar_restore_stats {
	uint64_t rewritten; /* entries extracted from the archive */
	uint64_t removed;   /* live entries removed (subtrees count once) */
	uint64_t kept;      /* entries left as they were */
	uint64_t bytes;     /* bytes extracted */
	uint64_t archives;  /* archives read (1 + older ones of a chain) */
	uint64_t entered;   /* entries read where they begin (tar_seek.h), not from the start */
	uint64_t tracked;   /* roots whose changed directories only were read (journal) */
};

/* Open the archive of one root in checkpoint src below store_fd, where
 * archive names the root's archive ("r0.tar.zst"; the other compression is
 * tried too): in src/ or, for a deleted checkpoint kept for its data, in
 * .keep/src/. */
int tar_source_open(int store_fd, const char *src, const char *archive);

/* Idempotent: running it again after a crash finishes the job. */
int tar_restore_root(int root_fd, int ckpt_dirfd, const char *archive, const char *manifest, struct tar_restore_opts *o,
		     struct tar_restore_stats *stats, ckpt_error *err);

/* Libarchive disk-writer flags used for every extraction. */
int tar_extract_flags(void);
