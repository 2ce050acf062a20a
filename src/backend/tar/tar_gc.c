/* tar_gc.c: deleting tar checkpoints, keeping the archives later ones still
 * read, removing them once nothing does, and compacting long chains (the
 * sweeper's cleanup, off the operation lock). */
#include "backend/tar/tar_internal.h"
#include "lib/failpoint.h"
#include "lib/strset.h"

/* Every archive some checkpoint (other than skip) still reads, into set:
 * the union of the "refs" of the checkpoint directories. 0 or -ENOMEM. */
static int tar_gc_refs_live(struct tar_state *s, const char *skip, struct strset *set)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	int q = 0;

	if (walk_open(s->tar_fd, NULL, &d) < 0)
		return 0;
	while (q >= 0 && (de = walk_next(d))) {
		if ((!id_valid(de->d_name) && strcmp(de->d_name, BASE)) || (skip && !strcmp(de->d_name, skip)))
			continue;
		_cleanup_close_ int cfd =
			openat(s->tar_fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		_cleanup_(tar_meta_free) struct tar_meta meta = { 0 };
		if (cfd >= 0)
			tar_meta_load(cfd, &meta);
		for (size_t i = 0; q >= 0 && i < meta.refs.n; i++)
			q = strset_add(set, meta.refs.v[i]);
	}
	return q < 0 ? q : 0;
}

/* Remove what nothing reads any more: kept archives no checkpoint names,
 * and checkpoint directories a compaction replaced. Idempotent. */
