/* tar_meta.c: a tar checkpoint's directory: the names of its archives and
 * manifests, its meta.json, the head (the next create's parent), and the
 * intent a restore leaves until it is done. */
#include "backend/tar/tar_internal.h"
#include "lib/failpoint.h"

void tar_meta_names(size_t i, bool zstd, char *arch, char *man)
{
	snprintf(arch, 32, "r%zu.tar%s", i, zstd ? ".zst" : "");
	snprintf(man, 32, "r%zu.manifest", i);
}

int tar_meta_open_root(const struct tar_state *s, size_t i, ckpt_error *err)
{
	int fd = open(s->roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errno, NULL, "cannot open root '%s': %m", s->roots[i]);
	return fd;
}

/* Only a hint (any checkpoint is a correct parent: reuse compares every
 * file with what the parent recorded), so a failure to save it is ignored.
 * Not synced, and harmless to lose: a crash leaves RUNNING, and then no
 * create takes a parent until a restore rewrote every file; a clean stop
 * syncs it (tar_meta_running_close's syncfs). After a power cut it may be
 * the old name, or empty: tar_meta_head_load takes only a name that is a
 * checkpoint directory still there, and any such is a correct parent. */
void tar_meta_head_set(struct tar_state *s, const char *name)
{
	pthread_mutex_lock(&s->lock);
	snprintf(s->head, sizeof(s->head), "%s", name);
	pthread_mutex_unlock(&s->lock);
	FAILPOINT_AROUND("tar.head.write", write_file_replace(s->tar_fd, HEAD, name, strlen(name), 0600));
}

void tar_meta_head_load(struct tar_state *s)
{
	_cleanup_free_ char *text = NULL;
	struct stat st;
	if (read_file_at(s->tar_fd, HEAD, 128, &text, NULL) < 0)
		return;
	text[strcspn(text, "\n")] = '\0';
	if ((id_valid(text) || !strcmp(text, BASE)) && fstatat(s->tar_fd, text, &st, AT_SYMLINK_NOFOLLOW) == 0)
		snprintf(s->head, sizeof(s->head), "%s", text);
}

void tar_meta_free(struct tar_meta *m)
{
	services_strv_clear(&m->roots);
	services_strv_clear(&m->refs);
	json_decref(m->unknown);
	*m = (struct tar_meta){ 0 };
}

/* {version, compression, roots, depth, refs, started_ns[, parent]}, in that
 * order, then the members this version does not know. */
char *tar_meta_text(const struct tar_meta *m)
{
	json_auto_t *o = json_object();
	const char *k;
	json_t *v;
	if (!o)
		return NULL;
	if (m->version)
		json_object_set_new(o, "version", json_integer(m->version));
	json_object_set_new(o, "compression", json_string(m->zstd ? "zstd" : "none"));
	json_object_set_new(o, "roots", services_strv_json(&m->roots));
	json_object_set_new(o, "depth", json_integer(m->depth));
	json_object_set_new(o, "refs", services_strv_json(&m->refs));
	if (m->has_started_ns)
		json_object_set_new(o, "started_ns", json_integer(m->started_ns));
	if (m->parent[0])
		json_object_set_new(o, "parent", json_string(m->parent));
	json_object_foreach (m->unknown, k, v)
		if (!json_object_get(o, k))
			json_object_set_new(o, k, json_deep_copy(v));
	return json_dumps(o, JSON_COMPACT);
}

/* An array of strings; false (and nothing kept) when a is not one. */
static bool tar_meta_names_read(json_t *a, struct strv *ret)
{
	bool ok = services_strv_from_json(ret, a) == 0;
	if (!ok)
		services_strv_clear(ret);
	return ok;
}

