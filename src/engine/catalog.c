/* catalog.c: checkpoint records, one JSON file each under <state>/catalog/,
 * and the only place where a record meets JSON. The records in memory and
 * their index are catalog_index.c's; this file holds the lock around them. */
#include "engine/catalog.h"
#include "engine/catalog_index.h"
#include "engine/engine_oci.h"
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

/* {unit: reason} */
static json_t *failures_json(const struct ckpt_record *r)
{
	json_t *o = json_object();
	for (size_t i = 0; o && i < r->n_freeze_failures; i++)
		json_object_set_new(o, r->freeze_failures[i].unit, json_string(r->freeze_failures[i].reason));
	return o;
}

json_t *record_push_json(const struct push_outcome *o)
{
	if (o->state == PUSH_DONE)
		return json_pack("{s:s, s:s, s:I, s:I, s:s}", "ref", o->ref, "digest", o->digest, "uploaded_bytes",
				 (json_int_t)o->uploaded_bytes, "reused_bytes", (json_int_t)o->reused_bytes, "status",
				 "done");
	if (o->state == PUSH_FAILED && o->code[0])
		return json_pack("{s:s, s:s, s:{s:s, s:s}}", "ref", o->ref, "status", "failed", "error", "code",
				 o->code, "detail", o->detail);
	return json_pack("{s:s, s:s}", "ref", o->ref, "status", o->state == PUSH_FAILED ? "failed" : "pushing");
}

static json_t *pull_of_json(const struct ckpt_pull_of *p)
{
	json_t *roots = json_object();
	for (size_t i = 0; roots && i < p->n_roots; i++)
		json_object_set_new(roots, p->roots[i].image, json_string(p->roots[i].local));
	return json_pack("{s:s?, s:s?, s:o?}", "ref", p->ref, "digest", p->digest, "roots", roots);
}

/* The members a create, push, pull or import added, then the unknown ones. */
static void extra_json(json_t *o, const struct ckpt_extra *x, bool internal)
{
	const char *k;
	json_t *v;

	if (x->has_freeze_ms)
		json_object_set_new(o, "freeze_ms", json_integer(x->freeze_ms));
	if (x->has_queue_ms)
		json_object_set_new(o, "queue_ms", json_integer(x->queue_ms));
	if (x->push)
		json_object_set_new(o, "push", record_push_json(x->push));
	if (x->pull_of)
		json_object_set_new(o, "pull_of", pull_of_json(x->pull_of));
	if (x->has_import_of)
		json_object_set_new(o, "import_of", x->import_of[0] ? json_string(x->import_of) : json_null());
	if (x->idem && internal)
		json_object_set_new(o, "_idempotency",
				    json_pack("{s:s, s:s, s:s, s:i}", "key", x->idem->key, "file", x->idem->file,
					      "fingerprint", x->idem->fingerprint, "status", x->idem->status));
	/* one the struct holds now (a push after a "push" this version could
	 * not read) wins over the member as read */
	json_object_foreach (x->unknown, k, v)
		if ((internal || k[0] != '_') && !json_object_get(o, k))
			json_object_set_new(o, k, json_deep_copy(v));
}

