/* catalog.c: checkpoint records, one JSON file each under <state>/catalog/,
 * and the only place where a record meets JSON. In memory the records sit in
 * three sorted arrays of shared pointers: by id (get), newest first (list) and
 * by name then newest first (name lookup), plus per-status counters. */
#include "engine/catalog.h"

#include <sys/stat.h>

#define RECORD_MAX (256 * 1024)

struct catalog {
	pthread_mutex_t lock;
	int dirfd; /* <state>/catalog */
	const struct ckpt_record **by_id, **by_time, **by_name;
	size_t n, cap;
	struct catalog_stats stats;
};

static const char *const status_names[CKPT_STATUS_N] = {
	[CKPT_CREATING] = "creating",
	[CKPT_ACTIVE] = "active",
	[CKPT_DELETING] = "deleting",
	[CKPT_FAILED] = "failed",
};

const char *ckpt_status_name(enum ckpt_status s)
{
	return (unsigned)s < CKPT_STATUS_N ? status_names[s] : "unknown";
}

static int status_parse(const char *s, enum ckpt_status *ret)
{
	for (int i = 0; s && i < CKPT_STATUS_N; i++)
		if (!strcmp(s, status_names[i])) {
			*ret = (enum ckpt_status)i;
			return 0;
		}
	return -EINVAL;
}

/* ---- records ---- */

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

static json_t *time_or_null(const char *s)
{
	return s[0] ? json_string(s) : json_null();
}

static json_t *copy_or_empty_object(json_t *j)
{
	return j ? json_deep_copy(j) : json_object();
}

static json_t *copy_or_empty_array(json_t *j)
{
	return j ? json_deep_copy(j) : json_array();
}

/* Members in the order a fresh record always had them; unknown ones last. */
json_t *record_json(const struct ckpt_record *r, bool internal)
{
	json_t *o = json_object(), *v;
	const char *k;

	if (!o)
		return NULL;
	json_object_set_new(o, "checkpoint_id", json_string(r->id));
	json_object_set_new(o, "name", json_string(r->name));
	json_object_set_new(o, "status", json_string(ckpt_status_name(r->status)));
	json_object_set_new(o, "created_at", time_or_null(r->created_at));
	json_object_set_new(o, "expires_at", time_or_null(r->expires_at));
	json_object_set_new(o, "last_used_at", time_or_null(r->last_used_at));
	json_object_set_new(o, "size_bytes", json_integer(r->size_bytes));
	json_object_set_new(o, "duration_ms", json_integer(r->duration_ms));
	json_object_set_new(o, "backend", r->backend ? json_string(r->backend) : json_null());
	json_object_set_new(o, "labels", copy_or_empty_object(r->labels));
	json_object_set_new(o, "roots", copy_or_empty_array(r->roots));
	json_object_set_new(o, "frozen_services", copy_or_empty_array(r->frozen_services));
	json_object_set_new(o, "ttl_secs", json_integer(r->ttl_secs));
	if (r->freeze_failures)
		json_object_set_new(o, "freeze_failures", json_deep_copy(r->freeze_failures));
	if (r->error)
		json_object_set_new(o, "error", json_deep_copy(r->error));
	if (internal) {
		json_object_set_new(o, "_created_ms", json_integer(r->created_ms));
		json_object_set_new(o, "_expires_ms", json_integer(r->expires_ms));
		if (r->backend_data)
			json_object_set_new(o, "_backend", json_deep_copy(r->backend_data));
	}
	json_object_foreach(r->extra, k, v) if (internal || k[0] != '_') json_object_set_new(o, k, json_deep_copy(v));
	return o;
}

static const char *const known_members[] = {
	"checkpoint_id", "name",
	"status",        "created_at",
	"expires_at",    "last_used_at",
	"size_bytes",    "duration_ms",
	"backend",       "labels",
	"roots",         "frozen_services",
	"ttl_secs",      "freeze_failures",
	"error",         "_created_ms",
	"_expires_ms",   "_backend",
};

static bool member_known(const char *k)
{
	for (size_t i = 0; i < ARRAY_SIZE(known_members); i++)
		if (!strcmp(k, known_members[i]))
			return true;
	return false;
}

static void time_from_json(char *buf, size_t len, json_t *v)
{
	snprintf(buf, len, "%s", json_is_string(v) ? json_string_value(v) : "");
}

/* A member of the given type, copied; NULL when absent or of another type. */
static json_t *member_copy(json_t *j, const char *key, json_type type)
{
	json_t *v = json_object_get(j, key);
	return v && json_typeof(v) == type ? json_deep_copy(v) : NULL;
}