void tar_gc_kept(struct tar_state *s)
{
	_cleanup_(strset_free) struct strset live = { 0 };
	bool known = tar_gc_refs_live(s, NULL, &live) == 0;
	_cleanup_close_ int kfd = openat(s->tar_fd, KEEP, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_closedir_ DIR *d = NULL, *top = NULL;
	struct dirent *de;

	if (kfd >= 0 && known && walk_open(kfd, NULL, &d) >= 0)
		while ((de = walk_next(d)))
			if (!strset_has(&live, de->d_name))
				FAILPOINT_AROUND("tar.gc.kept.remove", rm_rf_at(kfd, de->d_name));
	if (walk_open(s->tar_fd, NULL, &top) >= 0)
		while ((de = walk_next(top)))
			if (!strncmp(de->d_name, ".trash-", 7))
				FAILPOINT_AROUND("tar.gc.trash.remove", rm_rf_at(s->tar_fd, de->d_name));
	if (kfd >= 0)
		fsync(kfd);
	unlinkat(s->tar_fd, KEEP, AT_REMOVEDIR); /* only once empty */
	fsync(s->tar_fd);
}

/* Delete checkpoint name's data. If a later checkpoint reads its archives,
 * move them out of the way (one rename: crash-safe) into .keep/, where the
 * chain finds them, until no checkpoint names them. Idempotent: the next
 * start finishes a delete a crash interrupted, maybe after the move. */
int tar_gc_drop(struct tar_state *s, const char *name)
{
	_cleanup_(strset_free) struct strset live = { 0 };
	char keep[128];
	struct stat st;
	int q = tar_gc_refs_live(s, name, &live);

	if (q < 0)
		return q;
	if (strset_has(&live, name)) {
		if (fstatat(s->tar_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return errno == ENOENT ? 0 : -errno; /* moved already: .keep/ holds it */
		int made = mkdirat_durable(s->tar_fd, KEEP, 0700);
		if (made < 0)
			return made;
		snprintf(keep, sizeof(keep), KEEP "/%s", name);
		rm_rf_at(s->tar_fd, keep); /* a leftover of an older life of the name: none expected */
		if (FAILPOINT_AROUND("tar.delete.keep.rename", renameat(s->tar_fd, name, s->tar_fd, keep)) < 0)
			return -errno;
		return 0;
	}
	return FAILPOINT_AROUND("tar.delete.remove", rm_rf_at(s->tar_fd, name));
}

void tar_gc_pre_drop(struct tar_state *s)
{
	if (!s->pre[0])
		return;
	if (tar_gc_drop(s, s->pre) < 0)
		log_warn("tar: cannot drop the precopy '%s': %m", s->pre);
	fsync(s->tar_fd);
	pthread_mutex_lock(&s->lock);
	s->pre[0] = '\0';
	pthread_mutex_unlock(&s->lock);
}

/* Compaction, off the operation lock: the first checkpoint whose chain is
 * longer than tar_chain_max is rewritten as a full one in .compact-<id>/,
 * which then takes its place by one atomic exchange; the old directory
 * becomes .trash-<id>, removed under the operation lock (tar_gc_kept), so a
 * reader that opened it before the exchange can finish. A crash at any
 * point leaves the old or the new directory, both whole (recover sweeps
 * .compact-*). Readers never see a mix: each reads one directory fd. */
static int tar_gc_compact_one(struct tar_state *s, const char *name, ckpt_error *err)
{
	char tmp[NAME_MAX + 16], trash[NAME_MAX + 16], arch[32], man[32], alias[48];
	_cleanup_close_ int cfd = openat(s->tar_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_(tar_meta_free) struct tar_meta meta = { 0 };
	_cleanup_close_ int ofd = -1;
	int r = 0;

	if (cfd < 0 || tar_meta_load(cfd, &meta) < 0)
		return 0; /* deleted meanwhile */
	bool zstd = meta.zstd;
	snprintf(tmp, sizeof(tmp), ".compact-%s", name);
	snprintf(trash, sizeof(trash), ".trash-%s", name);
	rm_rf_at(s->tar_fd, tmp);
	if (mkdirat(s->tar_fd, tmp, 0700) < 0 ||
	    (ofd = openat(s->tar_fd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		r = err_set(err, errno, NULL, "cannot create '%s': %m", tmp);
	for (size_t i = 0; r >= 0 && i < s->n_roots; i++) {
		_cleanup_free_ char *text = NULL;
		size_t len = 0;
		tar_meta_names(i, zstd, arch, man);
		r = tar_compact_root(s->tar_fd, cfd, ofd, arch, man, zstd, err);
		snprintf(alias, sizeof(alias), "%s.alias", man);
		if (r >= 0 && read_file_at(cfd, alias, 1 << 30, &text, &len) >= 0)
			write_file_atomic(ofd, alias, text, len, 0600); /* only a cache */
	}
	meta.depth = 0; /* whole now: one archive per root */
	services_strv_clear(&meta.refs);
	meta.parent[0] = '\0';
	_cleanup_free_ char *text = r >= 0 ? tar_meta_text(&meta) : NULL;
	if (r >= 0 && !text)
		r = err_set(err, ENOMEM, NULL, "out of memory");
	if (r >= 0 &&
	    (r = FAILPOINT_AROUND("tar.compact.meta.write", write_file_atomic(ofd, META, text, strlen(text), 0600))) <
		    0)
		err_set(err, -r, NULL, "cannot write '%s/" META "': %s", tmp, strerror(-r));
	if (r >= 0 && FAILPOINT_AROUND("tar.compact.dir.fsync", fsync(ofd)) < 0)
		r = err_set(err, errno, NULL, "cannot sync '%s': %m", tmp);
	if (r >= 0 &&
	    FAILPOINT_AROUND("tar.compact.exchange", renameat2(s->tar_fd, tmp, s->tar_fd, name, RENAME_EXCHANGE)) < 0) {
		/* gVisor has no RENAME_EXCHANGE (EINVAL): no swap that readers
		 * never see half done, so chains stay as they are from now on */
		s->no_exchange = errno == EINVAL || errno == ENOSYS;
		r = errno == ENOENT ? 0 : err_set(err, errno, NULL, "cannot put '%s' in place: %m", tmp);
	}
	if (r >= 0)
		FAILPOINT_AROUND("tar.compact.trash.rename", renameat(s->tar_fd, tmp, s->tar_fd, trash));
	if (r < 0 || faccessat(s->tar_fd, tmp, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		rm_rf_at(s->tar_fd, tmp);
	fsync(s->tar_fd);
	return r < 0 ? r : 1;
}

/* Called by the engine's sweeper without the operation lock. */
int tar_cleanup(void *st)
{
	struct tar_state *s = st;
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	int max = s->ctx->tar_chain_max;

	tar_track_drain(s);
	if (max <= 0 || s->no_exchange || walk_open(s->tar_fd, NULL, &d) < 0)
		return 0;
	while ((de = walk_next(d))) {
		pthread_mutex_lock(&s->lock);
		bool pre = !strcmp(de->d_name, s->pre);
		pthread_mutex_unlock(&s->lock);
		if (!id_valid(de->d_name) || pre)
			continue;
		_cleanup_close_ int cfd =
			openat(s->tar_fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		_cleanup_(tar_meta_free) struct tar_meta meta = { 0 };
		if (cfd < 0 || tar_meta_load(cfd, &meta) < 0 || meta.depth <= max)
			continue;
		ckpt_error err = { 0 };
		int64_t t0 = mono_ms();
		char name[NAME_MAX + 1];
		snprintf(name, sizeof(name), "%s", de->d_name);
		bool skip = false;
		for (size_t i = 0; i < s->n_no_compact && !skip; i++)
			skip = !strcmp(s->no_compact[i], name);
		if (skip)
			continue;
		int r = tar_gc_compact_one(s, name, &err);
		if (r < 0)
			log_warn("tar: cannot compact '%s': %s%s", name, err.msg,
				 s->no_exchange ? " (no RENAME_EXCHANGE here: chains are not compacted from now on, "
						  "restores read more archives)"
						: "");
		if (s->no_exchange)
			return 0;
		if (r == -EBADMSG) { /* not again: each try would read the chain */
			char(*n)[NAME_MAX + 1] = realloc(s->no_compact, (s->n_no_compact + 1) * sizeof(*n));
			if (n) {
				snprintf(n[s->n_no_compact++], sizeof(*n), "%s", name);
				s->no_compact = n;
			}
			continue;
		}
		if (r >= 0)
			log_info("tar: compacted the chain of '%s' into a full archive in %lld ms", name,
				 (long long)(mono_ms() - t0));
		return r < 0 ? 0 : 1; /* one per call; the sweeper calls again */
	}
	return 0;
}

int tar_remove(void *st, const char *id, json_t *data, ckpt_error *err)
{
	struct tar_state *s = st;
	(void)data;
	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	int r = tar_gc_drop(s, id);
	if (r < 0)
		return err_set(err, r, NULL, "cannot remove checkpoint data '%s': %s", id, strerror(-r));
	if (FAILPOINT_AROUND("tar.delete.fsync", fsync(s->tar_fd)) < 0)
		return err_set(err, errno, NULL, "cannot sync the tar state dir: %m");
	tar_gc_kept(s);
	return 0;
}
