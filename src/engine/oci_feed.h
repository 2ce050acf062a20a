/* oci_feed.h: blobs handed from the thread that downloads them to the
 * thread that applies them (oci_feed.c), through a few blocks of memory, so
 * a pull applies each layer while it arrives and never writes the blob.
 * Private to src/engine (engine_oci_pull.c uses it). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct oci_feed;

int oci_feed_new(struct oci_feed **ret);
void oci_feed_free(struct oci_feed *f);

/* The producer. put copies len bytes of the current blob in, waiting while
 * the feed is full; after a cancel it drops them (the producer still reads
 * to the blob's end, to learn its digest). end closes the current blob:
 * status 0 when it verified, else -errno; the next put starts the next. */
void oci_feed_put(struct oci_feed *f, const void *buf, size_t len);
void oci_feed_end(struct oci_feed *f, int status);
/* Has the consumer given up? Then no further blob need start. */
bool oci_feed_cancelled(struct oci_feed *f);

/* The consumer. read gives the next block of the current blob (>0, valid
 * until the next call), then at its end its status: 0, or the producer's
 * -errno; again on every later call, until next moves on to the next blob.
 * skip reads to the end and gives the status. cancel gives up: what the
 * producer puts from then on is dropped and put never waits again. */
ssize_t oci_feed_read(struct oci_feed *f, const void **buf);
int oci_feed_skip(struct oci_feed *f);
void oci_feed_next(struct oci_feed *f);
void oci_feed_cancel(struct oci_feed *f);
