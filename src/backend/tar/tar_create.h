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
};

/* Write <out_dirfd>/<archive> and <out_dirfd>/<manifest> for the tree below
 * root_fd (the root's contents, plus the root directory's own metadata in the
 * manifest), then fsync both. */
int tar_create_root(int root_fd, int out_dirfd, const char *archive, const char *manifest, struct tar_create_opts *o,
		    ckpt_error *err);

/* Can libarchive write zstd here? */
bool tar_create_zstd_available(void);
