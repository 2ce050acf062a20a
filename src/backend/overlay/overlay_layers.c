/* overlay_layers.c: the layer store of the overlay backend: layer names,
 * per-checkpoint chain files, reference counts, garbage collection and the
 * flattening of long chains into one layer. */
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"
#include "lib/walk.h"

#include <sys/stat.h>
#include "lib/failpoint.h"

void overlay_layers_ref(struct ovl *o, const char *h, json_t *layers, int delta)
{
	size_t i;
	json_t *v;
	json_array_foreach (layers, i, v) {
		char key[2 * OVL_NAME_LEN + 2];
		snprintf(key, sizeof(key), "%s/%s", h, json_string_value(v));
		json_int_t n = json_integer_value(json_object_get(o->refs, key)) + delta;
		if (n > 0)
			json_object_set_new(o->refs, key, json_integer(n));
		else
			json_object_del(o->refs, key);
	}
}

static void overlay_layers_ref_all(struct ovl *o, json_t *chains, int delta)
{
	const char *h;
	json_t *layers;
	json_object_foreach (chains, h, layers)
		overlay_layers_ref(o, h, layers, delta);
}

static int overlay_layers_chain_write(struct ovl *o, const char *id, json_t *chains)
{
	char name[64];
	_cleanup_free_ char *s = json_dumps(chains, JSON_COMPACT);
	if (!s)
		return -ENOMEM;
	snprintf(name, sizeof(name), "%s.json", id);
	return FAILPOINT_AROUND("overlay.chain.write", write_file_atomic(o->cdir_fd, name, s, strlen(s), 0600));
}

int overlay_layers_chain_save(struct ovl *o, const char *id, json_t *chains)
{
	int q = overlay_layers_chain_write(o, id, chains);
	if (q < 0)
		return q;
	json_t *old = json_object_get(o->chains, id);
	if (old)
		overlay_layers_ref_all(o, old, -1);
	overlay_layers_ref_all(o, chains, +1);
	json_object_set(o->chains, id, chains);
	return 0;
}

/* From a record's data (an imported or older checkpoint): {roots:[{path, layers}]}. */
static json_t *overlay_layers_from_data(struct ovl *o, json_t *data)
{
	json_auto_t *out = json_object();
	json_t *e;
	size_t i;
	json_array_foreach (json_object_get(data, "roots"), i, e) {
		const char *path = json_string_value(json_object_get(e, "path"));
		json_t *layers = json_object_get(e, "layers");
		for (size_t k = 0; path && json_is_array(layers) && k < o->n_roots; k++)
			if (!strcmp(o->roots[k].path, path))
				json_object_set(out, o->roots[k].h, layers);
	}
	return json_object_size(out) ? TAKE_PTR(out) : NULL;
}

json_t *overlay_layers_chain_get(struct ovl *o, const char *id, json_t *data)
{
	char name[64];
	_cleanup_free_ char *s = NULL;
	json_t *c = json_object_get(o->chains, id);
	if (c)
		return json_incref(c);
	if (!id_valid(id))
		return NULL;
	snprintf(name, sizeof(name), "%s.json", id);
	if (read_file_at(o->cdir_fd, name, 1 << 20, &s, NULL) == 0) {
		json_auto_t *loaded = json_loads(s, 0, NULL);
		if (json_is_object(loaded))
			return TAKE_PTR(loaded);
	}
	return data ? overlay_layers_from_data(o, data) : NULL;
}

