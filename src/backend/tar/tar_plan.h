/* tar_plan.h: a whole-root restore announces what it will change before it
 * changes anything (restore_details' before_change): the services step
 * stops the units whose own files are in it (docs/whole-root.md). The live
 * walk defers its removals here; once the set of entries to write is
 * closed, tar_plan_announce records what goes (gone), notes the unit files,
 * calls the hook, and only then are the removals made. */
#pragma once
#include "backend/tar/tar_manifest.h"
#include "backend/tar/tar_restore.h"

struct tar_plan {
	char **removals; /* "path", or "path/" for a directory and all below it */
	size_t n, cap;
};
void tar_plan_free(struct tar_plan *p);
/* A live entry the walk found extra: removed now, or with before_change
 * set, remembered to be removed by tar_plan_run. 0 or -errno. */
int tar_plan_extra(struct tar_plan *p, struct tar_restore_opts *o, int dirfd, const char *name, const struct stat *st,
		   const char *path);
/* The hook with the deferred removals and the needed entries of m, then
 * the removals. < 0 with err set; o->held when the hook refused. */
int tar_plan_run(struct tar_restore_opts *o, int root_fd, struct tar_plan *p, const struct tar_manifest *m,
		 ckpt_error *err);
