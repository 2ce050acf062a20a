/* backend.h: the storage backends behind one table of function pointers.
 * The engine owns the catalog and the ordering of steps; a backend owns its
 * files below <state_dir>/<backend name>/ and the managed roots' contents.
 * A failure is an errno and a message (err_set), with a reason code only
 * where the errno cannot say it ("not_found": the checkpoint's data is gone;
 * "root_busy", "forks_exist", "release_incomplete" from release). A backend
 * never picks an error kind: the engine classifies (engine_err.c). */
#pragma once
#include <jansson.h>
#include <stdatomic.h>
#include "config.h"
#include "backend/rootexcl.h"
#include "lib/devino.h"
#include "lib/util.h"
#include "services/services_ops.h"

struct backend_ctx {
	/* The config's settings a backend reads, copied by engine_open: a
	 * backend never sees the whole config (host mode's fields, the token). */
	int flatten_depth;     /* overlay: flatten chains deeper than this (0: 64) */
	int tar_chain_max;     /* tar: compact chains longer than this (0: never) */
	const char *state_dir; /* absolute */
	int state_fd;          /* O_DIRECTORY fd of state_dir */
	char *const *roots;    /* absolute canonical paths */
	size_t n_roots;
	/* config's track_changes and track_check (ckptd.json(5)): the create
	 * paths read these, not the whole config */
	enum track_mode track_changes;
	bool track_check;
	/* the root is "/" (docs/whole-root.md), and the config's "exclude" */
	bool whole_root;
	char *const *excludes;
	size_t n_excludes;
	/* Called by open right before it mounts over a root (first adoption,
	 * reboot, an interrupted restore), with what the mount is about to hide
	 * still in place; may be NULL. */
	void (*before_mount)(void *hook_ctx, const char *root);
	void *hook_ctx;
};

/* Progress of a long operation; written by the backend, read by GET. */
struct progress {
	_Atomic uint64_t bytes_done, bytes_total, files_done, files_total;
};

/* A process that still held a root when a restore swapped it. */
struct busy_process {
	long pid;
	char command[64];
};

/* What a restore or reset did besides succeeding, as data: the API layer
 * writes it into the response. Fields a backend does not fill stay zero. */
/* What a backend says of itself in GET /v1/health, as data. */
struct backend_root_health {
	const char *tracking;      /* how changes are tracked: a method's name (static) */
	char tracking_reason[160]; /* why */
	/* The backend counts the walks tracking spared and probed what ctime
	 * misses: the members below are set. */
	bool detailed;
	uint64_t tracked, walked;   /* creates and restores that read only what changed, or all */
	const char *ctime_blind[2]; /* what changes here without a new ctime (static strings) */
	size_t n_ctime_blind;
	const char *not_guaranteed[2]; /* what a create or restore cannot see then (static) */
	size_t n_not_guaranteed;
};
/* The overlay backend's account of one root: its live chain's length, its
 * upper, whether it was released, the delta layers made from that upper. */
struct backend_overlay_root {
	const char *path; /* lives as long as the backend */
	uint64_t layers;
	char upper[16];
	bool released;
	uint64_t deltas;
};
/* The tar backend's account: compression, the base, what the roots leave
 * out, the last restore's counts, a restore it could not finish. */
struct backend_tar_health {
	bool zstd;
	bool base;                                                   /* the base is there */
	bool base_failed;                                            /* taking it failed: base_error says why */
	char base_error[256];                                        /* "" unless base_failed */
	struct rootexcl excluded;                                    /* owned; only the items not nested are shown */
	char excluded_error[512];                                    /* set: excluded could not be read */
	uint64_t rewritten, removed, kept, bytes, archives, entered; /* the last restore */
	char pending[64]; /* id of a restore that could not be finished, or "" */
	char pending_msg[256];
};
struct backend_health {
	bool preparing;                              /* not ready for a create yet: health's status is "preparing" */
	struct backend_root_health roots[MAX_ROOTS]; /* tracking, per root in the config's order */
	size_t n_roots;                              /* 0: the backend reports no tracking */
	bool has_overlay;                            /* the overlay options, where overlay mounts */
	const char *overlay_kind;
	bool redirect_dir, userxattr;
	/* The backend's own diagnostics, each present or absent as a whole:
	 * health shows them, no code reads them. */
	bool has_overlay_roots;
	struct backend_overlay_root overlay_roots[MAX_ROOTS];
	size_t n_overlay_roots;
	bool has_tar;
	struct backend_tar_health tar;
};
static inline void backend_health_free(struct backend_health *h)
{
	rootexcl_free(&h->tar.excluded);
}