int overlay_layers_chain_drop(struct ovl *o, const char *id)
{
	char name[64];
	json_t *c = json_object_get(o->chains, id);
	if (!id_valid(id))
		return -EINVAL;
	snprintf(name, sizeof(name), "%s.json", id);
	if (FAILPOINT_AROUND("overlay.chain.unlink", unlinkat(o->cdir_fd, name, 0)) < 0 && errno != ENOENT)
		return -errno;
	FAILPOINT_AROUND("overlay.chain.unlink.fsync", fsync_dirfd(o->cdir_fd));
	if (!c)
		return -ENOENT;
	overlay_layers_ref_all(o, c, -1);
	json_object_del(o->chains, id);
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
	json_object_clear(o->refs);
	json_object_clear(o->chains);
	const char *fid;
	json_t *fc;
	/* forks use layers too (o->forks loaded by the caller) */
	json_object_foreach (o->forks, fid, fc)
		overlay_layers_ref_all(o, fc, +1);
	for (size_t i = 0; i < n; i++) {
		json_auto_t *c = overlay_layers_chain_get(o, ids[i], data ? data[i] : NULL);
		if (!c)
			continue;
		json_object_set(o->chains, ids[i], c);
		overlay_layers_ref_all(o, c, +1);
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

static bool overlay_layers_in(json_t *arr, const char *name)
{
	size_t i;
	json_t *v;
	json_array_foreach (arr, i, v)
		if (!strcmp(json_string_value(v), name))
			return true;
	return false;
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
static int overlay_layers_truncate(void *ctx, int dfd, const char *name)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	if (S_ISDIR(st.st_mode))
		walk_each(dfd, name, overlay_layers_truncate, ctx); /* best effort: rm -rf follows */
	if (S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_size > 0) {
		_cleanup_close_ int fd = openat(dfd, name, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
		if (fd >= 0 && ftruncate(fd, 0) < 0)
			log_debug("overlay: truncate trash file '%s': %m", name);
	}
	return 0;
}

void overlay_layers_empty_trash(struct ovl_root *r)
{
	DIR *d;
	if (walk_open(r->rdir_fd, "t", &d) < 0)
		return;
	struct dirent *de;
	while ((de = walk_next(d))) {
		if (!strncmp(de->d_name, "u-", 2)) /* an upper (layers share inodes) */
			overlay_layers_truncate(NULL, dirfd(d), de->d_name);
		if (FAILPOINT_AROUND("overlay.trash.remove", rm_rf_at(dirfd(d), de->d_name)) < 0)
			log_debug("overlay: remove '%s/t/%s' failed", r->rdir, de->d_name);
	}
	closedir(d);
}

static bool overlay_layers_keep_layer(struct ovl *o, struct ovl_root *r, const char *name)
{
	char key[64];
	snprintf(key, sizeof(key), "%s/%s", r->h, name);
	return json_object_get(o->refs, key) || overlay_layers_in(r->chain, name) ||
		overlay_layers_in(r->stack, name) || overlay_layers_in(r->mounted, name);
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
	return json_object_get(o->forks, name) != NULL;
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
int overlay_layers_merge(struct ovl_root *r, json_t *chain, char ret_name[OVL_NAME_LEN + 1], ckpt_error *err)
{
	char tmp[32];
	size_t n = json_array_size(chain), opened = 0;
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (l < 0 || overlay_layers_new_name(l, ret_name) < 0)
		return err_set(err, EIO, NULL, "open layer store of '%s'", r->path);
	_cleanup_free_ int *lfd = calloc(n + 1, sizeof(int));
	if (!lfd)
		return err_set(err, ENOMEM, NULL, "out of memory");
	int q = 0;
	for (; q == 0 && opened < n; opened++) {
		lfd[opened] = openat(l, json_string_value(json_array_get(chain, opened)),
				     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
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
	    (q = FAILPOINT_AROUND("overlay.flatten.record.write", overlay_record_write(r, dst, ret_name))) < 0)
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

static bool overlay_layers_ends_with(json_t *x, json_t *c)
{
	size_t m = json_array_size(x), k = json_array_size(c);
	if (m < k)
		return false;
	for (size_t i = 0; i < k; i++)
		if (strcmp(json_string_value(json_array_get(x, m - k + i)), json_string_value(json_array_get(c, i))))
			return false;
	return true;
}

/* x with its suffix c replaced by [f], or by [f, base layer] when c ends
 * with one (a base layer is never merged). */
static json_t *overlay_layers_rebase(json_t *x, json_t *c, const char *f)
{
	json_t *out = json_array();
	for (size_t i = 0; i < json_array_size(x) - json_array_size(c); i++)
		json_array_append(out, json_array_get(x, i));
	json_array_append_new(out, json_string(f));
	if (!overlay_chain_on_base(c))
		json_array_append(out, json_array_get(c, json_array_size(c) - 1));
	return out;
}

/* The first n layers of c. */
static json_t *overlay_layers_head(json_t *c, size_t n)
{
	json_t *out = json_array();
	for (size_t i = 0; out && i < n; i++)
		json_array_append(out, json_array_get(c, i));
	return out;
}

static json_t *overlay_layers_longest(struct ovl *o, struct ovl_root *r)
{
	json_t *best = r->chain, *c;
	const char *id;
	json_object_foreach (o->chains, id, c) {
		json_t *x = json_object_get(c, r->h);
		if (json_array_size(x) > json_array_size(best))
			best = x;
	}
	return best;
}

/* Switch every chain ending with c to the merged layer f: chain files are
 * rewritten one by one (each atomically; old and new both mount the same
 * tree), then the live chain. The running mount keeps its layers ("mounted"). */
static void overlay_layers_switch(struct ovl *o, struct ovl_root *r, json_t *c, const char *f)
{
	const char *id;
	json_t *chains;
	json_object_foreach (o->chains, id, chains) {
		json_t *x = json_object_get(chains, r->h);
		if (!x || !overlay_layers_ends_with(x, c))
			continue;
		json_auto_t *nc = json_deep_copy(chains);
		json_object_set_new(nc, r->h, overlay_layers_rebase(x, c, f));
		if (overlay_layers_chain_save(o, id, nc) < 0)
			log_debug("overlay: rewrite chain of %s failed", id);
	}
	if (overlay_layers_ends_with(r->chain, c) && json_array_size(c)) {
		json_t *old = r->chain; /* kept when live.json cannot be rewritten (disk full) */
		r->chain = overlay_layers_rebase(old, c, f);
		if (overlay_live_save(r) < 0) {
			json_decref(r->chain);
			r->chain = old;
		} else {
			json_decref(old);
		}
	}
	o->dirty_gc = true;
}

int overlay_layers_flatten(struct ovl *o, size_t depth, ckpt_error *err)
{
	for (size_t i = 0; i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		for (int round = 0; round < 16 && !r->released; round++) {
			json_auto_t *c = json_incref(overlay_layers_longest(o, r));
			if (json_array_size(c) <= depth)
				break;
			/* a base layer stays the bottom: the layers above it merge */
			json_auto_t *above = overlay_layers_head(c, json_array_size(c) - !overlay_chain_on_base(c));
			char f[OVL_NAME_LEN + 1];
			int q = above ? overlay_layers_merge(r, above, f, err)
				      : err_set(err, ENOMEM, NULL, "out of memory");
			if (q < 0)
				return q;
			overlay_layers_switch(o, r, c, f);
		}
	}
	return 0;
}

/* Finish layer store l's .tmp-<name> (fd dst) once written (q == 0): record
 * it, make it durable, publish it as name. On any failure it is removed. */
int overlay_layer_publish(struct ovl_root *r, int l, int dst, const char *tmp, const char *name, int q, ckpt_error *err)
{
	if (q == 0 && (q = FAILPOINT_AROUND("overlay.layer.record.write", overlay_record_write(r, dst, name))) < 0)
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