/* Takes member k into m when it has the shape this version writes. */
static bool tar_meta_take(struct tar_meta *m, const char *k, json_t *v)
{
	const char *c = json_string_value(v);
	if (!strcmp(k, "version") && json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < 1000)
		return (m->version = (int)json_integer_value(v)) > 0;
	if (!strcmp(k, "compression") && c && (!strcmp(c, "zstd") || !strcmp(c, "none"))) {
		m->zstd = !strcmp(c, "zstd");
		return true;
	}
	if (!strcmp(k, "roots"))
		return tar_meta_names_read(v, &m->roots);
	if (!strcmp(k, "refs"))
		return tar_meta_names_read(v, &m->refs);
	if (!strcmp(k, "depth") && json_is_integer(v)) {
		m->depth = json_integer_value(v);
		return true;
	}
	if (!strcmp(k, "started_ns") && json_is_integer(v)) {
		m->started_ns = json_integer_value(v);
		return m->has_started_ns = true;
	}
	if (!strcmp(k, "parent") && c && c[0] && strlen(c) < sizeof(m->parent)) {
		snprintf(m->parent, sizeof(m->parent), "%s", c);
		return true;
	}
	return false;
}

int tar_meta_load(int dirfd, struct tar_meta *ret)
{
	_cleanup_free_ char *text = NULL;
	const char *k;
	json_t *v;
	*ret = (struct tar_meta){ 0 };
	int r = read_file_at(dirfd, META, 1 << 20, &text, NULL);
	if (r < 0)
		return r;
	json_auto_t *j = json_loads(text, 0, NULL);
	if (!json_is_object(j))
		return -EBADMSG;
	json_object_foreach (j, k, v) {
		if (tar_meta_take(ret, k, v))
			continue;
		if (!ret->unknown)
			ret->unknown = json_object();
		json_object_set_new(ret->unknown, k, json_deep_copy(v));
	}
	return 0;
}

int tar_meta_write(struct tar_state *s, int dirfd, const struct chain *ch, ckpt_error *err)
{
	struct tar_meta m = { .version = 1,
			      .zstd = s->zstd,
			      .roots = { .v = s->roots, .n = s->n_roots }, /* borrowed: not freed */
			      .depth = ch->depth,
			      .refs = *ch->refs,
			      .has_started_ns = true,
			      .started_ns = (int64_t)ch->started.tv_sec * 1000000000 + ch->started.tv_nsec };
	snprintf(m.parent, sizeof(m.parent), "%s", ch->parent ? ch->parent : "");
	_cleanup_free_ char *text = tar_meta_text(&m);
	if (!text)
		return err_set(err, ENOMEM, NULL, "out of memory");
	int r = FAILPOINT_AROUND("tar.meta.write", write_file_atomic(dirfd, META, text, strlen(text), 0600));
	if (r < 0)
		return err_set(err, tar_errno_norm(r), NULL, "cannot write checkpoint metadata: %s", strerror(-r));
	return 0;
}

/* Read meta.json of a checkpoint dir and check it covers our roots. */
int tar_meta_read(struct tar_state *s, int dirfd, const char *name, bool *zstd, ckpt_error *err)
{
	_cleanup_(tar_meta_free) struct tar_meta m;
	int r = tar_meta_load(dirfd, &m);

	if (r < 0 && r != -EBADMSG)
		return err_set(err, r, NULL, "checkpoint '%s' has no metadata: %s", name, strerror(-r));
	r = 0;
	if (m.roots.n != s->n_roots)
		r = err_set(err, EINVAL, NULL, "checkpoint '%s' was made for other roots", name);
	for (size_t i = 0; r == 0 && i < s->n_roots; i++)
		if (strcmp(m.roots.v[i], s->roots[i]))
			r = err_set(err, EINVAL, NULL, "checkpoint '%s' was made for other roots", name);
	*zstd = m.zstd;
	return r;
}

int tar_meta_intent_write(struct tar_state *s, const char *name, ckpt_error *err)
{
	char text[128];
	int n = snprintf(text, sizeof(text), "{\"id\":\"%s\"}\n", name);
	int r = FAILPOINT_AROUND("tar.restore.intent.write",
				 write_file_atomic(s->tar_fd, INTENT, text, (size_t)n, 0600));
	return r < 0 ? err_set(err, r, NULL, "cannot write the restore intent: %s", strerror(-r)) : 0;
}