/* Members in the order a fresh record always had them; unknown ones last. */
json_t *record_json(const struct ckpt_record *r, bool internal)
{
	json_t *o = json_object();

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
	json_object_set_new(o, "frozen_services", services_strv_json(&r->frozen_services));
	json_object_set_new(o, "ttl_secs", json_integer(r->ttl_secs));
	if (r->n_freeze_failures)
		json_object_set_new(o, "freeze_failures", failures_json(r));
	if (r->error.code)
		json_object_set_new(o, "error",
				    json_pack("{s:s, s:s}", "code", r->error.code, "detail", r->error.detail ?: ""));
	if (internal) {
		json_object_set_new(o, "_created_ms", json_integer(r->created_ms));
		json_object_set_new(o, "_expires_ms", json_integer(r->expires_ms));
		if (r->backend_data)
			json_object_set_new(o, "_backend", json_deep_copy(r->backend_data));
	}
	extra_json(o, &r->extra, internal);
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

static void freeze_from_json(struct ckpt_record *r, json_t *j)
{
	json_t *failures = json_object_get(j, "freeze_failures"), *v;
	const char *k;

	services_strv_from_json(&r->frozen_services, json_object_get(j, "frozen_services"));
	size_t n = json_object_size(failures);
	if (!n || !(r->freeze_failures = calloc(n, sizeof(*r->freeze_failures))))
		return;
	json_object_foreach (failures, k, v) {
		struct svc_failure *f = &r->freeze_failures[r->n_freeze_failures];
		if (!json_is_string(v) || !(f->unit = strdup(k)))
			continue;
		if ((f->reason = strdup(json_string_value(v))))
			r->n_freeze_failures++;
		else
			free(f->unit);
	}
}

static void error_from_json(struct ckpt_record *r, json_t *j)
{
	json_t *e = json_object_get(j, "error");
	const char *code = json_string_value(json_object_get(e, "code"));
	const char *detail = json_string_value(json_object_get(e, "detail"));
	if (code) {
		r->error.code = strdup(code);
		r->error.detail = strdup(detail ?: "");
	}
}

/* A member's value read back from its struct writes the same JSON: else the
 * member stays as read, so a record file rewritten keeps its bytes. */
static bool same_json(json_t *made, json_t *read)
{
	bool same = made && json_equal(made, read);
	json_decref(made);
	return same;
}

static struct push_outcome *push_from_json(json_t *v)
{
	const char *st = json_string_value(json_object_get(v, "status"));
	json_t *error = json_object_get(v, "error");
	struct push_outcome o = { .state = !st                     ? 0
					  : !strcmp(st, "pushing") ? PUSH_PUSHING
					  : !strcmp(st, "done")    ? PUSH_DONE
					  : !strcmp(st, "failed")  ? PUSH_FAILED
								   : 0 };
	snprintf(o.ref, sizeof(o.ref), "%s", json_string_value(json_object_get(v, "ref")) ?: "");
	snprintf(o.digest, sizeof(o.digest), "%s", json_string_value(json_object_get(v, "digest")) ?: "");
	o.uploaded_bytes = (uint64_t)json_integer_value(json_object_get(v, "uploaded_bytes"));
	o.reused_bytes = (uint64_t)json_integer_value(json_object_get(v, "reused_bytes"));
	snprintf(o.code, sizeof(o.code), "%s", json_string_value(json_object_get(error, "code")) ?: "");
	snprintf(o.detail, sizeof(o.detail), "%s", json_string_value(json_object_get(error, "detail")) ?: "");
	struct push_outcome *ret = o.state && same_json(record_push_json(&o), v) ? malloc(sizeof(*ret)) : NULL;
	if (ret)
		*ret = o;
	return ret;
}

/* NULL unless v is {ref, digest, roots} as pull_of_json writes it. */
static struct ckpt_pull_of *pull_of_from_json(json_t *v)
{
	json_t *roots = json_object_get(v, "roots"), *l;
	const char *ref = json_string_value(json_object_get(v, "ref")), *k;
	const char *digest = json_string_value(json_object_get(v, "digest"));
	struct ckpt_pull_of *ret =
		json_is_object(v) && ref && digest && json_is_object(roots) ? calloc(1, sizeof(*ret)) : NULL;
	bool ok = ret && (ret->ref = strdup(ref)) && (ret->digest = strdup(digest)) &&
		(ret->roots = calloc(json_object_size(roots) + 1, sizeof(*ret->roots)));
	json_object_foreach (roots, k, l) {
		struct pull_root *m = ok ? &ret->roots[ret->n_roots] : NULL;
		ok = ok && json_is_string(l) && (m->image = strdup(k)) && (m->local = strdup(json_string_value(l)));
		if (m && m->image)
			ret->n_roots++; /* freed with the rest */
	}
	if (ok && same_json(pull_of_json(ret), v))
		return ret;
	struct ckpt_extra drop = { .pull_of = ret };
	ckpt_extra_free(&drop);
	return NULL;
}

/* The first n characters of s are lowercase hex digits. */
static bool hex_lower(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!s[i] || !strchr("0123456789abcdef", s[i]))
			return false;
	return true;
}

/* "_idempotency": its file name becomes a path, so only what
 * engine_idem_begin makes: 64 lowercase hex digits and ".json". The key is
 * only written back into that file's JSON. */
static struct ckpt_idem *idem_from_json(json_t *v)
{
	const char *key = json_string_value(json_object_get(v, "key"));
	const char *file = json_string_value(json_object_get(v, "file"));
	const char *fp = json_string_value(json_object_get(v, "fingerprint"));
	json_int_t status = json_integer_value(json_object_get(v, "status"));
	if (!key || !file || !fp || !*key || strlen(key) > 255 || strlen(file) != 69 || !hex_lower(file, 64) ||
	    strcmp(file + 64, ".json") != 0 || strlen(fp) != 64 || !hex_lower(fp, 64) ||
	    (status != 201 && status != 202))
		return NULL;
	struct ckpt_idem *d = calloc(1, sizeof(*d));
	if (d) {
		snprintf(d->key, sizeof(d->key), "%s", key);
		snprintf(d->file, sizeof(d->file), "%s", file);
		snprintf(d->fingerprint, sizeof(d->fingerprint), "%s", fp);
		d->status = (int)status;
	}
	return d;
}

