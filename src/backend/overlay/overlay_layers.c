/* overlay_layers.c: the layer store of the overlay backend: layer names,
 * per-checkpoint chain files, reference counts, garbage collection and the
 * flattening of long chains into one layer. */
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"
#include "lib/walk.h"

#include <sys/stat.h>
#include "lib/failpoint.h"

static int overlay_layers_chain_write(struct ovl *o, const char *id, const struct ovl_chains *cs, bool synced)
{
	char name[64];
	_cleanup_free_ char *s = overlay_json_chains_dump(cs);
	if (!s)
		return -ENOMEM;
	snprintf(name, sizeof(name), "%s.json", id);
	/* !synced (a new checkpoint, created or imported): harmless to lose.
	 * The engine writes the record durably (catalog_put) before it
	 * answers, and the record's data names the same chains; at start a
	 * c/<id>.json missing, empty or torn (it does not parse) falls back to
	 * them (overlay_layers_chain_get). A new id has no older file to come
	 * back. Every later rewrite (flatten, release) is synced. */
	return FAILPOINT_AROUND("overlay.chain.write",
				synced ? write_file_atomic(o->cdir_fd, name, s, strlen(s), 0600)
				       : write_file_replace(o->cdir_fd, name, s, strlen(s), 0600));
}

int overlay_layers_chain_save(struct ovl *o, const char *id, const struct ovl_chains *cs, bool new_record)
{
	struct ovl_chains copy = { 0 };
	if (overlay_chains_copy(&copy, cs) < 0)
		return -ENOMEM;
	int q = overlay_layers_chain_write(o, id, cs, !new_record);
	if (q < 0) {
		overlay_chains_free(&copy);
		return q;
	}
	struct ovl_chains *old = overlay_chain_map_get(&o->chains, id);
	if (old)
		overlay_refs_add_all(&o->refs, old, -1);
	overlay_refs_add_all(&o->refs, cs, +1);
	q = overlay_chain_map_put(&o->chains, id, &copy);
	overlay_chains_free(&copy);
	return q;
}

/* c/<id>.json as written; -ENOENT without one, -EBADMSG when it says nothing. */
static int overlay_layers_chain_read(struct ovl *o, const char *id, struct ovl_chains *out)
{
	char name[64];
	_cleanup_free_ char *s = NULL;
	snprintf(name, sizeof(name), "%s.json", id);
	int q = read_file_at(o->cdir_fd, name, 1 << 20, &s, NULL);
	return q < 0 ? q : overlay_json_chains_parse(s, out);
}

int overlay_layers_chain_get(struct ovl *o, const char *id, json_t *data, struct ovl_chains *out)
{
	const struct ovl_chains *c = overlay_chain_map_get(&o->chains, id);
	if (c)
		return overlay_chains_copy(out, c);
	if (!id_valid(id))
		return -ENOENT;
	int q = overlay_layers_chain_read(o, id, out);
	if (q == 0 || q == -ENOMEM)
		return q;
	/* an imported or older checkpoint: its record data names its layers */
	q = data ? overlay_json_data_read(o, data, out) : -ENOENT;
	return q == -ENOMEM ? q : q < 0 ? -ENOENT : 0;
}

int overlay_layers_chain_drop(struct ovl *o, const char *id)
{
	char name[64];
	struct ovl_chains *c = overlay_chain_map_get(&o->chains, id);
	if (!id_valid(id))
		return -EINVAL;
	snprintf(name, sizeof(name), "%s.json", id);
	if (FAILPOINT_AROUND("overlay.chain.unlink", unlinkat(o->cdir_fd, name, 0)) < 0 && errno != ENOENT)
		return -errno;
	FAILPOINT_AROUND("overlay.chain.unlink.fsync", fsync_dirfd(o->cdir_fd));
	if (!c)
		return -ENOENT;
	overlay_refs_add_all(&o->refs, c, -1);
	overlay_chain_map_del(&o->chains, id);
	return 0;
}

static bool overlay_layers_listed(const char *const *ids, size_t n, const char *id)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(ids[i], id))
			return true;
	return false;
}

