/* engine_export.h: a checkpoint as one portable archive, and back.
 * The archive format is described at the top of engine_export.c and in
 * README "Portability". Knows no HTTP: the API streams through these calls. */
#pragma once
#include <jansson.h>
#include <sys/types.h>
#include "lib/util.h"

struct engine;
struct engine_export;
struct ckpt_view;

/* Start exporting checkpoint id_or_name: builds the manifest (reading every
 * file once for its digest), then a worker writes the archive that
 * engine_export_read returns piece by piece. */
int engine_export_open(struct engine *e, const char *id_or_name, struct engine_export **ret, ckpt_error *err);
/* Up to max bytes of the archive: > 0 bytes, 0 at a complete end, < 0
 * (-errno) when the export failed midway (the stream must then be cut). */
ssize_t engine_export_read(struct engine_export *x, char *buf, size_t max);
/* Stop (a writer still running sees the reader gone) and clean up. */
void engine_export_free(struct engine_export *x);

/* Import the archive read from fd as a new checkpoint (a new id, with
 * import_of naming the exported one). Hostile or damaged archives fail with
 * code invalid_archive (400); an overlay checkpoint over another base with
 * base_mismatch (409). Nothing is kept of a failed import. On success
 * fills ret (the new checkpoint; the caller frees it). idem: the request's
 * Idempotency-Key, kept in the record (NULL: none). */
struct ckpt_idem;
int engine_import(struct engine *e, int fd, const struct ckpt_idem *idem, struct ckpt_view *ret, ckpt_error *err);

/* The base identity of this daemon ("sha256:..."); for overlay. */
int engine_base_identity(struct engine *e, char out[80], ckpt_error *err);
/* Remove what a killed export or import left below <state>/xfer. */
void engine_xfer_sweep(struct engine *e);
