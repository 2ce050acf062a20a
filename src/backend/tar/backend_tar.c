/* backend_tar.c: checkpoints as libarchive pax archives, for sandboxes where
 * mounting is not allowed. Layout below <state>/tar/:
 *   <id>/meta.json, <id>/r<N>.tar[.zst], <id>/r<N>.manifest   one checkpoint
 *   base/...                    the roots as ckptd first adopted them
 *   .tmp-<id>/                  a checkpoint being written (never trusted)
 *   restoring.json              intent: a restore in progress ({"id": ...})
 *   head                        the checkpoint the roots were last made or
 *                               restored as: the next create's parent
 *   .keep/<id>/                 a deleted checkpoint whose archives later
 *                               (incremental) checkpoints still read
 *   .compact-<id>/, .trash-<id>/ a compaction being written / replaced
 * Incremental checkpoints: a create writes into its own archive only what
 * changed since the head (and every directory, link and special file),
 * plus the full manifest, whose lines name the older archive holding each
 * unchanged file's data. meta.json lists those archives ("refs") and the
 * chain's length ("depth"); chains longer than tar_chain_max are compacted
 * into a full archive off the operation lock.
 * A checkpoint directory appears by rename only once its files are durable;
 * a restore runs between writing and removing the intent, and is idempotent,
 * so a restarted daemon finishes it by running it again. */
#include "backend/backend.h"

#include <limits.h>
#include <pthread.h>
#include <sys/stat.h>

#include "config.h"
#include "backend/change_track.h"
#include "backend/tar/tar_compact.h"
#include "backend/tar/tar_create.h"
#include "backend/tar/tar_diff.h"
#include "backend/tar/tar_fs.h"
#include "backend/tar/tar_restore.h"
#include "lib/walk.h"
#include "backend/backend_diff.h"
#include "backend/tar/tar_verify.h"

#define TAR_DIR "tar"
#define INTENT "restoring.json"
#define BASE "base"
#define META "meta.json"
#define HEAD "head"
#define KEEP ".keep"

struct tar_state {
	const struct backend_ctx *ctx;
	char **roots;
	size_t n_roots;
	int tar_fd;
	bool zstd;
	dev_t state_dev;
	ino_t state_ino;
	pthread_mutex_t lock;     /* guards the members health reads */
	pthread_cond_t base_cond; /* base_state left BASE_PREPARING */
	pthread_t base_thread;
	bool base_thread_started;
	enum {
		BASE_READY,
		BASE_PREPARING,
		BASE_FAILED
	} base_state;
	char base_error[256];
	struct tar_restore_stats last; /* of the last restore */
	char pending[64];              /* id of a restore that could not be finished */
	char pending_msg[256];
	char head[64];        /* see HEAD; "" when unknown (the next create is full) */
	char pre[64];         /* the last precopy's directory, until a create uses it */
	uint64_t last_reused; /* files the last create took from older archives */
	/* Change tracking (the journal, docs in tar_create.h): one tracker per
	 * root, or none. trk_for names the checkpoint whose capture (or
	 * restore) began at the trackers' last collect: only a create whose
	 * parent it is may trust the events since. The operation lock's. */
	struct chg_track *trk;
	pthread_mutex_t trk_lock; /* the trackers: collects, and the sweeper's drains */
	char trk_for[64];
	bool trk_collected;               /* the trackers have seen everything since the last collect */
	char (*no_compact)[NAME_MAX + 1]; /* chains whose compaction found data unlike */
	size_t n_no_compact;              /* its digests: left as they are (the sweeper's own) */
};

static void pre_drop(struct tar_state *s);
static int drop_ckpt(struct tar_state *s, const char *name);

static int tar_probe(const struct backend_ctx *ctx, ckpt_error *err)
{
	(void)ctx;
	(void)err;
	return 0; /* needs nothing but a writable state dir */
}

static void entry_names(size_t i, bool zstd, char *arch, char *man)
{
	snprintf(arch, 32, "r%zu.tar%s", i, zstd ? ".zst" : "");
	snprintf(man, 32, "r%zu.manifest", i);
}

static int open_root(const struct tar_state *s, size_t i, ckpt_error *err)
{
	int fd = open(s->roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errno, NULL, "cannot open root '%s': %m", s->roots[i]);
	return fd;
}

/* The chain a checkpoint heads: its parent (NULL: a full checkpoint), the
 * older checkpoints whose archives its manifests name, its length, and when
 * its capture began (what reusing its entries compares ctimes with). */
struct chain {
	const char *parent;
	json_t *refs; /* array of names; borrowed */
	json_int_t depth;
	struct timespec started;
};

/* Only a hint (any checkpoint is a correct parent: reuse compares every
 * file with what the parent recorded), so a failure to save it is ignored. */
static void head_set(struct tar_state *s, const char *name)
{
	pthread_mutex_lock(&s->lock);
	snprintf(s->head, sizeof(s->head), "%s", name);
	pthread_mutex_unlock(&s->lock);
	write_file_atomic(s->tar_fd, HEAD, name, strlen(name), 0600);
}

static void head_load(struct tar_state *s)
{
	_cleanup_free_ char *text = NULL;
	struct stat st;
	if (read_file_at(s->tar_fd, HEAD, 128, &text, NULL) < 0)
		return;
	text[strcspn(text, "\n")] = '\0';
	if ((id_valid(text) || !strcmp(text, BASE)) && fstatat(s->tar_fd, text, &st, AT_SYMLINK_NOFOLLOW) == 0)
		snprintf(s->head, sizeof(s->head), "%s", text);
}

