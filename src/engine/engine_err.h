/* engine_err.h: the one place where a failure from below the engine (a
 * backend, the catalog, the filesystem) gets its error kind. */
#pragma once
#include "lib/util.h"

/* What the engine asked for when the failure came back: the same errno can
 * mean different things to the client depending on it. */
enum engine_err_ctx {
	ENGINE_CTX_CREATE,  /* create, import: writing a new checkpoint */
	ENGINE_CTX_RESTORE, /* restore, reset, verify: reading a recorded one */
	ENGINE_CTX_READ,    /* fork, export view, diff: reading without swapping */
	ENGINE_CTX_DELETE,  /* delete, sweep, fork delete: dropping data */
	ENGINE_CTX_RELEASE, /* release of a root */
	ENGINE_CTX_COUNT_
};

/* Give err the kind (and the client's code) its errno, its reason code and
 * ctx call for, and return r (-ENOSPC for a full disk or quota). An error
 * the engine already classified keeps its kind; one no rule covers stays
 * unset (500 internal). r >= 0 or a NULL err: r unchanged. */
int engine_err_classify(ckpt_error *err, enum engine_err_ctx ctx, int r);
