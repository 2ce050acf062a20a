/* catalog.c: checkpoint records, one JSON file each under <state>/catalog/. */
#include "engine/catalog.h"
#include "lib/walk.h"

#include <sys/stat.h>

#define RECORD_MAX (256 * 1024)

struct catalog {
	pthread_mutex_t lock;
	int dirfd;       /* <state>/catalog */
	json_t *records; /* object: id -> record */
};

const char *record_id(json_t *r)
{
	return json_string_value(json_object_get(r, "checkpoint_id"));
}

int64_t record_int(json_t *r, const char *key)
{
	return json_integer_value(json_object_get(r, key));
}

json_t *record_public(json_t *r)
{
	json_t *out = json_object(), *v;
	const char *k;
	json_object_foreach(r, k, v) if (k[0] != '_') json_object_set_new(out, k, json_deep_copy(v));
	return out;
}

static bool record_valid(json_t *r, const char *file)
{
	const char *id = record_id(r);
	char want[64];
	if (!json_is_object(r) || !id_valid(id) || !json_is_string(json_object_get(r, "name")))
		return false;
	snprintf(want, sizeof(want), "%s.json", id);
	return !strcmp(want, file);
}

/* Load one record; files that are not whole records (a torn temp file, a
 * foreign file) are left out, temp files removed. */
static void catalog_load_one(struct catalog *c, const char *file)
{
	_cleanup_free_ char *buf = NULL;
	json_error_t jerr;
	size_t len;

	if (file[0] == '.') {
		if (strstr(file, ".tmp."))
			unlinkat(c->dirfd, file, 0);
		return;
	}
	if (read_file_at(c->dirfd, file, RECORD_MAX, &buf, &len) < 0)
		return;
	json_t *r = json_loadb(buf, len, 0, &jerr);
	if (!r)
		return;
	if (!record_valid(r, file)) {
		json_decref(r);
		return;
	}
	json_object_set_new(c->records, record_id(r), r);
}

int catalog_open(int state_fd, struct catalog **ret, ckpt_error *err)
{
	struct catalog *c = calloc(1, sizeof(*c));
	DIR *d;
	struct dirent *de;

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	c->records = json_object();
	if (mkdirat(state_fd, "catalog", 0700) < 0 && errno != EEXIST) {
		catalog_close(c);
		return err_set(err, errno, NULL, "cannot create catalog dir: %m");
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
	json_decref(c->records);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int catalog_put(struct catalog *c, json_t *record, ckpt_error *err)
{
	const char *id = record_id(record);
	char file[64];
	int r;

	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id");
	_cleanup_free_ char *text = json_dumps(record, JSON_COMPACT | JSON_SORT_KEYS);
	if (!text)
		return -ENOMEM;
	snprintf(file, sizeof(file), "%s.json", id);
	r = write_file_atomic(c->dirfd, file, text, strlen(text), 0600);
	if (r < 0)
		return err_set(err, -r, r == -ENOSPC || r == -EDQUOT ? "insufficient_storage" : NULL,
			       "cannot write checkpoint record: %s", strerror(-r));
	return catalog_put_volatile(c, record);
}

int catalog_put_volatile(struct catalog *c, json_t *record)
{
	json_t *copy = json_deep_copy(record);
	if (!copy)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	json_object_set_new(c->records, record_id(record), copy);
	pthread_mutex_unlock(&c->lock);
	return 0;
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
	json_object_del(c->records, id);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

json_t *catalog_get(struct catalog *c, const char *id)
{
	pthread_mutex_lock(&c->lock);
	json_t *r = json_deep_copy(json_object_get(c->records, id));
	pthread_mutex_unlock(&c->lock);
	return r;
}

/* Newest first: by creation time, then by id (ids sort by time too). */
static int record_cmp(const void *a, const void *b)
{
	json_t *ra = *(json_t *const *)a, *rb = *(json_t *const *)b;
	int64_t ta = record_int(ra, "_created_ms"), tb = record_int(rb, "_created_ms");
	if (ta != tb)
		return ta < tb ? 1 : -1;
	return -strcmp(record_id(ra), record_id(rb));
}

json_t *catalog_list(struct catalog *c, const char *name)
{
	json_t *out = json_array(), *v;
	const char *k;
	size_t n = 0;

	pthread_mutex_lock(&c->lock);
	json_t **v_arr = calloc(json_object_size(c->records) + 1, sizeof(*v_arr));
	json_object_foreach(c->records, k, v)
	{
		if (!v_arr)
			break;
		if (name && strcmp(json_string_value(json_object_get(v, "name")), name))
			continue;
		v_arr[n++] = json_deep_copy(v);
	}
	pthread_mutex_unlock(&c->lock);
	if (!v_arr)
		return out;
	qsort(v_arr, n, sizeof(*v_arr), record_cmp);
	for (size_t i = 0; i < n; i++)
		json_array_append_new(out, v_arr[i]);
	free(v_arr);
	return out;
}

size_t catalog_count(struct catalog *c)
{
	pthread_mutex_lock(&c->lock);
	size_t n = json_object_size(c->records);
	pthread_mutex_unlock(&c->lock);
	return n;
}
