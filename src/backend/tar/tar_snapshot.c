/* tar_snapshot.c: taking a tar checkpoint of the roots (create, precopy) or
 * of other trees (import), and the base, taken on a thread at first start. */
#include "backend/tar/tar_internal.h"
#include "lib/failpoint.h"

static void tar_snapshot_srcs_free(struct tar_create_opts *o)
{
	for (size_t k = 0; k < o->n_srcs; k++)
		free(o->srcs[k]);
	free(o->srcs);
	o->srcs = NULL;
	o->n_srcs = 0;
}

/* from: the trees to capture, one per root (NULL: the roots themselves).
 * *max_ctime: the newest ctime captured, for the caller's tar_wait_past. */
static int tar_snapshot_roots(struct tar_state *s, int dirfd, char *const *from, struct progress *p,
			      struct timespec *max_ctime, ckpt_error *err)
{
	struct tar_create_opts o = { .zstd = s->zstd, .skip_dev = s->state_dev, .skip_ino = s->state_ino, .p = p };
	_cleanup_(rootexcl_free) struct rootexcl excl = { 0 };
	_cleanup_(services_strv_clear) struct strv refs = { 0 };
	_cleanup_(tar_meta_free) struct tar_meta pmeta = { 0 };
	struct chain ch = { .refs = &refs };
	_cleanup_close_ int pfd = -1;
	struct stat ist;
	char arch[32], man[32];