static void record_fill(struct ckpt_record *r, json_t *j)
{
	const char *k;
	json_t *v;

	record_set_backend(r, json_string_value(json_object_get(j, "backend")));
	time_from_json(r->created_at, sizeof(r->created_at), json_object_get(j, "created_at"));
	time_from_json(r->expires_at, sizeof(r->expires_at), json_object_get(j, "expires_at"));
	time_from_json(r->last_used_at, sizeof(r->last_used_at), json_object_get(j, "last_used_at"));
	r->size_bytes = json_integer_value(json_object_get(j, "size_bytes"));
	r->duration_ms = json_integer_value(json_object_get(j, "duration_ms"));
	r->ttl_secs = json_integer_value(json_object_get(j, "ttl_secs"));
	r->created_ms = json_integer_value(json_object_get(j, "_created_ms"));
	r->expires_ms = json_integer_value(json_object_get(j, "_expires_ms"));
	json_t *labels = member_copy(j, "labels", JSON_OBJECT), *roots = member_copy(j, "roots", JSON_ARRAY),
	       *frozen = member_copy(j, "frozen_services", JSON_ARRAY);
	if (labels)
		json_decref(r->labels), r->labels = labels;
	if (roots)
		json_decref(r->roots), r->roots = roots;
	if (frozen)
		json_decref(r->frozen_services), r->frozen_services = frozen;
	r->freeze_failures = member_copy(j, "freeze_failures", JSON_OBJECT);
	r->error = member_copy(j, "error", JSON_OBJECT);
	r->backend_data = copy_or_null(json_object_get(j, "_backend"));
	json_object_foreach(j, k, v)
	{
		if (member_known(k))
			continue;
		if (!r->extra)
			r->extra = json_object();
		json_object_set_new(r->extra, k, json_deep_copy(v));
	}
}

struct ckpt_record *record_from_json(json_t *j, const char **why)
{
	enum ckpt_status status = CKPT_ACTIVE;
	const char *id = json_string_value(json_object_get(j, "checkpoint_id"));
	const char *name = json_string_value(json_object_get(j, "name"));

	*why = NULL;
	if (!json_is_object(j))
		*why = "not a JSON object";
	else if (!id_valid(id))
		*why = "no valid checkpoint_id";
	else if (!name)
		*why = "no name";
	else if (!json_object_get(j, "status"))
		*why = "no status";
	else if (!json_is_string(json_object_get(j, "status")))
		*why = "status is not a string";
	else if (status_parse(json_string_value(json_object_get(j, "status")), &status) < 0)
		*why = "unknown status";
	if (*why)
		return NULL;
	struct ckpt_record *r = record_new(id, name, status);
	if (!r) {
		*why = "out of memory";
		return NULL;
	}
	record_fill(r, j);
	return r;
}

/* ---- the index ---- */

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

static const struct ckpt_record *index_find_id(struct catalog *c, const char *id)
{
	struct ckpt_record key = { 0 };
	snprintf(key.id, sizeof(key.id), "%s", id);
	size_t i = lower_bound(c->by_id, c->n, &key, cmp_id);
	return i < c->n && !strcmp(c->by_id[i]->id, id) ? c->by_id[i] : NULL;
}

static void stats_add(struct catalog *c, const struct ckpt_record *r, bool add)
{
	if (add) {
		c->stats.count[r->status]++;
		c->stats.bytes[r->status] += (uint64_t)r->size_bytes;
	} else {
		c->stats.count[r->status]--;
		c->stats.bytes[r->status] -= (uint64_t)r->size_bytes;
	}
}

static void index_remove(struct catalog *c, const struct ckpt_record *r)
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

static int index_grow(struct catalog *c)
{
	size_t cap = c->cap ? c->cap * 2 : 64;
	if (grow(&c->by_id, cap) < 0 || grow(&c->by_time, cap) < 0 || grow(&c->by_name, cap) < 0)
		return -ENOMEM;
	c->cap = cap;
	return 0;
}

/* Take over r (one reference), replacing any record with its id. Lock held. */
static int index_put(struct catalog *c, struct ckpt_record *r)
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

/* ---- the catalog ---- */

/* Load one record; files that are not whole records (a torn temp file, a
 * foreign file, a record without a valid status) are left out and logged,
 * temp files removed. */
static void catalog_load_one(struct catalog *c, const char *file)
{
	_cleanup_free_ char *buf = NULL;
	json_error_t jerr;
	const char *why = NULL;
	char want[64];
	size_t len;

	if (file[0] == '.') {
		if (strstr(file, ".tmp."))
			unlinkat(c->dirfd, file, 0);
		return;
	}
	if (read_file_at(c->dirfd, file, RECORD_MAX, &buf, &len) < 0) {
		log_warn("catalog: %s left out: cannot read it", file);
		return;
	}
	json_t *j = json_loadb(buf, len, 0, &jerr);
	if (!j) {
		log_warn("catalog: %s left out: not JSON (%s)", file, jerr.text);
		return;
	}
	struct ckpt_record *r = record_from_json(j, &why);
	json_decref(j);
	if (r) {
		snprintf(want, sizeof(want), "%s.json", r->id);
		if (strcmp(want, file))
			why = "its checkpoint_id does not match the file name";
	}
	if (why) {
		log_warn("catalog: %s left out: %s", file, why);
		record_unref(r);
		return;
	}
	index_put(c, r);
}

