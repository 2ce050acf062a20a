/* catalog_index.h: the catalog's records in memory; for catalog.c only.
 * Not thread-safe: the catalog holds its lock around every call. */
#pragma once
#include "engine/catalog.h"

struct catalog_index {
	const struct ckpt_record **by_id, **by_time, **by_name;
	size_t n, cap;
	struct catalog_stats stats;
};

/* Take over r (its one reference), replacing any record with its id. */
int catalog_index_put(struct catalog_index *ix, struct ckpt_record *r);
void catalog_index_remove(struct catalog_index *ix, const char *id);
/* Borrowed pointers: record_ref them before the lock is let go. */
const struct ckpt_record *catalog_index_get(const struct catalog_index *ix, const char *id);
const struct ckpt_record *catalog_index_find_name(const struct catalog_index *ix, const char *name);
/* *ret: the records of that name (all when NULL), newest first; returns how many. */
size_t catalog_index_range(const struct catalog_index *ix, const char *name, const struct ckpt_record *const **ret);
void catalog_index_free(struct catalog_index *ix);
