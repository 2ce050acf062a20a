/* oci_pipe.c: a bounded queue of byte blocks and the thread that consumes
 * them. A few blocks in flight keep both threads busy in memory that does
 * not grow with the layer (SLOTS x SLOT bytes). */
#include "engine/oci_pipe.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 8
#define SLOT (128 * 1024)

struct oci_pipe {
	pthread_mutex_t mu;
	pthread_cond_t changed;
	pthread_t thread;
	oci_pipe_fn consume;
	void *ctx;
	char *buf[SLOTS];
	size_t len[SLOTS];
	size_t head, count;
	bool end, cancel;
	int err;
};

static void *pipe_main(void *arg)
{
	struct oci_pipe *p = arg;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (p->count == 0 && !p->end && !p->cancel)
			pthread_cond_wait(&p->changed, &p->mu);
		if (p->cancel || p->err || p->count == 0)
			break;
		size_t i = p->head;
		pthread_mutex_unlock(&p->mu); /* the slot is ours until count drops */
		int q = p->consume(p->ctx, p->buf[i], p->len[i], false);
		pthread_mutex_lock(&p->mu);
		p->head = (p->head + 1) % SLOTS;
		p->count--;
		if (q < 0)
			p->err = q;
		pthread_cond_broadcast(&p->changed);
	}
	bool finish = !p->cancel && !p->err;
	pthread_mutex_unlock(&p->mu);
	int q = finish ? p->consume(p->ctx, NULL, 0, true) : 0;
	pthread_mutex_lock(&p->mu);
	if (q < 0 && !p->err)
		p->err = q;
	p->count = 0;
	pthread_cond_broadcast(&p->changed);
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static void pipe_free(struct oci_pipe *p)
{
	for (size_t i = 0; i < SLOTS; i++)
		free(p->buf[i]);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->changed);
	free(p);
}

int oci_pipe_start(oci_pipe_fn consume, void *ctx, struct oci_pipe **ret)
{
	struct oci_pipe *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->changed, NULL);
	p->consume = consume;
	p->ctx = ctx;
	int q = 0;
	for (size_t i = 0; i < SLOTS && q == 0; i++)
		if (!(p->buf[i] = malloc(SLOT)))
			q = -ENOMEM;
	if (q == 0 && (q = -pthread_create(&p->thread, NULL, pipe_main, p)) == 0) {
		*ret = p;
		return 0;
	}
	pipe_free(p);
	return q;
}

int oci_pipe_put(struct oci_pipe *p, const void *buf, size_t len)
{
	const char *b = buf;
	int q = 0;
	pthread_mutex_lock(&p->mu);
	while (len && q == 0) {
		while (p->count == SLOTS && !p->err)
			pthread_cond_wait(&p->changed, &p->mu);
		if ((q = p->err) < 0)
			break;
		size_t i = (p->head + p->count) % SLOTS, n = len < SLOT ? len : SLOT;
		memcpy(p->buf[i], b, n); /* a free slot: the consumer does not touch it */
		p->len[i] = n;
		p->count++;
		b += n;
		len -= n;
		pthread_cond_broadcast(&p->changed);
	}
	pthread_mutex_unlock(&p->mu);
	return q;
}

int oci_pipe_finish(struct oci_pipe *p, bool cancel)
{
	if (!p)
		return 0;
	pthread_mutex_lock(&p->mu);
	p->end = true;
	p->cancel |= cancel;
	pthread_cond_broadcast(&p->changed);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->thread, NULL);
	int q = p->err;
	pipe_free(p);
	return q;
}