int catalog_open(int state_fd, struct catalog **ret, ckpt_error *err)
{
	struct catalog *c = calloc(1, sizeof(*c));
	DIR *d;
	struct dirent *de;

	if (!c)
		return -ENOMEM;
	c->dirfd = -1;
	pthread_mutex_init(&c->lock, NULL);
	if (mkdirat(state_fd, "catalog", 0700) < 0 && errno != EEXIST) {
		catalog_close(c);
		return err_set(err, errno, NULL, "cannot create catalog dir: %m");
	}
	c->dirfd = openat(state_fd, "catalog", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (c->dirfd < 0 || !(d = fdopendir(dup(c->dirfd)))) {
		int e = errno;
		catalog_close(c);
		return err_set(err, e, NULL, "cannot open catalog dir: %s", strerror(e));
	}
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			catalog_load_one(c, de->d_name);
	closedir(d);
	*ret = c;
	return 0;
}

void catalog_close(struct catalog *c)
{
	if (!c)
		return;
	if (c->dirfd >= 0)
		close(c->dirfd);
	for (size_t i = 0; i < c->n; i++)
		record_unref(c->by_id[i]);
	free(c->by_id);
	free(c->by_time);
	free(c->by_name);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int catalog_put(struct catalog *c, const struct ckpt_record *r, ckpt_error *err)
{
	char file[64];
	int ret;

	if (!id_valid(r->id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id");
	json_t *j = record_json(r, true);
	_cleanup_free_ char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(j);
	if (!text)
		return -ENOMEM;
	snprintf(file, sizeof(file), "%s.json", r->id);
	ret = write_file_atomic(c->dirfd, file, text, strlen(text), 0600);
	if (ret < 0)
		return err_set(err, -ret, ret == -ENOSPC || ret == -EDQUOT ? "insufficient_storage" : NULL,
			       "cannot write checkpoint record: %s", strerror(-ret));
	return catalog_put_volatile(c, r);
}

int catalog_put_volatile(struct catalog *c, const struct ckpt_record *r)
{
	struct ckpt_record *copy = record_dup(r);
	int ret;
	if (!copy)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	ret = index_put(c, copy);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int catalog_remove(struct catalog *c, const char *id, ckpt_error *err)
{
	char file[64];
	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id");
	snprintf(file, sizeof(file), "%s.json", id);
	if (unlinkat(c->dirfd, file, 0) < 0 && errno != ENOENT)
		return err_set(err, errno, NULL, "cannot remove checkpoint record: %m");
	fsync_dirfd(c->dirfd);
	pthread_mutex_lock(&c->lock);
	const struct ckpt_record *r = index_find_id(c, id);
	if (r)
		index_remove(c, r);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

const struct ckpt_record *catalog_get(struct catalog *c, const char *id)
{
	if (!id)
		return NULL;
	pthread_mutex_lock(&c->lock);
	const struct ckpt_record *r = record_ref(index_find_id(c, id));
	pthread_mutex_unlock(&c->lock);
	return r;
}

/* Range [*first, *end) of by_name holding that name, newest first. Lock held. */
static void name_range(struct catalog *c, const char *name, size_t *first, size_t *end)
{
	struct ckpt_record key = { .name = (char *)name, .created_ms = INT64_MAX };
	size_t i = lower_bound(c->by_name, c->n, &key, cmp_name), j = i;
	while (j < c->n && !strcmp(c->by_name[j]->name, name))
		j++;
	*first = i, *end = j;
}

const struct ckpt_record *catalog_find_name(struct catalog *c, const char *name)
{
	const struct ckpt_record *r = NULL;
	size_t i, end;

	if (!name)
		return NULL;
	pthread_mutex_lock(&c->lock);
	name_range(c, name, &i, &end);
	for (size_t k = i; k < end && !r; k++)
		if (c->by_name[k]->status == CKPT_ACTIVE)
			r = c->by_name[k];
	if (!r && i < end)
		r = c->by_name[i];
	record_ref(r);
	pthread_mutex_unlock(&c->lock);
	return r;
}

int catalog_list(struct catalog *c, const char *name, struct catalog_list *ret)
{
	size_t first = 0, end;

	pthread_mutex_lock(&c->lock);
	const struct ckpt_record **src = name ? c->by_name : c->by_time;
	if (name)
		name_range(c, name, &first, &end);
	else
		end = c->n;
	ret->n = end - first;
	ret->v = calloc(ret->n + 1, sizeof(*ret->v));
	if (!ret->v) {
		pthread_mutex_unlock(&c->lock);
		ret->n = 0;
		return -ENOMEM;
	}
	for (size_t i = 0; i < ret->n; i++)
		ret->v[i] = record_ref(src[first + i]);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

void catalog_list_free(struct catalog_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		record_unref(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

void catalog_stats(struct catalog *c, struct catalog_stats *ret)
{
	pthread_mutex_lock(&c->lock);
	*ret = c->stats;
	pthread_mutex_unlock(&c->lock);
}

size_t catalog_count(struct catalog *c)
{
	pthread_mutex_lock(&c->lock);
	size_t n = c->n;
	pthread_mutex_unlock(&c->lock);
	return n;
}
