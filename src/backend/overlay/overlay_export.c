/* overlay_export.c: what export and import need of the overlay backend.
 * A view of a checkpoint is a read-only overlay of its layer chain over the
 * base, mounted privately below a temp dir: the kernel resolves whiteouts,
 * opaque directories and redirects exactly as the live mount does. An
 * imported tree becomes one base layer (overlay_internal.h), mounted without
 * the root's base dir, so restoring it gives the imported tree whatever the
 * base holds. */
#include "backend/overlay/overlay_internal.h"
#include "config.h"
#include "backend/overlay/overlay_mount.h"
#include "lib/walk.h"

#include <linux/mount.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include "lib/failpoint.h"

static int ovx_cfg(int fs, const char *key, const char *val, ckpt_error *err)
{
	if (fsconfig(fs, FSCONFIG_SET_STRING, key, val, 0) < 0)
		return err_set(err, errno, NULL, "overlay option %s=%s: %m", key, val);
	return 0;
}

/* Read-only overlay of r's layers (newest first) over its base (unless they
 * end with a base layer) onto target. */
static int ovx_mount_ro(struct ovl_root *r, const struct ovl_chain *layers, const char *target, ckpt_error *err)
{
	char p[PATH_MAX];
	_cleanup_close_ int fs = fsopen("overlay", FSOPEN_CLOEXEC);
	if (fs < 0)
		return err_set(err, errno, NULL, "fsopen overlay: %m");
	if (ovx_cfg(fs, "redirect_dir", "follow", err) < 0 || ovx_cfg(fs, "index", "off", err) < 0 ||
	    ovx_cfg(fs, "metacopy", "off", err) < 0 || ovx_cfg(fs, "xino", "off", err) < 0)
		return -err->errnum;
	for (size_t i = 0; i < layers->n + overlay_chain_on_base(layers); i++) {
		if (i < layers->n)
			snprintf(p, sizeof(p), "/proc/self/fd/%d/l/%s", r->rdir_fd, layers->v[i]);
		else
			snprintf(p, sizeof(p), "/proc/self/fd/%d/base", r->rdir_fd);
		if (ovx_cfg(fs, "lowerdir+", p, err) < 0)
			return -err->errnum;
	}
	if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
		return err_set(err, errno, NULL, "create a read-only overlay of '%s': %m", r->path);
	_cleanup_close_ int mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY);
	if (mnt < 0)
		return err_set(err, errno, NULL, "fsmount overlay: %m");
	if (move_mount(mnt, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0)
		return err_set(err, errno, NULL, "move overlay onto '%s': %m", target);
	overlay_mount_private(target);
	return 0;
}

static void ovx_free_dirs(struct ovl *o, char **dirs)
{
	for (size_t i = 0; dirs && i < o->n_roots; i++) {
		const char *rdir = o->roots[i].rdir;
		/* a mount of ours below tmp, not the base or a layer in the state dir */
		if (dirs[i] && strncmp(dirs[i], rdir, strlen(rdir)))
			overlay_umount_detach(dirs[i]);
		free(dirs[i]);
	}
	free(dirs);
}