/* Rebuild chains and references from the checkpoints that exist; drop the
 * chain files of anything else (half-made creates, half-done deletes). */
int overlay_layers_load_chains(struct ovl *o, const char *const *ids, json_t *const *data, size_t n)
{
	overlay_refs_clear(&o->refs);
	overlay_chain_map_clear(&o->chains);
	/* forks use layers too (o->forks loaded by the caller) */
	for (size_t i = 0; i < o->forks.n; i++)
		overlay_refs_add_all(&o->refs, &o->forks.v[i].cs, +1);
	for (size_t i = 0; i < n; i++) {
		struct ovl_chains c = { 0 };
		int q = overlay_layers_chain_get(o, ids[i], data ? data[i] : NULL, &c);
		if (q == 0) {
			overlay_refs_add_all(&o->refs, &c, +1);
			q = overlay_chain_map_put(&o->chains, ids[i], &c);
		}
		overlay_chains_free(&c);
		if (q == -ENOMEM)
			return q;
	}
	_cleanup_closedir_ DIR *d = NULL;
	int q = walk_open(o->cdir_fd, NULL, &d);
	if (q < 0)
		return q;
	struct dirent *de;
	while ((de = walk_next(d))) {
		char id[64];
		size_t len = strlen(de->d_name);
		if (de->d_name[0] != '.' && len > 5 && len < sizeof(id) && !strcmp(de->d_name + len - 5, ".json")) {
			snprintf(id, sizeof(id), "%.*s", (int)(len - 5), de->d_name);
			if (overlay_layers_listed(ids, n, id))
				continue;
		}
		FAILPOINT_AROUND("overlay.recover.chain.unlink", unlinkat(o->cdir_fd, de->d_name, 0));
	}
	fsync_dirfd(o->cdir_fd);
	return 0;
}

/* Remove entries of dir sub that keep() rejects. */
static void overlay_layers_sweep(struct ovl *o, struct ovl_root *r, const char *sub,
				 bool (*keep)(struct ovl *, struct ovl_root *, const char *))
{
	DIR *d;
	if (walk_open(r->rdir_fd, sub, &d) < 0)
		return;
	struct dirent *de;
	while ((de = walk_next(d)))
		if (!keep(o, r, de->d_name))
			overlay_layers_trash(r, dirfd(d), sub, de->d_name);
	closedir(d);
}

void overlay_layers_trash(struct ovl_root *r, int dfd, const char *sub, const char *name)
{
	char t[64];
	snprintf(t, sizeof(t), "t/%s-%s", sub, name);
	if (FAILPOINT_AROUND("overlay.trash.rename", renameat(dfd, name, r->rdir_fd, t)) == 0)
		return;
	if (rm_rf_at(dfd, name) < 0)
		log_debug("overlay: remove '%s/%s/%s' failed", r->rdir, sub, name);
}

/* Truncate the regular files only this name holds: their pages and blocks
 * go at once, even while a detached mount still holds the inode. A file
 * with other links (a layer's, shared with a newer one) is left whole. */