int tar_meta_intent_clear(struct tar_state *s, ckpt_error *err)
{
	if (FAILPOINT_AROUND("tar.restore.intent.unlink", unlinkat(s->tar_fd, INTENT, 0)) < 0 && errno != ENOENT)
		return err_set(err, errno, NULL, "cannot remove the restore intent: %m");
	return FAILPOINT_AROUND("tar.restore.intent.fsync", fsync(s->tar_fd)) < 0
		? err_set(err, errno, NULL, "cannot sync the tar state dir: %m")
		: 0;
}

/* The roots are not (all) checkpoint name: say so in health, and keep or
 * put back the intent, so the next restore rewrites every entry rather than
 * trust what looks unchanged. */
void tar_meta_unfinished(struct tar_state *s, const char *name, const char *why)
{
	struct stat st;
	if (fstatat(s->tar_fd, INTENT, &st, AT_SYMLINK_NOFOLLOW) < 0)
		tar_meta_intent_write(s, name, NULL);
	pthread_mutex_lock(&s->lock);
	snprintf(s->pending, sizeof(s->pending), "%s", name);
	snprintf(s->pending_msg, sizeof(s->pending_msg), "%.200s", why);
	pthread_mutex_unlock(&s->lock);
}

/* RUNNING says a run is under way: left by the last one, it ended by a kill
 * or a power cut. A first start (no base yet) has nothing to distrust.
 * Ctimes are trusted only while RUNNING is on disk: a run that cannot write
 * it could be cut without a trace, so it trusts none (tar_meta_running_trust
 * tries again once a full restore has made them true). */
void tar_meta_running_open(struct tar_state *s)
{
	struct stat st;
	s->ctime_suspect = fstatat(s->tar_fd, RUNNING, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		fstatat(s->tar_fd, BASE, &st, AT_SYMLINK_NOFOLLOW) == 0;
	if (s->ctime_suspect) {
		log_notice("tar: the last run did not end cleanly: the next restore rewrites every file, and "
			   "creates are full until then");
		return;
	}
	int r = FAILPOINT_AROUND("tar.running.write", write_file_atomic(s->tar_fd, RUNNING, "", 0, 0600));
	if (r < 0) {
		s->ctime_suspect = true;
		log_warn("tar: cannot write '%s': %s: ctimes are not trusted (restores rewrite every file, creates "
			 "are full) until it can be written",
			 RUNNING, strerror(-r));
	}
}

/* After a restore that rewrote every entry: ctimes are true again, and are
 * trusted from here on if RUNNING is on disk (written now if it is not). */
void tar_meta_running_trust(struct tar_state *s)
{
	struct stat st;
	/* No failpoint here: only a run whose first write failed gets here,
	 * and a crash around it is the one tar.running.write models. */
	if (fstatat(s->tar_fd, RUNNING, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
	    write_file_atomic(s->tar_fd, RUNNING, "", 0, 0600) == 0)
		s->ctime_suspect = false;
}

/* A clean stop: the roots on disk as ckptd last saw them (syncfs), and the
 * state dir's head and alias caches (write_file_replace), then RUNNING
 * goes. It stays while ctimes are still suspect. */
void tar_meta_running_close(struct tar_state *s)
{
	for (size_t i = 0; i < s->n_roots && !s->ctime_suspect; i++) {
		_cleanup_close_ int fd = open(s->roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0 || syncfs(fd) < 0)
			return;
	}
	if (!s->ctime_suspect && syncfs(s->tar_fd) < 0)
		return;
	if (!s->ctime_suspect && FAILPOINT_AROUND("tar.running.unlink", unlinkat(s->tar_fd, RUNNING, 0)) == 0)
		fsync(s->tar_fd);
}

int tar_meta_open_ckpt(struct tar_state *s, const char *id, bool *zstd, ckpt_error *err)
{
	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	int cfd = openat(s->tar_fd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cfd < 0)
		return err_set(err, errno, NULL, "checkpoint data '%s' is missing: %m", id);
	if (tar_meta_read(s, cfd, id, zstd, err) < 0) {
		close(cfd);
		return -EINVAL;
	}
	return cfd;
}
