/* overlay_internal.h: the overlay backend's state, shared by backend_overlay.c
 * (the ops), overlay_create.c (the create pipeline), overlay_layers.c (layer
 * store, references, GC, flatten) and overlay_root.c (live.json). Calls go
 * ops -> create -> layers -> root, never back. The state is structs
 * (overlay_state.c); each file below that is JSON is built and read by one
 * pair of functions in overlay_json.c.
 *
 * On disk, below <state>/overlay/:
 *   r/<h>/            one per root (h: hash of the root's path)
 *     base/           read-only bind of the root's original contents
 *     l/<name>/       immutable layers; l/.tmp-<name> while being written
 *     u/<name>, w/<name>  upper and work dirs; only live.json's upper is in use
 *     idx/<upper>     index of the upper at its last create (for hard links)
 *     rec/<name>      each layer's record, what verify compares it with
 *     t/<kind>-<name> discarded uppers, work dirs and layers, deleted by
 *                     cleanup without the operation lock
 *     release.json    {ino, layers, base}: a release's intent (overlay_release.c)
 *     rebase.json     the same file renamed: the release is done, its chains
 *                     not yet moved onto the kept base layer l/<base>
 *     live.json       {path, chain, mounted, upper}: the adoption record and
 *                     the intent of a restore (written before the swap)
 *     mnt.json        {id, upper}: gVisor only (its mountinfo names no
 *                     upperdir): the mount id the last mount at P got
 *     f/<fork>/u, f/<fork>/w   a fork's upper and work dirs (overlay_fork.c)
 *     dv/<name>/  a checkpoint's view mounted for a diff, while it runs
 *   restore.json    {h: {chain, upper}}: a restore's intent (overlay_intent.c)
 *   running         empty, while ckptd runs: left by a kill or a power cut,
 *                   and then no upper's index is trusted (overlay_running.c)
 *   fk/<fork>.json  each fork's chains {h: [layers]} (overlay_fork.c)
 *   c/<id>.json       each checkpoint's chains {h: [layers, newest first]};
 *                     flattening rewrites these, the catalog never changes. */
#pragma once
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/change_track.h"
#include "backend/overlay/overlay_mount.h"
#include "backend/overlay/treecopy.h"

#define OVL_NAME_LEN 8

/* overlay_state.c: the backend's state as structs. */
#define OVL_LAYER_LEN 16 /* a layer's name, or one being written (.tmp-<name>), with its NUL */
/* A chain of layers, newest first: what a mount of a root lies on. */
struct ovl_chain {
	char (*v)[OVL_LAYER_LEN];
	size_t n;
};
/* Whether name can be a layer of a chain (a name in l/). */
bool overlay_chain_name_ok(const char *name);
/* Add name below the chain's layers (push) or on top of them (push_top). */
int overlay_chain_push(struct ovl_chain *c, const char *name);
int overlay_chain_push_top(struct ovl_chain *c, const char *name);
int overlay_chain_extend(struct ovl_chain *c, const struct ovl_chain *x);
int overlay_chain_copy(struct ovl_chain *dst, const struct ovl_chain *src);
void overlay_chain_free(struct ovl_chain *c);
bool overlay_chain_equal(const struct ovl_chain *a, const struct ovl_chain *b);
bool overlay_chain_has(const struct ovl_chain *c, const char *name);
/* Every root's chain of one checkpoint or fork, by the root's hash h, in
 * the order they were set (or read from its file). */
