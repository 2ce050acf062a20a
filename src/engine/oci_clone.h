/* oci_clone.h: a tree of hard links to an immutable one (oci_clone.c).
 * Private to src/engine (engine_oci_pull.c uses it). */
#pragma once
#include "lib/util.h"

/* Fill the empty directory dst_fd with the tree at src: regular files
 * hard-linked (copied where a link cannot be), the rest made anew with the
 * same owners, modes, xattrs and times; dst_fd's own metadata last. */
int oci_clone_tree(const char *src, int dst_fd, ckpt_error *err);