/* Arm root i's tracker (again): a plain directory, ckptd's own writes. */
static int trk_arm_one(struct tar_state *s, size_t i)
{
	_cleanup_close_ int fd = open(s->roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int r = fd < 0 ? -errno : chg_track_arm(&s->trk[i], fd);
	if (r >= 0) {
		s->trk[i].plain_dir = true;
		s->trk[i].own_pid = getpid();
	}
	return r;
}

/* Change tracking: CKPTD_TRACK_CHANGES=0 turns it off (as on overlay). */
static void trk_arm(struct tar_state *s)
{
	const char *v = getenv("CKPTD_TRACK_CHANGES");
	if ((v && !strcmp(v, "0")) || !(s->trk = calloc(s->n_roots, sizeof(*s->trk))))
		return;
	for (size_t i = 0; i < s->n_roots; i++) {
		s->trk[i] = (struct chg_track)CHG_TRACK_INIT;
		int r = trk_arm_one(s, i);
		if (r < 0) {
			log_info("tar: no change tracking for '%s' (%s): creates read the whole tree", s->roots[i],
				 strerror(-r));
			for (size_t k = 0; k <= i; k++)
				chg_track_disarm(&s->trk[k]);
			free(s->trk);
			s->trk = NULL;
			return;
		}
	}
}

static void trk_free(struct tar_state *s)
{
	for (size_t i = 0; s->trk && i < s->n_roots; i++)
		chg_track_disarm(&s->trk[i]);
	free(s->trk);
	s->trk = NULL;
}

/* What changed in each root since the last collect, into dirty[i] (when
 * dirty is not NULL; else dropped); from now on the trackers count for the
 * checkpoint trk_mark names. 0 when every root could tell; a tracker that
 * could not is armed again, so that it can from now on (the walk that
 * follows covers what it lost). */
static int trk_collect_locked(struct tar_state *s, struct treecopy_dirty **dirty, size_t *n_dirty,
			      struct treecopy_index **sus)
{
	int ret = s->trk ? 0 : -EAGAIN;
	s->trk_for[0] = '\0';
	for (size_t i = 0; s->trk && i < s->n_roots; i++) {
		struct treecopy_dirty *d = NULL;
		size_t n = 0;
		const char *why = "cannot stat the root";
		struct stat rst;
		int r = stat(s->roots[i], &rst) < 0
			? -EAGAIN
			: chg_track_collect(&s->trk[i], s->roots[i], rst.st_dev, &d, &n, &why);
		if (r < 0) {
			log_debug("tar: change tracking of '%s' cannot tell what changed (%s): this create reads "
				  "the whole tree",
				  s->roots[i], why);
			if (trk_arm_one(s, i) < 0) {
				trk_free(s);
				return -EAGAIN;
			}
			ret = -EAGAIN;
		}
		if (r >= 0 && dirty) {
			dirty[i] = d;
			n_dirty[i] = n;
		} else {
			treecopy_dirty_free(d, n);
		}
		if (sus) {
			treecopy_index_free(sus[i]);
			/* an empty set when the collect found none: known, not scanned again */
			sus[i] = r < 0               ? NULL
				: s->trk[i].suspects ? TAKE_PTR(s->trk[i].suspects)
						     : treecopy_index_new();
		}
	}
	s->trk_collected = s->trk != NULL; /* each root read or armed again: from now on */
	return ret;
}

static int trk_collect(struct tar_state *s, struct treecopy_dirty **dirty, size_t *n_dirty, struct treecopy_index **sus)
{
	pthread_mutex_lock(&s->trk_lock);
	int r = trk_collect_locked(s, dirty, n_dirty, sus);
	pthread_mutex_unlock(&s->trk_lock);
	return r;
}

/* The sweeper reads the events now and then: a tracker armed between
 * creates would otherwise queue, in the kernel, every change of the
 * filesystem (a tar root shares it with everything else). */
static void trk_drain(struct tar_state *s)
{
	pthread_mutex_lock(&s->trk_lock);
	for (size_t i = 0; s->trk && i < s->n_roots; i++)
		chg_track_drain(&s->trk[i]);
	pthread_mutex_unlock(&s->trk_lock);
}

/* name's capture or restore began at the last collect: it is the one the
 * events since count for, if that collect saw everything. */
static void trk_mark(struct tar_state *s, const char *name)
{
	snprintf(s->trk_for, sizeof(s->trk_for), "%s", s->trk && s->trk_collected ? name : "");
	s->trk_collected = false;
}

static int write_meta(struct tar_state *s, int dirfd, const struct chain *ch, ckpt_error *err)
{
	json_t *roots = json_array();
	for (size_t i = 0; i < s->n_roots; i++)
		json_array_append_new(roots, json_string(s->roots[i]));
	json_auto_t *meta = json_pack("{s:i, s:s, s:o, s:I, s:O, s:I}", "version", 1, "compression",
				      s->zstd ? "zstd" : "none", "roots", roots, "depth", ch->depth, "refs", ch->refs,
				      "started_ns", (json_int_t)ch->started.tv_sec * 1000000000 + ch->started.tv_nsec);
	if (meta && ch->parent)
		json_object_set_new(meta, "parent", json_string(ch->parent));
	_cleanup_free_ char *text = meta ? json_dumps(meta, JSON_COMPACT) : NULL;
	if (!text)
		return err_set(err, ENOMEM, NULL, "out of memory");
	int r = write_file_atomic(dirfd, META, text, strlen(text), 0600);
	if (r < 0)
		return err_set(err, tar_errno_norm(r), r == -ENOSPC || r == -EDQUOT ? "insufficient_storage" : NULL,
			       "cannot write checkpoint metadata: %s", strerror(-r));
	return 0;
}

/* Read meta.json of a checkpoint dir and check it covers our roots. */
static int read_meta(struct tar_state *s, int dirfd, const char *name, bool *zstd, ckpt_error *err)
{
	_cleanup_free_ char *text = NULL;
	json_auto_t *meta = NULL;
	json_t *roots;
	int r = read_file_at(dirfd, META, 1 << 20, &text, NULL);

	if (r < 0)
		return err_set(err, r, NULL, "checkpoint '%s' has no metadata: %s", name, strerror(-r));
	meta = json_loads(text, 0, NULL);
	roots = json_object_get(meta, "roots");
	r = 0;
	if (!json_is_array(roots) || json_array_size(roots) != s->n_roots)
		r = err_set(err, EINVAL, NULL, "checkpoint '%s' was made for other roots", name);
	for (size_t i = 0; r == 0 && i < s->n_roots; i++)
		if (!json_is_string(json_array_get(roots, i)) ||
		    strcmp(json_string_value(json_array_get(roots, i)), s->roots[i]))
			r = err_set(err, EINVAL, NULL, "checkpoint '%s' was made for other roots", name);
	*zstd = !strcmp(json_string_value(json_object_get(meta, "compression")) ?: "", "zstd");
	return r;
}

/* The meta.json of dirfd as JSON, or NULL. */
static json_t *meta_load(int dirfd)
{
	_cleanup_free_ char *text = NULL;
	if (read_file_at(dirfd, META, 1 << 20, &text, NULL) < 0)
		return NULL;
	return json_loads(text, 0, NULL);
}

static void srcs_free(struct tar_create_opts *o)
{
	for (size_t k = 0; k < o->n_srcs; k++)
		free(o->srcs[k]);
	free(o->srcs);
	o->srcs = NULL;
	o->n_srcs = 0;
}

/* The progress totals of a create, counted by a thread beside it: a walk
 * that stats every file would otherwise come first and double the time of a
 * create after a few changes. The create's own counts raise a total they
 * pass (tar_create.c add_done), so the bar is full until the count arrives. */
struct tar_count {
	pthread_t t;
	bool started;
	atomic_bool stop;
	int fds[MAX_ROOTS];
	size_t n;
	dev_t skip_dev;
	ino_t skip_ino;
	struct progress *p;
};

/* total = max(total, v), against add_done's own raises. */
static void raise_total(_Atomic uint64_t *total, uint64_t v)
{
	uint64_t t = atomic_load(total);
	while (v > t && !atomic_compare_exchange_weak(total, &t, v))
		;
}

static void *tar_count_main(void *arg)
{
	struct tar_count *c = arg;
	uint64_t files = 0, bytes = 0;
	for (size_t i = 0; i < c->n && !atomic_load(&c->stop); i++)
		tar_count_tree(c->fds[i], c->skip_dev, c->skip_ino, &c->stop, &files, &bytes);
	if (!atomic_load(&c->stop)) {
		raise_total(&c->p->files_total, files);
		raise_total(&c->p->bytes_total, bytes);
	}
	return NULL;
}

static void tar_count_start(struct tar_count *c, struct tar_state *s, char *const *from, struct progress *p)
{
	c->p = p;
	c->skip_dev = s->state_dev;
	c->skip_ino = s->state_ino;
	for (size_t i = 0; i < s->n_roots && i < MAX_ROOTS; i++) {
		int fd = open(from ? from[i] : s->roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd >= 0)
			c->fds[c->n++] = fd;
	}
	c->started = pthread_create(&c->t, NULL, tar_count_main, c) == 0;
	if (!c->started)
		log_debug("tar: no thread to count the progress totals: the bar follows the create");
}

/* Stop and wait for the count (a cleanup: every way out of the create). */
static void tar_count_join(struct tar_count *c)
{
	atomic_store(&c->stop, true);
	if (c->started)
		pthread_join(c->t, NULL);
	c->started = false;
	for (size_t i = 0; i < c->n; i++)
		close(c->fds[i]);
	c->n = 0;
}

/* A file the checkpoint holds that is mapped for writing, or got another
 * name, outside the root (a chroot, a mount namespace, a hard link): its
 * writes make no event in the root, so only the walk can see them. */
static bool changed_elsewhere(const struct chg_track *t, const struct tar_manifest *pm)
{
	const struct tar_mentry *e = tar_manifest_holds_ino(pm, t->outside_inos, t->n_outside_inos);
	if (e)
		log_debug("tar: '%s' is mapped for writing or linked under a path outside the root: the whole tree "
			  "is read",
			  e->path);
	return e != NULL;
}

/* Files a process maps shared and writable now, for each root change
 * tracking named none for (not tracking, or it could not tell): a write
 * through such a mapping may leave no new ctime, so they are archived and
 * rewritten, never trusted. A scan that fails is logged. */
static void scan_suspects(struct tar_state *s, struct treecopy_index **sus)
{
	for (size_t i = 0; i < s->n_roots; i++) {
		struct stat rst;
		const char *why = "cannot stat the root";
		if (sus[i])
			continue;
		if (stat(s->roots[i], &rst) < 0 || chg_scan_mapped(s->roots[i], rst.st_dev, true, &sus[i], &why) < 0)
			log_warn("tar: cannot tell which files of '%s' are mapped shared and writable (%s): a "
				 "write through such a mapping may be missed",
				 s->roots[i], why);
	}
}

struct journal_bufs {
	struct treecopy_dirty **dirty;
	size_t *n_dirty;
	struct treecopy_index **sus;
	struct tar_manifest *pms; /* or NULL */
	size_t n;
};

static void journal_free(struct journal_bufs *j)
{
	for (size_t i = 0; i < j->n; i++) {
		treecopy_dirty_free(j->dirty[i], j->n_dirty[i]);
		treecopy_index_free(j->sus[i]);
		if (j->pms)
			tar_manifest_free(&j->pms[i]);
	}
}

/* from: the trees to capture, one per root (NULL: the roots themselves). */
static int snapshot_roots(struct tar_state *s, int dirfd, char *const *from, struct progress *p, ckpt_error *err)
{
	struct tar_create_opts o = { .zstd = s->zstd, .skip_dev = s->state_dev, .skip_ino = s->state_ino, .p = p };
	json_auto_t *refs = json_array(), *pmeta = NULL;
	struct chain ch = { .refs = refs };
	_cleanup_close_ int pfd = -1;
	struct stat ist;
	char arch[32], man[32];

	clock_gettime(CLOCK_REALTIME_COARSE, &ch.started);
	/* Incremental against the head, unless this is an import, a restore
	 * was left unfinished (the roots are not the head), or the head is
	 * gone; the head's own meta and manifests are read through one fd. */
	pthread_mutex_lock(&s->lock);
	char head[64];
	snprintf(head, sizeof(head), "%s", s->head);
	pthread_mutex_unlock(&s->lock);
	if (!from && head[0] && s->ctx->cfg && s->ctx->cfg->tar_chain_max > 0 &&
	    fstatat(s->tar_fd, INTENT, &ist, AT_SYMLINK_NOFOLLOW) < 0)
		pfd = openat(s->tar_fd, head, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	pmeta = pfd >= 0 ? meta_load(pfd) : NULL;
	if (pmeta) {
		json_int_t ns = json_integer_value(json_object_get(pmeta, "started_ns"));
		ch.parent = head;
		ch.depth = json_integer_value(json_object_get(pmeta, "depth")) + 1;
		/* a parent from before started_ns: every entry counts as unsure */
		o.parent_started =
			ns > 0 ? (struct timespec){ ns / 1000000000, ns % 1000000000 } : (struct timespec){ 0 };
	}

	/* What changed since the head, when the trackers can tell (the events
	 * since its capture began): only those directories are read. */
	struct treecopy_dirty *dirty[MAX_ROOTS] = { 0 };
	size_t n_dirty[MAX_ROOTS] = { 0 };
	struct treecopy_index *sus[MAX_ROOTS] = { 0 };
	bool journal = false;
	if (!from && s->trk) {
		bool for_head = ch.parent && !strcmp(s->trk_for, ch.parent);
		journal = trk_collect(s, dirty, n_dirty, sus) == 0 && for_head;
	}
	if (!from)
		scan_suspects(s, sus);
	/* the parents' manifests, with what past restores wrote (aliases) */
	struct tar_manifest pms[MAX_ROOTS] = { 0 };
	bool have_pm[MAX_ROOTS] = { 0 };
	for (size_t i = 0; ch.parent && i < s->n_roots; i++) {
		char pa[32], pman[32], alias[48];
		ckpt_error perr = { 0 };
		entry_names(i, s->zstd, pa, pman);
		have_pm[i] = tar_manifest_load(pfd, pman, &pms[i], &perr) >= 0;
		if (have_pm[i]) {
			snprintf(alias, sizeof(alias), "%s.alias", pman);
			tar_manifest_alias_load(pfd, alias, &pms[i]);
		}
	}
	_cleanup_(journal_free) struct journal_bufs jb = { dirty, n_dirty, sus, pms, s->n_roots };
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
			_cleanup_close_ int fd = open_root(s, i, &perr);
			struct tar_create_opts co = o;
			co.parent = &pms[i];
			co.dirty = dirty[i];
			co.n_dirty = n_dirty[i];
			counted = fd >= 0 && have_pm[i] && tar_create_count_journal(fd, &co, &files, &bytes);
		}
		if (counted) {
			raise_total(&p->files_total, files);
			raise_total(&p->bytes_total, bytes);
		}
	}
	if (p && !counted)
		tar_count_start(&cnt, s, from, p);
	for (size_t i = 0; i < s->n_roots; i++) {
		_cleanup_close_ int fd =
			from ? open(from[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : open_root(s, i, err);
		if (fd < 0) {
			srcs_free(&o);
			return from ? err_set(err, errno, NULL, "cannot open '%s': %m", from[i]) : fd;
		}
		struct tar_manifest *pm = have_pm[i] ? &pms[i] : NULL;
		o.parent = pm;
		o.parent_name = ch.parent;
		o.journal = journal && pm && !changed_elsewhere(&s->trk[i], pm);
		o.dirty = dirty[i];
		o.n_dirty = n_dirty[i];
		o.suspects = sus[i];
		entry_names(i, s->zstd, arch, man);
		int r = tar_create_root(fd, dirfd, arch, man, &o, err);
		if (r >= 0 && journal && getenv("CKPTD_TRACK_CHECK"))
			r = tar_create_check(fd, dirfd, man, &o, ch.started, err);
		if (r < 0) {
			srcs_free(&o);
			return err_prefix(err, "root '%s'", s->roots[i]);
		}
	}
	tar_count_join(&cnt);
	if (p) { /* all archived: the totals are what was */
		atomic_store(&p->files_total, atomic_load(&p->files_done));
		atomic_store(&p->bytes_total, atomic_load(&p->bytes_done));
	}
	tar_wait_past(o.max_ctime);
	if (!from) {
		pthread_mutex_lock(&s->lock);
		s->last_reused = o.reused;
		pthread_mutex_unlock(&s->lock);
		log_debug("tar: create read %llu directories (%s)", (unsigned long long)o.dirs_read,
			  journal ? "the changed ones: change tracking" : "all of them");
	}
	/* refs: exactly the archives the manifests name (what deletion keeps) */
	for (size_t k = 0; k < o.n_srcs; k++)
		json_array_append_new(refs, json_string(o.srcs[k]));
	srcs_free(&o);
	if (o.reused == 0) { /* nothing taken from older archives: a full one */
		ch.parent = NULL;
		ch.depth = 0;
	}
	return write_meta(s, dirfd, &ch, err);
}

/* Write checkpoint name into .tmp-<name>, then make it appear atomically. */
static int snapshot(struct tar_state *s, const char *name, char *const *from, struct progress *p, ckpt_error *err)
{
	char tmp[64];
	int r;

	snprintf(tmp, sizeof(tmp), ".tmp-%s", name);
	rm_rf_at(s->tar_fd, tmp);
	if (mkdirat(s->tar_fd, tmp, 0700) < 0)
		return err_set(err, tar_errno_norm(errno), errno == ENOSPC ? "insufficient_storage" : NULL,
			       "cannot create '%s': %m", tmp);
	_cleanup_close_ int dfd = openat(s->tar_fd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	r = dfd < 0 ? err_set(err, errno, NULL, "cannot open '%s': %m", tmp) : 0;
	if (r >= 0)
		r = snapshot_roots(s, dfd, from, p, err);
	if (r >= 0 && fsync(dfd) < 0)
		r = err_set(err, tar_errno_norm(errno), NULL, "cannot sync '%s': %m", tmp);
	if (r >= 0 && renameat(s->tar_fd, tmp, s->tar_fd, name) < 0)
		r = err_set(err, errno, NULL, "cannot rename '%s': %m", tmp);
	if (r >= 0 && fsync(s->tar_fd) < 0)
		r = err_set(err, tar_errno_norm(errno), NULL, "cannot sync the tar state dir: %m");
	if (r < 0) {
		rm_rf_at(s->tar_fd, tmp);
		rm_rf_at(s->tar_fd, name);
		fsync(s->tar_fd);
		if (err && err->errnum == ENOSPC && !err->code)
			err->code = "insufficient_storage";
	}
	return r;
}

/* The first start takes the base off the request path: health answers at
 * once ("preparing") and everything that reads or writes the roots waits. */
static void *base_thread(void *arg)
{
	struct tar_state *s = arg;
	ckpt_error err = { 0 };
	int64_t t0 = mono_ms();
	int r = snapshot(s, BASE, NULL, NULL, &err);

	if (r >= 0)
		head_set(s, BASE);
	trk_mark(s, r >= 0 ? BASE : "");
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
static int base_wait(struct tar_state *s, ckpt_error *err)
{
	pthread_mutex_lock(&s->lock);
	while (s->base_state == BASE_PREPARING)
		pthread_cond_wait(&s->base_cond, &s->lock);
	bool failed = s->base_state == BASE_FAILED;
	pthread_mutex_unlock(&s->lock);
	if (!failed)
		return 0;
	int r = snapshot(s, BASE, NULL, NULL, err);
	trk_mark(s, r < 0 ? "" : BASE);
	if (r < 0)
		return err_prefix(err, "cannot record the roots' base");
	head_set(s, BASE);
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
	if ((r = base_wait(s, err)) < 0)
		return r;
	pthread_mutex_lock(&s->lock);
	bool after_pre = !from && s->pre[0];
	pthread_mutex_unlock(&s->lock);
	r = snapshot(s, id, from, after_pre ? NULL : p, err);
	if (!from)
		trk_mark(s, r < 0 ? "" : id);
	if (r < 0)
		return r;
	if (!from && s->pre[0]) /* the precopy's data is this checkpoint's too */
		tree_disk_usage(s->tar_fd, s->pre, &size);
	if (!from) { /* the roots are this checkpoint now; an import is not the roots */
		head_set(s, id);
		pre_drop(s);
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
 * .keep/ by pre_drop, removed when nothing reads it). */
static int tar_precopy(void *st, struct progress *p, ckpt_error *err)
{
	struct tar_state *s = st;
	char id[64];
	int r;

	if (!s->ctx->cfg || s->ctx->cfg->tar_chain_max <= 0)
		return 0;
	if ((r = base_wait(s, err)) < 0)
		return r;
	if ((r = id_generate(id, sizeof(id))) < 0)
		return err_set(err, -r, NULL, "cannot make an id: %s", strerror(-r));
	/* the progress a client sees is this pass's: the frozen one is short */
	r = snapshot(s, id, NULL, p, err);
	trk_mark(s, r < 0 ? "" : id);
	if (r < 0)
		return r;
	pre_drop(s); /* an older precopy no create used */
	head_set(s, id);
	pthread_mutex_lock(&s->lock);
	snprintf(s->pre, sizeof(s->pre), "%s", id);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static int tar_create(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p,
		      ckpt_error *err)
{
	return tar_capture(st, id, NULL, ret_data, ret_size, p, err);
}

static int tar_import(void *st, const char *id, char *const *dirs, json_t **ret_data, uint64_t *ret_size,
		      ckpt_error *err)
{
	return tar_capture(st, id, dirs, ret_data, ret_size, NULL, err);
}

/* A view is an extraction of the checkpoint (or base) into tmp/r<N>: restore
 * into an empty directory writes every entry. */
static int tar_view_open(void *st, const char *id, json_t *data, const char *tmp, char ***ret_dirs, ckpt_error *err)
{
	struct tar_state *s = st;
	const char *name = id ? id : BASE;
	char **dirs = calloc(s->n_roots + 1, sizeof(*dirs));
	bool zstd = false;
	int r = dirs ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
	(void)data;

	_cleanup_close_ int cfd = openat(s->tar_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (r == 0 && cfd < 0)
		r = err_set(err, errno, NULL, "checkpoint data '%s' is missing: %m", name);
	if (r == 0)
		r = read_meta(s, cfd, name, &zstd, err);
	for (size_t i = 0; r == 0 && i < s->n_roots; i++) {
		struct tar_restore_opts o = { .skip_dev = s->state_dev,
					      .skip_ino = s->state_ino,
					      .store_fd = s->tar_fd };
		struct tar_restore_stats one;
		char arch[32], man[32];
		if (asprintf(&dirs[i], "%s/r%zu", tmp, i) < 0) {
			dirs[i] = NULL;
			r = err_set(err, ENOMEM, NULL, "out of memory");
			break;
		}
		if (mkdir(dirs[i], 0700) < 0) {
			r = err_set(err, errno, NULL, "cannot create '%s': %m", dirs[i]);
			break;
		}
		_cleanup_close_ int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		entry_names(i, zstd, arch, man);
		r = fd < 0 ? err_set(err, errno, NULL, "cannot open '%s': %m", dirs[i])
			   : tar_restore_root(fd, cfd, arch, man, &o, &one, err);
	}
	if (r < 0) {
		for (size_t i = 0; dirs && i < s->n_roots; i++)
			free(dirs[i]);
		free(dirs);
		return r;
	}
	*ret_dirs = dirs;
	return 0;
}

static void tar_view_close(void *st, char **dirs)
{
	struct tar_state *s = st;
	for (size_t i = 0; dirs && i < s->n_roots; i++)
		free(dirs[i]);
	free(dirs);
}

static int intent_write(struct tar_state *s, const char *name, ckpt_error *err)
{
	char text[128];
	int n = snprintf(text, sizeof(text), "{\"id\":\"%s\"}\n", name);
	int r = write_file_atomic(s->tar_fd, INTENT, text, (size_t)n, 0600);
	return r < 0 ? err_set(err, r, NULL, "cannot write the restore intent: %s", strerror(-r)) : 0;
}

static int intent_clear(struct tar_state *s, ckpt_error *err)
{
	if (unlinkat(s->tar_fd, INTENT, 0) < 0 && errno != ENOENT)
		return err_set(err, errno, NULL, "cannot remove the restore intent: %m");
	return fsync(s->tar_fd) < 0 ? err_set(err, errno, NULL, "cannot sync the tar state dir: %m") : 0;
}

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
			 struct tar_restore_stats *sum, struct journal_bufs *jb, bool journal, ckpt_error *err)
{
	struct tar_restore_opts o = { .skip_dev = s->state_dev,
				      .skip_ino = s->state_ino,
				      .p = p,
				      .trust_nothing = trust_nothing,
				      .store_fd = s->tar_fd };
	char arch[32], man[32];

	for (size_t i = 0; i < s->n_roots; i++) {
		struct tar_restore_stats one;
		_cleanup_close_ int fd = open_root(s, i, err);
		if (fd < 0)
			return fd;
		entry_names(i, zstd, arch, man);
		o.journal = journal;
		o.dirty = journal ? jb->dirty[i] : NULL;
		o.n_dirty = journal ? jb->n_dirty[i] : 0;
		o.suspects = jb->sus[i];
		o.outside_inos = journal && s->trk ? s->trk[i].outside_inos : NULL;
		o.n_outside_inos = journal && s->trk ? s->trk[i].n_outside_inos : 0;
		int r = tar_restore_root(fd, cfd, arch, man, &o, &one, err);
		if (r < 0)
			return err_prefix(err, "root '%s'", s->roots[i]);
		add_stats(sum, &one);
		tar_wait_past(o.max_ctime);
		/* The intent goes only once the restored tree is on disk. */
		if (syncfs(fd) < 0)
			return err_set(err, errno, NULL, "cannot sync root '%s': %m", s->roots[i]);
	}
	return 0;
}

static json_t *stats_json(const struct tar_restore_stats *t)
{
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "rewritten", (json_int_t)t->rewritten, "removed",
			 (json_int_t)t->removed, "kept", (json_int_t)t->kept, "bytes", (json_int_t)t->bytes, "archives",
			 (json_int_t)t->archives, "entered", (json_int_t)t->entered);
}

/* The roots are not (all) checkpoint name: say so in health, and keep or
 * put back the intent, so the next restore rewrites every entry rather than
 * trust what looks unchanged. */
static void unfinished(struct tar_state *s, const char *name, const char *why)
{
	struct stat st;
	if (fstatat(s->tar_fd, INTENT, &st, AT_SYMLINK_NOFOLLOW) < 0)
		intent_write(s, name, NULL);
	pthread_mutex_lock(&s->lock);
	snprintf(s->pending, sizeof(s->pending), "%s", name);
	snprintf(s->pending_msg, sizeof(s->pending_msg), "%.200s", why);
	pthread_mutex_unlock(&s->lock);
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
	r = read_meta(s, cfd, name, &zstd, err);
	if (r < 0)
		return r;
	/* An intent left over means a restore failed or was cut short: what it
	 * touched may look unchanged (same size, a new ctime that an alias
	 * could have recorded), so this one trusts nothing and rewrites all. */
	struct stat ist;
	bool trust_nothing = fstatat(s->tar_fd, INTENT, &ist, AT_SYMLINK_NOFOLLOW) == 0;
	r = intent_write(s, name, err);
	if (r < 0)
		return r;
	/* Restoring the checkpoint the roots were last made or restored as,
	 * the events since say where they differ: only there is looked at.
	 * From here on the events say what this restore wrote, and what
	 * changed after (an entry it kept is the one the checkpoint captured). */
	struct treecopy_dirty *dirty[MAX_ROOTS] = { 0 };
	size_t n_dirty[MAX_ROOTS] = { 0 };
	struct treecopy_index *sus[MAX_ROOTS] = { 0 };
	bool same = s->trk && !strcmp(s->trk_for, name);
	bool journal = trk_collect(s, dirty, n_dirty, sus) == 0 && same;
	_cleanup_(journal_free) struct journal_bufs jb = { dirty, n_dirty, sus, NULL, s->n_roots };
	scan_suspects(s, sus);
	r = restore_roots(s, cfd, zstd, trust_nothing, p, &sum, &jb, journal, err);
	log_debug("tar: restore of '%s' read %s", name,
		  r >= 0 && sum.tracked == s->n_roots ? "the directories that changed (change tracking)"
						      : "the whole tree");
	if (r < 0) { /* the intent stays: the next open runs the restore again */
		unfinished(s, name, err ? err->msg : "");
		return r;
	}
	r = intent_clear(s, err);
	if (r >= 0)
		head_set(s, name);
	trk_mark(s, r >= 0 ? name : "");
	pthread_mutex_lock(&s->lock);
	s->last = sum;
	s->pending[0] = '\0';
	pthread_mutex_unlock(&s->lock);
	if (details)
		*details = (struct restore_details){ .has_tar_stats = true,
						     .rewritten = sum.rewritten,
						     .removed = sum.removed,
						     .kept = sum.kept,
						     .bytes = sum.bytes };
	return r;
}

static int tar_restore(void *st, const char *id, json_t *data, struct restore_details *details, struct progress *p,
		       ckpt_error *err)
{
	int r;
	(void)data;
	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	if ((r = base_wait(st, err)) < 0)
		return r;
	return do_restore(st, id, details, p, err);
}

static int tar_verify(void *st, const char *id, json_t *data, json_t *diffs, size_t max, ckpt_error *err)
{
	struct tar_state *s = st;
	const char *name = id ? id : BASE;
	char arch[32], man[32];
	bool zstd;
	(void)data;

	if (id && !id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	_cleanup_close_ int cfd = openat(s->tar_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cfd < 0)
		return err_set(err, errno, NULL, "checkpoint data '%s' is missing: %m", name);
	int r = read_meta(s, cfd, name, &zstd, err);
	for (size_t i = 0; r >= 0 && i < s->n_roots; i++) {
		struct tar_verify_opts o = {
			.root_path = s->roots[i], .skip_dev = s->state_dev, .skip_ino = s->state_ino, .max_diffs = max
		};
		_cleanup_close_ int fd = open_root(s, i, err);
		if (fd < 0)
			return fd;
		entry_names(i, zstd, arch, man);
		if ((r = tar_verify_root(fd, cfd, man, &o, diffs, err)) < 0)
			err_prefix(err, "root '%s'", s->roots[i]);
	}
	if (r >= 0 && json_array_size(diffs) > 0)
		unfinished(s, name, "verify found differences");
	return r;
}

static int tar_reset(void *st, struct restore_details *details, ckpt_error *err)
{
	int r = base_wait(st, err);
	return r < 0 ? r : do_restore(st, BASE, details, NULL, err);
}

/* Every archive some checkpoint (other than skip) still reads: the union of
 * the "refs" of the checkpoint directories (names as keys). */
static json_t *refs_live(struct tar_state *s, const char *skip)
{
	json_t *set = json_object();
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;

	if (!set || walk_open(s->tar_fd, NULL, &d) < 0)
		return set;
	while ((de = walk_next(d))) {
		if ((!id_valid(de->d_name) && strcmp(de->d_name, BASE)) || (skip && !strcmp(de->d_name, skip)))
			continue;
		_cleanup_close_ int cfd =
			openat(s->tar_fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		json_auto_t *meta = cfd >= 0 ? meta_load(cfd) : NULL;
		size_t i;
		json_t *v;
		json_array_foreach(json_object_get(meta, "refs"), i, v) if (json_is_string(v))
			json_object_set_new(set, json_string_value(v), json_true());
	}
	return set;
}

/* Remove what nothing reads any more: kept archives no checkpoint names,
 * and checkpoint directories a compaction replaced. Idempotent. */
static void gc_kept(struct tar_state *s)
{
	json_auto_t *live = refs_live(s, NULL);
	_cleanup_close_ int kfd = openat(s->tar_fd, KEEP, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_closedir_ DIR *d = NULL, *top = NULL;
	struct dirent *de;

	if (kfd >= 0 && live && walk_open(kfd, NULL, &d) >= 0)
		while ((de = walk_next(d)))
			if (!json_object_get(live, de->d_name))
				rm_rf_at(kfd, de->d_name);
	if (walk_open(s->tar_fd, NULL, &top) >= 0)
		while ((de = walk_next(top)))
			if (!strncmp(de->d_name, ".trash-", 7))
				rm_rf_at(s->tar_fd, de->d_name);
	if (kfd >= 0)
		fsync(kfd);
	unlinkat(s->tar_fd, KEEP, AT_REMOVEDIR); /* only once empty */
	fsync(s->tar_fd);
}

/* Delete checkpoint name's data. If a later checkpoint reads its archives,
 * move them out of the way (one rename: crash-safe) into .keep/, where the
 * chain finds them, until no checkpoint names them. Idempotent: the next
 * start finishes a delete a crash interrupted, maybe after the move. */
static int drop_ckpt(struct tar_state *s, const char *name)
{
	json_auto_t *live = refs_live(s, name);
	char keep[128];
	struct stat st;

	if (json_object_get(live, name)) {
		if (fstatat(s->tar_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return errno == ENOENT ? 0 : -errno; /* moved already: .keep/ holds it */
		if (mkdirat(s->tar_fd, KEEP, 0700) < 0 && errno != EEXIST)
			return -errno;
		snprintf(keep, sizeof(keep), KEEP "/%s", name);
		rm_rf_at(s->tar_fd, keep); /* a leftover of an older life of the name: none expected */
		if (renameat(s->tar_fd, name, s->tar_fd, keep) < 0)
			return -errno;
		return 0;
	}
	return rm_rf_at(s->tar_fd, name);
}

static void pre_drop(struct tar_state *s)
{
	if (!s->pre[0])
		return;
	if (drop_ckpt(s, s->pre) < 0)
		log_warn("tar: cannot drop the precopy '%s': %m", s->pre);
	fsync(s->tar_fd);
	pthread_mutex_lock(&s->lock);
	s->pre[0] = '\0';
	pthread_mutex_unlock(&s->lock);
}

/* Compaction, off the operation lock: the first checkpoint whose chain is
 * longer than tar_chain_max is rewritten as a full one in .compact-<id>/,
 * which then takes its place by one atomic exchange; the old directory
 * becomes .trash-<id>, removed under the operation lock (gc_kept), so a
 * reader that opened it before the exchange can finish. A crash at any
 * point leaves the old or the new directory, both whole (recover sweeps
 * .compact-*). Readers never see a mix: each reads one directory fd. */
static int compact_one(struct tar_state *s, const char *name, ckpt_error *err)
{
	char tmp[NAME_MAX + 16], trash[NAME_MAX + 16], arch[32], man[32], alias[48];
	_cleanup_close_ int cfd = openat(s->tar_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	json_auto_t *meta = cfd >= 0 ? meta_load(cfd) : NULL;
	_cleanup_close_ int ofd = -1;
	int r = 0;

	if (!meta)
		return 0; /* deleted meanwhile */
	bool zstd = !strcmp(json_string_value(json_object_get(meta, "compression")) ?: "", "zstd");
	snprintf(tmp, sizeof(tmp), ".compact-%s", name);
	snprintf(trash, sizeof(trash), ".trash-%s", name);
	rm_rf_at(s->tar_fd, tmp);
	if (mkdirat(s->tar_fd, tmp, 0700) < 0 ||
	    (ofd = openat(s->tar_fd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		r = err_set(err, errno, NULL, "cannot create '%s': %m", tmp);
	for (size_t i = 0; r >= 0 && i < s->n_roots; i++) {
		_cleanup_free_ char *text = NULL;
		size_t len = 0;
		entry_names(i, zstd, arch, man);
		r = tar_compact_root(s->tar_fd, cfd, ofd, arch, man, zstd, err);
		snprintf(alias, sizeof(alias), "%s.alias", man);
		if (r >= 0 && read_file_at(cfd, alias, 1 << 30, &text, &len) >= 0)
			write_file_atomic(ofd, alias, text, len, 0600); /* only a cache */
	}
	json_object_set_new(meta, "depth", json_integer(0));
	json_object_set_new(meta, "refs", json_array());
	json_object_del(meta, "parent");
	_cleanup_free_ char *text = r >= 0 ? json_dumps(meta, JSON_COMPACT) : NULL;
	if (r >= 0 && !text)
		r = err_set(err, ENOMEM, NULL, "out of memory");
	if (r >= 0 && (r = write_file_atomic(ofd, META, text, strlen(text), 0600)) < 0)
		err_set(err, -r, NULL, "cannot write '%s/" META "': %s", tmp, strerror(-r));
	if (r >= 0 && fsync(ofd) < 0)
		r = err_set(err, errno, NULL, "cannot sync '%s': %m", tmp);
	if (r >= 0 && renameat2(s->tar_fd, tmp, s->tar_fd, name, RENAME_EXCHANGE) < 0)
		r = errno == ENOENT ? 0 : err_set(err, errno, NULL, "cannot put '%s' in place: %m", tmp);
	if (r >= 0)
		renameat(s->tar_fd, tmp, s->tar_fd, trash);
	if (r < 0 || faccessat(s->tar_fd, tmp, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		rm_rf_at(s->tar_fd, tmp);
	fsync(s->tar_fd);
	return r < 0 ? r : 1;
}

/* Called by the engine's sweeper without the operation lock. */
static int tar_cleanup(void *st)
{
	struct tar_state *s = st;
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	int max = s->ctx->cfg ? s->ctx->cfg->tar_chain_max : 0;

	trk_drain(s);
	if (max <= 0 || walk_open(s->tar_fd, NULL, &d) < 0)
		return 0;
	while ((de = walk_next(d))) {
		pthread_mutex_lock(&s->lock);
		bool pre = !strcmp(de->d_name, s->pre);
		pthread_mutex_unlock(&s->lock);
		if (!id_valid(de->d_name) || pre)
			continue;
		_cleanup_close_ int cfd =
			openat(s->tar_fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		json_auto_t *meta = cfd >= 0 ? meta_load(cfd) : NULL;
		if (json_integer_value(json_object_get(meta, "depth")) <= max)
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
		int r = compact_one(s, name, &err);
		if (r < 0)
			log_warn("tar: cannot compact '%s': %s", name, err.msg);
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

static int tar_remove(void *st, const char *id, json_t *data, ckpt_error *err)
{
	struct tar_state *s = st;
	(void)data;
	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	int r = drop_ckpt(s, id);
	if (r < 0)
		return err_set(err, r, NULL, "cannot remove checkpoint data '%s': %s", id, strerror(-r));
	if (fsync(s->tar_fd) < 0)
		return err_set(err, errno, NULL, "cannot sync the tar state dir: %m");
	gc_kept(s);
	return 0;
}

static int open_ckpt(struct tar_state *s, const char *id, bool *zstd, ckpt_error *err)
{
	if (!id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	int cfd = openat(s->tar_fd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cfd < 0)
		return err_set(err, errno, NULL, "checkpoint data '%s' is missing: %m", id);
	if (read_meta(s, cfd, id, zstd, err) < 0) {
		close(cfd);
		return -EINVAL;
	}
	return cfd;
}

/* A fork is a full extraction of the checkpoint into each empty dir. */
static int tar_fork_mount(void *st, const char *id, json_t *data, const char *fid, const char *const *dirs,
			  json_t **fdata, ckpt_error *err)
{
	struct tar_state *s = st;
	bool zstd;
	char arch[32], man[32];
	(void)data;
	(void)fid;
	if (*fdata) /* extracted once, nothing to mount again */
		return 0;
	_cleanup_close_ int cfd = open_ckpt(s, id, &zstd, err);
	if (cfd < 0)
		return cfd;
	for (size_t i = 0; i < s->n_roots; i++) {
		struct tar_restore_opts o = { .skip_dev = s->state_dev,
					      .skip_ino = s->state_ino,
					      .trust_nothing = true,
					      .no_alias = true,
					      .store_fd = s->tar_fd };
		struct tar_restore_stats one;
		_cleanup_close_ int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return err_set(err, errno, NULL, "open '%s': %m", dirs[i]);
		entry_names(i, zstd, arch, man);
		if (tar_restore_root(fd, cfd, arch, man, &o, &one, err) < 0 || syncfs(fd) < 0)
			return err_prefix(err, "extract into '%s'", dirs[i]);
	}
	*fdata = json_pack("{s:b}", "extracted", true);
	return 0;
}

static int tar_fork_remove(void *st, const char *fid, json_t *fdata, const char *const *dirs, ckpt_error *err)
{
	struct tar_state *s = st;
	(void)fid;
	(void)fdata;
	for (size_t i = 0; i < s->n_roots; i++) {
		_cleanup_close_ int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		DIR *d;
		if (fd < 0 || walk_open(fd, NULL, &d) < 0)
			continue; /* already gone */
		struct dirent *de;
		int r = 0;
		while ((de = walk_next(d)))
			if (rm_rf_at(dirfd(d), de->d_name) < 0)
				r = -errno;
		closedir(d);
		if (r < 0)
			return err_set(err, -r, NULL, "empty '%s': %s", dirs[i], strerror(-r));
	}
	return 0;
}

static int tar_diff(void *st, const char *id, json_t *data, const char *id2, json_t *data2, json_t *out,
		    ckpt_error *err)
{
	struct tar_state *s = st;
	bool zstd, zstd2;
	char arch[32], man[32];
	(void)data;
	(void)data2;
	_cleanup_close_ int cfd = open_ckpt(s, id, &zstd, err);
	if (cfd < 0)
		return cfd;
	_cleanup_close_ int cfd2 = id2 ? open_ckpt(s, id2, &zstd2, err) : -1;
	if (id2 && cfd2 < 0)
		return cfd2;
	for (size_t i = 0; i < s->n_roots; i++) {
		_cleanup_close_ int fd = id2 ? -1 : open_root(s, i, err);
		if (!id2 && fd < 0)
			return fd;
		entry_names(i, zstd, arch, man);
		if (tar_diff_root(s->roots[i], cfd, man, cfd2, man, fd, s->state_dev, s->state_ino, out, err) < 0)
			return -EIO;
	}
	bdiff_sort(out);
	return 0;
}

/* A restore the previous run did not finish is run again now. A failure is
 * kept visible (health) and the intent stays, so nothing pretends the roots
 * are consistent; the daemon still starts so a client can restore again. */
static void finish_interrupted(struct tar_state *s)
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
		intent_clear(s, NULL);
		return;
	}
	log_debug("tar: finishing the interrupted restore of '%s'", name);
	if (do_restore(s, name, NULL, NULL, &err) >= 0)
		return;
	if (err.errnum == ENOENT) {
		intent_clear(s, NULL);
		return;
	}
	log_debug("tar: interrupted restore of '%s' failed again: %s", name, err.msg);
}

static int state_init(struct tar_state *s, const struct backend_ctx *ctx, ckpt_error *err)
{
	struct stat st;

	s->ctx = ctx;
	s->roots = (char **)ctx->roots;
	s->n_roots = ctx->n_roots;
	s->tar_fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->trk_lock, NULL);
	pthread_cond_init(&s->base_cond, NULL);
	if (fstat(ctx->state_fd, &st) < 0)
		return err_set(err, errno, NULL, "cannot stat the state dir: %m");
	s->state_dev = st.st_dev;
	s->state_ino = st.st_ino;
	if (mkdirat(ctx->state_fd, TAR_DIR, 0700) < 0 && errno != EEXIST)
		return err_set(err, errno, NULL, "cannot create '%s/" TAR_DIR "': %m", ctx->state_dir);
	s->tar_fd = openat(ctx->state_fd, TAR_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (s->tar_fd < 0)
		return err_set(err, errno, NULL, "cannot open '%s/" TAR_DIR "': %m", ctx->state_dir);
	s->zstd = tar_create_zstd_available();
	return 0;
}

static void tar_close(void *st, bool unmount)
{
	struct tar_state *s = st;
	(void)unmount;
	if (!s)
		return;
	if (s->base_thread_started)
		pthread_join(s->base_thread, NULL);
	if (s->tar_fd >= 0)
		close(s->tar_fd);
	pthread_cond_destroy(&s->base_cond);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_lock(&s->trk_lock);
	trk_free(s);
	pthread_mutex_unlock(&s->trk_lock);
	pthread_mutex_destroy(&s->trk_lock);
	free(s->no_compact);
	free(s);
}

static int tar_open(const struct backend_ctx *ctx, void **ret_st, ckpt_error *err)
{
	struct tar_state *s = calloc(1, sizeof(*s));
	struct stat st;
	int r;

	if (!s)
		return err_set(err, ENOMEM, NULL, "out of memory");
	r = state_init(s, ctx, err);
	if (r >= 0) {
		head_load(s);
		finish_interrupted(s);
		trk_arm(s); /* before the base: its capture is the first collect */
		rm_rf_at(s->tar_fd, ".tmp-" BASE);
		/* The base is what reset returns to: the roots as first adopted. */
		if (fstatat(s->tar_fd, BASE, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			s->base_state = BASE_PREPARING;
			if ((r = -pthread_create(&s->base_thread, NULL, base_thread, s)) < 0)
				err_set(err, -r, NULL, "cannot start taking the roots' base: %s", strerror(-r));
			s->base_thread_started = r == 0;
		}
	}
	if (r < 0) {
		tar_close(s, false);
		return r;
	}
	*ret_st = s;
	return 0;
}

static bool id_listed(const char *name, const char *const *ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] && !strcmp(ids[i], name))
			return true;
	return false;
}

static int tar_recover(void *st, const char *const *ids, json_t *const *data, size_t n, ckpt_error *err)
{
	struct tar_state *s = st;
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	int q = walk_open(s->tar_fd, NULL, &d);
	(void)data;

	pthread_mutex_lock(&s->lock); /* the base being taken is not stale */
	bool preparing = s->base_state == BASE_PREPARING;
	pthread_mutex_unlock(&s->lock);
	if (q < 0)
		return err_set(err, -q, NULL, "cannot list the tar state dir: %s", strerror(-q));
	while ((de = walk_next(d))) {
		const char *nm = de->d_name;
		bool stale = (!strncmp(nm, ".tmp-", 5) && (strcmp(nm, ".tmp-" BASE) || !preparing)) ||
			!strncmp(nm, ".compact-", 9) || !strncmp(nm, "." INTENT ".tmp.", sizeof(INTENT) + 5) ||
			(id_valid(nm) && !id_listed(nm, ids, n));
		if (stale && (nm[0] == '.' ? rm_rf_at(s->tar_fd, nm) : drop_ckpt(s, nm)) < 0)
			return err_set(err, errno, NULL, "cannot remove stale '%s': %m", nm);
		_cleanup_close_ int cfd = !stale && id_valid(nm)
			? openat(s->tar_fd, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
			: -1;
		if (cfd >= 0) /* an alias file's temp (restore writes into checkpoint dirs) */
			write_file_atomic_sweep(cfd);
	}
	write_file_atomic_sweep(s->tar_fd);
	gc_kept(s);
	return fsync(s->tar_fd) < 0 ? err_set(err, errno, NULL, "cannot sync the tar state dir: %m") : 0;
}

static void tar_health(void *st, json_t *out)
{
	struct tar_state *s = st;
	struct stat b;

	json_object_set_new(out, "backend_reason", json_string("tar backend selected"));
	if (!s)
		return;
	json_object_set_new(out, "tar_compression", json_string(s->zstd ? "zstd" : "none"));
	json_object_set_new(out, "tar_base", json_boolean(fstatat(s->tar_fd, BASE, &b, AT_SYMLINK_NOFOLLOW) == 0));
	pthread_mutex_lock(&s->lock);
	if (s->base_state == BASE_PREPARING)
		json_object_set_new(out, "status", json_string("preparing"));
	if (s->base_state == BASE_FAILED)
		json_object_set_new(out, "tar_base_error", json_string(s->base_error));
	json_object_set_new(out, "tar_last_restore", stats_json(&s->last));
	if (s->pending[0])
		json_object_set_new(out, "tar_unfinished_restore",
				    json_pack("{s:s, s:s}", "id", s->pending, "error", s->pending_msg));
	pthread_mutex_unlock(&s->lock);
}

/* The root is a plain directory already, and each archive is a whole tree
 * that restores without the base: nothing to do, checkpoints stay. */
static int tar_release(void *st, size_t i, ckpt_error *err)
{
	(void)st, (void)i, (void)err;
	return 0;
}

const struct backend_ops backend_tar_ops = {
	.name = "tar",
	.probe = tar_probe,
	.open = tar_open,
	.recover = tar_recover,
	.create = tar_create,
	.restore = tar_restore,
	.verify = tar_verify,
	.reset = tar_reset,
	.remove = tar_remove,
	.fork_mount = tar_fork_mount,
	.fork_remove = tar_fork_remove,
	.diff = tar_diff,
	.health = tar_health,
	.maintain = NULL,
	.cleanup = tar_cleanup,
	.precopy = tar_precopy,
	.precopy_only_if_frozen = true,
	.close = tar_close,
	.view_open = tar_view_open,
	.view_close = tar_view_close,
	.import = tar_import,
	.release = tar_release,
};
