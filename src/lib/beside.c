/* beside.c: work on a thread beside the caller (beside.h). The threads wait
 * in a pool between uses; one is made when none is free. A create used to
 * start one for its look at every directory, and pthread_create with an
 * affinity cost its first pass about 0.2 ms (100k files, a 2-vCPU VM):
 * handing work to a sleeping thread costs a wake-up. */
#include "lib/beside.h"

#include <pthread.h>
#include <stdlib.h>

struct beside_thread {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	void *(*fn)(void *); /* the work given, until done */
	void *arg;
	bool done;
	struct beside_thread *next; /* in the pool */
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct beside_thread *pool;

static void *beside_main(void *arg)
{
	struct beside_thread *t = arg;
	pthread_mutex_lock(&t->lock);
	for (;;) {
		while (!t->fn)
			pthread_cond_wait(&t->cond, &t->lock);
		void *(*fn)(void *) = t->fn;
		pthread_mutex_unlock(&t->lock);
		fn(t->arg);
		pthread_mutex_lock(&t->lock);
		t->fn = NULL;
		t->done = true;
		pthread_cond_broadcast(&t->cond);
	}
	return NULL;
}

/* A thread from the pool, or a new one; NULL when none can be made. */
static struct beside_thread *beside_take(void)
{
	pthread_mutex_lock(&pool_lock);
	struct beside_thread *t = pool;
	if (t)
		pool = t->next;
	pthread_mutex_unlock(&pool_lock);
	if (t)
		return t;
	if (!(t = calloc(1, sizeof(*t))))
		return NULL;
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->cond, NULL);
	if (pthread_create(&t->thread, NULL, beside_main, t) != 0) {
		pthread_cond_destroy(&t->cond);
		pthread_mutex_destroy(&t->lock);
		free(t);
		return NULL;
	}
	pthread_detach(t->thread); /* it lives as long as the process */
	return t;
}

bool beside_spawn(struct beside *b, void *(*fn)(void *), void *arg)
{
	cpu_set_t other;
	int cpu = sched_getcpu();
	b->t = beside_take();
	if (!b->t)
		return b->hinted = false;
	/* set while it sleeps: it wakes on the other CPU, not queued behind us */
	b->hinted = cpu >= 0 && sched_getaffinity(0, sizeof(b->cpus), &b->cpus) == 0 && CPU_ISSET(cpu, &b->cpus) &&
		CPU_COUNT(&b->cpus) > 1;
	if (b->hinted) {
		other = b->cpus;
		CPU_CLR(cpu, &other);
		b->hinted = pthread_setaffinity_np(b->t->thread, sizeof(other), &other) == 0;
	}
	pthread_mutex_lock(&b->t->lock);
	b->t->arg = arg;
	b->t->done = false;
	b->t->fn = fn;
	pthread_cond_broadcast(&b->t->cond);
	pthread_mutex_unlock(&b->t->lock);
	return true;
}

void beside_join(struct beside *b)
{
	struct beside_thread *t = b->t;
	if (!t)
		return;
	if (b->hinted)
		pthread_setaffinity_np(t->thread, sizeof(b->cpus), &b->cpus);
	pthread_mutex_lock(&t->lock);
	while (!t->done)
		pthread_cond_wait(&t->cond, &t->lock);
	pthread_mutex_unlock(&t->lock);
	b->t = NULL;
	b->hinted = false;
	pthread_mutex_lock(&pool_lock);
	t->next = pool;
	pool = t;
	pthread_mutex_unlock(&pool_lock);
}
