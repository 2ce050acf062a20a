/* tar_diff.h: a tar checkpoint's manifest against another's or the live tree. */
#pragma once
#include <jansson.h>
#include <sys/types.h>
#include "backend/rootexcl.h"
#include "lib/util.h"

struct bdiff_list;

/* Append to out the differences of one root (path root_path) from manifest
 * man_a in cfd_a to manifest man_b in cfd_b, or, when cfd_b < 0, to the tree
 * below live_fd (skipping the (skip_dev, skip_ino) directory). Content is
 * compared by digest between manifests, by size and mtime against the tree. */
int tar_diff_root(const char *root_path, int cfd_a, const char *man_a, int cfd_b, const char *man_b, int live_fd,
		  dev_t skip_dev, ino_t skip_ino, const struct rootexcl *excl, struct bdiff_list *out, ckpt_error *err);