struct ovl_root_chain {
	char h[OVL_NAME_LEN + 1];
	struct ovl_chain c;
};
struct ovl_chains {
	struct ovl_root_chain *v;
	size_t n;
};
/* Root h's chain, or NULL when it has none. */
const struct ovl_chain *overlay_chains_get(const struct ovl_chains *cs, const char *h);
int overlay_chains_set(struct ovl_chains *cs, const char *h, const struct ovl_chain *c);
int overlay_chains_copy(struct ovl_chains *dst, const struct ovl_chains *src);
void overlay_chains_free(struct ovl_chains *cs);
/* Checkpoint or fork id -> its chains, in the order ids came. */
struct ovl_chain_entry {
	char id[64];
	struct ovl_chains cs;
};
struct ovl_chain_map {
	struct ovl_chain_entry *v;
	size_t n, cap;
};
struct ovl_chains *overlay_chain_map_get(const struct ovl_chain_map *m, const char *id);
/* Takes cs (left empty). */
int overlay_chain_map_put(struct ovl_chain_map *m, const char *id, struct ovl_chains *cs);
void overlay_chain_map_del(struct ovl_chain_map *m, const char *id);
void overlay_chain_map_clear(struct ovl_chain_map *m);
void overlay_chain_map_free(struct ovl_chain_map *m);
/* How many checkpoints and forks use each layer "h/name". */
#define OVL_REF_KEY_LEN (OVL_NAME_LEN + 1 + OVL_LAYER_LEN)
struct ovl_ref {
	char key[OVL_REF_KEY_LEN]; /* "" an empty slot */
	int n;
};
struct ovl_refs {
	struct ovl_ref *v; /* cap slots, a power of two */
	size_t cap, used;
};
int overlay_refs_get(const struct ovl_refs *t, const char *h, const char *name);
void overlay_refs_add(struct ovl_refs *t, const char *h, const struct ovl_chain *c, int delta);
void overlay_refs_add_all(struct ovl_refs *t, const struct ovl_chains *cs, int delta);
void overlay_refs_clear(struct ovl_refs *t);
void overlay_refs_free(struct ovl_refs *t);
/* live.json as read (overlay_root.c). */
struct ovl_live {
	struct ovl_chain chain, mounted;
	char upper[OVL_NAME_LEN + 1];
};
/* restore.json (overlay_intent.c): each root's chain and upper. */
struct ovl_intent_root {
	char h[OVL_NAME_LEN + 1];
	struct ovl_chain chain;
	char upper[OVL_NAME_LEN + 1];
	bool bad; /* read from a file, not {chain, upper} */
};
struct ovl_intent {
	struct ovl_intent_root *v;
	size_t n;
};
/* Append e (taken: left empty). */
int overlay_intent_push(struct ovl_intent *in, struct ovl_intent_root *e);
void overlay_intent_free(struct ovl_intent *in);
/* release.json and rebase.json (overlay_release.c). */
struct ovl_release_intent {
	uint64_t ino;                /* the released copy's inode */
	bool layers;                 /* checkpoints use the root's layers */
	char base[OVL_NAME_LEN + 1]; /* the base layer the old base becomes, or "" */
};

/* An xattr of overlayfs's own (opaque, redirect, origin...), which a layer
 * keeps only where ckptd put it. The kernel stores a user's trusted.overlay.X
 * escaped, as trusted.overlay.overlay.X: that one is the user's data (an
 * image store's opaque mark in the root). */
static inline bool ovl_own_xattr(const char *k)
{
	return !strncmp(k, "trusted.overlay.", 16) && strncmp(k + 16, "overlay.", 8);
}

/* overlay_delta.c: a create's layer that holds only what changed in the
 * upper since the previous create, over that create's layers. */
#define OVL_DELTA_MAX 16 /* deltas over one full layer; the next create makes a full one */
struct ovl_dmeta {
	char *path; /* relative, "" the top */
	mode_t mode;
	uid_t uid;
	gid_t gid;
	struct timespec mtim;
	bool changed; /* overlay_delta_dir_look found the upper's differ: now */
	struct {
		mode_t mode;
		uid_t uid;
		gid_t gid;
		struct timespec mtim;
	} now;
};
struct ovl_look;
/* Every directory of the upper with the metadata its newest copy has. */
struct ovl_delta_dirs {
	struct ovl_dmeta *v;
	size_t n, cap;
	bool looked;           /* overlay_delta_dir_look ran since the last overlay_delta_dir_meta */
	struct ovl_look *look; /* overlay_delta_dir_look_start's, running or done */
	int64_t look_us;       /* the last look's on its thread */
	bool look_apart;       /* the last look began on a thread (its caller may have done it all) */
};
struct ovl_delta_opts {
	int up;                /* the upper */
	const int *prev;       /* the previous layers (newest first, the last one full) */
	size_t n_prev;         /* 1 .. OVL_DELTA_MAX */
	struct pathindex *ix;  /* the upper's index at the full layer */
	struct pathindex *dix; /* the files the deltas copied: this one's added */
	const struct pathindex *suspects;
	struct ovl_delta_dirs *dirs; /* every directory of the upper: new ones added */
	bool xattrs_keep_ctime;      /* gVisor: treecopy_opts' */
	bool early_writeback;        /* start each copied file's writeback (not gVisor: a full fsync there) */
};
/* Make the delta dst hold what the dirty directories of the upper hold,
 * relative to the previous layers; the directories' times are left to
 * overlay_delta_dir_meta. -EAGAIN: a change a delta does not express (a
 * directory moved with a redirect, or made where the previous layers hold
 * something and not opaque; a changed file of several names): make a full
 * layer instead. */
