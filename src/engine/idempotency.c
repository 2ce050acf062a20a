/* idempotency.c: Idempotency-Key bookkeeping. A key names one mutating
 * request (method, path and body, hashed as its fingerprint); its first
 * answer is kept in <state>/idempotency/<sha256(key)>.json, written
 * crash-safely, so that a client that retries after a timeout, a 503 or a
 * restart of the daemon gets that answer again instead of a second checkpoint
 * or a second restore. Keys running now live in memory only: a daemon killed
 * mid-request forgets them and a retry runs the request again. */
#include <dirent.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <sys/stat.h>

#include "config.h"
#include "engine/engine_internal.h"

#define IDEM_DIR "idempotency"
#define IDEM_MAX_FILE (2 * 1024 * 1024)

struct idem_running {
	char name[72]; /* file name: sha256(key) in hex + ".json" */
	char fingerprint[65];
	char *body; /* the answer, once there is one to keep (engine_idem_answer) */
	int status;
	bool problem;
	struct idem_running *next;
};

bool idem_key_valid(const char *key)
{
	size_t n = strlen(key);
	if (n == 0 || n > IDEM_KEY_MAX)
		return false;
	for (const char *p = key; *p; p++)
		if (*p < 0x20 || *p > 0x7e)
			return false;
	return true;
}

