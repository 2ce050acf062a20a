/* catalog_index.c: records in memory: their lifetime (new, copy, shared
 * references) and the catalog's index of them: three sorted arrays of the
 * same shared pointers, by id (get), newest first (list) and by name then
 * newest first (name lookup), and counters per state. No JSON is read or
 * written here, no lock taken: catalog.c does both. */
#include "engine/catalog_index.h"

struct ckpt_record *record_new(const char *id, const char *name, enum ckpt_status status)
{
	struct ckpt_record *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->refs = 1;
	snprintf(r->id, sizeof(r->id), "%s", id);
	r->name = strdup(name);
	r->status = status;
	r->labels = json_object();
	r->roots = json_array();
	r->frozen_services = json_array();
	if (!r->name || !r->labels || !r->roots || !r->frozen_services) {
		record_unref(r);
		return NULL;
	}
	return r;
}

static void record_free(struct ckpt_record *r)
{
	free(r->name);
	free(r->backend);
	json_decref(r->labels);
	json_decref(r->roots);
	json_decref(r->frozen_services);
	json_decref(r->freeze_failures);
	json_decref(r->error);
	json_decref(r->backend_data);
	json_decref(r->extra);
	free(r);
}

const struct ckpt_record *record_ref(const struct ckpt_record *r)
{
	if (r)
		__atomic_add_fetch(&((struct ckpt_record *)r)->refs, 1, __ATOMIC_RELAXED);
	return r;
}

void record_unref(const struct ckpt_record *r)
{
	struct ckpt_record *m = (struct ckpt_record *)r;
	if (m && __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0)
		record_free(m);
}

void record_set_name(struct ckpt_record *r, const char *name)
{
	free(r->name);
	r->name = strdup(name ? name : "");
}

void record_set_backend(struct ckpt_record *r, const char *backend)
{
	free(r->backend);
	r->backend = backend ? strdup(backend) : NULL;
}

static json_t *copy_or_null(json_t *j)
{
	return j ? json_deep_copy(j) : NULL;
}

struct ckpt_record *record_dup(const struct ckpt_record *r)
{
	struct ckpt_record *d = malloc(sizeof(*d));
	if (!d)
		return NULL;
	*d = *r;
	d->refs = 1;
	d->name = strdup(r->name);
	d->backend = r->backend ? strdup(r->backend) : NULL;
	d->labels = copy_or_null(r->labels);
	d->roots = copy_or_null(r->roots);
	d->frozen_services = copy_or_null(r->frozen_services);
	d->freeze_failures = copy_or_null(r->freeze_failures);
	d->error = copy_or_null(r->error);
	d->backend_data = copy_or_null(r->backend_data);
	d->extra = copy_or_null(r->extra);
	if (!d->name || (r->backend && !d->backend) || (r->labels && !d->labels) || (r->roots && !d->roots) ||
	    (r->frozen_services && !d->frozen_services)) {
		record_free(d);
		return NULL;
	}
	return d;
}

typedef int (*rec_cmp_fn)(const struct ckpt_record *a, const struct ckpt_record *b);

static int cmp_id(const struct ckpt_record *a, const struct ckpt_record *b)
{
	return strcmp(a->id, b->id);
}

/* Newest first: by creation time, then by id (ids sort by time too). */
static int cmp_time(const struct ckpt_record *a, const struct ckpt_record *b)
{
	if (a->created_ms != b->created_ms)
		return a->created_ms < b->created_ms ? 1 : -1;
	return -strcmp(a->id, b->id);
}

static int cmp_name(const struct ckpt_record *a, const struct ckpt_record *b)
{
	int d = strcmp(a->name, b->name);
	return d ? d : cmp_time(a, b);
}

