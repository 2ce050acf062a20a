/* devino.c: open addressing, linear probing, at most half full. */
#include "lib/devino.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t devino_slot(const struct devino_entry *v, size_t cap, dev_t dev, ino_t ino)
{
	size_t i = (size_t)(((uint64_t)ino * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)dev) & (cap - 1);
	while (v[i].path && !(v[i].dev == dev && v[i].ino == ino))
		i = (i + 1) & (cap - 1);
	return i;
}

const char *devino_get(const struct devino_map *m, dev_t dev, ino_t ino)
{
	return m->cap ? m->v[devino_slot(m->v, m->cap, dev, ino)].path : NULL;
}

static int devino_grow(struct devino_map *m)
{
	size_t cap = m->cap ? m->cap * 2 : 64;
	struct devino_entry *v = calloc(cap, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < m->cap; i++)
		if (m->v[i].path)
			v[devino_slot(v, cap, m->v[i].dev, m->v[i].ino)] = m->v[i];
	free(m->v);
	m->v = v;
	m->cap = cap;
	return 0;
}

int devino_put(struct devino_map *m, dev_t dev, ino_t ino, const char *path)
{
	if ((m->n + 1) * 2 > m->cap && devino_grow(m) < 0)
		return -ENOMEM;
	struct devino_entry *e = &m->v[devino_slot(m->v, m->cap, dev, ino)];
	if (e->path)
		return 0;
	e->path = strdup(path);
	if (!e->path)
		return -ENOMEM;
	e->dev = dev;
	e->ino = ino;
	m->n++;
	return 0;
}

void devino_free(struct devino_map *m)
{
	for (size_t i = 0; i < m->cap; i++)
		free(m->v[i].path);
	free(m->v);
	*m = (struct devino_map){ 0 };
}