int overlay_delta_dirs(const struct ovl_delta_opts *o, int dst, const struct pathindex_dirty *dirty, size_t n,
		       struct treecopy_stats *st, ckpt_error *err);
/* overlay_look.c. Which directories' own metadata changed, with no event maybe (dirs:
 * every directory of the upper): a stat of each, read only, so that it can
 * run while the tracker scans /proc (overlay_delta_pass). */
void overlay_delta_dir_look(int up, struct ovl_delta_dirs *dirs);
/* That look begun now on a thread beside the caller (when dirs are many)
 * and ended by the next overlay_delta_dir_look, which waits for it and
 * looks itself only at the directories added since: for a create that
 * freezes no unit, whose look need not wait for its first pass. Any look
 * begun before and not ended is dropped. */
void overlay_delta_dir_look_start(int up, struct ovl_delta_dirs *dirs);
/* A look begun and not ended, waited for and forgotten. */
void overlay_delta_dir_look_drop(struct ovl_delta_dirs *dirs);
/* Those directories into dst (looked at now unless overlay_delta_dir_look
 * just did); dirs then says what dst has. Then every directory of dst
 * takes its twin's times in the upper. */
int overlay_delta_dir_meta(const struct ovl_delta_opts *o, int dst, struct ovl_delta_dirs *dirs,
			   struct treecopy_stats *st, ckpt_error *err);
/* Every directory of layer_fd (a full layer just made) with its metadata. */
int overlay_delta_dirs_read(int layer_fd, struct ovl_delta_dirs *out);
int overlay_delta_dirs_add(struct ovl_delta_dirs *d, const char *rel, const struct stat *s);
void overlay_delta_dirs_free(struct ovl_delta_dirs *d);
struct ovl_root;
/* Forget r's delta state (the next create makes a full layer) and stop its tracker. */
void overlay_delta_reset(struct ovl_root *r);
/* Whether r's next create can be a delta. */
bool overlay_delta_ready(struct ovl_root *r);
/* overlay_rebase.c. With OVL_DELTA_MAX deltas over r's full layer (l, its
 * layer store), the next create is to be a delta over that full layer alone
 * holding what they hold, when that costs less than a full layer: the stack
 * becomes the full layer, the deltas' directories r->rebase. 1 so, 0 not
 * (the next create is full), -errno. */
int overlay_rebase(struct ovl_root *r, int l);
/* Whether the next create tries that. */
bool overlay_rebase_due(const struct ovl_root *r);
/* A first pass's dirty directories with r->rebase folded in (and freed). */
int overlay_rebase_merge(struct ovl_root *r, struct pathindex_dirty **dirty, size_t *n);
/* overlay_delta_pass.c. One pass of a delta into dst (l/<tmp> or l/<pre>):
 * the directories the tracker names since its last collect (the first
 * pass: with the folded deltas' too), then (frozen) every directory's own
 * metadata. -EAGAIN: make a full layer. */
int overlay_delta_pass(struct ovl_root *r, int l, int up, int dst, bool frozen, struct treecopy_stats *stats,
		       ckpt_error *err);
/* The names of a directory, sorted and unique (overlay_delta.c). */
struct ovl_names {
	char **v;
	size_t n, cap;
};
/* Add the names of directory fd (-1: none) to ns. */
int overlay_delta_names_read(int fd, struct ovl_names *ns);
bool overlay_delta_names_has(const struct ovl_names *ns, const char *name);
void overlay_delta_names_free(struct ovl_names *ns);

/* overlay_check.c, track_check (ckptd.json(5)): read-only checks that a
 * tracked create's layer shows what the upper shows. A difference a change
 * since the tracker's collect explains is excused; any other fails the
 * create (-EIO, the path named). Neither changes a layer. */
/* A full layer made by a tracked frozen pass (dst) against the upper. */
int overlay_check_layer(struct ovl_root *r, int up, int dst, ckpt_error *err);
/* The checkpoint of delta l/<tmp> (over r->stack and the live chain),
 * mounted read-only, against the root. */
int overlay_check_delta(struct ovl_root *r, const char *tmp, ckpt_error *err);

