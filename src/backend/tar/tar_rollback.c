/* tar_rollback.c: restore (and reset) every root to a tar checkpoint under
 * an intent file, and finish at start a restore the last run left. */
#include "backend/tar/tar_internal.h"
#include "lib/failpoint.h"

static void add_stats(struct tar_restore_stats *sum, const struct tar_restore_stats *one)
{
	sum->rewritten += one->rewritten;
	sum->removed += one->removed;
	sum->kept += one->kept;
	sum->bytes += one->bytes;
	sum->archives += one->archives;
	sum->entered += one->entered;
	sum->tracked += one->tracked;
}

static int restore_roots(struct tar_state *s, int cfd, bool zstd, bool trust_nothing, struct progress *p,
			 struct tar_restore_stats *sum, struct journal_bufs *jb, bool journal,
			 struct restore_details *whole, ckpt_error *err)
{
	struct tar_restore_opts o = { .skip_dev = s->state_dev,
				      .skip_ino = s->state_ino,
				      .p = p,
				      .trust_nothing = trust_nothing,
				      .store_fd = s->tar_fd };
	char arch[32], man[32];
	_cleanup_(rootexcl_free) struct rootexcl excl = { 0 };
	int q = tar_excl_build(s, &excl, err);

	if (q < 0)
		return q;
	o.excl = &excl;
	for (size_t i = 0; i < s->n_roots; i++) {
		struct tar_restore_stats one;
		_cleanup_close_ int fd = tar_meta_open_root(s, i, err);
		if (fd < 0)
			return fd;
		tar_meta_names(i, zstd, arch, man);
		o.journal = journal;
		o.dirty = journal ? jb->dirty[i] : NULL;
		o.n_dirty = journal ? jb->n_dirty[i] : 0;
		o.suspects = jb->sus[i];
		o.xattrs_blind = s->blind[i].xattrs_blind;
		o.outside_inos = journal && s->trk ? s->trk[i].outside_inos : NULL;
		o.n_outside_inos = journal && s->trk ? s->trk[i].n_outside_inos : 0;
		o.root_path = s->roots[i];
		o.by_rename = s->ctx->whole_root; /* also when resumed at start */
		o.gone = whole ? whole->gone : NULL;
		o.units_linked = whole ? &whole->units_linked : NULL;
		o.before_change = whole ? whole->before_change : NULL;
		o.before_change_ctx = whole ? whole->before_change_ctx : NULL;
		o.mcache = &s->mcache[i];
		int r = tar_restore_root(fd, cfd, arch, man, &o, &one, err);
		if (whole && o.unit_files_changed)
			whole->unit_files_changed = true;
		if (whole)
			whole->held = o.held;
		if (r < 0)
			return err_prefix(err, "root '%s'", s->roots[i]);
		tar_track_count(s, i, one.tracked);
		add_stats(sum, &one);
		/* The intent goes only once the restored tree is on disk. */
		if (FAILPOINT_AROUND("tar.restore.syncfs", syncfs(fd)) < 0)
			return err_set(err, errno, NULL, "cannot sync root '%s': %m", s->roots[i]);
		/* after the sync, which mostly outlasts the tick: no wait left */
		tar_wait_past(o.max_ctime);
	}
	return 0;
}

