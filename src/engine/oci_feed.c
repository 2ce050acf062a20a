/* oci_feed.c: a ring of a few large blocks between the thread that
 * downloads blobs and the one that applies them. The producer fills the
 * block past the published ones and publishes it when full, so each
 * hand-over moves SLOT bytes; a blob's end is a block of its own, with the
 * blob's status. The consumer reads the head block in place and gives it
 * back on its next call: one copy, and memory that does not grow with the
 * blob (SLOTS x SLOT bytes). */
#include "engine/oci_feed.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 8
#define SLOT (256 * 1024)

struct feed_slot {
	char *buf;
	size_t len;
	bool end; /* the blob's end: no data, its status */
	int status;
};

struct oci_feed {
	pthread_mutex_t mu;
	pthread_cond_t changed;
	struct feed_slot s[SLOTS];
	size_t head, count; /* the published blocks, the head one first */
	size_t fill;        /* bytes in the producer's block (head + count), unpublished */
	bool held;          /* the consumer reads the head block */
	bool ended;         /* the consumer reached the current blob's end */
	int status;         /* that end's status */
	bool cancel;
};

int oci_feed_new(struct oci_feed **ret)
{
	struct oci_feed *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->changed, NULL);
	for (size_t i = 0; i < SLOTS; i++)
		if (!(f->s[i].buf = malloc(SLOT))) {
			oci_feed_free(f);
			return -ENOMEM;
		}
	*ret = f;
	return 0;
}

void oci_feed_free(struct oci_feed *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < SLOTS; i++)
		free(f->s[i].buf);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->changed);
	free(f);
}

/* Publish the producer's block (count < SLOTS). Under mu. */
static void feed_publish(struct oci_feed *f, bool end, int status)
{
	struct feed_slot *s = &f->s[(f->head + f->count) % SLOTS];
	s->len = end ? 0 : f->fill;
	s->end = end;
	s->status = status;
	f->count++;
	f->fill = 0;
	pthread_cond_broadcast(&f->changed);
}

/* Wait for a free block; false once cancelled. Under mu. */
static bool feed_room(struct oci_feed *f)
{
	while (f->count == SLOTS && !f->cancel)
		pthread_cond_wait(&f->changed, &f->mu);
	return !f->cancel;
}

void oci_feed_put(struct oci_feed *f, const void *buf, size_t len)
{
	const char *b = buf;
	pthread_mutex_lock(&f->mu);
	while (len && feed_room(f)) {
		char *dst = f->s[(f->head + f->count) % SLOTS].buf + f->fill;
		size_t n = len < SLOT - f->fill ? len : SLOT - f->fill;
		pthread_mutex_unlock(&f->mu); /* the block past the published ones is the producer's alone */
		memcpy(dst, b, n);
		pthread_mutex_lock(&f->mu);
		if (f->cancel)
			break;
		f->fill += n;
		b += n;
		len -= n;
		if (f->fill == SLOT)
			feed_publish(f, false, 0);
	}
	pthread_mutex_unlock(&f->mu);
}

void oci_feed_end(struct oci_feed *f, int status)
{
	pthread_mutex_lock(&f->mu);
	if (f->fill && !f->cancel) /* a block being filled has its room already */
		feed_publish(f, false, 0);
	if (feed_room(f))
		feed_publish(f, true, status);
	pthread_mutex_unlock(&f->mu);
}

bool oci_feed_cancelled(struct oci_feed *f)
{
	pthread_mutex_lock(&f->mu);
	bool c = f->cancel;
	pthread_mutex_unlock(&f->mu);
	return c;
}

/* Give the head block back, if the consumer holds it. Under mu. */
static void feed_release(struct oci_feed *f)
{
	if (!f->held)
		return;
	f->held = false;
	f->head = (f->head + 1) % SLOTS;
	f->count--;
	pthread_cond_broadcast(&f->changed);
}

ssize_t oci_feed_read(struct oci_feed *f, const void **buf)
{
	ssize_t r;
	pthread_mutex_lock(&f->mu);
	feed_release(f);
	while (!f->ended && !f->count && !f->cancel)
		pthread_cond_wait(&f->changed, &f->mu);
	if (f->ended) {
		r = f->status;
	} else if (f->cancel) {
		r = -ECANCELED;
	} else if (f->s[f->head].end) {
		f->ended = true;
		r = f->status = f->s[f->head].status;
		f->held = true;
		feed_release(f);
	} else {
		f->held = true;
		*buf = f->s[f->head].buf;
		r = (ssize_t)f->s[f->head].len;
	}
	pthread_mutex_unlock(&f->mu);
	return r;
}

int oci_feed_skip(struct oci_feed *f)
{
	const void *b;
	ssize_t r;
	while ((r = oci_feed_read(f, &b)) > 0)
		;
	return (int)r;
}

void oci_feed_next(struct oci_feed *f)
{
	pthread_mutex_lock(&f->mu);
	feed_release(f);
	f->ended = false;
	f->status = 0;
	pthread_mutex_unlock(&f->mu);
}

void oci_feed_cancel(struct oci_feed *f)
{
	pthread_mutex_lock(&f->mu);
	f->cancel = true;
	f->held = false;
	f->count = 0;
	f->fill = 0;
	pthread_cond_broadcast(&f->changed);
	pthread_mutex_unlock(&f->mu);
}