struct ovl_root {
	char *path;                      /* the managed root P */
	const struct overlay_opts *opts; /* the backend's (struct ovl) */
	char h[OVL_NAME_LEN + 1];
	char *rdir; /* <state>/overlay/r/<h> */
	int rdir_fd;
	struct ovl_chain chain;   /* live chain (layers under the upper), newest first */
	struct ovl_chain mounted; /* chain the current mount really uses (differs after flatten) */
	char upper[OVL_NAME_LEN + 1];
	char spare[OVL_NAME_LEN + 1]; /* a durable empty upper made off the request path, or "" */
	struct pathindex *ix;         /* upper's index at its last create */
	char ix_layer[OVL_NAME_LEN + 1];
	/* create's first pass (precopy), made before the freeze: l/<pre> and
	 * the upper's index into it; "" / NULL when there is none. */
	char pre[OVL_NAME_LEN + 6];
	struct pathindex *pre_ix;
	struct pathindex *pre_ix_next; /* a copy of it for the tracked pass, or NULL */
	struct treecopy_dirs pre_dirs; /* the directories the first pass made */
	struct pathindex *pre_sus;     /* untracked: files mapped shared and writable after it */
	uint64_t pre_bytes;
	/* create's frozen copy (capture), not yet published: l/<cap_tmp>,
	 * to become layer cap_name, with the upper's index and the bytes it
	 * adds; cap_tmp "" when there is none. */
	char cap_tmp[OVL_NAME_LEN + 6];
	char cap_name[OVL_NAME_LEN + 1];
	struct pathindex *cap_ix;
	uint64_t cap_size;
	struct chg_track trk; /* armed when the first pass begins (change_track.h); kept
			       * between creates while deltas can follow */
	/* Delta layers (overlay_delta.c): the layers made from this upper
	 * since its last full one, newest first ([]: the next create makes a
	 * full one), the files they copied, every directory of the upper. */
	struct ovl_chain stack;
	struct pathindex *dix;
	struct ovl_delta_dirs ddirs;
	/* the deltas folded into the next one (overlay_rebase), its first
	 * pass's until that reads them: sorted by path */
	struct pathindex_dirty *rebase;
	size_t n_rebase;
	bool pre_delta;   /* the first pass (pre) is a delta */
	bool cap_delta;   /* the capture (cap_tmp) is a delta */
	bool cap_tracked; /* a full capture whose frozen pass the tracker answered */
	bool trk_said;    /* that tracking is not possible here was logged */
	bool released;    /* by overlay_release: no longer ours, r/<h> is gone */
	/* backend_ctx's track_changes and track_check (ckptd.json(5)) */
	enum track_mode track;
	bool track_check;
};

struct ovl {
	int flatten_depth;        /* backend_ctx's */
	struct overlay_opts opts; /* what overlay_probe found at open */
	char *odir;               /* <state>/overlay */
	int odir_fd, cdir_fd;
	struct ovl_root *roots;
	size_t n_roots;
	struct ovl_refs refs;        /* "h/layer" -> number of checkpoints and forks using it */
	struct ovl_chain_map chains; /* checkpoint id -> its chains (cache of c/<id>.json) */
	bool dirty_gc;               /* maintain has layers or uppers to remove */
	struct ovl_chain_map forks;  /* fork id -> its chains: counted in refs too (overlay_fork.c) */
	void (*before_mount)(void *hook_ctx, const char *root); /* backend_ctx's */
	void *hook_ctx;
	/* Old mounts detached by restores, held open until cleanup has deleted
	 * their uppers: the last close then drops their dirty pages instead of
	 * writing them back. Guarded by trash_lock (cleanup runs unlocked). */
	pthread_mutex_t trash_lock;
	int *pins;
	size_t n_pins;
	_Atomic int64_t last_swap_ms; /* when a restore last swapped the mounts */
	struct ovl_intent intent;     /* restore.json found at open (overlay_intent.c), or empty */
	bool has_intent;
	/* overlay_running.c: the uppers' indexes found at open are not read
	 * (the last run did not end cleanly); none is saved either, when the
	 * marker that says so could not be written. */
	bool index_distrust, index_unsaved;
};

/* overlay_running.c: the marker, at open (before the roots' indexes are
 * read) and at a clean stop. */
void overlay_running_open(struct ovl *o);
void overlay_running_close(struct ovl *o);

/* A base layer (named "B" and 7 hex digits) holds a whole tree: a chain
 * ending with one is mounted without the root's base dir. A release keeps
 * the base it replaces as one (overlay_release.c); an import makes one. */
