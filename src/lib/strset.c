/* strset.c: the string set of strset.h. Entries stay in the order added; a
 * table of indexes into them, probed linearly, finds a key. A deleted entry
 * keeps its place until the table is rebuilt, so iteration survives it. */
#include "lib/strset.h"
#include "lib/hash.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The slot holding key, or the empty slot where it would go (cap > 0). */
static size_t strset_find(const struct strset *s, const char *key, uint64_t h)
{
	size_t i = h & (s->cap - 1);
	for (; s->slot[i]; i = (i + 1) & (s->cap - 1)) {
		const struct strset_entry *e = &s->v[s->slot[i] - 1];
		if (e->key && e->hash == h && !strcmp(e->key, key))
			return i;
	}
	return i;
}

static struct strset_entry *strset_lookup(const struct strset *s, const char *key)
{
	if (!s->cap)
		return NULL;
	size_t i = strset_find(s, key, hash_str(key));
	return s->slot[i] ? &s->v[s->slot[i] - 1] : NULL;
}

/* Drop the deleted entries and index the rest in a table at most a
 * quarter full. */
static int strset_rebuild(struct strset *s)
{
	size_t cap = 16, n = 0;
	while (cap < (s->live + 1) * 4)
		cap *= 2;
	uint32_t *slot = calloc(cap, sizeof(*slot));
	if (!slot)
		return -ENOMEM;
	for (size_t j = 0; j < s->n; j++)
		if (s->v[j].key)
			s->v[n++] = s->v[j];
	free(s->slot);
	s->slot = slot;
	s->cap = cap;
	s->n = n;
	for (size_t j = 0; j < n; j++) {
		size_t i = s->v[j].hash & (cap - 1);
		while (slot[i])
			i = (i + 1) & (cap - 1);
		slot[i] = (uint32_t)(j + 1);
	}
	return 0;
}

/* Room for one more entry, in the table (at most half full, deleted
 * entries counted) and in the array. */
static int strset_reserve(struct strset *s)
{
	if (s->n >= UINT32_MAX - 1)
		return -ENOMEM;
	if ((s->n + 1) * 2 > s->cap && strset_rebuild(s) < 0)
		return -ENOMEM;
	if (s->n < s->cap_v)
		return 0;
	size_t cap_v = s->cap_v ? s->cap_v * 2 : 16;
	struct strset_entry *v = realloc(s->v, cap_v * sizeof(*v));
	if (!v)
		return -ENOMEM;
	s->v = v;
	s->cap_v = cap_v;
	return 0;
}

/* key's entry, added with no value when absent (*added set); NULL: no memory. */
static struct strset_entry *strset_entry(struct strset *s, const char *key, bool *added)
{
	struct strset_entry *e = strset_lookup(s, key);
	*added = false;
	if (e)
		return e;
	uint64_t h = hash_str(key);
	char *k = strset_reserve(s) < 0 ? NULL : strdup(key);
	if (!k)
		return NULL;
	size_t i = strset_find(s, key, h);
	s->v[s->n] = (struct strset_entry){ .key = k, .hash = h };
	s->slot[i] = (uint32_t)++s->n;
	s->live++;
	*added = true;
	return &s->v[s->n - 1];
}

int strset_add(struct strset *s, const char *key)
{
	bool added;
	return strset_entry(s, key, &added) ? added : -ENOMEM;
}

int strset_put(struct strset *s, const char *key, const char *val)
{
	bool added;
	char *copy = strdup(val);
	struct strset_entry *e = copy ? strset_entry(s, key, &added) : NULL;
	if (!e) {
		free(copy);
		return -ENOMEM;
	}
	free(e->val);
	e->val = copy;
	return 0;
}

bool strset_has(const struct strset *s, const char *key)
{
	return strset_lookup(s, key) != NULL;
}

const char *strset_get(const struct strset *s, const char *key)
{
	const struct strset_entry *e = strset_lookup(s, key);
	return e ? e->val : NULL;
}

bool strset_del(struct strset *s, const char *key)
{
	struct strset_entry *e = strset_lookup(s, key);
	if (!e)
		return false;
	free(e->key);
	free(e->val);
	e->key = e->val = NULL;
	s->live--;
	return true;
}

const char *strset_next(const struct strset *s, size_t *i, const char **ret_val)
{
	for (; *i < s->n; (*i)++)
		if (s->v[*i].key) {
			if (ret_val)
				*ret_val = s->v[*i].val;
			return s->v[(*i)++].key;
		}
	return NULL;
}

static int strset_cmp(const void *x, const void *y)
{
	return strcmp(*(const char *const *)x, *(const char *const *)y);
}

int strset_sorted(const struct strset *s, const char ***ret)
{
	const char **keys = calloc(s->live ? s->live : 1, sizeof(*keys));
	const char *k;
	size_t i = 0, n = 0;
	if (!keys)
		return -ENOMEM;
	while ((k = strset_next(s, &i, NULL)))
		keys[n++] = k;
	qsort(keys, n, sizeof(*keys), strset_cmp);
	*ret = keys;
	return 0;
}

void strset_free(struct strset *s)
{
	for (size_t i = 0; i < s->n; i++) {
		free(s->v[i].key);
		free(s->v[i].val);
	}
	free(s->v);
	free(s->slot);
	memset(s, 0, sizeof(*s));
}
