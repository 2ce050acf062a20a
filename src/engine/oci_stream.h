/* oci_stream.h: read a file while another thread still writes it, on a
 * thread of the stream's own (oci_stream.c): a push sends a layer to the
 * registry while the layer is being made. Private to src/engine. */
#pragma once
#include <stdint.h>
#include <sys/types.h>
#include "lib/util.h"

struct oci_stream;

/* What the stream's thread runs: read the file with oci_stream_read until
 * it gives 0 (the end), then name it with oci_stream_digest. */
typedef int (*oci_stream_fn)(void *ctx, struct oci_stream *s, ckpt_error *err);

/* Start send(ctx, ...) on its own thread, over fd (open for reading; the
 * stream closes it). */
int oci_stream_start(int fd, oci_stream_fn send, void *ctx, struct oci_stream **ret);

/* The writer's side. The file holds n bytes now: 0, or -ECANCELED once
 * the sender failed (stop writing). */
int oci_stream_grew(struct oci_stream *s, uint64_t n);
/* The writer is done: made 0 with the file's size and digest, or its error
 * (the sender then stops). Always before oci_stream_wait. */
void oci_stream_end(struct oci_stream *s, int made, uint64_t size, const char *digest);
/* Wait for the sender and free the stream: 0, or the sender's own error
 * (in err), even when the writer failed after it (-ECANCELED). A sender
 * stopped by the writer's error gives 0: that error is the one to tell. */
int oci_stream_wait(struct oci_stream *s, ckpt_error *err);

/* The sender's side. Up to cap bytes at the reading position, waiting for
 * the writer: how many, 0 at the end, or the writer's error. */
ssize_t oci_stream_read(struct oci_stream *s, void *buf, size_t cap);
/* The digest the writer gave at its end. */
void oci_stream_digest(struct oci_stream *s, char out[80]);
