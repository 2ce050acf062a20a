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
#include "lib/failpoint.h"

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

void fork_info_free(struct fork_info *f)
{
	for (size_t i = 0; i < f->n_paths; i++)
		free(f->paths[i]);
	free(f->paths);
	free(f->path);
	free(f->error);
	memset(f, 0, sizeof(*f));
}

void fork_list_free(struct fork_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		fork_info_free(&l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

static void fork_free(struct engine_fork *f)
{
	if (!f)
		return;
	fork_info_free(&f->info);
	json_decref(f->backend);
	free(f);
}

void engine_forks_free(struct engine *e)
{
	while (e->forks) {
		struct engine_fork *f = e->forks;
		e->forks = f->next;
		fork_free(f);
	}
}

static int fork_info_copy(const struct fork_info *f, struct fork_info *ret)
{
	*ret = *f;
	ret->path = NULL, ret->paths = NULL, ret->error = NULL, ret->n_paths = 0;
	if ((f->path && !(ret->path = strdup(f->path))) || (f->error && !(ret->error = strdup(f->error))) ||
	    !(ret->paths = calloc(f->n_paths + 1, sizeof(*ret->paths))))
		return -ENOMEM;
	for (; ret->n_paths < f->n_paths; ret->n_paths++)
		if (!(ret->paths[ret->n_paths] = strdup(f->paths[ret->n_paths])))
			return -ENOMEM;
	return 0;
}

/* Append f at the end (forks list in the order made). Under state_lock. */
static void fork_link(struct engine *e, struct engine_fork *f)
{
	struct engine_fork **p = &e->forks;
	while (*p)
		p = &(*p)->next;
	f->next = NULL;
	*p = f;
}

static struct engine_fork *fork_find(struct engine *e, const char *fid)
{
	for (struct engine_fork *f = e->forks; f; f = f->next)
		if (!strcmp(f->info.fork_id, fid))
			return f;
	return NULL;
}

/* The dirs root i of a fork mounts on: path itself for one root, else
 * path/<basename of the root> (with -<i> when two names collide). */
static int fork_dirs(struct engine *e, const char *path, struct fork_info *f)
{
	if (!(f->paths = calloc(e->cfg->n_roots + 1, sizeof(*f->paths))))
		return -ENOMEM;
	for (size_t i = 0; i < e->cfg->n_roots; i++) {
		if (e->cfg->n_roots == 1) {
			f->paths[f->n_paths++] = strdup(path);
			break;
		}
		const char *base = strrchr(e->cfg->roots[i], '/');
		base = base && base[1] ? base + 1 : "root";
		bool dup = false;
		for (size_t k = 0; k < i; k++) {
			const char *o = strrchr(e->cfg->roots[k], '/');
			dup |= o && !strcmp(o + 1, base);
		}
		if ((dup ? asprintf(&f->paths[i], "%s/%s-%zu", path, base, i)
			 : asprintf(&f->paths[i], "%s/%s", path, base)) < 0)
			f->paths[i] = NULL;
		f->n_paths++;
	}
	for (size_t i = 0; i < f->n_paths; i++)
		if (!f->paths[i])
			return -ENOMEM;
	return 0;
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
	for (const struct engine_fork *f = e->forks; f; f = f->next) {
		const char *fp = f->info.path;
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

static void fork_unsave(struct engine *e, const char *fid)
{
	char name[64];
	_cleanup_close_ int fd = engine_forks_fd(e);
	snprintf(name, sizeof(name), "%s.json", fid);
	if (fd >= 0 && FAILPOINT_AROUND("fork.record.unlink", unlinkat(fd, name, 0)) == 0)
		fsync_dirfd(fd);
}

/* The record on disk, <state>/forks/<fork_id>.json: {fork_id,
 * checkpoint_id, path, paths, created_at[, intent][, _backend, mounted]}.
 * This and fork_from_json are its one writer and reader. */
static json_t *fork_to_json(const struct engine_fork *f, const char *intent)
{
	json_t *paths = json_array();
	for (size_t i = 0; i < f->info.n_paths; i++)
		json_array_append_new(paths, json_string(f->info.paths[i]));
	json_t *o = json_pack("{s:s, s:s}", "fork_id", f->info.fork_id, "checkpoint_id", f->info.checkpoint_id);
	if (!o || !paths) {
		json_decref(o);
		json_decref(paths);
		return NULL;
	}
	if (f->info.path)
		json_object_set_new(o, "path", json_string(f->info.path));
	json_object_set_new(o, "paths", paths);
	json_object_set_new(o, "created_at", json_string(f->info.created_at));
	if (intent)
		json_object_set_new(o, "intent", json_string(intent));
	if (f->backend) {
		json_object_set(o, "_backend", f->backend);
		json_object_set_new(o, "mounted", json_boolean(f->info.mounted));
	}
	return o;
}

static int fork_save(struct engine *e, const struct engine_fork *f, const char *intent)
{
	char name[64];
	_cleanup_close_ int fd = engine_forks_fd(e);
	if (fd < 0)
		return fd;
	json_auto_t *o = fork_to_json(f, intent);
	_cleanup_free_ char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	if (!s)
		return -ENOMEM;
	snprintf(name, sizeof(name), "%s.json", f->info.fork_id);
	return FAILPOINT_AROUND("fork.record.write", write_file_atomic(fd, name, s, strlen(s), 0600));
}

/* A fork from its record; NULL when it is not one (or out of memory). */
static struct engine_fork *fork_from_json(json_t *j)
{
	const char *fid = json_string_value(json_object_get(j, "fork_id"));
	const char *cid = json_string_value(json_object_get(j, "checkpoint_id"));
	const char *path = json_string_value(json_object_get(j, "path"));
	const char *created = json_string_value(json_object_get(j, "created_at"));
	json_t *paths = json_object_get(j, "paths");
	struct engine_fork *f = calloc(1, sizeof(*f));
	if (!f || !fid || !fork_id_valid(fid) || !cid ||
	    !(f->info.paths = calloc(json_array_size(paths) + 1, sizeof(char *))))
		goto bad;
	snprintf(f->info.fork_id, sizeof(f->info.fork_id), "%s", fid);
	snprintf(f->info.checkpoint_id, sizeof(f->info.checkpoint_id), "%s", cid);
	snprintf(f->info.created_at, sizeof(f->info.created_at), "%s", created ? created : "");
	if (path && !(f->info.path = strdup(path)))
		goto bad;
	for (size_t i = 0; i < json_array_size(paths); i++) {
		const char *p = json_string_value(json_array_get(paths, i));
		if (!p || !(f->info.paths[f->info.n_paths++] = strdup(p)))
			goto bad;
	}
	f->backend = json_incref(json_object_get(j, "_backend"));
	f->info.fork_ms = -1;
	return f;
bad:
	fork_free(f);
	return NULL;
}

/* Check the dir, then make the fork's record of checkpoint rec (not yet
 * saved, its dirs not yet made). */
static int fork_prepare(struct engine *e, const struct ckpt_record *rec, const char *path, struct engine_fork *f,
			ckpt_error *err)
{
	char resolved[PATH_MAX];
	int r;
	pthread_mutex_lock(&e->state_lock);
	r = fork_check_dir(e, path, resolved, err);
	pthread_mutex_unlock(&e->state_lock);
	if (r < 0)
		return r;
	strcpy(f->info.fork_id, "fk_");
	if (random_hex(f->info.fork_id + 3, 12) < 0)
		return err_set(err, EIO, NULL, "no randomness for a fork id");
	snprintf(f->info.checkpoint_id, sizeof(f->info.checkpoint_id), "%s", rec->id);
	fmt_rfc3339_ms(now_ms(), f->info.created_at, sizeof(f->info.created_at));
	if (!(f->info.path = strdup(resolved)) || fork_dirs(e, resolved, &f->info) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	return 0;
}

/* Record the intent, mount, record the fork. */
static int fork_make(struct engine *e, const struct ckpt_record *rec, struct engine_fork *f, ckpt_error *err)
{
	const char *const *dv = (const char *const *)f->info.paths;
	const char *fid = f->info.fork_id;
	/* The intent is durable before anything is mounted or extracted: a crash
	 * from here on leaves a record that the next start removes whole
	 * (engine_forks_open), never a stray mount or a half-filled DIR. */
	int r = fork_save(e, f, "create");
	if (r < 0) {
		fork_unsave(e, fid);
		return err_set(err, -r, NULL, "cannot record the fork: %s", strerror(-r));
	}
	/* With several roots, DIR/<root> after the intent: a crash between the
	 * two used to leave them behind, recorded nowhere. */
	for (size_t i = 0; e->cfg->n_roots > 1 && dv[i]; i++)
		if (mkdir(dv[i], 0755) < 0 && errno != EEXIST) {
			r = err_set(err, errno, NULL, "create '%s': %m", dv[i]);
			fork_unsave(e, fid);
			return r;
		}
	if ((r = FAILPOINT_AROUND(
		     "fork.create.mount",
		     e->backend->forks->mount(e->bst, rec->id, rec->backend_data, fid, dv, &f->backend, err))) < 0) {
		fork_unsave(e, fid);
		return r;
	}
	f->info.mounted = true;
	if ((r = fork_save(e, f, NULL)) < 0) {
		ckpt_error e2 = { 0 };
		if (e->backend->forks->remove(e->bst, fid, f->backend, dv, &e2) == 0)
			fork_unsave(e, fid);
		return err_set(err, -r, NULL, "cannot record the fork: %s", strerror(-r));
	}
	return 0;
}

int engine_fork(struct engine *e, const char *id_or_name, const char *path, struct fork_info *ret, ckpt_error *err)
{
	if (!e->backend->forks)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "not_supported", "the %s backend cannot fork",
				    e->backend->name);
	if (engine_check_not_creating(e, id_or_name, err) < 0)
		return -EBUSY;
	pthread_mutex_lock(&e->op_lock);
	int64_t t0 = mono_ms();
	_cleanup_record_ const struct ckpt_record *rec = NULL;
	struct engine_fork *f = calloc(1, sizeof(*f));
	int r = f ? engine_check_managed(e, err) : err_set(err, ENOMEM, NULL, "out of memory");
	if (r == 0)
		r = engine_resolve_active(e, id_or_name, &rec, err);
	if (r == 0)
		r = fork_prepare(e, rec, path, f, err);
	if (r == 0)
		r = fork_make(e, rec, f, err);
	if (r == 0) {
		f->info.fork_ms = mono_ms() - t0;
		if (fork_info_copy(&f->info, ret) < 0) { /* the fork is made and recorded: list it all the same */
			fork_info_free(ret);
			r = err_set(err, ENOMEM, NULL, "out of memory");
		}
		pthread_mutex_lock(&e->state_lock);
		fork_link(e, f);
		pthread_mutex_unlock(&e->state_lock);
		log_event(LOG_INFO_, &(struct log_fields){ "fork", rec->id, NULL, mono_ms() - t0 },
			  "forked checkpoint \"%s\" at %s", rec->id, f->info.path);
		f = NULL;
	}
	r = engine_err_classify(err, ENGINE_CTX_READ, r);
	for (size_t i = 0; r < 0 && f && e->cfg->n_roots > 1 && i < f->info.n_paths; i++)
		rmdir(f->info.paths[i]); /* a refused fork leaves DIR as it was */
	fork_free(f);
	pthread_mutex_unlock(&e->op_lock);
	return r;
}

int engine_fork_list(struct engine *e, struct fork_list *ret, ckpt_error *err)
{
	int r = 0;
	*ret = (struct fork_list){ 0 };
	pthread_mutex_lock(&e->state_lock);
	size_t n = 0;
	for (const struct engine_fork *f = e->forks; f; f = f->next)
		n++;
	if (n && !(ret->v = calloc(n, sizeof(*ret->v))))
		r = -ENOMEM;
	for (const struct engine_fork *f = e->forks; r == 0 && f; f = f->next)
		r = fork_info_copy(&f->info, &ret->v[ret->n++]);
	pthread_mutex_unlock(&e->state_lock);
	if (r < 0) {
		fork_list_free(ret);
		return err_set_kind(err, ERR_INTERNAL, ENOMEM, NULL, "out of memory listing forks");
	}
	return 0;
}

/* Unlink f from the list. Under state_lock. */
static void fork_unlink(struct engine *e, struct engine_fork *f)
{
	for (struct engine_fork **p = &e->forks; *p; p = &(*p)->next)
		if (*p == f) {
			*p = f->next;
			return;
		}
}

int engine_fork_delete(struct engine *e, const char *fid, ckpt_error *err)
{
	int r = 0;
	pthread_mutex_lock(&e->op_lock);
	/* Only the op_lock holder changes the list or a fork's record; the
	 * state_lock keeps readers out while it does. */
	pthread_mutex_lock(&e->state_lock);
	struct engine_fork *f = fork_id_valid(fid) ? fork_find(e, fid) : NULL;
	pthread_mutex_unlock(&e->state_lock);
	if (!f) {
		r = err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no fork with id '%s'", fid);
		goto out;
	}
	const char *const *dv = (const char *const *)f->info.paths;
	/* Durable before anything is removed: a crash halfway through finishes
	 * the removal at the next start instead of mounting a fork whose upper
	 * is half gone. */
	if ((r = fork_save(e, f, "delete")) < 0) {
		r = err_set(err, -r, NULL, "cannot record the fork's removal: %s", strerror(-r));
		goto out;
	}
	if ((r = FAILPOINT_AROUND("fork.delete.remove", e->backend->forks->remove(e->bst, fid, f->backend, dv, err))) <
	    0) {
		fork_save(e, f, NULL); /* still whole: keep it as it was */
		goto out;
	}
	for (size_t i = 0; e->cfg->n_roots > 1 && dv[i]; i++)
		rmdir(dv[i]);
	fork_unsave(e, fid);
	log_event(LOG_INFO_, &(struct log_fields){ "fork-delete", fid, NULL, -1 }, "deleted fork \"%s\"", fid);
	pthread_mutex_lock(&e->state_lock);
	fork_unlink(e, f);
	pthread_mutex_unlock(&e->state_lock);
	fork_free(f);
out:
	r = engine_err_classify(err, ENGINE_CTX_DELETE, r);
	pthread_mutex_unlock(&e->op_lock);
	if (r == 0)
		engine_kick_maintenance(e);
	return r;
}

/* A fork whose create or delete was cut short by a crash: remove what there
 * is of it (its mount, its upper or extracted files, its layers' refs), then
 * its record. If that fails the record stays, to be tried at the next start. */
static void fork_finish_intent(struct engine *e, const struct engine_fork *f, const char *intent)
{
	const char *fid = f->info.fork_id;
	const char *const *dv = (const char *const *)f->info.paths;
	ckpt_error e2 = { 0 };
	if (e->backend->forks->remove(e->bst, fid, f->backend, dv, &e2) < 0) {
		log_warn("fork \"%s\": the %s cut short by a crash cannot be undone yet: %s", fid, intent, e2.msg);
		return;
	}
	for (size_t i = 0; e->cfg->n_roots > 1 && dv[i]; i++)
		rmdir(dv[i]);
	fork_unsave(e, fid);
	log_info("fork \"%s\": removed what a %s cut short by a crash left", fid, intent);
}

/* One record at start: finish an intent, or mount the fork again. */
static void fork_open_one(struct engine *e, json_t *j)
{
	struct engine_fork *f = e->backend->forks ? fork_from_json(j) : NULL;
	const char *intent = json_string_value(json_object_get(j, "intent"));
	ckpt_error e2 = { 0 };
	if (!f)
		return;
	if (json_object_get(j, "intent")) {
		fork_finish_intent(e, f, intent ? intent : "(unknown)");
		fork_free(f);
		return;
	}
	f->info.mounted = f->backend &&
		e->backend->forks->mount(e->bst, f->info.checkpoint_id, NULL, f->info.fork_id,
					 (const char *const *)f->info.paths, &f->backend, &e2) == 0;
	if (!f->info.mounted) {
		log_warn("fork \"%s\" cannot be mounted again: %s", f->info.fork_id, e2.msg);
		f->info.error = strdup(e2.msg);
	}
	fork_link(e, f);
}

/* At start: load every fork record and mount what is not mounted. A fork that
 * cannot be mounted stays listed with "mounted": false and its error. */
int engine_forks_open(struct engine *e, ckpt_error *err)
{
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
		json_auto_t *j = json_loads(s, 0, NULL);
		fork_open_one(e, j);
	}
	closedir(d);
	return 0;
}
