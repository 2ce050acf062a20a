/* engine_fork.c: forks of a checkpoint.
 *
 * A fork record lives in <state>/forks/<fork_id>.json (written atomically:
 * temp + fsync + rename + fsync of the dir) before the fork is reported;
 * at start every recorded fork is mounted again if it is not. The backend
 * does the mounting (fork_mount) and keeps the fork's layers alive. A
 * checkpoint with forks is not deleted, neither by a client nor by expiry. */
#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>

#include "config.h"
#include "engine/engine_internal.h"
#include "lib/walk.h"

#define FORKS_DIR "forks"

static int engine_forks_fd(struct engine *e)
{
	int made = mkdirat_durable(e->state_fd, FORKS_DIR, 0700);
	if (made < 0)
		return made;
	int fd = openat(e->state_fd, FORKS_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static bool fork_id_valid(const char *s)
{
	if (strlen(s) != 27 || strncmp(s, "fk_", 3))
		return false;
	for (const char *p = s + 3; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

/* The dirs root i of a fork mounts on: path itself for one root, else
 * path/<basename of the root> (with -<i> when two names collide). */
static json_t *fork_dirs(struct engine *e, const char *path)
{
	json_t *dirs = json_array();
	for (size_t i = 0; i < e->cfg->n_roots; i++) {
		if (e->cfg->n_roots == 1) {
			json_array_append_new(dirs, json_string(path));
			break;
		}
		const char *base = strrchr(e->cfg->roots[i], '/');
		base = base && base[1] ? base + 1 : "root";
		bool dup = false;
		for (size_t k = 0; k < i; k++) {
			const char *o = strrchr(e->cfg->roots[k], '/');
			dup |= o && !strcmp(o + 1, base);
		}
		json_array_append_new(
			dirs, dup ? json_sprintf("%s/%s-%zu", path, base, i) : json_sprintf("%s/%s", path, base));
	}
	return dirs;
}

static const char **fork_dir_array(json_t *dirs)
{
	size_t n = json_array_size(dirs);
	const char **v = calloc(n + 1, sizeof(*v));
	for (size_t i = 0; v && i < n; i++)
		v[i] = json_string_value(json_array_get(dirs, i));
	return v;
}

static bool path_within(const char *p, const char *top)
{
	size_t n = strlen(top);
	if (n == 1 && top[0] == '/')
		return true;
	return !strncmp(p, top, n) && (p[n] == 0 || p[n] == '/');
}

static int fork_bad_dir(ckpt_error *err, const char *path, const char *why)
{
	return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_path", "path '%s' %s", path, why);
}

/* path must be an existing empty directory, reached through no symlink,
 * outside every root, the state dir and every other fork. */
static int fork_check_dir(struct engine *e, const char *path, char resolved[PATH_MAX], ckpt_error *err)
{
	struct stat st;
	if (path[0] != '/')
		return fork_bad_dir(err, path, "must be absolute");
	if (lstat(path, &st) < 0)
		return fork_bad_dir(err, path, errno == ENOENT ? "does not exist" : "cannot be read");
	if (S_ISLNK(st.st_mode))
		return fork_bad_dir(err, path, "is a symlink");
	if (!S_ISDIR(st.st_mode))
		return fork_bad_dir(err, path, "is not a directory");
	if (!realpath(path, resolved))
		return fork_bad_dir(err, path, "cannot be resolved");
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	if (strlen(resolved) != n || strncmp(resolved, path, n))
		return fork_bad_dir(err, path, "goes through a symlink (or '.', '..')");
	for (size_t i = 0; i < e->cfg->n_roots; i++)
		if (path_within(resolved, e->cfg->roots[i]) || path_within(e->cfg->roots[i], resolved))
			return fork_bad_dir(err, path, "is inside (or holds) a managed root");
	char state[PATH_MAX];
	if (realpath(e->cfg->state_dir, state) && (path_within(resolved, state) || path_within(state, resolved)))
		return fork_bad_dir(err, path, "is inside (or holds) the state dir");
	const char *fid;
	json_t *f;
	json_object_foreach(e->forks, fid, f)
	{
		const char *fp = json_string_value(json_object_get(f, "path"));
		if (fp && (path_within(resolved, fp) || path_within(fp, resolved)))
			return fork_bad_dir(err, path, "is inside (or holds) another fork");
	}
	DIR *d = opendir(resolved);
	if (!d)
		return fork_bad_dir(err, path, "cannot be opened");
	errno = 0;
	bool empty = !walk_next(d) && errno == 0;
	closedir(d);
	if (!empty)
		return fork_bad_dir(err, path, "is not empty");
	return 0;
}

static json_t *fork_public(json_t *f)
{
	json_t *o = json_deep_copy(f);
	json_object_del(o, "_backend");
	return o;
}

static void fork_unsave(struct engine *e, const char *fid)
{
	char name[64];
	_cleanup_close_ int fd = engine_forks_fd(e);
	snprintf(name, sizeof(name), "%s.json", fid);
	if (fd >= 0 && unlinkat(fd, name, 0) == 0)
		fsync_dirfd(fd);
}

static int fork_save(struct engine *e, json_t *f)
{
	char name[64];
	_cleanup_close_ int fd = engine_forks_fd(e);
	if (fd < 0)
		return fd;
	_cleanup_free_ char *s = json_dumps(f, JSON_COMPACT);
	if (!s)
		return -ENOMEM;
	snprintf(name, sizeof(name), "%s.json", json_string_value(json_object_get(f, "fork_id")));
	return write_file_atomic(fd, name, s, strlen(s), 0600);
}

int engine_fork(struct engine *e, const char *id_or_name, const char *path, json_t **ret, ckpt_error *err)
{
	char resolved[PATH_MAX], fid[32], created[40];
	int r;

	if (!e->backend->forks)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "not_supported", "the %s backend cannot fork",
				    e->backend->name);
	if (engine_check_not_creating(e, id_or_name, err) < 0)
		return -EBUSY;
	pthread_mutex_lock(&e->op_lock);
	int64_t t0 = mono_ms();
	_cleanup_record_ const struct ckpt_record *rec = engine_resolve(e, id_or_name);
	json_auto_t *dirs = NULL;
	json_t *fdata = NULL;
	_cleanup_free_ const char **dv = NULL;
	if ((r = engine_check_managed(e, err)) < 0)
		goto out;
	if (!rec) {
		r = err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint with id or name '%s'",
				 id_or_name);
		goto out;
	}
	if (rec->status != CKPT_ACTIVE) {
		r = err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "checkpoint '%s' is not active", id_or_name);
		goto out;
	}
	pthread_mutex_lock(&e->state_lock);
	r = fork_check_dir(e, path, resolved, err);
	pthread_mutex_unlock(&e->state_lock);
	if (r < 0)
		goto out;
	strcpy(fid, "fk_");
	if ((r = random_hex(fid + 3, 12)) < 0) {
		err_set(err, EIO, NULL, "no randomness for a fork id");
		goto out;
	}
	dirs = fork_dirs(e, resolved);
	dv = fork_dir_array(dirs);
	if (!dv) {
		r = err_set(err, ENOMEM, NULL, "out of memory");
		goto out;
	}
	const char *cid = rec->id;
	/* The intent is durable before anything is mounted or extracted: a crash
	 * from here on leaves a record that the next start removes whole
	 * (engine_forks_open), never a stray mount or a half-filled DIR. */
	json_t *f = json_pack("{s:s, s:s, s:s, s:O, s:s, s:s}", "fork_id", fid, "checkpoint_id", cid, "path", resolved,
			      "paths", dirs, "created_at", fmt_rfc3339_ms(now_ms(), created, sizeof(created)), "intent",
			      "create");
	if (!f || (r = fork_save(e, f)) < 0) {
		fork_unsave(e, fid);
		json_decref(f);
		r = err_set(err, r < 0 ? -r : ENOMEM, NULL, "cannot record the fork: %s",
			    strerror(r < 0 ? -r : ENOMEM));
		goto out;
	}
	/* With several roots, DIR/<root> after the intent: a crash between the
	 * two used to leave them behind, recorded nowhere. */
	for (size_t i = 0; e->cfg->n_roots > 1 && dv[i]; i++)
		if (mkdir(dv[i], 0755) < 0 && errno != EEXIST) {
			r = err_set(err, errno, NULL, "create '%s': %m", dv[i]);
			fork_unsave(e, fid);
			json_decref(f);
			goto out;
		}
	if ((r = e->backend->forks->mount(e->bst, cid, rec->backend_data, fid, dv, &fdata, err)) < 0) {
		fork_unsave(e, fid);
		json_decref(f);
		goto out;
	}
	json_object_del(f, "intent");
	json_object_set_new(f, "_backend", fdata);
	json_object_set_new(f, "mounted", json_true());
	if ((r = fork_save(e, f)) < 0) {
		ckpt_error e2 = { 0 };
		if (e->backend->forks->remove(e->bst, fid, json_object_get(f, "_backend"), dv, &e2) == 0)
			fork_unsave(e, fid);
		json_decref(f);
		r = err_set(err, -r, NULL, "cannot record the fork: %s", strerror(-r));
		goto out;
	}
	json_object_set_new(f, "fork_ms", json_integer(mono_ms() - t0));
	pthread_mutex_lock(&e->state_lock);
	json_object_set(e->forks, fid, f);
	pthread_mutex_unlock(&e->state_lock);
	log_event(LOG_INFO_, &(struct log_fields){ "fork", cid, NULL, mono_ms() - t0 },
		  "forked checkpoint \"%s\" at %s", cid, resolved);
	*ret = fork_public(f);
	json_decref(f);
out:
	r = engine_err_classify(err, ENGINE_CTX_READ, r);
	for (size_t i = 0; r < 0 && e->cfg->n_roots > 1 && i < json_array_size(dirs); i++)
		rmdir(json_string_value(json_array_get(dirs, i))); /* a refused fork leaves DIR as it was */
	pthread_mutex_unlock(&e->op_lock);
	return r;
}

json_t *engine_fork_list(struct engine *e)
{
	json_t *out = json_array();
	const char *fid;
	json_t *f;
	pthread_mutex_lock(&e->state_lock);
	json_object_foreach(e->forks, fid, f) json_array_append_new(out, fork_public(f));
	pthread_mutex_unlock(&e->state_lock);
	return out;
}

int engine_fork_delete(struct engine *e, const char *fid, ckpt_error *err)
{
	int r = 0;
	_cleanup_free_ const char **dv = NULL;
	json_auto_t *marked = NULL;
	pthread_mutex_lock(&e->op_lock);
	pthread_mutex_lock(&e->state_lock);
	json_t *f = fork_id_valid(fid) ? json_incref(json_object_get(e->forks, fid)) : NULL;
	pthread_mutex_unlock(&e->state_lock);
	if (!f) {
		r = err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no fork with id '%s'", fid);
		goto out;
	}
	dv = fork_dir_array(json_object_get(f, "paths"));
	if (!dv) {
		r = err_set(err, ENOMEM, NULL, "out of memory");
		goto out;
	}
	/* Durable before anything is removed: a crash halfway through finishes
	 * the removal at the next start instead of mounting a fork whose upper
	 * is half gone. */
	marked = json_deep_copy(f);
	if (!marked || json_object_set_new(marked, "intent", json_string("delete")) < 0 ||
	    (r = fork_save(e, marked)) < 0) {
		r = err_set(err, r < 0 ? -r : ENOMEM, NULL, "cannot record the fork's removal: %s",
			    strerror(r < 0 ? -r : ENOMEM));
		goto out;
	}
	if ((r = e->backend->forks->remove(e->bst, fid, json_object_get(f, "_backend"), dv, err)) < 0) {
		fork_save(e, f); /* still whole: keep it as it was */
		goto out;
	}
	for (size_t i = 0; e->cfg->n_roots > 1 && dv[i]; i++)
		rmdir(dv[i]);
	fork_unsave(e, fid);
	pthread_mutex_lock(&e->state_lock);
	json_object_del(e->forks, fid);
	pthread_mutex_unlock(&e->state_lock);
	log_event(LOG_INFO_, &(struct log_fields){ "fork-delete", fid, NULL, -1 }, "deleted fork \"%s\"", fid);
out:
	r = engine_err_classify(err, ENGINE_CTX_DELETE, r);
	json_decref(f);
	pthread_mutex_unlock(&e->op_lock);
	if (r == 0)
		engine_kick_maintenance(e);
	return r;
}

/* A fork whose create or delete was cut short by a crash: remove what there
 * is of it (its mount, its upper or extracted files, its layers' refs), then
 * its record. If that fails the record stays, to be tried at the next start. */
static void fork_finish_intent(struct engine *e, const char *fid, json_t *f, const char *const *dv)
{
	const char *intent = json_string_value(json_object_get(f, "intent"));
	ckpt_error e2 = { 0 };
	if (!dv || e->backend->forks->remove(e->bst, fid, json_object_get(f, "_backend"), dv, &e2) < 0) {
		log_warn("fork \"%s\": the %s cut short by a crash cannot be undone yet: %s", fid, intent,
			 dv ? e2.msg : "out of memory");
		return;
	}
	for (size_t i = 0; e->cfg->n_roots > 1 && dv[i]; i++)
		rmdir(dv[i]);
	fork_unsave(e, fid);
	log_info("fork \"%s\": removed what a %s cut short by a crash left", fid, intent);
}

/* At start: load every fork record and mount what is not mounted. A fork that
 * cannot be mounted stays listed with "mounted": false and its error. */
int engine_forks_open(struct engine *e, ckpt_error *err)
{
	e->forks = json_object();
	if (!e->forks)
		return err_set(err, ENOMEM, NULL, "out of memory");
	_cleanup_close_ int fd = engine_forks_fd(e);
	if (fd < 0)
		return err_set(err, -fd, NULL, "cannot open the forks dir: %s", strerror(-fd));
	write_file_atomic_sweep(fd);
	DIR *d;
	if (walk_open(fd, NULL, &d) < 0)
		return err_set(err, errno, NULL, "cannot list the forks dir: %m");
	struct dirent *de;
	while ((de = walk_next(d))) {
		_cleanup_free_ char *s = NULL;
		if (read_file_at(fd, de->d_name, 1 << 20, &s, NULL) < 0)
			continue;
		json_t *f = json_loads(s, 0, NULL);
		const char *fid = json_string_value(json_object_get(f, "fork_id"));
		if (!fid || !fork_id_valid(fid) || !e->backend->forks) {
			json_decref(f);
			continue;
		}
		_cleanup_free_ const char **dv = fork_dir_array(json_object_get(f, "paths"));
		json_t *fdata = json_object_get(f, "_backend");
		ckpt_error e2 = { 0 };
		if (json_object_get(f, "intent")) {
			fork_finish_intent(e, fid, f, dv);
			json_decref(f);
			continue;
		}
		bool ok = dv && fdata &&
			e->backend->forks->mount(e->bst, json_string_value(json_object_get(f, "checkpoint_id")), NULL,
						 fid, dv, &fdata, &e2) == 0;
		json_object_set_new(f, "mounted", json_boolean(ok));
		if (!ok) {
			log_warn("fork \"%s\" cannot be mounted again: %s", fid, e2.msg);
			json_object_set_new(f, "error", json_string(e2.msg));
		}
		json_object_set_new(e->forks, fid, f);
	}
	closedir(d);
	return 0;
}
