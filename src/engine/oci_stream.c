/* oci_stream.c: one thread writes a file, the stream's thread reads it as
 * it grows. The writer says how far it got; the reader waits for that,
 * then reads from the page cache the bytes just written. Nothing is
 * buffered here: memory does not grow with the file, and a slow reader
 * never holds up the writer. */
#include "engine/oci_stream.h"

#include <pthread.h>

struct oci_stream {
	pthread_mutex_t mu;
	pthread_cond_t more;
	pthread_t thread;
	int fd;
	uint64_t written; /* what the writer said it wrote */
	uint64_t pos;     /* what the reader read; its thread's alone */
	bool ended;
	int made;     /* the writer's outcome, once ended */
	bool gave_up; /* the sender ended with an error */
	bool told;    /* the reader was given the writer's error */
	char digest[80];
	oci_stream_fn send;
	void *ctx;
	int rc;
	ckpt_error err;
};

static void *stream_main(void *arg)
{
	struct oci_stream *s = arg;
	int rc = s->send(s->ctx, s, &s->err);
	pthread_mutex_lock(&s->mu);
	s->rc = rc;
	s->gave_up = rc < 0;
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

int oci_stream_start(int fd, oci_stream_fn send, void *ctx, struct oci_stream **ret)
{
	struct oci_stream *s = calloc(1, sizeof(*s));
	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->more, NULL);
	s->fd = fd;
	s->send = send;
	s->ctx = ctx;
	int q = -pthread_create(&s->thread, NULL, stream_main, s);
	if (q < 0) {
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->more);
		close(fd);
		free(s);
		return q;
	}
	*ret = s;
	return 0;
}

int oci_stream_grew(struct oci_stream *s, uint64_t n)
{
	pthread_mutex_lock(&s->mu);
	s->written = n;
	int q = s->gave_up ? -ECANCELED : 0;
	pthread_cond_signal(&s->more);
	pthread_mutex_unlock(&s->mu);
	return q;
}

void oci_stream_end(struct oci_stream *s, int made, uint64_t size, const char *digest)
{
	pthread_mutex_lock(&s->mu);
	s->ended = true;
	s->made = made < 0 ? made : 0;
	if (made == 0) {
		s->written = size;
		snprintf(s->digest, sizeof(s->digest), "%s", digest);
	}
	pthread_cond_signal(&s->more);
	pthread_mutex_unlock(&s->mu);
}

int oci_stream_wait(struct oci_stream *s, ckpt_error *err)
{
	pthread_join(s->thread, NULL);
	/* a sender the writer's error stopped has nothing of its own to tell */
	int q = s->told ? 0 : s->rc;
	if (q < 0 && err)
		*err = s->err;
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->more);
	close(s->fd);
	free(s);
	return q;
}

ssize_t oci_stream_read(struct oci_stream *s, void *buf, size_t cap)
{
	pthread_mutex_lock(&s->mu);
	while (s->pos == s->written && !s->ended)
		pthread_cond_wait(&s->more, &s->mu);
	uint64_t avail = s->written - s->pos;
	int made = s->ended ? s->made : 0;
	pthread_mutex_unlock(&s->mu);
	if (made < 0) {
		s->told = true;
		return made;
	}
	if (avail == 0)
		return 0;
	ssize_t k = pread(s->fd, buf, avail < cap ? (size_t)avail : cap, (off_t)s->pos);
	if (k <= 0)
		return k < 0 ? -errno : -EIO;
	s->pos += (uint64_t)k;
	return k;
}

void oci_stream_digest(struct oci_stream *s, char out[80])
{
	pthread_mutex_lock(&s->mu);
	snprintf(out, 80, "%s", s->digest);
	pthread_mutex_unlock(&s->mu);
}
