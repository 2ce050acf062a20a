/* oci_pipe.h: hand blocks of bytes to a thread of their own (oci_pipe.c),
 * so making a layer runs on two cores: the caller reads files, writes the
 * tar and hashes it; the pipe's thread compresses, hashes and writes.
 * Private to src/engine. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct oci_pipe;

/* consume(ctx, buf, len, end) gets the blocks in order on the pipe's
 * thread, then once with end true (buf NULL) unless the pipe was
 * cancelled; a negative return (-errno) stops it. */
typedef int (*oci_pipe_fn)(void *ctx, const void *buf, size_t len, bool end);

int oci_pipe_start(oci_pipe_fn consume, void *ctx, struct oci_pipe **ret);
/* Copy len bytes in, waiting while the pipe is full: 0, or the
 * consumer's error (then nothing more goes in). */
int oci_pipe_put(struct oci_pipe *p, const void *buf, size_t len);
/* Wait for the consumer to take everything and its end (cancel: drop what
 * is left, no end); free the pipe. 0, or the consumer's error. NULL: 0. */
int oci_pipe_finish(struct oci_pipe *p, bool cancel);