/* Make every root equal to checkpoint dir name ("base" for a reset). */
static int do_restore(struct tar_state *s, const char *name, struct restore_details *details, struct progress *p,
		      ckpt_error *err)
{
	struct tar_restore_stats sum = { 0 };
	bool zstd = false;
	int r;

	_cleanup_close_ int cfd = openat(s->tar_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cfd < 0)
		return err_set(err, errno == ENOENT ? ENOENT : errno, errno == ENOENT ? "not_found" : NULL,
			       "checkpoint data '%s' is missing: %m", name);
	r = tar_meta_read(s, cfd, name, &zstd, err);
	if (r < 0)
		return r;
	/* An intent left over means a restore failed or was cut short: what it
	 * touched may look unchanged (same size, a new ctime that an alias
	 * could have recorded), so this one trusts nothing and rewrites all.
	 * So does the first restore after a run that did not end cleanly. */
	struct stat ist;
	bool suspect = s->ctime_suspect, left = fstatat(s->tar_fd, INTENT, &ist, AT_SYMLINK_NOFOLLOW) == 0;
	bool trust_nothing = suspect || left;
	r = tar_meta_intent_write(s, name, err);
	if (r < 0)
		return r;
	/* Restoring the checkpoint the roots were last made or restored as,
	 * the events since say where they differ: only there is looked at.
	 * From here on the events say what this restore wrote, and what
	 * changed after (an entry it kept is the one the checkpoint captured). */
	struct pathindex_dirty *dirty[MAX_ROOTS] = { 0 };
	size_t n_dirty[MAX_ROOTS] = { 0 };
	struct pathindex *sus[MAX_ROOTS] = { 0 };
	bool same = s->trk && !strcmp(s->trk_for, name);
	bool journal = tar_track_collect(s, dirty, n_dirty, sus) == 0 && same;
	_cleanup_(tar_track_journal_free) struct journal_bufs jb = { dirty, n_dirty, sus, NULL, s->n_roots };
	tar_track_scan_suspects(s, sus);
	if (tar_track_mapped_join(s, sus) < 0) /* out of memory: rewrite them all */
		journal = false, trust_nothing = true;
	/* The whole sandbox: what the restore replaced, for the services step */
	bool want_whole = details && s->ctx->whole_root;
	struct restore_details whole = { .before_change = want_whole ? details->before_change : NULL,
					 .before_change_ctx = want_whole ? details->before_change_ctx : NULL };
	if (want_whole && !(whole.gone = calloc(1, sizeof(*whole.gone)))) {
		restore_details_free(&whole);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	r = restore_roots(s, cfd, zstd, trust_nothing, p, &sum, &jb, journal, want_whole ? &whole : NULL, err);
	tar_track_drain_own(s);
	log_debug("tar: restore of '%s' read %s", name,
		  r >= 0 && sum.tracked == s->n_roots ? "the directories that changed (change tracking)"
						      : "the whole tree");
	if (r < 0 && whole.held) { /* nothing changed: as if it never began */
		details->held = true;
		tar_track_mark(s, ""); /* the events collected are lost: the next one walks all */
		restore_details_free(&whole);
		if (!left)
			tar_meta_intent_clear(s, NULL);
		return r;
	}
	if (r < 0) { /* the intent stays: the next open runs the restore again */
		restore_details_free(&whole);
		tar_meta_unfinished(s, name, err ? err->msg : "");
		return r;
	}
	tar_meta_head_set(s, name); /* before the intent goes: its sync covers both */
	r = tar_meta_intent_clear(s, err);
	if (r >= 0 && suspect) /* every entry rewritten, and synced (restore_roots) */
		tar_meta_running_trust(s);
	tar_track_mark(s, r >= 0 ? name : "");
	pthread_mutex_lock(&s->lock);
	s->last = sum;
	s->pending[0] = '\0';
	pthread_mutex_unlock(&s->lock);
	if (details) {
		*details = (struct restore_details){ .counts_key = "tar",
						     .rewritten = sum.rewritten,
						     .removed = sum.removed,
						     .kept = sum.kept,
						     .bytes = sum.bytes,
						     .gone = whole.gone,
						     .unit_files_changed = whole.unit_files_changed,
						     .units_linked = whole.units_linked };
		whole.gone = NULL, whole.units_linked = (struct strv){ 0 }; /* handed to details */
	}
	restore_details_free(&whole);
	return r;
}

int tar_restore(void *st, const char *id, json_t *data, struct restore_details *details, struct progress *p,
		ckpt_error *err)
{
	int r;
	(void)data;
	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	if ((r = tar_snapshot_base_wait(st, err)) < 0)
		return r;
	return do_restore(st, id, details, p, err);
}

int tar_reset(void *st, struct restore_details *details, ckpt_error *err)
{
	int r = tar_snapshot_base_wait(st, err);
	return r < 0 ? r : do_restore(st, BASE, details, NULL, err);
}

/* A restore the previous run did not finish is run again now. A failure is
 * kept visible (health) and the intent stays, so nothing pretends the roots
 * are consistent; the daemon still starts so a client can restore again. */
void tar_rollback_finish(struct tar_state *s)
{
	_cleanup_free_ char *text = NULL;
	ckpt_error err = { 0 };

	if (read_file_at(s->tar_fd, INTENT, 4096, &text, NULL) < 0)
		return;
	json_auto_t *j = json_loads(text, 0, NULL);
	const char *id = json_string_value(json_object_get(j, "id"));
	char name[64];
	snprintf(name, sizeof(name), "%s", id ? id : "");
	if (strcmp(name, BASE) && !id_valid(name)) {
		tar_meta_intent_clear(s, NULL);
		return;
	}
	log_debug("tar: finishing the interrupted restore of '%s'", name);
	if (do_restore(s, name, NULL, NULL, &err) >= 0)
		return;
	if (err.errnum == ENOENT) {
		tar_meta_intent_clear(s, NULL);
		return;
	}
	log_debug("tar: interrupted restore of '%s' failed again: %s", name, err.msg);
}
