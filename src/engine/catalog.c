/* catalog.c: checkpoint records, one JSON file each under <state>/catalog/,
 * and the only place where a record meets JSON. The records in memory and
 * their index are catalog_index.c's; this file holds the lock around them. */
#include "engine/catalog.h"
#include "engine/catalog_index.h"
#include "lib/walk.h"

#include <sys/stat.h>
#include "lib/failpoint.h"

#define RECORD_MAX (256 * 1024)

struct catalog {
	pthread_mutex_t lock;
	int dirfd; /* <state>/catalog */
	struct catalog_index ix;
	char (*left_out)[32]; /* ids of record files left out at load */
	size_t n_left_out;
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
	json_object_foreach (r->extra, k, v)
		if (internal || k[0] != '_')
			json_object_set_new(o, k, json_deep_copy(v));
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
	if (json_object_get(j, "_backend"))
		r->backend_data = json_deep_copy(json_object_get(j, "_backend"));
	json_object_foreach (j, k, v) {
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

static struct ckpt_record *catalog_read(struct catalog *c, const char *file, const char **why)
{
	_cleanup_free_ char *buf = NULL;
	char want[64];
	size_t len;

	if (read_file_at(c->dirfd, file, RECORD_MAX, &buf, &len) < 0) {
		*why = "cannot read it";
		return NULL;
	}
	json_t *j = json_loadb(buf, len, 0, NULL);
	if (!j) {
		*why = "not JSON";
		return NULL;
	}
	struct ckpt_record *r = record_from_json(j, why);
	json_decref(j);
	if (r) {
		snprintf(want, sizeof(want), "%s.json", r->id);
		if (strcmp(want, file)) {
			*why = "its checkpoint_id does not match the file name";
			record_unref(TAKE_PTR(r));
		}
	}
	return r;
}

/* A file named like a record that was left out: remember its id, so that
 * recovery keeps that checkpoint's data until someone looks at the file. */
static void catalog_left_out(struct catalog *c, const char *file)
{
	char id[32];
	size_t len = strlen(file);
	if (len < 5 || len - 5 >= sizeof(id) || strcmp(file + len - 5, ".json"))
		return;
	memcpy(id, file, len - 5);
	id[len - 5] = '\0';
	if (!id_valid(id))
		return;
	char(*v)[32] = realloc(c->left_out, (c->n_left_out + 1) * sizeof(*v));
	if (!v)
		return;
	c->left_out = v;
	memcpy(v[c->n_left_out++], id, sizeof(id));
}

/* Load one record; files that are not whole records (a torn temp file, a
 * foreign file, a record without a valid status) are left out and logged,
 * temp files removed. */
static void catalog_load_one(struct catalog *c, const char *file)
{
	const char *why = NULL;

	if (file[0] == '.') {
		if (strstr(file, ".tmp."))
			unlinkat(c->dirfd, file, 0);
		return;
	}
	struct ckpt_record *r = catalog_read(c, file, &why);
	if (!r) {
		log_warn("catalog: %s left out: %s", file, why);
		catalog_left_out(c, file);
		return;
	}
	catalog_index_put(&c->ix, r);
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
	int made = mkdirat_durable(state_fd, "catalog", 0700);
	if (made < 0) {
		catalog_close(c);
		return err_set(err, -made, NULL, "cannot create catalog dir: %s", strerror(-made));
	}
	c->dirfd = openat(state_fd, "catalog", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	int q = c->dirfd < 0 ? -errno : walk_open(c->dirfd, NULL, &d);
	if (q < 0) {
		catalog_close(c);
		return err_set(err, -q, NULL, "cannot open catalog dir: %s", strerror(-q));
	}
	while ((de = walk_next(d)))
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
	catalog_index_free(&c->ix);
	free(c->left_out);
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
	ret = FAILPOINT_AROUND("catalog.put.write", write_file_atomic(c->dirfd, file, text, strlen(text), 0600));
	if (ret < 0)
		return err_set(err, -ret, NULL, "cannot write checkpoint record: %s", strerror(-ret));
	return catalog_put_volatile(c, r);
}

int catalog_put_volatile(struct catalog *c, const struct ckpt_record *r)
{
	struct ckpt_record *copy = record_dup(r);
	int ret;
	if (!copy)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	ret = catalog_index_put(&c->ix, copy);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

int catalog_remove(struct catalog *c, const char *id, ckpt_error *err)
{
	char file[64];
	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id");
	snprintf(file, sizeof(file), "%s.json", id);
	if (FAILPOINT_AROUND("catalog.remove.unlink", unlinkat(c->dirfd, file, 0)) < 0 && errno != ENOENT)
		return err_set(err, errno, NULL, "cannot remove checkpoint record: %m");
	FAILPOINT_AROUND("catalog.remove.fsync", fsync_dirfd(c->dirfd));
	pthread_mutex_lock(&c->lock);
	catalog_index_remove(&c->ix, id);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

const struct ckpt_record *catalog_get(struct catalog *c, const char *id)
{
	if (!id)
		return NULL;
	pthread_mutex_lock(&c->lock);
	const struct ckpt_record *r = record_ref(catalog_index_get(&c->ix, id));
	pthread_mutex_unlock(&c->lock);
	return r;
}

const struct ckpt_record *catalog_find_name(struct catalog *c, const char *name)
{
	if (!name)
		return NULL;
	pthread_mutex_lock(&c->lock);
	const struct ckpt_record *r = record_ref(catalog_index_find_name(&c->ix, name));
	pthread_mutex_unlock(&c->lock);
	return r;
}

int catalog_list(struct catalog *c, const char *name, struct catalog_list *ret)
{
	const struct ckpt_record *const *v;

	pthread_mutex_lock(&c->lock);
	ret->n = catalog_index_range(&c->ix, name, &v);
	ret->v = calloc(ret->n + 1, sizeof(*ret->v));
	for (size_t i = 0; ret->v && i < ret->n; i++)
		ret->v[i] = record_ref(v[i]);
	pthread_mutex_unlock(&c->lock);
	if (!ret->v) {
		ret->n = 0;
		return -ENOMEM;
	}
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
	*ret = c->ix.stats;
	pthread_mutex_unlock(&c->lock);
}

size_t catalog_count(struct catalog *c)
{
	pthread_mutex_lock(&c->lock);
	size_t n = c->ix.n;
	pthread_mutex_unlock(&c->lock);
	return n;
}

size_t catalog_left_out_ids(struct catalog *c, const char (**ret)[32])
{
	*ret = (const char(*)[32])c->left_out;
	return c->n_left_out;
}
