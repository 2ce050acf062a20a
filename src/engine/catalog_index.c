/* catalog_index.c: records in memory: their lifetime (new, copy, shared
 * references) and the catalog's index of them: three sorted arrays of the
 * same shared pointers, by id (get), newest first (list) and by name then
 * newest first (name lookup), and counters per state. No JSON is read or
 * written here, no lock taken: catalog.c does both. */
#include "engine/catalog_index.h"
#include "engine/engine_oci.h"

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
	if (!r->name || !r->labels || !r->roots) {
		record_unref(r);
		return NULL;
	}
	return r;
}

static void pull_of_free(struct ckpt_pull_of *p)
{
	if (!p)
		return;
	free(p->ref);
	free(p->digest);
	for (size_t i = 0; i < p->n_roots; i++)
		free((char *)p->roots[i].image), free((char *)p->roots[i].local);
	free(p->roots);
	free(p);
}

void ckpt_extra_free(struct ckpt_extra *x)
{
	free(x->push);
	free(x->idem);
	pull_of_free(x->pull_of);
	json_decref(x->unknown);
	*x = (struct ckpt_extra){ 0 };
}

static void record_free(struct ckpt_record *r)
{
	free(r->name);
	free(r->backend);
	json_decref(r->labels);
	json_decref(r->roots);
	services_strv_clear(&r->frozen_services);
	for (size_t i = 0; i < r->n_freeze_failures; i++)
		free(r->freeze_failures[i].unit), free(r->freeze_failures[i].reason);
	free(r->freeze_failures);
	free(r->error.code);
	free(r->error.detail);
	json_decref(r->backend_data);
	ckpt_extra_free(&r->extra);
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

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* The copy's pointers are its own; false when some copy failed. */
static bool freeze_dup(struct ckpt_record *d, const struct ckpt_record *r)
{
	d->frozen_services = (struct strv){ 0 };
	d->freeze_failures = r->n_freeze_failures ? calloc(r->n_freeze_failures, sizeof(*d->freeze_failures)) : NULL;
	d->n_freeze_failures = d->freeze_failures ? r->n_freeze_failures : 0;
	bool ok = d->n_freeze_failures == r->n_freeze_failures;
	for (size_t i = 0; i < r->frozen_services.n; i++)
		ok &= services_strv_add(&d->frozen_services, r->frozen_services.v[i]) == 0;
	for (size_t i = 0; i < d->n_freeze_failures; i++) {
		d->freeze_failures[i].unit = strdup(r->freeze_failures[i].unit);
		d->freeze_failures[i].reason = strdup(r->freeze_failures[i].reason);
		ok &= d->freeze_failures[i].unit && d->freeze_failures[i].reason;
	}
	return ok;
}

static struct ckpt_pull_of *pull_of_dup(const struct ckpt_pull_of *p)
{
	struct ckpt_pull_of *d = p ? calloc(1, sizeof(*d)) : NULL;
	if (!d)
		return NULL;
	d->ref = dup_or_null(p->ref);
	d->digest = dup_or_null(p->digest);
	d->roots = calloc(p->n_roots + 1, sizeof(*d->roots));
	bool ok = d->roots && (!p->ref || d->ref) && (!p->digest || d->digest);
	for (size_t i = 0; ok && i < p->n_roots; i++, d->n_roots++) {
		d->roots[i].image = strdup(p->roots[i].image);
		d->roots[i].local = strdup(p->roots[i].local);
		ok = d->roots[i].image && d->roots[i].local;
	}
	if (!ok)
		pull_of_free(TAKE_PTR(d));
	return d;
}

static bool extra_dup(struct ckpt_extra *d, const struct ckpt_extra *x)
{
	*d = *x;
	d->push = x->push ? malloc(sizeof(*d->push)) : NULL;
	if (d->push)
		memcpy(d->push, x->push, sizeof(*d->push));
	d->idem = x->idem ? malloc(sizeof(*d->idem)) : NULL;
	if (d->idem)
		memcpy(d->idem, x->idem, sizeof(*d->idem));
	d->pull_of = pull_of_dup(x->pull_of);
	d->unknown = copy_or_null(x->unknown);
	return (!x->push || d->push) && (!x->idem || d->idem) && (!x->pull_of || d->pull_of) &&
		(!x->unknown || d->unknown);
}

struct ckpt_record *record_dup(const struct ckpt_record *r)
{
	struct ckpt_record *d = malloc(sizeof(*d));
	if (!d)
		return NULL;
	*d = *r;
	d->refs = 1;
	d->name = strdup(r->name);
	d->backend = dup_or_null(r->backend);
	d->labels = copy_or_null(r->labels);
	d->roots = copy_or_null(r->roots);
	d->error.code = dup_or_null(r->error.code);
	d->error.detail = dup_or_null(r->error.detail);
	d->backend_data = copy_or_null(r->backend_data);
	/* both run: each replaces the pointers *d shares with r */
	bool ok = freeze_dup(d, r);
	ok = extra_dup(&d->extra, &r->extra) && ok;
	if (!ok || !d->name || (r->backend && !d->backend) || (r->labels && !d->labels) || (r->roots && !d->roots) ||
	    (r->error.code && !d->error.code) || (r->error.detail && !d->error.detail) ||
	    (r->backend_data && !d->backend_data)) {
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
