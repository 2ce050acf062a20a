/* tar_compact.h: fold an incremental checkpoint's chain into a full archive. */
#pragma once
#include "backend/backend.h"
#include "backend/tar/tar_manifest.h"

/* Write <out_fd>/<archive> (every entry of the checkpoint in cfd, data taken
 * from the older archives below store_fd its manifest names) and
 * <out_fd>/<manifest> (the same lines, no data source), both synced. */
int tar_compact_root(int store_fd, int cfd, int out_fd, const char *archive, const char *manifest, bool zstd,
		     ckpt_error *err);