int overlay_view_open(void *st, const char *id, json_t *data, const char *tmp, char ***ret_dirs, ckpt_error *err)
{
	struct ovl *o = st;
	char **dirs = calloc(o->n_roots + 1, sizeof(*dirs));
	_cleanup_(overlay_chains_free) struct ovl_chains chains = { 0 };
	static const struct ovl_chain none = { 0 };
	int q = id ? overlay_layers_chain_get(o, id, data, &chains) : 0;

	if (!dirs || q == -ENOMEM) {
		free(dirs);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	if (q < 0)
		q = err_set(err, ENOENT, NULL, "checkpoint %s has no layer chain", id);
	for (size_t i = 0; q == 0 && i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		const struct ovl_chain *layers = overlay_chains_get(&chains, r->h);
		layers = layers ? layers : &none;
		size_t n = layers->n;
		if (n <= 1 && overlay_chain_on_base(layers) == (n == 0)) { /* base, or one base layer */
			char rel[32] = "base";
			if (n)
				snprintf(rel, sizeof(rel), "l/%s", layers->v[0]);
			dirs[i] = path_join(r->rdir, rel);
			q = dirs[i] ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
			continue;
		}
		if (asprintf(&dirs[i], "%s/v%zu", tmp, i) < 0) {
			dirs[i] = NULL;
			q = err_set(err, ENOMEM, NULL, "out of memory");
		} else if (mkdir(dirs[i], 0700) < 0) {
			q = err_set(err, errno, NULL, "create '%s': %m", dirs[i]);
		} else {
			q = ovx_mount_ro(r, layers, dirs[i], err);
		}
	}
	if (q < 0) {
		ovx_free_dirs(o, dirs);
		return q;
	}
	*ret_dirs = dirs;
	return 0;
}

void overlay_view_close(void *st, char **dirs)
{
	ovx_free_dirs(st, dirs);
}

/* Move dir into r's layer store as a new base layer: the imported tree
 * whole, mounted without the root's base dir (whatever that holds). */
static int ovx_import_root(struct ovl_root *r, const char *dir, char name[OVL_NAME_LEN + 1], ckpt_error *err)
{
	char tmp[32];
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = l < 0 ? err_set(err, errno, NULL, "open layer store of '%s': %m", r->path) : 0;

	if (q == 0 && (q = overlay_layers_new_base_name(l, name)) < 0)
		err_set(err, -q, NULL, "name a layer: %s", strerror(-q));
	if (q < 0)
		return q;
	snprintf(tmp, sizeof(tmp), ".tmp-%s", name);
	if (FAILPOINT_AROUND("overlay.import.rename", renameat(AT_FDCWD, dir, l, tmp)) < 0)
		return err_set(err, errno, NULL, "move the imported tree into the layer store: %m");
	_cleanup_close_ int dst = openat(l, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	q = dst < 0 ? err_set(err, errno, NULL, "open imported layer: %m") : 0;
	return overlay_layer_publish(r, l, dst, tmp, name, q, err);
}

int overlay_import(void *st, const char *id, char *const *dirs, json_t **ret_data, uint64_t *ret_size, ckpt_error *err)
{
	struct ovl *o = st;
	char(*names)[OVL_NAME_LEN + 1] = calloc(o->n_roots + 1, sizeof(*names));
	_cleanup_(overlay_chains_free) struct ovl_chains chains = { 0 };
	json_auto_t *data = NULL;
	int q = names ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
	size_t done = 0;

	for (; q == 0 && done < o->n_roots; done++)
		q = ovx_import_root(&o->roots[done], dirs[done], names[done], err);
	for (size_t i = 0; q == 0 && i < o->n_roots; i++) {
		struct ovl_chain c = { 0 };
		if ((q = overlay_chain_push(&c, names[i])) == 0)
			q = overlay_chains_set(&chains, o->roots[i].h, &c);
		overlay_chain_free(&c);
		if (q < 0)
			err_set(err, -q, NULL, "out of memory");
	}
	if (q == 0 && !(data = overlay_json_data(o, &chains)))
		q = err_set(err, ENOMEM, NULL, "out of memory");
	if (q == 0 &&
	    (q = FAILPOINT_AROUND("overlay.import.chain.write", overlay_layers_chain_save(o, id, &chains, true))) < 0)
		err_set(err, -q, NULL, "record layer chain: %s", strerror(-q));
	if (q < 0) {
		for (size_t i = 0; names && i < done; i++) {
			_cleanup_close_ int l = openat(o->roots[i].rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (l >= 0 && names[i][0])
				rm_rf_at(l, names[i]);
		}
		free(names);
		return q;
	}
	*ret_size = 0;
	for (size_t i = 0; i < o->n_roots; i++) {
		char rel[32];
		uint64_t b = 0;
		snprintf(rel, sizeof(rel), "l/%s", names[i]);
		tree_disk_usage(o->roots[i].rdir_fd, rel, &b);
		*ret_size += b;
	}
	free(names);
	*ret_data = TAKE_PTR(data);
	return 0;
}

static int ovx_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ovl_root_chain *)a)->h, ((const struct ovl_root_chain *)b)->h);
}

/* The layers of every root at each depth, oldest first, roots in the order
 * of their keys: a checkpoint made on top of another has its chains plus
 * one layer each. Chains of unequal depths (after a flatten) give NULL. */
json_t *overlay_lineage(void *st, const char *id, json_t *data)
{
	struct ovl *o = st;
	_cleanup_(overlay_chains_free) struct ovl_chains cs = { 0 };
	if (overlay_layers_chain_get(o, id, data, &cs) < 0 || !cs.n || cs.n > MAX_ROOTS)
		return NULL;
	size_t depth = cs.v[0].c.n;
	for (size_t i = 1; i < cs.n; i++)
		if (cs.v[i].c.n != depth)
			return NULL;
	qsort(cs.v, cs.n, sizeof(*cs.v), ovx_cmp);
	json_t *out = json_array();
	for (size_t d = 0; out && d < depth; d++) {
		char el[MAX_ROOTS * (OVL_LAYER_LEN + 1) + 1] = "";
		for (size_t i = 0; i < cs.n; i++) {
			size_t len = strlen(el);
			snprintf(el + len, sizeof(el) - len, "%s%s", i ? "/" : "", cs.v[i].c.v[depth - 1 - d]);
		}
		json_array_append_new(out, json_string(el));
	}
	return out;
}