struct restore_details {
	/* Processes that still held a root the restore swapped away (its old
	 * mount was detached lazily); owned array. */
	struct busy_process *busy;
	size_t n_busy;
	/* An in-place restore's counts, answered under this key (the backend's
	 * name); NULL: the restore rewrote nothing in place. */
	const char *counts_key;
	uint64_t rewritten, removed, kept, bytes;
	/* The whole sandbox as a root (docs/whole-root.md): the files the
	 * restore replaced or removed (owned; NULL otherwise), whether a unit
	 * file changed, and the .service units whose file or enablement link
	 * the restore wrote (owned). */
	struct devino_map *gone;
	bool unit_files_changed;
	struct strv units_linked;
	/* In, whole root (may be NULL): called once the restore knows what it
	 * will change, before it changes anything. paths are below "/", with
	 * no leading slash; one ending in "/" is a directory removed with all
	 * below it; directories only rewritten are left out. planned holds
	 * gone, unit_files_changed and units_linked as the restore will make
	 * them. < 0: the restore stops there, nothing changed, and held is set. */
	int (*before_change)(void *ctx, const char *const *paths, size_t n, const struct restore_details *planned);
	void *before_change_ctx;
	bool held;
};

static inline void restore_details_free(struct restore_details *d)
{
	free(d->busy);
	d->busy = NULL;
	d->n_busy = 0;
	if (d->gone)
		devino_free(d->gone);
	free(d->gone);
	d->gone = NULL;
	services_strv_clear(&d->units_linked);
}

struct bdiff_list; /* backend_diff.h */

/* What verify found: each path that differs (absolute) and why. */
struct verify_diff {
	char *path, *reason;
};
struct verify_diffs {
	struct verify_diff *v;
	size_t n;
};
/* backend_diff.c: append one (copies both); -ENOMEM. */
int verify_diffs_add(struct verify_diffs *d, const char *path, const char *reason);
void verify_diffs_free(struct verify_diffs *d);

/* Comparing checkpoints with each other and with the live roots. */
struct backend_compare_ops {
	/* After a restore: compare every root with checkpoint id (NULL: the base)
	 * by its recorded contents, not by the shortcuts restore takes. Appends
	 * up to max differences to diffs; <0 only when the comparison could
	 * not run. */
	int (*verify)(void *st, const char *id, json_t *data, struct verify_diffs *diffs, size_t max, ckpt_error *err);
	/* Append to out one change per path that differs between checkpoint id
	 * and checkpoint id2 (NULL: the live roots), sorted by path (see
	 * backend_diff.h). */
	int (*diff)(void *st, const char *id, json_t *data, const char *id2, json_t *data2, struct bdiff_list *out,
		    ckpt_error *err);
};

/* Forks: a writable copy-on-write view of a checkpoint. */
struct backend_fork_ops {
	/* Mount a writable copy-on-write view of checkpoint id as fork fid,
	 * root i's at dirs[i] (empty directories). *fdata is NULL for a new
	 * fork (set it to the backend's JSON to record), or that JSON again to
	 * mount it after a restart (no-op if mounted). */
	int (*mount)(void *st, const char *id, json_t *data, const char *fid, const char *const *dirs, json_t **fdata,
		     ckpt_error *err);
	/* Unmount fork fid and remove its private data; dirs stay, empty. */
	int (*remove)(void *st, const char *fid, json_t *fdata, const char *const *dirs, ckpt_error *err);
};

/* Export and import (engine_export.h explains the archive). */
struct backend_xfer_ops {
	/* For each root, an absolute directory showing checkpoint id (NULL: the
	 * base) as a whole tree, made below the empty dir tmp, which the caller
	 * removes after view_close. Nothing may write to it. */
	int (*view_open)(void *st, const char *id, json_t *data, const char *tmp, char ***ret_dirs, ckpt_error *err);
	void (*view_close)(void *st, char **dirs);
	/* Checkpoint id's lineage, oldest first: a JSON array of strings such
	 * that checkpoint A's is a proper prefix of B's exactly when B was made
	 * on top of A (push makes one image layer per such ancestor). NULL when
	 * unknown (no ancestors). Called with the operation lock held. */
	json_t *(*lineage)(void *st, const char *id, json_t *data);
	/* Make checkpoint id from dirs[i], root i's whole tree (below the state
	 * dir; the backend may move from it, the caller removes what is left). */
	int (*import)(void *st, const char *id, char *const *dirs, json_t **ret_data, uint64_t *ret_size,
		      ckpt_error *err);
	/* The export's identity. Non-NULL when a checkpoint holds only what
	 * changed over the base (layers): an export then names the base (this
	 * kind and a digest of the base's tree), and an import of another
	 * export by a backend of the same name is refused over another base.
	 * NULL: a checkpoint is a whole tree, importable over any base. */
	const char *base_kind;
	/* Import filtering: whether the extended attribute name may cross in an
	 * archive (export writes, import keeps only those). NULL: all may. */
	bool (*xattr_portable)(const char *name);
};

/* overlayfs reads trusted.overlay.* (redirects into other paths, opaque
 * dirs) on any layer it mounts, and any tree may become one: such an
 * attribute never crosses in an archive, whichever backend exports or
 * imports it. The xattr_portable both backends use. */