static inline bool overlay_layer_is_base(const char *name)
{
	return name && name[0] == 'B';
}
/* overlay_layers.c (the names: overlay_root.c) */
int overlay_layers_new_name(int dirfd, char name[OVL_NAME_LEN + 1]);
int overlay_layers_new_base_name(int dirfd, char name[OVL_NAME_LEN + 1]);
/* c/<id>.json and the chains in memory. new_record: a checkpoint whose
 * record, written durably next, names the same chains (the record data a
 * missing or torn c/<id>.json falls back to): the file is not synced. */
int overlay_layers_chain_save(struct ovl *o, const char *id, const struct ovl_chains *cs, bool new_record);
/* Checkpoint id's chains into out: the cache, else c/<id>.json, else what
 * its record data names; -ENOENT when none says. */
int overlay_layers_chain_get(struct ovl *o, const char *id, json_t *data, struct ovl_chains *out);
int overlay_layers_chain_drop(struct ovl *o, const char *id);
/* Checkpoint id's chains (it has some) with root h's replaced by x; saved. */
int overlay_layers_chain_set_root(struct ovl *o, const char *id, const char *h, const struct ovl_chain *x);
int overlay_layers_load_chains(struct ovl *o, const char *const *ids, json_t *const *data, size_t n);
/* Move layers, uppers, work dirs and records nothing uses to t/ (quick). */
void overlay_layers_gc(struct ovl *o);
/* Move entry name of dir sub of r to t/ (else delete it at once). */
void overlay_layers_trash(struct ovl_root *r, int dfd, const char *sub, const char *name);
/* Delete everything in r's t/ (slow; needs no lock). */
void overlay_layers_empty_trash(struct ovl_root *r);
/* Merge chains deeper than the threshold into one layer each. */
int overlay_layers_flatten(struct ovl *o, size_t depth, ckpt_error *err);
int overlay_layers_merge(struct ovl_root *r, const struct ovl_chain *chain, char ret_name[OVL_NAME_LEN + 1],
			 ckpt_error *err);
/* overlay_layers.c too: record, sync and publish layer .tmp-<name> (fd dst) of layer store l when
 * q == 0; remove it on any failure. Returns q or the new failure. */
int overlay_layer_publish(struct ovl_root *r, int l, int dst, const char *tmp, const char *name, int q,
			  ckpt_error *err);
/* The same for a create's new layer: renamed, then synced (one barrier; the
 * chain and record that name it follow). !sync: the caller syncs its file
 * system before anything durable names it (overlay_create_defer). */
int overlay_layer_publish_new(struct ovl_root *r, int l, int dst, const char *tmp, const char *name, bool sync, int q,
			      ckpt_error *err);

/* overlay_flatten.c: merge layers lfd[0..n) (newest first) into the empty
 * dir dst so that dst over base shows what the chain over base shows. */
int overlay_flatten(const int *lfd, size_t n, int dst, ckpt_error *err);
/* overlay_verify.c */
/* Record the layer being written in layer_fd as rec/<name>. synced_after:
 * the caller's syncfs of the layer comes next, and covers the record too
 * (rec/ and l/ share the root's state dir): it is not synced on its own. */
int overlay_record_write(struct ovl_root *r, int layer_fd, const char *name, bool synced_after);
/* Append to diffs what differs in r from chain: mount (mounted_ok false or
 * another chain), a non-empty upper, layers that no longer match their records. */
int overlay_verify_root(struct ovl_root *r, const struct ovl_chain *chain, bool mounted_ok, struct verify_diffs *diffs,
			size_t max, ckpt_error *err);

/* overlay_root.c: live.json of a root; whether chain (newest first) lies on
 * the root's base dir (else on a base layer) */
bool overlay_chain_on_base(const struct ovl_chain *chain);
int overlay_live_save(struct ovl_root *r);
/* overlay_intent.c: every root's chain and upper of a restore, durable
 * before any root's live.json changes, so that a kill never leaves a mix */
int overlay_intent_add(struct ovl_intent *in, const struct ovl_root *r, const struct ovl_chain *chain,
		       const char *upper);
int overlay_intent_write(struct ovl *o, const struct ovl_intent *in);
int overlay_intent_clear(struct ovl *o);
/* Whether a restore writes restore.json: only with several roots (one
 * root's live.json rename is the whole switch, atomic by itself). */
bool overlay_intent_needed(const struct ovl *o);
/* 1: o->intent holds restore.json; 0: there is none. */
int overlay_intent_load(struct ovl *o);
int overlay_intent_apply(const struct ovl_intent *in, struct ovl_root *r);
int overlay_live_load(struct ovl_root *r);
/* Set r's live chain and the chain its mount uses (copies; either may be
 * r's own). */