static int overlay_layers_truncate_one(void *ctx, struct walk_entry *e)
{
	(void)ctx;
	if (S_ISREG(e->st.st_mode) && e->st.st_nlink == 1 && e->st.st_size > 0) {
		_cleanup_close_ int fd = openat(e->dirfd, e->name, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
		if (fd >= 0 && ftruncate(fd, 0) < 0)
			log_debug("overlay: truncate trash file '%s': %m", e->name);
	}
	return 0;
}

/* Best effort: rm -rf follows. */
static void overlay_layers_truncate(int dfd, const char *name)
{
	struct walk_opts o = { .flags = WALK_STAT, .pre = overlay_layers_truncate_one, .fail = walk_fail_ignore };
	walk_tree(dfd, name, &o);
}

void overlay_layers_empty_trash(struct ovl_root *r)
{
	DIR *d;
	if (walk_open(r->rdir_fd, "t", &d) < 0)
		return;
	struct dirent *de;
	while ((de = walk_next(d))) {
		if (!strncmp(de->d_name, "u-", 2)) /* an upper (layers share inodes) */
			overlay_layers_truncate(dirfd(d), de->d_name);
		if (FAILPOINT_AROUND("overlay.trash.remove", rm_rf_at(dirfd(d), de->d_name)) < 0)
			log_debug("overlay: remove '%s/t/%s' failed", r->rdir, de->d_name);
	}
	closedir(d);
}

static bool overlay_layers_keep_layer(struct ovl *o, struct ovl_root *r, const char *name)
{
	return overlay_refs_get(&o->refs, r->h, name) > 0 || overlay_chain_has(&r->chain, name) ||
		overlay_chain_has(&r->stack, name) || overlay_chain_has(&r->mounted, name);
}

static bool overlay_layers_keep_upper(struct ovl *o, struct ovl_root *r, const char *name)
{
	(void)o;
	return !strcmp(name, r->upper) || !strcmp(name, r->spare);
}

/* Diff views live only while a diff runs (under the operation lock, as GC). */
static bool overlay_layers_keep_none(struct ovl *o, struct ovl_root *r, const char *name)
{
	(void)o, (void)r, (void)name;
	return false;
}

/* A fork's upper stays while the fork is recorded (even when not mounted). */
static bool overlay_layers_keep_fork(struct ovl *o, struct ovl_root *r, const char *name)
{
	(void)r;
	return overlay_chain_map_get(&o->forks, name) != NULL;
}

void overlay_layers_gc(struct ovl *o)
{
	for (size_t i = 0; i < o->n_roots; i++) {
		if (o->roots[i].released)
			continue;
		overlay_layers_sweep(o, &o->roots[i], "l", overlay_layers_keep_layer);
		overlay_layers_sweep(o, &o->roots[i], "rec", overlay_layers_keep_layer);
		overlay_layers_sweep(o, &o->roots[i], "u", overlay_layers_keep_upper);
		overlay_layers_sweep(o, &o->roots[i], "w", overlay_layers_keep_upper);
		overlay_layers_sweep(o, &o->roots[i], "dv", overlay_layers_keep_none);
		overlay_layers_sweep(o, &o->roots[i], "f", overlay_layers_keep_fork);
	}
	o->dirty_gc = false;
}

/* Merge the chain into one new layer (overlay_flatten.c). */
int overlay_layers_merge(struct ovl_root *r, const struct ovl_chain *chain, char ret_name[OVL_NAME_LEN + 1],
			 ckpt_error *err)
{
	char tmp[32];
	size_t n = chain->n, opened = 0;
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (l < 0 || overlay_layers_new_name(l, ret_name) < 0)
		return err_set(err, EIO, NULL, "open layer store of '%s'", r->path);
	_cleanup_free_ int *lfd = calloc(n + 1, sizeof(int));
	if (!lfd)
		return err_set(err, ENOMEM, NULL, "out of memory");
	int q = 0;
	for (; q == 0 && opened < n; opened++) {
		lfd[opened] = openat(l, chain->v[opened], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (lfd[opened] < 0)
			q = err_set(err, errno, NULL, "open layer: %m");
	}
	snprintf(tmp, sizeof(tmp), ".tmp-%s", ret_name);
	if (q == 0 && mkdirat(l, tmp, 0700) < 0)
		q = err_set(err, errno, NULL, "create merged layer: %m");
	_cleanup_close_ int dst = q == 0 ? openat(l, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (q == 0)
		q = dst < 0 ? err_set(err, errno, NULL, "open merged layer: %m") : overlay_flatten(lfd, n, dst, err);
	if (q == 0 &&
	    (q = FAILPOINT_AROUND("overlay.flatten.record.write", overlay_record_write(r, dst, ret_name, true))) < 0)
		err_set(err, -q, NULL, "record merged layer: %s", strerror(-q));
	if (q == 0 && FAILPOINT_AROUND("overlay.flatten.syncfs", syncfs(dst)) < 0)
		q = err_set(err, errno, NULL, "sync merged layer: %m");
	if (q == 0 &&
	    (FAILPOINT_AROUND("overlay.flatten.rename", renameat(l, tmp, l, ret_name)) < 0 ||
	     FAILPOINT_AROUND("overlay.flatten.fsync", fsync_dirfd(l)) < 0))
		q = err_set(err, errno, NULL, "publish merged layer: %m");
	if (q < 0)
		rm_rf_at(l, tmp);
	for (size_t i = 0; i < opened; i++)
		if (lfd[i] >= 0)
			close(lfd[i]);
	return q;
}

static bool overlay_layers_ends_with(const struct ovl_chain *x, const struct ovl_chain *c)
{
	if (x->n < c->n)
		return false;
	for (size_t i = 0; i < c->n; i++)
		if (strcmp(x->v[x->n - c->n + i], c->v[i]))
			return false;
	return true;
}

/* out: x with its suffix c replaced by [f], or by [f, base layer] when c
 * ends with one (a base layer is never merged). */
static int overlay_layers_rebase(const struct ovl_chain *x, const struct ovl_chain *c, const char *f,
				 struct ovl_chain *out)
{
	struct ovl_chain head = { .v = x->v, .n = x->n - c->n };
	int q = overlay_chain_extend(out, &head);
	if (q == 0)
		q = overlay_chain_push(out, f);
	if (q == 0 && !overlay_chain_on_base(c))
		q = overlay_chain_push(out, c->v[c->n - 1]);
	return q;
}

/* The longest chain of r (the live one when none is longer). */
static const struct ovl_chain *overlay_layers_longest(struct ovl *o, struct ovl_root *r)
{
	const struct ovl_chain *best = &r->chain;
	for (size_t i = 0; i < o->chains.n; i++) {
		const struct ovl_chain *x = overlay_chains_get(&o->chains.v[i].cs, r->h);
		if (x && x->n > best->n)
			best = x;
	}
	return best;
}

int overlay_layers_chain_set_root(struct ovl *o, const char *id, const char *h, const struct ovl_chain *x)
{
	struct ovl_chains nc = { 0 };
	int q = overlay_chains_copy(&nc, overlay_chain_map_get(&o->chains, id));
	if (q == 0)
		q = overlay_chains_set(&nc, h, x);
	if (q == 0)
		q = overlay_layers_chain_save(o, id, &nc, false);
	overlay_chains_free(&nc);
	return q;
}

/* Checkpoint id's chain of root r (ending with c) rebased onto f; saved. */
static int overlay_layers_switch_one(struct ovl *o, struct ovl_root *r, const char *id, const struct ovl_chain *c,
				     const char *f)
{
	struct ovl_chain x = { 0 };
	int q = overlay_layers_rebase(overlay_chains_get(overlay_chain_map_get(&o->chains, id), r->h), c, f, &x);
	if (q == 0)
		q = overlay_layers_chain_set_root(o, id, r->h, &x);
	overlay_chain_free(&x);
	return q;
}

/* Switch every chain ending with c to the merged layer f: chain files are
 * rewritten one by one (each atomically; old and new both mount the same
 * tree), then the live chain. The running mount keeps its layers ("mounted"). */
static void overlay_layers_switch(struct ovl *o, struct ovl_root *r, const struct ovl_chain *c, const char *f)
{
	for (size_t i = 0; i < o->chains.n; i++) {
		const struct ovl_chain *x = overlay_chains_get(&o->chains.v[i].cs, r->h);
		if (!x || !overlay_layers_ends_with(x, c))
			continue;
		char id[sizeof(o->chains.v[i].id)];
		memcpy(id, o->chains.v[i].id, sizeof(id)); /* the save replaces the entry's chains */
		if (overlay_layers_switch_one(o, r, id, c, f) < 0)
			log_debug("overlay: rewrite chain of %s failed", id);
	}
	if (overlay_layers_ends_with(&r->chain, c) && c->n) {
		struct ovl_chain nc = { 0 };
		if (overlay_layers_rebase(&r->chain, c, f, &nc) == 0) {
			struct ovl_chain old = r->chain; /* kept when live.json cannot be rewritten (disk full) */
			r->chain = nc;
			if (overlay_live_save(r) < 0) {
				r->chain = old;
				old = nc; /* the one to free */
			}
			overlay_chain_free(&old);
		} else {
			overlay_chain_free(&nc);
		}
	}
	o->dirty_gc = true;
}

int overlay_layers_flatten(struct ovl *o, size_t depth, ckpt_error *err)
{
	for (size_t i = 0; i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		for (int round = 0; round < 16 && !r->released; round++) {
			struct ovl_chain c = { 0 };
			if (overlay_chain_copy(&c, overlay_layers_longest(o, r)) < 0)
				return err_set(err, ENOMEM, NULL, "out of memory");
			if (c.n <= depth) {
				overlay_chain_free(&c);
				break;
			}
			/* a base layer stays the bottom: the layers above it merge */
			struct ovl_chain above = { .v = c.v, .n = c.n - !overlay_chain_on_base(&c) };
			char f[OVL_NAME_LEN + 1];
			int q = overlay_layers_merge(r, &above, f, err);
			if (q == 0)
				overlay_layers_switch(o, r, &c, f);
			overlay_chain_free(&c);
			if (q < 0)
				return q;
		}
	}
	return 0;
}

/* Finish layer store l's .tmp-<name> (fd dst) once written (q == 0): record
 * it, make it durable, publish it as name. On any failure it is removed. */
int overlay_layer_publish(struct ovl_root *r, int l, int dst, const char *tmp, const char *name, int q, ckpt_error *err)
{
	if (q == 0 &&
	    (q = FAILPOINT_AROUND("overlay.layer.record.write", overlay_record_write(r, dst, name, true))) < 0)
		err_set(err, -q, NULL, "record layer: %s", strerror(-q));
	if (q == 0 && FAILPOINT_AROUND("overlay.layer.syncfs", syncfs(dst)) < 0)
		q = err_set(err, errno, NULL, "sync layer: %m");
	if (q == 0 && FAILPOINT_AROUND("overlay.layer.rename", renameat(l, tmp, l, name)) < 0)
		q = err_set(err, errno, NULL, "publish layer: %m");
	if (q == 0 && FAILPOINT_AROUND("overlay.layer.fsync", fsync_dirfd(l)) < 0)
		q = err_set(err, errno, NULL, "sync layer store: %m");
	if (q < 0)
		rm_rf_at(l, tmp);
	return q;
}

/* overlay_layer_publish for a create's new layer, with one barrier less:
 * renamed before its syncfs, which then makes the data and the name durable
 * at once (the fsync of the layer store it saves costs 1-2 ms on a VM's
 * disk). A crash before that syncfs ends may leave l/<name> torn, but
 * nothing durable names it yet: the chain and the catalog record are
 * written after this returns, and a layer no chain holds is swept at the
 * next start (overlay_layers_gc). !sync leaves that syncfs to the caller,
 * whose one syncfs of the file system comes before the record's rename
 * (overlay_create_defer, catalog_write): until it ends, the same
 * holds. Not for a step a restart skips when the name exists (a release
 * keeping the old base). */
int overlay_layer_publish_new(struct ovl_root *r, int l, int dst, const char *tmp, const char *name, bool sync, int q,
			      ckpt_error *err)
{
	bool renamed = false;
	if (q == 0 &&
	    (q = FAILPOINT_AROUND("overlay.layer.record.write", overlay_record_write(r, dst, name, true))) < 0)
		err_set(err, -q, NULL, "record layer: %s", strerror(-q));
	if (q == 0 && FAILPOINT_AROUND("overlay.layer.rename", renameat(l, tmp, l, name)) < 0)
		q = err_set(err, errno, NULL, "publish layer: %m");
	renamed = q == 0;
	if (q == 0 && sync && FAILPOINT_AROUND("overlay.layer.syncfs", syncfs(dst)) < 0)
		q = err_set(err, errno, NULL, "sync layer: %m");
	if (q < 0)
		rm_rf_at(l, renamed ? name : tmp);
	return q;
}