/* Takes member k into x when it is one of the extras; false: unknown. */
static bool extra_take(struct ckpt_extra *x, const char *k, json_t *v)
{
	if (!strcmp(k, "freeze_ms") && json_is_integer(v)) {
		x->freeze_ms = json_integer_value(v);
		return x->has_freeze_ms = true;
	}
	if (!strcmp(k, "queue_ms") && json_is_integer(v)) {
		x->queue_ms = json_integer_value(v);
		return x->has_queue_ms = true;
	}
	if (!strcmp(k, "push"))
		return (x->push = push_from_json(v)) != NULL;
	if (!strcmp(k, "pull_of"))
		return (x->pull_of = pull_of_from_json(v)) != NULL;
	if (!strcmp(k, "_idempotency"))
		return (x->idem = idem_from_json(v)) != NULL;
	if (!strcmp(k, "import_of") && (json_is_null(v) || (json_is_string(v) && id_valid(json_string_value(v))))) {
		snprintf(x->import_of, sizeof(x->import_of), "%s", json_string_value(v) ?: "");
		return x->has_import_of = true;
	}
	return false;
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
	json_t *labels = member_copy(j, "labels", JSON_OBJECT), *roots = member_copy(j, "roots", JSON_ARRAY);
	if (labels)
		json_decref(r->labels), r->labels = labels;
	if (roots)
		json_decref(r->roots), r->roots = roots;
	freeze_from_json(r, j);
	error_from_json(r, j);
	if (json_object_get(j, "_backend"))
		r->backend_data = json_deep_copy(json_object_get(j, "_backend"));
	json_object_foreach (j, k, v) {
		if (member_known(k) || extra_take(&r->extra, k, v))
			continue;
		if (!r->extra.unknown)
			r->extra.unknown = json_object();
		json_object_set_new(r->extra.unknown, k, json_deep_copy(v));
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

/* r's file name (<id>.json) and text, as the catalog writes them. */
static int catalog_put_text(const struct ckpt_record *r, char file[static 64], char **ret_text, ckpt_error *err)
{
	if (!id_valid(r->id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id");
	json_t *j = record_json(r, true);
	*ret_text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(j);
	snprintf(file, 64, "%s.json", r->id);
	return *ret_text ? 0 : -ENOMEM;
}

/* The record's file written with one syncfs of the catalog's file system
 * for the temp file's fsync; in the same barrier it makes durable what the
 * caller left unsynced there (a create's new layers). Only after it ends
 * is the record renamed into place, so a crash before leaves no record
 * (the temp file is swept at start: catalog_load_one), and a record that
 * exists names only what that syncfs made durable. The rename must not
 * come first: ext4 may commit a rename before the data written ahead of
 * it. */
static int catalog_write_syncfs(struct catalog *c, const char *file, const char *text)
{
	char tmp[WRITE_FILE_TMP_MAX];
	int ret = write_file_stage(c->dirfd, file, text, strlen(text), 0600, tmp);
	if (ret == 0 && FAILPOINT_AROUND("catalog.put.syncfs", syncfs(c->dirfd)) < 0) {
		ret = -errno;
		unlinkat(c->dirfd, tmp, 0);
	}
	return ret < 0 ? ret : FAILPOINT_AROUND("catalog.put.commit", write_file_commit(c->dirfd, tmp, file));
}

int catalog_write(struct catalog *c, const struct ckpt_record *r, bool by_syncfs, ckpt_error *err)
{
	char file[64];
	_cleanup_free_ char *text = NULL;
	int ret = catalog_put_text(r, file, &text, err);
	if (ret < 0)
		return ret;
	ret = by_syncfs
		? catalog_write_syncfs(c, file, text)
		: FAILPOINT_AROUND("catalog.put.write", write_file_atomic(c->dirfd, file, text, strlen(text), 0600));
	if (ret < 0)
		return err_set(err, -ret, NULL, "cannot write checkpoint record: %s", strerror(-ret));
	return 0;
}

int catalog_put(struct catalog *c, const struct ckpt_record *r, ckpt_error *err)
{
	int ret = catalog_write(c, r, false, err);
	return ret < 0 ? ret : catalog_put_volatile(c, r);
}

dev_t catalog_dev(struct catalog *c)
{
	struct stat st;
	return fstat(c->dirfd, &st) == 0 ? st.st_dev : 0;
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
