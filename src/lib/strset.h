/* strset.h: a set of strings, each with an optional string value, kept in
 * the order added. What the backends use where they remember names or paths
 * seen (a diff's candidates, a flatten's names, a layer record's entries)
 * instead of a JSON object. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct strset_entry {
	char *key; /* NULL: deleted */
	char *val; /* NULL: none */
	uint64_t hash;
};

/* Zero-initialise; strset_free releases it. */
struct strset {
	struct strset_entry *v; /* in the order added, deleted ones in place */
	size_t n, cap_v;        /* entries used (deleted included), allocated */
	size_t live;            /* keys present */
	uint32_t *slot;         /* open addressing: 0 empty, else index + 1 into v */
	size_t cap;             /* a power of two, or 0 */
};

/* Add key (copied): 1 added, 0 present already, -ENOMEM. */
int strset_add(struct strset *s, const char *key);
/* Add key or replace its value with a copy of val: 0 or -ENOMEM. */
int strset_put(struct strset *s, const char *key, const char *val);
bool strset_has(const struct strset *s, const char *key);
/* key's value; NULL when key is absent or has none. */
const char *strset_get(const struct strset *s, const char *key);
/* Remove key: true when it was there. */
bool strset_del(struct strset *s, const char *key);
static inline size_t strset_count(const struct strset *s)
{
	return s->live;
}
/* The next key present from *i on, in the order added, and its value
 * (ret_val may be NULL); NULL at the end. Start with *i = 0. The set may
 * lose keys meanwhile, not gain them. */
const char *strset_next(const struct strset *s, size_t *i, const char **ret_val);
/* The keys present, sorted by strcmp, into *ret (the caller frees the array,
 * not the keys, which live until they are removed): 0 or -ENOMEM. */
int strset_sorted(const struct strset *s, const char ***ret);
void strset_free(struct strset *s);
