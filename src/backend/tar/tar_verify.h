/* tar_verify.h: compare a restored root with its checkpoint's manifest. */
#pragma once
#include <jansson.h>
#include "backend/rootexcl.h"
#include "backend/tar/tar_manifest.h"

struct verify_diffs;

struct tar_verify_opts {
	const char *root_path; /* prefix of the paths reported */
	dev_t skip_dev;        /* a directory never compared (the state dir) */
	ino_t skip_ino;
	const struct rootexcl *excl; /* what else is never compared */
	size_t max_diffs;            /* stop once diffs holds this many */
};

/* Append to diffs each difference found (reasons: unexpected, missing,
 * type, mode, owner, size, mtime, xattrs, hardlink, content). Returns <0
 * only when the comparison itself could not run. */
int tar_verify_root(int root_fd, int ckpt_dirfd, const char *manifest, const struct tar_verify_opts *o,
		    struct verify_diffs *diffs, ckpt_error *err);
