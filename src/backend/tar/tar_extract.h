/* tar_extract.h: what tar_restore.c shares with tar_extract.c, the
 * extraction half of an in-place restore. Internal to the two. */
#pragma once
#include <limits.h>

#include "backend/tar/tar_plan.h"
#include "backend/tar/tar_restore.h"

struct tar_rctx {
	struct tar_manifest m;
	struct tar_restore_opts *o;
	struct tar_restore_stats *st;
	ckpt_error *err;
	int pdir_fd; /* the directory of the last regular file written */
	char pdir[PATH_MAX];
	struct tar_plan plan; /* removals deferred until before_change ran */
	size_t n_direct;      /* directories set from the manifest (dir_direct) */
};

/* The directory of path below root_fd, kept for the entries that follow
 * (they come in a row); *leaf its last name. < 0: -errno. */
int tar_rctx_parent_fd(struct tar_rctx *c, int root_fd, const char *path, const char **leaf);
/* The checkpoint's own archive first (directories, links and changed
 * files), then each older archive that holds a marked entry, once. */
int tar_extract_chain(struct tar_rctx *c, int root_fd, int ckpt_dirfd, const char *archive);
