/* tar_internal.h: the tar backend's state, shared by its files (the layout
 * on disk is described in backend_tar.c). Calls go one way:
 * backend_tar.c (ops table, open, close, recover, health)
 *   -> tar_rollback.c (restore and reset of the roots under an intent)
 *   -> tar_snapshot.c (creates, precopies, imports, the base thread)
 *   -> tar_view.c (views, forks, diff, verify), tar_gc.c (delete, GC, compaction)
 *   -> tar_count.c (progress totals), tar_track.c (change tracking)
 *   -> tar_meta.c (meta.json, head, the restore intent), never back.
 * tar_probe.c (what a root's filesystem changes without a new ctime) is
 * called by backend_tar.c at open. */
#pragma once
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
#define RUNNING "running"

/* What a root's filesystem changes without moving ctime (tar_probe.c):
 * (inode, ctime, size) then does not name a file's xattrs, or its data. */
struct tar_ctime_probe {
	bool probed;       /* false: the probe failed, both count as blind */
	bool xattrs_blind; /* a setxattr leaves ctime (gVisor): xattrs are compared */
	bool mapped_blind; /* a store through a shared mapping leaves it (gVisor) */
};

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
	struct rootexcl trk_excl; /* what the trackers leave out, as of their arming */
	pthread_mutex_t trk_lock; /* the trackers: collects, and the sweeper's drains */
	char trk_for[64];
	bool trk_collected; /* the trackers have seen everything since the last collect */
	/* What health says of each root's tracking (the lock's): kept apart
	 * from trk, which goes when tracking stops. */
	struct tar_track_info {
		enum chg_track_method method; /* NONE: not tracking */
		char reason[160];
		uint64_t tracked, walked; /* creates and restores that read only what changed, or all */
	} * tinfo;
	/* Per root, the files a process mapped shared at the last create or
	 * restore, and at the one running (tar_track_mapped_*): a store into a
	 * page that was dirty then leaves ctime as it was, on every filesystem.
	 * The operation lock's. */
	struct pathindex *mapped_last[MAX_ROOTS], *mapped_now[MAX_ROOTS];
	struct tar_ctime_probe blind[MAX_ROOTS]; /* per root, probed at open */
	struct tar_mcache mcache[MAX_ROOTS];     /* the last restore's manifests (operation lock) */
	/* The last run did not end cleanly (RUNNING was left): after a power
	 * cut a file can hold data newer than its ctime (fdatasync logs no
	 * timestamp), so (inode, ctime, size) proves nothing until a restore
	 * has rewritten every entry. Until then creates are full. */
	bool ctime_suspect;
	bool opened;      /* tar_open succeeded: a close is a clean stop */
	bool no_exchange; /* renameat2 has no RENAME_EXCHANGE (gVisor): no compaction (the sweeper's own) */
	char (*no_compact)[NAME_MAX + 1]; /* chains whose compaction found data unlike */
	size_t n_no_compact;              /* its digests: left as they are (the sweeper's own) */
};

/* The chain a checkpoint heads: its parent (NULL: a full checkpoint), the
 * older checkpoints whose archives its manifests name, its length, and when
 * its capture began (what reusing its entries compares ctimes with). */
struct chain {
	const char *parent;
	const struct strv *refs; /* borrowed */
	int64_t depth;
	struct timespec started;
};

/* A checkpoint directory's meta.json as data. tar_meta.c is the one reader
 * and writer of the file. */
struct tar_meta {
	int version;         /* 0: absent */
	bool zstd;           /* "compression": "zstd", else "none" */
	struct strv roots;   /* the roots it was made for, in order */
	int64_t depth;       /* the length of its incremental chain */
	struct strv refs;    /* the older archives its manifests name */
	bool has_started_ns; /* absent in checkpoints from before it */
	int64_t started_ns;  /* when its capture began */
	char parent[64];     /* "": none */
	json_t *unknown;     /* members of a newer version, kept as read */
};

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
	const struct rootexcl *excl;
	struct progress *p;
};

/* The change tracking journal of a capture or restore, one entry per root. */
struct journal_bufs {
	struct pathindex_dirty **dirty;
	size_t *n_dirty;
	struct pathindex **sus;
	struct tar_manifest *pms; /* or NULL */
	size_t n;
};