	int q = from ? 0 : tar_excl_build(s, &excl, err);
	if (q < 0)
		return q;
	o.excl = from ? NULL : &excl;
	clock_gettime(CLOCK_REALTIME_COARSE, &ch.started);
	/* Incremental against the head, unless this is an import, a restore
	 * was left unfinished (the roots are not the head), the last run was
	 * cut short (ctimes prove nothing: tar_internal.h) or the head is
	 * gone; the head's own meta and manifests are read through one fd. */
	pthread_mutex_lock(&s->lock);
	char head[64];
	snprintf(head, sizeof(head), "%s", s->head);
	pthread_mutex_unlock(&s->lock);
	if (!from && head[0] && s->ctx->tar_chain_max > 0 && !s->ctime_suspect &&
	    fstatat(s->tar_fd, INTENT, &ist, AT_SYMLINK_NOFOLLOW) < 0)
		pfd = openat(s->tar_fd, head, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (pfd >= 0 && tar_meta_load(pfd, &pmeta) == 0) {
		int64_t ns = pmeta.started_ns;
		ch.parent = head;
		ch.depth = pmeta.depth + 1;
		/* a parent from before started_ns: every entry counts as unsure */
		o.parent_started =
			ns > 0 ? (struct timespec){ ns / 1000000000, ns % 1000000000 } : (struct timespec){ 0 };
	}

	/* What changed since the head, when the trackers can tell (the events
	 * since its capture began): only those directories are read. */
	struct pathindex_dirty *dirty[MAX_ROOTS] = { 0 };
	size_t n_dirty[MAX_ROOTS] = { 0 };
	struct pathindex *sus[MAX_ROOTS] = { 0 };
	bool journal = false;
	if (!from && s->trk) {
		bool for_head = ch.parent && !strcmp(s->trk_for, ch.parent);
		journal = tar_track_collect(s, dirty, n_dirty, sus) == 0 && for_head;
	}
	if (!from)
		tar_track_scan_suspects(s, sus);
	if (!from && tar_track_mapped_join(s, sus) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	/* the parents' manifests, with what past restores wrote (aliases) */
	struct tar_manifest pms[MAX_ROOTS] = { 0 };
	bool have_pm[MAX_ROOTS] = { 0 };
	for (size_t i = 0; ch.parent && i < s->n_roots; i++) {
		char pa[32], pman[32], alias[48];
		ckpt_error perr = { 0 };
		tar_meta_names(i, s->zstd, pa, pman);
		have_pm[i] = tar_manifest_load(pfd, pman, &pms[i], &perr) >= 0;
		if (have_pm[i]) {
			snprintf(alias, sizeof(alias), "%s.alias", pman);
			tar_manifest_alias_load(pfd, alias, &pms[i]);
		}
	}
	_cleanup_(tar_track_journal_free) struct journal_bufs jb = { dirty, n_dirty, sus, pms, s->n_roots };
	(void)jb; /* only its cleanup */
	o.journal = journal;
	/* the progress totals, counted beside the create rather than before it
	 * (a walk that stats every file: half a create after a few changes);
	 * with the journal, from the parent and the changed directories */
	_cleanup_(tar_count_join) struct tar_count cnt = { 0 };
	bool counted = false;
	if (p && journal) {
		uint64_t files = 0, bytes = 0;
		counted = true;
		for (size_t i = 0; i < s->n_roots && counted; i++) {
			ckpt_error perr = { 0 };
			_cleanup_close_ int fd = tar_meta_open_root(s, i, &perr);
			struct tar_create_opts co = o;
			co.parent = &pms[i];
			co.dirty = dirty[i];
			co.n_dirty = n_dirty[i];
			counted = fd >= 0 && have_pm[i] && tar_create_count_journal(fd, &co, &files, &bytes);
		}
		if (counted) {
			tar_count_raise(&p->files_total, files);
			tar_count_raise(&p->bytes_total, bytes);
		}
	}
	if (p && !counted)
		tar_count_start(&cnt, s, from, o.excl, p);
	for (size_t i = 0; i < s->n_roots; i++) {
		_cleanup_close_ int fd = from ? open(from[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
					      : tar_meta_open_root(s, i, err);
		if (fd < 0) {
			tar_snapshot_srcs_free(&o);
			return from ? err_set(err, errno, NULL, "cannot open '%s': %m", from[i]) : fd;
		}
		struct tar_manifest *pm = have_pm[i] ? &pms[i] : NULL;
		o.parent = pm;
		o.parent_name = ch.parent;
		o.journal = journal && pm && !tar_track_changed_elsewhere(&s->trk[i], fd, pm);
		if (!from)
			tar_track_count(s, i, o.journal);
		o.dirty = dirty[i];
		o.n_dirty = n_dirty[i];
		o.suspects = sus[i];
		o.xattrs_blind = s->blind[i].xattrs_blind;
		o.mapped_blind = s->blind[i].mapped_blind;
		o.mapped_now = from ? NULL : s->mapped_now[i];
		o.mapped_last = from ? NULL : s->mapped_last[i];
		tar_meta_names(i, s->zstd, arch, man);
		int r = tar_create_root(fd, dirfd, arch, man, &o, err);
		if (r >= 0 && journal && s->ctx->track_check) /* reads only */
			r = tar_create_check(fd, dirfd, man, &o, ch.started, err);
		if (r < 0) {
			tar_snapshot_srcs_free(&o);
			return err_prefix(err, "root '%s'", s->roots[i]);
		}
	}
	tar_count_join(&cnt);
	if (p) { /* all archived: the totals are what was */
		atomic_store(&p->files_total, atomic_load(&p->files_done));
		atomic_store(&p->bytes_total, atomic_load(&p->bytes_done));
	}
	*max_ctime = o.max_ctime;
	if (!from) {
		pthread_mutex_lock(&s->lock);
		s->last_reused = o.reused;
		pthread_mutex_unlock(&s->lock);
		log_debug("tar: create read %llu directories (%s)", (unsigned long long)o.dirs_read,
			  journal ? "the changed ones: change tracking" : "all of them");
	}
	/* refs: exactly the archives the manifests name (what deletion keeps) */
	bool refs_ok = true;
	for (size_t k = 0; k < o.n_srcs; k++)
		refs_ok = refs_ok && services_strv_add(&refs, o.srcs[k]) == 0;
	tar_snapshot_srcs_free(&o);
	if (!refs_ok)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (o.reused == 0) { /* nothing taken from older archives: a full one */
		ch.parent = NULL;
		ch.depth = 0;
	}
	return tar_meta_write(s, dirfd, &ch, err);
}

/* Write checkpoint name into .tmp-<name>, then make it appear atomically. */
static int tar_snapshot_make(struct tar_state *s, const char *name, char *const *from, struct progress *p,
			     ckpt_error *err)
{
	char tmp[64];
	struct timespec max_ctime = { 0 };
	int r;

	snprintf(tmp, sizeof(tmp), ".tmp-%s", name);
	rm_rf_at(s->tar_fd, tmp);
	if (mkdirat(s->tar_fd, tmp, 0700) < 0)
		return err_set(err, tar_errno_norm(errno), NULL, "cannot create '%s': %m", tmp);
	_cleanup_close_ int dfd = openat(s->tar_fd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	r = dfd < 0 ? err_set(err, errno, NULL, "cannot open '%s': %m", tmp) : 0;
	if (r >= 0)
		r = tar_snapshot_roots(s, dfd, from, p, &max_ctime, err);
	if (r >= 0 && FAILPOINT_AROUND("tar.create.dir.fsync", fsync(dfd)) < 0)
		r = err_set(err, tar_errno_norm(errno), NULL, "cannot sync '%s': %m", tmp);
	if (r >= 0 && FAILPOINT_AROUND("tar.create.rename", renameat(s->tar_fd, tmp, s->tar_fd, name)) < 0)
		r = err_set(err, errno, NULL, "cannot rename '%s': %m", tmp);
	if (r >= 0 && FAILPOINT_AROUND("tar.create.store.fsync", fsync(s->tar_fd)) < 0)
		r = err_set(err, tar_errno_norm(errno), NULL, "cannot sync the tar state dir: %m");
	if (r < 0) {
		rm_rf_at(s->tar_fd, tmp);
		rm_rf_at(s->tar_fd, name);
		fsync(s->tar_fd);
		return r;
	}
	/* after the syncs, which mostly outlast the tick: no wait left */
	tar_wait_past(max_ctime);
	return r;
}

/* The first start takes the base off the request path: health answers at
 * once ("preparing") and everything that reads or writes the roots waits. */
void *tar_snapshot_base(void *arg)
{
	struct tar_state *s = arg;
	ckpt_error err = { 0 };
	int64_t t0 = mono_ms();
	int r = tar_snapshot_make(s, BASE, NULL, NULL, &err);

	if (r >= 0)
		tar_meta_head_set(s, BASE);
	tar_track_mark(s, r >= 0 ? BASE : "");
	pthread_mutex_lock(&s->lock);
	s->base_state = r < 0 ? BASE_FAILED : BASE_READY;
	snprintf(s->base_error, sizeof(s->base_error), "%.200s", r < 0 ? err.msg : "");
	pthread_cond_broadcast(&s->base_cond);
	pthread_mutex_unlock(&s->lock);
	if (r < 0)
		log_warn("tar: cannot record the roots' base: %s", err.msg);
	else
		log_info("tar: recorded the roots' base in %lld ms", (long long)(mono_ms() - t0));
	return NULL;
}

/* Wait for the base; if taking it failed, try again now (callers hold the
 * engine's operation lock, so only one does). */
int tar_snapshot_base_wait(struct tar_state *s, ckpt_error *err)
{
	pthread_mutex_lock(&s->lock);
	while (s->base_state == BASE_PREPARING)
		pthread_cond_wait(&s->base_cond, &s->lock);
	bool failed = s->base_state == BASE_FAILED;
	pthread_mutex_unlock(&s->lock);
	if (!failed)
		return 0;
	int r = tar_snapshot_make(s, BASE, NULL, NULL, err);
	tar_track_mark(s, r < 0 ? "" : BASE);
	if (r < 0)
		return err_prefix(err, "cannot record the roots' base");
	tar_meta_head_set(s, BASE);
	pthread_mutex_lock(&s->lock);
	s->base_state = BASE_READY;
	s->base_error[0] = '\0';
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* A checkpoint of the roots (from NULL) or of the trees from[] (import). */
static int tar_capture(void *st, const char *id, char *const *from, json_t **ret_data, uint64_t *ret_size,
		       struct progress *p, ckpt_error *err)
{
	struct tar_state *s = st;
	uint64_t size = 0;
	int r;

	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	if ((r = tar_snapshot_base_wait(s, err)) < 0)
		return r;
	pthread_mutex_lock(&s->lock);
	bool after_pre = !from && s->pre[0];
	pthread_mutex_unlock(&s->lock);
	r = tar_snapshot_make(s, id, from, after_pre ? NULL : p, err);
	if (!from)
		tar_track_mark(s, r < 0 ? "" : id);
	if (r < 0)
		return r;
	if (!from && s->pre[0]) /* the precopy's data is this checkpoint's too */
		tree_disk_usage(s->tar_fd, s->pre, &size);
	if (!from) { /* the roots are this checkpoint now; an import is not the roots */
		tar_meta_head_set(s, id);
		tar_gc_pre_drop(s);
	}
	uint64_t own = 0;
	tree_disk_usage(s->tar_fd, id, &own);
	size += own;
	if (ret_size)
		*ret_size = size;
	if (ret_data) {
		*ret_data = json_pack("{s:s, s:I}", "compression", s->zstd ? "zstd" : "none", "roots",
				      (json_int_t)s->n_roots);
		pthread_mutex_lock(&s->lock);
		if (*ret_data && !from)
			json_object_set_new(*ret_data, "reused_files", json_integer((json_int_t)s->last_reused));
		pthread_mutex_unlock(&s->lock);
	}
	return 0;
}

/* The pass before the freeze: an incremental checkpoint that no record
 * names, made the head, so that the frozen create archives only what
 * changed since. It stays as a data source of that create (kept aside in
 * .keep/ by tar_gc_pre_drop, removed when nothing reads it). It costs a
 * walk of its own: made only when some unit is frozen around the create
 * (frozen), which it shortens. */
int tar_precopy(void *st, bool frozen, struct progress *p, ckpt_error *err)
{
	struct tar_state *s = st;
	char id[64];
	int r;

	if (!frozen || s->ctx->tar_chain_max <= 0)
		return 0;
	if ((r = tar_snapshot_base_wait(s, err)) < 0)
		return r;
	if ((r = id_generate(id, sizeof(id))) < 0)
		return err_set(err, -r, NULL, "cannot make an id: %s", strerror(-r));
	/* the progress a client sees is this pass's: the frozen one is short */
	r = tar_snapshot_make(s, id, NULL, p, err);
	tar_track_mark(s, r < 0 ? "" : id);
	if (r < 0)
		return r;
	tar_gc_pre_drop(s); /* an older precopy no create used */
	tar_meta_head_set(s, id);
	pthread_mutex_lock(&s->lock);
	snprintf(s->pre, sizeof(s->pre), "%s", id);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int tar_create(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p, ckpt_error *err)
{
	return tar_capture(st, id, NULL, ret_data, ret_size, p, err);
}

int tar_import(void *st, const char *id, char *const *dirs, json_t **ret_data, uint64_t *ret_size, ckpt_error *err)
{
	return tar_capture(st, id, dirs, ret_data, ret_size, NULL, err);
}
