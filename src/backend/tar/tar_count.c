/* tar_count.c: a create's progress totals, counted by a thread beside it. */
#include "backend/tar/tar_internal.h"

/* total = max(total, v), against add_done's own raises. */
void tar_count_raise(_Atomic uint64_t *total, uint64_t v)
{
	uint64_t t = atomic_load(total);
	while (v > t && !atomic_compare_exchange_weak(total, &t, v))
		;
}

static void *tar_count_main(void *arg)
{
	struct tar_count *c = arg;
	uint64_t files = 0, bytes = 0;
	for (size_t i = 0; i < c->n && !atomic_load(&c->stop); i++)
		tar_count_tree(c->fds[i], c->skip_dev, c->skip_ino, c->excl, &c->stop, &files, &bytes);
	if (!atomic_load(&c->stop)) {
		tar_count_raise(&c->p->files_total, files);
		tar_count_raise(&c->p->bytes_total, bytes);
	}
	return NULL;
}

void tar_count_start(struct tar_count *c, struct tar_state *s, char *const *from, const struct rootexcl *excl,
		     struct progress *p)
{
	c->p = p;
	c->excl = from ? NULL : excl;
	c->skip_dev = s->state_dev;
	c->skip_ino = s->state_ino;
	for (size_t i = 0; i < s->n_roots && i < MAX_ROOTS; i++) {
		int fd = open(from ? from[i] : s->roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd >= 0)
			c->fds[c->n++] = fd;
	}
	c->started = pthread_create(&c->t, NULL, tar_count_main, c) == 0;
	if (!c->started)
		log_debug("tar: no thread to count the progress totals: the bar follows the create");
}

/* Stop and wait for the count (a cleanup: every way out of the create). */
void tar_count_join(struct tar_count *c)
{
	atomic_store(&c->stop, true);
	if (c->started)
		pthread_join(c->t, NULL);
	c->started = false;
	for (size_t i = 0; i < c->n; i++)
		close(c->fds[i]);
	c->n = 0;
}