int overlay_live_set(struct ovl_root *r, const struct ovl_chain *chain, const struct ovl_chain *mounted);
/* Mount chain (+ base) at target with upper/work dirs up and wk (relative to
 * the root's state dir). */
int overlay_mount_layers(struct ovl_root *r, const struct ovl_chain *chain, const char *target, const char *up,
			 const char *wk, ckpt_error *err);
/* A read-only look at chain over r's base: an fd of the view (dv/<name>,
 * name set, or "" for the base itself); drop removes dv/<name>. */
int overlay_chain_view(struct ovl_root *r, const struct ovl_chain *chain, char name[OVL_NAME_LEN + 1], ckpt_error *err);
void overlay_chain_view_drop(struct ovl_root *r, const char *name);

/* overlay_json.c: the JSON formats, one pair each (build or dump, read or
 * parse); what each file holds is listed at the top of this header. */
json_t *overlay_json_chains(const struct ovl_chains *cs);
int overlay_json_chains_read(json_t *j, struct ovl_chains *out);
char *overlay_json_chains_dump(const struct ovl_chains *cs);
int overlay_json_chains_parse(const char *s, struct ovl_chains *out);
json_t *overlay_json_data(const struct ovl *o, const struct ovl_chains *cs);
int overlay_json_data_read(const struct ovl *o, json_t *data, struct ovl_chains *out);
json_t *overlay_json_fork_data(const struct ovl_chains *cs);
int overlay_json_fork_data_read(json_t *fdata, struct ovl_chains *out);
char *overlay_json_live_dump(const struct ovl_root *r);
int overlay_json_live_parse(const char *s, struct ovl_live *out);
char *overlay_json_intent_dump(const struct ovl_intent *in);
int overlay_json_intent_parse(const char *s, struct ovl_intent *out);
char *overlay_json_release_dump(const struct ovl_release_intent *ri);
int overlay_json_release_parse(const char *s, struct ovl_release_intent *out);
char *overlay_json_mnt_dump(int id, const char *upper);
int overlay_json_mnt_parse(const char *s, int64_t *ret_id, char upper[OVL_NAME_LEN + 1]);

/* overlay_fork.c, overlay_diff.c: the backend ops of the same names. */
int overlay_fork_mount(void *st, const char *id, json_t *data, const char *fid, const char *const *dirs, json_t **fdata,
		       ckpt_error *err);
/* Load fk/<fork>.json into o->forks (before overlay_layers_load_chains counts the refs). */
void overlay_fork_load(struct ovl *o);
int overlay_fork_remove(void *st, const char *fid, json_t *fdata, const char *const *dirs, ckpt_error *err);
int overlay_diff(void *st, const char *id, json_t *data, const char *id2, json_t *data2, struct bdiff_list *out,
		 ckpt_error *err);

/* overlay_create.c: the precopy, capture and create ops. */
int overlay_precopy(void *st, bool frozen, struct progress *p, ckpt_error *err);
int overlay_capture(void *st, struct progress *p, ckpt_error *err);
int overlay_create(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p,
		   ckpt_error *err);
int overlay_create_defer(void *st, const char *id, dev_t dev, json_t **ret_data, uint64_t *ret_size, struct progress *p,
			 bool *ret_deferred, ckpt_error *err);

/* overlay_export.c: the view_open, view_close and import ops. */
int overlay_view_open(void *st, const char *id, json_t *data, const char *tmp, char ***ret_dirs, ckpt_error *err);
void overlay_view_close(void *st, char **dirs);
json_t *overlay_lineage(void *st, const char *id, json_t *data);
int overlay_import(void *st, const char *id, char *const *dirs, json_t **ret_data, uint64_t *ret_size, ckpt_error *err);

/* overlay_release.c: the release op; at open, finish or undo a release a
 * kill interrupted (1: finished, adopt the root afresh); remove a temp copy
 * left without an intent. */
int overlay_release(void *st, size_t i, ckpt_error *err);
int overlay_release_recover(struct ovl *o, struct ovl_root *r);
/* Once the chains are loaded: a release that kept the old base as a layer
 * puts it under every chain of r that lay on the base (idempotent). */
int overlay_release_rebase(struct ovl *o, struct ovl_root *r);
void overlay_release_sweep(struct ovl_root *r);
void overlay_release_sweep_gone(struct ovl *o);