static void sha256_hex(const void *parts[], const size_t lens[], size_t n, char out[65])
{
	struct sha256_ctx c;
	uint8_t d[SHA256_DIGEST_SIZE];
	sha256_init(&c);
	for (size_t i = 0; i < n; i++)
		sha256_update(&c, lens[i], parts[i]);
	sha256_digest(&c, sizeof(d), d);
	for (size_t i = 0; i < sizeof(d); i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
}

int engine_idem_open(struct engine *e, ckpt_error *err)
{
	int made = mkdirat_durable(e->state_fd, IDEM_DIR, 0700);
	if (made < 0)
		return err_set(err, -made, NULL, "cannot create %s/%s: %s", e->cfg->state_dir, IDEM_DIR,
			       strerror(-made));
	e->idem_fd = openat(e->state_fd, IDEM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (e->idem_fd < 0)
		return err_set(err, errno, NULL, "cannot open %s/%s: %m", e->cfg->state_dir, IDEM_DIR);
	write_file_atomic_sweep(e->idem_fd); /* we hold the state lock */
	return 0;
}

void engine_idem_close(struct engine *e)
{
	while (e->idem_running) {
		struct idem_running *r = e->idem_running;
		e->idem_running = r->next;
		free(r->body);
		free(r);
	}
	if (e->idem_fd >= 0)
		close(e->idem_fd);
}

static bool idem_file_expired(struct engine *e, const char *name, int64_t now)
{
	struct stat st;
	if (fstatat(e->idem_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return true;
	return (int64_t)st.st_mtim.tv_sec * 1000 + IDEM_TTL_SECS * 1000 < now;
}

/* The stored answer for name, if any and not expired. */
static json_t *idem_load(struct engine *e, const char *name)
{
	char *data = NULL;
	size_t len = 0;
	if (idem_file_expired(e, name, now_ms()) || read_file_at(e->idem_fd, name, IDEM_MAX_FILE, &data, &len) < 0)
		return NULL;
	json_t *j = json_loadb(data, len, 0, NULL);
	free(data);
	if (j &&
	    (!json_is_integer(json_object_get(j, "status")) || !json_is_string(json_object_get(j, "body")) ||
	     !json_is_string(json_object_get(j, "fingerprint")))) {
		json_decref(j);
		return NULL;
	}
	return j;
}

static void idem_ticket(const char *key, const char *method, const char *path, const char *body_sha256,
			struct idem_ticket *t)
{
	const void *kp[] = { key };
	const size_t kl[] = { strlen(key) };
	const void *fp[] = { method, "\n", path, "\n", body_sha256 };
	const size_t fl[] = { strlen(method), 1, strlen(path), 1, strlen(body_sha256) };
	char hex[65];

	*t = (struct idem_ticket){ 0 };
	sha256_hex(kp, kl, 1, hex);
	snprintf(t->name, sizeof(t->name), "%s.json", hex);
	sha256_hex(fp, fl, ARRAY_SIZE(fp), t->fingerprint);
}

void engine_idem_of_request(const char *key, const char *method, const char *path, const char *body_sha256, int status,
			    struct ckpt_idem *ret)
{
	struct idem_ticket t;
	idem_ticket(key, method, path, body_sha256, &t);
	*ret = (struct ckpt_idem){ .status = status };
	snprintf(ret->key, sizeof(ret->key), "%s", key);
	memcpy(ret->file, t.name, sizeof(ret->file));
	memcpy(ret->fingerprint, t.fingerprint, sizeof(ret->fingerprint));
}

int engine_idem_begin(struct engine *e, const char *key, const char *method, const char *path, const char *body_sha256,
		      struct idem_ticket *t, struct idem_answer *ret)
{
	int state = IDEM_FRESH;

	*ret = (struct idem_answer){ 0 };
	idem_ticket(key, method, path, body_sha256, t);

	pthread_mutex_lock(&e->idem_lock);
	for (struct idem_running *r = e->idem_running; r; r = r->next)
		if (!strcmp(r->name, t->name)) {
			state = strcmp(r->fingerprint, t->fingerprint) ? IDEM_MISMATCH
				: r->body                              ? IDEM_REPLAY
								       : IDEM_RUNNING;
			if (state == IDEM_REPLAY) { /* answered, its file still being written */
				ret->status = r->status;
				ret->problem = r->problem;
				if (!(ret->body = strdup(r->body)))
					state = -ENOMEM;
			}
			goto out;
		}
	json_t *j = idem_load(e, t->name);
	if (j) {
		if (strcmp(json_string_value(json_object_get(j, "fingerprint")), t->fingerprint)) {
			state = IDEM_MISMATCH;
		} else {
			state = IDEM_REPLAY;
			ret->status = (int)json_integer_value(json_object_get(j, "status"));
			ret->problem = json_is_true(json_object_get(j, "problem"));
			ret->body = strdup(json_string_value(json_object_get(j, "body")));
			if (!ret->body)
				state = -ENOMEM;
		}
		json_decref(j);
		goto out;
	}
	struct idem_running *r = calloc(1, sizeof(*r));
	if (!r) {
		state = -ENOMEM;
		goto out;
	}
	memcpy(r->name, t->name, sizeof(r->name));
	memcpy(r->fingerprint, t->fingerprint, sizeof(r->fingerprint));
	r->next = e->idem_running;
	e->idem_running = r;
	t->run = r;
	t->active = true;
out:
	pthread_mutex_unlock(&e->idem_lock);
	return state;
}

void engine_idem_answer(struct engine *e, struct idem_ticket *t, int status, const char *body, bool problem)
{
	if (!t->active || !body)
		return;
	pthread_mutex_lock(&e->idem_lock);
	struct idem_running *r = t->run;
	if (!r->body && (r->body = strdup(body))) {
		r->status = status;
		r->problem = problem;
	}
	pthread_mutex_unlock(&e->idem_lock);
}

/* The key's answer as its file holds it; NULL: out of memory. */
static char *idem_file_text(const char *key, const char *fingerprint, int64_t created_ms, int status, const char *body,
			    bool problem)
{
	json_t *j = json_pack("{s:s, s:s, s:I, s:i, s:b, s:s}", "key", key, "fingerprint", fingerprint, "created_ms",
			      (json_int_t)created_ms, "status", status, "problem", problem, "body", body);
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return s;
}

void engine_idem_finish(struct engine *e, struct idem_ticket *t, const char *key, int status, const char *body,
			bool problem)
{
	bool in_memory = false;
	if (!t->active)
		return;
	if (body) {
		_cleanup_free_ char *s = idem_file_text(key, t->fingerprint, now_ms(), status, body, problem);
		int r = s ? write_file_atomic(e->idem_fd, t->name, s, strlen(s), 0600) : -ENOMEM;
		pthread_mutex_lock(&e->idem_lock);
		struct idem_running *run = t->run;
		if (r < 0 && !run->body && (run->body = strdup(body))) {
			run->status = status;
			run->problem = problem;
		}
		in_memory = r < 0 && run->body; /* a repeat is answered all the same, until the daemon stops */
		pthread_mutex_unlock(&e->idem_lock);
		if (r < 0)
			log_warn("cannot remember idempotency key \"%s\": %s%s", key, strerror(-r),
				 in_memory ? "; its answer is kept in memory until ckptd stops" : "");
	}
	pthread_mutex_lock(&e->idem_lock);
	for (struct idem_running **p = &e->idem_running; *p && !in_memory; p = &(*p)->next)
		if (*p == t->run) {
			*p = t->run->next;
			free(t->run->body);
			free(t->run);
			break;
		}
	pthread_mutex_unlock(&e->idem_lock);
	t->run = NULL;
	t->active = false;
}

/* One record's key: its file written with the answer the create gave (the
 * checkpoint as it is now), dated from the create, unless there is one. */
static void idem_from_record(struct engine *e, const struct ckpt_record *rec, int64_t now)
{
	const struct ckpt_idem *k = rec->extra.idem;
	if (!k || rec->status != CKPT_ACTIVE || rec->created_ms + IDEM_TTL_SECS * 1000LL < now ||
	    faccessat(e->idem_fd, k->file, F_OK, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
		return;
	json_t *view = record_json(rec, false);
	_cleanup_free_ char *body = view ? json_dumps(view, JSON_COMPACT) : NULL;
	json_decref(view);
	_cleanup_free_ char *s =
		body ? idem_file_text(k->key, k->fingerprint, rec->created_ms, k->status, body, false) : NULL;
	int r = s ? write_file_atomic(e->idem_fd, k->file, s, strlen(s), 0600) : -ENOMEM;
	struct timespec at[2] = { { .tv_sec = rec->created_ms / 1000, .tv_nsec = rec->created_ms % 1000 * 1000000 } };
	at[1] = at[0]; /* its 24 hours count from the create, as the file's would have */
	if (r == 0)
		(void)utimensat(e->idem_fd, k->file, at, AT_SYMLINK_NOFOLLOW);
	if (r < 0)
		log_warn("cannot remember idempotency key \"%s\" of checkpoint %s: %s", k->key, rec->id, strerror(-r));
	else
		log_notice("idempotency key \"%s\": its answer (checkpoint %s) written from the record; ckptd had "
			   "stopped before writing it",
			   k->key, rec->id);
}

void engine_idem_from_records(struct engine *e)
{
	struct catalog_list all;
	if (catalog_list(e->catalog, NULL, &all) < 0)
		return;
	int64_t now = now_ms();
	for (size_t i = 0; i < all.n; i++)
		idem_from_record(e, all.v[i], now);
	catalog_list_free(&all);
}

int engine_idem_sweep(struct engine *e)
{
	int dfd = dup(e->idem_fd), n = 0;
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *de;
	int64_t now = now_ms();

	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return -errno;
	}
	rewinddir(d);
	pthread_mutex_lock(&e->idem_lock);
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);
		if (len != 69 || strcmp(de->d_name + 64, ".json") || !idem_file_expired(e, de->d_name, now))
			continue;
		if (unlinkat(e->idem_fd, de->d_name, 0) == 0)
			n++;
	}
	pthread_mutex_unlock(&e->idem_lock);
	closedir(d);
	if (n > 0)
		fsync_dirfd(e->idem_fd);
	return n;
}