static inline bool backend_xattr_portable(const char *name)
{
	return strncmp(name, "trusted.overlay.", 16) != 0;
}

/* Stop managing a root. */
struct backend_release_ops {
	/* Leave at root i's path a plain directory holding what it shows now
	 * (the caller stopped the units using it). Checkpoints outlive it: they
	 * restore once the root is adopted again. A kill at any point leaves
	 * the managed root (open undoes the rest) or the released directory,
	 * complete. A failure after the path holds the released directory sets
	 * the code "release_incomplete": the root counts as released. */
	int (*release)(void *st, size_t i, ckpt_error *err);
	/* Whether release unmounts the root: the engine then refuses while a
	 * process outside the units uses it, or a fork exists. */
	bool unmounts;
};

/* Create in two steps: the copy inside the freeze, the rest after it. */
struct backend_capture_ops {
	/* Inside the services' freeze, in place of create: take what the roots
	 * hold now (the consistent copy), without making it durable. create,
	 * called next and after the thaw, then only makes that copy the
	 * checkpoint (records, syncs, publishes): the freeze lasts only as
	 * long as the copy. On failure nothing is kept and create is not
	 * called. A backend without it runs create whole inside the freeze. */
	int (*capture)(void *st, struct progress *p, ckpt_error *err);
	/* Optional: create, except the last sync of what it wrote on the file
	 * system dev (an st_dev; 0: none). *ret_deferred then says the caller
	 * must syncfs that file system before anything durable names the
	 * checkpoint (the catalog record), so one barrier covers both. What
	 * lies on another file system is synced here, as create does. */
	int (*create_defer)(void *st, const char *id, dev_t dev, json_t **ret_data, uint64_t *ret_size,
			    struct progress *p, bool *ret_deferred, ckpt_error *err);
};

/* Every pointer of this table is set: the engine calls each without
 * asking. What a backend may lack is a capability table below, present
 * or absent as a whole. */
struct backend_ops {
	const char *name; /* "overlay" | "tar" */

	/* 0 when the backend can work here; else <0 with the reason in err. */
	int (*probe)(const struct backend_ctx *ctx, ckpt_error *err);

	/* Adopt the roots (first start) or re-adopt them (restart). ret_st is the
	 * backend's private state. Must finish or undo any interrupted restore. */
	int (*open)(const struct backend_ctx *ctx, void **ret_st, ckpt_error *err);

	/* After the catalog is loaded: ids[] are the checkpoints that exist (with
	 * their backend data). Remove data of anything else (half-made creates,
	 * half-done deletes). */
	int (*recover)(void *st, const char *const *ids, json_t *const *data, size_t n, ckpt_error *err);

	/* Capture all roots as checkpoint id. Data must be durable on return.
	 * ret_data: backend's JSON for the record (stored under "_backend");
	 * ret_size: bytes this checkpoint adds on disk. */
	int (*create)(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p,
		      ckpt_error *err);

	/* Before create and outside the services' freeze: copy what the roots
	 * hold now, so that create (frozen) copies only what changed since.
	 * Not durable, not a checkpoint; the next create uses or discards it.
	 * frozen: some unit is frozen around this create. The backend decides
	 * whether a first pass pays (one that costs a walk of its own is worth
	 * it only then) and returns 0 having done nothing when it does not. A
	 * failure only makes create copy everything. */
	int (*precopy)(void *st, bool frozen, struct progress *p, ckpt_error *err);

	/* Make every root equal to checkpoint id. details (may be NULL, else
	 * zeroed by the caller) says what it did; the caller frees it. */
	int (*restore)(void *st, const char *id, json_t *data, struct restore_details *details, struct progress *p,
		       ckpt_error *err);

	/* Reset every root to its base (its contents when ckptd adopted it). */
	int (*reset)(void *st, struct restore_details *details, ckpt_error *err);

	/* Drop checkpoint id's data (the record is already gone or going). */
	int (*remove)(void *st, const char *id, json_t *data, ckpt_error *err);

	/* Fill out (zeroed by the caller, who frees it with
	 * backend_health_free) for GET /v1/health. */
	void (*health)(void *st, struct backend_health *out);

	/* Background housekeeping off the request path (GC, flattening); called
	 * with the operation lock held. */
	void (*maintain)(void *st);
	/* Slow deletions that maintain and restore left behind; called without
	 * the operation lock, never at the same time as itself. >0: work is
	 * left, call again in a second. */
	int (*cleanup)(void *st);

	void (*close)(void *st, bool unmount);

	/* The optional abilities, each present or absent as a whole (NULL:
	 * the backend has none of it); the engine never asks which backend it
	 * has. */
	const struct backend_capture_ops *capture;
	const struct backend_compare_ops *compare;
	const struct backend_fork_ops *forks;
	const struct backend_xfer_ops *xfer;
	const struct backend_release_ops *release;
};

extern const struct backend_ops backend_tar_ops;
extern const struct backend_ops backend_overlay_ops;