/* First position whose record is not before key. */
static size_t lower_bound(const struct ckpt_record **v, size_t n, const struct ckpt_record *key, rec_cmp_fn cmp)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (cmp(v[mid], key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void index_insert(const struct ckpt_record **v, size_t n, const struct ckpt_record *r, rec_cmp_fn cmp)
{
	size_t i = lower_bound(v, n, r, cmp);
	memmove(v + i + 1, v + i, (n - i) * sizeof(*v));
	v[i] = r;
}

static void index_delete(const struct ckpt_record **v, size_t n, const struct ckpt_record *r, rec_cmp_fn cmp)
{
	size_t i = lower_bound(v, n, r, cmp);
	if (i < n && v[i] == r)
		memmove(v + i, v + i + 1, (n - i - 1) * sizeof(*v));
}

static const struct ckpt_record *index_find_id(const struct catalog_index *c, const char *id)
{
	struct ckpt_record key = { 0 };
	snprintf(key.id, sizeof(key.id), "%s", id);
	size_t i = lower_bound(c->by_id, c->n, &key, cmp_id);
	return i < c->n && !strcmp(c->by_id[i]->id, id) ? c->by_id[i] : NULL;
}

static void stats_add(struct catalog_index *c, const struct ckpt_record *r, bool add)
{
	if (add) {
		c->stats.count[r->status]++;
		c->stats.bytes[r->status] += (uint64_t)r->size_bytes;
	} else {
		c->stats.count[r->status]--;
		c->stats.bytes[r->status] -= (uint64_t)r->size_bytes;
	}
}

static void index_remove(struct catalog_index *c, const struct ckpt_record *r)
{
	index_delete(c->by_id, c->n, r, cmp_id);
	index_delete(c->by_time, c->n, r, cmp_time);
	index_delete(c->by_name, c->n, r, cmp_name);
	c->n--;
	stats_add(c, r, false);
	record_unref(r);
}

static int grow(const struct ckpt_record ***v, size_t cap)
{
	const struct ckpt_record **nv = realloc(*v, cap * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	*v = nv;
	return 0;
}

static int index_grow(struct catalog_index *c)
{
	size_t cap = c->cap ? c->cap * 2 : 64;
	if (grow(&c->by_id, cap) < 0 || grow(&c->by_time, cap) < 0 || grow(&c->by_name, cap) < 0)
		return -ENOMEM;
	c->cap = cap;
	return 0;
}

int catalog_index_put(struct catalog_index *c, struct ckpt_record *r)
{
	const struct ckpt_record *old = index_find_id(c, r->id);
	if (old)
		index_remove(c, old);
	else if (c->n == c->cap && index_grow(c) < 0) {
		record_unref(r);
		return -ENOMEM;
	}
	index_insert(c->by_id, c->n, r, cmp_id);
	index_insert(c->by_time, c->n, r, cmp_time);
	index_insert(c->by_name, c->n, r, cmp_name);
	c->n++;
	stats_add(c, r, true);
	return 0;
}

void catalog_index_remove(struct catalog_index *c, const char *id)
{
	const struct ckpt_record *r = index_find_id(c, id);
	if (r)
		index_remove(c, r);
}

const struct ckpt_record *catalog_index_get(const struct catalog_index *c, const char *id)
{
	return index_find_id(c, id);
}

/* The records of that name (all when NULL), newest first. */
size_t catalog_index_range(const struct catalog_index *c, const char *name, const struct ckpt_record *const **ret)
{
	if (!name) {
		*ret = c->by_time;
		return c->n;
	}
	struct ckpt_record key = { .name = (char *)name, .created_ms = INT64_MAX };
	size_t i = lower_bound(c->by_name, c->n, &key, cmp_name), j = i;
	while (j < c->n && !strcmp(c->by_name[j]->name, name))
		j++;
	*ret = c->by_name + i;
	return j - i;
}

const struct ckpt_record *catalog_index_find_name(const struct catalog_index *c, const char *name)
{
	const struct ckpt_record *const *v;
	size_t n = catalog_index_range(c, name, &v);
	for (size_t k = 0; k < n; k++)
		if (v[k]->status == CKPT_ACTIVE)
			return v[k];
	return n ? v[0] : NULL;
}

void catalog_index_free(struct catalog_index *c)
{
	for (size_t i = 0; i < c->n; i++)
		record_unref(c->by_id[i]);
	free(c->by_id);
	free(c->by_time);
	free(c->by_name);
	memset(c, 0, sizeof(*c));
}
