/* tar_create.h: capture one root as a pax archive plus its manifest. */
#pragma once
#include <stdatomic.h>
#include "backend/backend.h"
#include "backend/tar/tar_manifest.h"

struct tar_create_opts {
	bool zstd;                 /* compress with zstd (else no filter) */
	dev_t skip_dev;            /* a directory never captured (the state dir, */
	ino_t skip_ino;            /* should it live inside a root) */
	struct progress *p;        /* may be NULL */
	struct timespec max_ctime; /* out: newest ctime recorded */
	/* Incremental: a regular file (one link) that the parent manifest lists
	 * as the same inode, ctime, mtime and size (or that a restore of the
	 * parent wrote: its alias) is not archived again; its line names the
	 * archive that holds its data. NULL: a full archive. */
	const struct tar_manifest *parent;
	const char *parent_name; /* the parent's checkpoint directory */
	/* When the parent's capture began (coarse clock): an entry whose ctime
	 * is not older may have changed while it was read, so its content is
	 * compared before it is reused. */
	struct timespec parent_started;
	uint64_t reused; /* out: files whose data stayed in an older archive */
	char **srcs;     /* out: the distinct checkpoints those are in */
	size_t n_srcs;   /* (the caller frees each and the array) */
};

/* Write <out_dirfd>/<archive> and <out_dirfd>/<manifest> for the tree below
 * root_fd (the root's contents, plus the root directory's own metadata in the
 * manifest), then fsync both. */
int tar_create_root(int root_fd, int out_dirfd, const char *archive, const char *manifest, struct tar_create_opts *o,
		    ckpt_error *err);

/* A pax writer as checkpoints use (zstd level 1 or no filter), not opened. */
struct archive *tar_writer_new(bool zstd);

/* Can libarchive write zstd here? */
bool tar_create_zstd_available(void);