/* tar_meta.c */
void tar_meta_names(size_t i, bool zstd, char *arch, char *man);
int tar_meta_open_root(const struct tar_state *s, size_t i, ckpt_error *err);
void tar_meta_head_set(struct tar_state *s, const char *name);
void tar_meta_head_load(struct tar_state *s);
int tar_meta_write(struct tar_state *s, int dirfd, const struct chain *ch, ckpt_error *err);
int tar_meta_read(struct tar_state *s, int dirfd, const char *name, bool *zstd, ckpt_error *err);
/* The meta.json of dirfd into *ret (tar_meta_free it): 0, -errno when
 * unreadable, -EBADMSG when no JSON object. */
int tar_meta_load(int dirfd, struct tar_meta *ret);
/* *m as meta.json's text (caller frees), or NULL. */
char *tar_meta_text(const struct tar_meta *m);
void tar_meta_free(struct tar_meta *m);
int tar_meta_intent_write(struct tar_state *s, const char *name, ckpt_error *err);
int tar_meta_intent_clear(struct tar_state *s, ckpt_error *err);
void tar_meta_unfinished(struct tar_state *s, const char *name, const char *why);
void tar_meta_running_open(struct tar_state *s);
void tar_meta_running_trust(struct tar_state *s);
void tar_meta_running_close(struct tar_state *s);
int tar_meta_open_ckpt(struct tar_state *s, const char *id, bool *zstd, ckpt_error *err);

/* tar_track.c */
void tar_track_arm(struct tar_state *s);
void tar_track_free(struct tar_state *s);
int tar_track_collect(struct tar_state *s, struct pathindex_dirty **dirty, size_t *n_dirty, struct pathindex **sus);
void tar_track_drain(struct tar_state *s);
void tar_track_mark(struct tar_state *s, const char *name);
void tar_track_drain_own(struct tar_state *s);
void tar_track_count(struct tar_state *s, size_t i, bool tracked);
void tar_track_health(struct tar_state *s, struct backend_health *out);
bool tar_track_changed_elsewhere(const struct chg_track *t, int root_fd, const struct tar_manifest *pm);
void tar_track_scan_suspects(struct tar_state *s, struct pathindex **sus);
int tar_track_mapped_join(struct tar_state *s, struct pathindex **sus);
void tar_track_journal_free(struct journal_bufs *j);

/* tar_probe.c */
void tar_probe_ctime(int tar_fd, const char *root, struct tar_ctime_probe *p);

/* tar_excl.c */
int tar_excl_build(const struct tar_state *s, struct rootexcl *x, ckpt_error *err);
void tar_excl_health(const struct tar_state *s, struct backend_tar_health *out);

/* tar_count.c */
void tar_count_raise(_Atomic uint64_t *total, uint64_t v);
void tar_count_start(struct tar_count *c, struct tar_state *s, char *const *from, const struct rootexcl *excl,
		     struct progress *p);
void tar_count_join(struct tar_count *c);

/* tar_gc.c */
void tar_gc_kept(struct tar_state *s);
int tar_gc_drop(struct tar_state *s, const char *name);
void tar_gc_pre_drop(struct tar_state *s);
int tar_cleanup(void *st);
int tar_remove(void *st, const char *id, json_t *data, ckpt_error *err);

/* tar_snapshot.c */
void *tar_snapshot_base(void *arg);
int tar_snapshot_base_wait(struct tar_state *s, ckpt_error *err);
int tar_precopy(void *st, bool frozen, struct progress *p, ckpt_error *err);
int tar_create(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p, ckpt_error *err);
int tar_import(void *st, const char *id, char *const *dirs, json_t **ret_data, uint64_t *ret_size, ckpt_error *err);

/* tar_rollback.c */
int tar_restore(void *st, const char *id, json_t *data, struct restore_details *details, struct progress *p,
		ckpt_error *err);
int tar_reset(void *st, struct restore_details *details, ckpt_error *err);
void tar_rollback_finish(struct tar_state *s);

/* tar_view.c */
int tar_view_open(void *st, const char *id, json_t *data, const char *tmp, char ***ret_dirs, ckpt_error *err);
void tar_view_close(void *st, char **dirs);
json_t *tar_lineage(void *st, const char *id, json_t *data);
int tar_verify(void *st, const char *id, json_t *data, struct verify_diffs *diffs, size_t max, ckpt_error *err);
int tar_fork_mount(void *st, const char *id, json_t *data, const char *fid, const char *const *dirs, json_t **fdata,
		   ckpt_error *err);
int tar_fork_remove(void *st, const char *fid, json_t *fdata, const char *const *dirs, ckpt_error *err);
int tar_diff(void *st, const char *id, json_t *data, const char *id2, json_t *data2, struct bdiff_list *out,
	     ckpt_error *err);
