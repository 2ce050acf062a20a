/* overlay_export.c: what export and import need of the overlay backend.
 * A view of a checkpoint is a read-only overlay of its layer chain over the
 * base, mounted privately below a temp dir: the kernel resolves whiteouts,
 * opaque directories and redirects exactly as the live mount does. An
 * imported tree becomes one layer that hides the base entirely (a whiteout
 * for each top-level name of the base, every top-level directory opaque),
 * so restoring it gives the imported tree whatever the base holds. */
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"
#include "lib/walk.h"

#include <linux/mount.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

static int ovx_cfg(int fs, const char *key, const char *val, ckpt_error *err)
{
	if (fsconfig(fs, FSCONFIG_SET_STRING, key, val, 0) < 0)
		return err_set(err, errno, NULL, "overlay option %s=%s: %m", key, val);
	return 0;
}

/* Read-only overlay of r's layers (newest first) over its base onto target. */
static int ovx_mount_ro(struct ovl_root *r, json_t *layers, const char *target, ckpt_error *err)
{
	char p[PATH_MAX];
	_cleanup_close_ int fs = fsopen("overlay", FSOPEN_CLOEXEC);
	if (fs < 0)
		return err_set(err, errno, NULL, "fsopen overlay: %m");
	if (ovx_cfg(fs, "redirect_dir", "follow", err) < 0 || ovx_cfg(fs, "index", "off", err) < 0 ||
	    ovx_cfg(fs, "metacopy", "off", err) < 0 || ovx_cfg(fs, "xino", "off", err) < 0)
		return -err->errnum;
	for (size_t i = 0; i <= json_array_size(layers); i++) {
		if (i < json_array_size(layers))
			snprintf(p, sizeof(p), "/proc/self/fd/%d/l/%s", r->rdir_fd,
				 json_string_value(json_array_get(layers, i)));
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
		if (dirs[i] && strstr(dirs[i], "/v")) /* ours: a mount below tmp */
			overlay_umount_detach(dirs[i]);
		free(dirs[i]);
	}
	free(dirs);
}

int overlay_view_open(void *st, const char *id, json_t *data, const char *tmp, char ***ret_dirs, ckpt_error *err)
{
	struct ovl *o = st;
	char **dirs = calloc(o->n_roots + 1, sizeof(*dirs));
	json_auto_t *chains = id ? overlay_layers_chain_get(o, id, data) : json_object();
	int q = 0;

	if (!dirs)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (!chains)
		q = err_set(err, ENOENT, NULL, "checkpoint %s has no layer chain", id);
	for (size_t i = 0; q == 0 && i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		json_t *layers = json_object_get(chains, r->h);
		if (json_array_size(layers) == 0) {
			dirs[i] = path_join(r->rdir, "base");
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

/* Make layer dir lfd hide all of base: whiteouts for base names the import
 * lacks, opaque top-level directories. */
static int ovx_hide_base(struct ovl_root *r, int lfd, ckpt_error *err)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	struct stat st;
	_cleanup_close_ int bfd = openat(r->rdir_fd, "base", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = bfd < 0 ? -errno : walk_open(bfd, NULL, &d);

	if (q < 0)
		return err_set(err, -q, NULL, "list the base of '%s': %s", r->path, strerror(-q));
	while ((de = walk_next(d))) {
		if (fstatat(lfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
			continue;
		if (errno != ENOENT || mknodat(lfd, de->d_name, S_IFCHR | 0000, makedev(0, 0)) < 0)
			return err_set(err, errno, NULL, "whiteout '%s': %m", de->d_name);
	}
	if (errno)
		return err_set(err, errno, NULL, "list the base of '%s': %m", r->path);
	closedir(TAKE_PTR(d));
	if ((q = walk_open(lfd, NULL, &d)) < 0)
		return err_set(err, -q, NULL, "list the imported layer: %s", strerror(-q));
	while ((de = walk_next(d))) {
		if (fstatat(lfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
			continue;
		_cleanup_close_ int fd = openat(lfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || fsetxattr(fd, "trusted.overlay.opaque", "y", 1, 0) < 0)
			return err_set(err, errno, NULL, "mark '%s' opaque: %m", de->d_name);
	}
	return 0;
}

/* Move dir into r's layer store as a new layer name. */
static int ovx_import_root(struct ovl_root *r, const char *dir, char name[OVL_NAME_LEN + 1], ckpt_error *err)
{
	char tmp[32];
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = l < 0 ? err_set(err, errno, NULL, "open layer store of '%s': %m", r->path) : 0;

	if (q == 0 && (q = overlay_layers_new_name(l, name)) < 0)
		err_set(err, -q, NULL, "name a layer: %s", strerror(-q));
	if (q < 0)
		return q;
	snprintf(tmp, sizeof(tmp), ".tmp-%s", name);
	if (renameat(AT_FDCWD, dir, l, tmp) < 0)
		return err_set(err, errno, NULL, "move the imported tree into the layer store: %m");
	_cleanup_close_ int dst = openat(l, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	q = dst < 0 ? err_set(err, errno, NULL, "open imported layer: %m") : ovx_hide_base(r, dst, err);
	return overlay_layer_publish(r, l, dst, tmp, name, q, err);
}

int overlay_import(void *st, const char *id, char *const *dirs, json_t **ret_data, uint64_t *ret_size, ckpt_error *err)
{
	struct ovl *o = st;
	char(*names)[OVL_NAME_LEN + 1] = calloc(o->n_roots + 1, sizeof(*names));
	json_auto_t *chains = json_object(), *data = json_pack("{s:[]}", "roots");
	int q = names && chains && data ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
	size_t done = 0;

	for (; q == 0 && done < o->n_roots; done++)
		q = ovx_import_root(&o->roots[done], dirs[done], names[done], err);
	for (size_t i = 0; q == 0 && i < o->n_roots; i++) {
		json_object_set_new(chains, o->roots[i].h, json_pack("[s]", names[i]));
		json_array_append_new(json_object_get(data, "roots"),
				      json_pack("{s:s,s:[s]}", "path", o->roots[i].path, "layers", names[i]));
	}
	if (q == 0 && (q = overlay_layers_chain_save(o, id, chains)) < 0)
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
	free(names);
	*ret_size = 0;
	for (size_t i = 0; i < o->n_roots; i++) {
		char rel[32];
		uint64_t b = 0;
		snprintf(rel, sizeof(rel), "l/%s",
			 json_string_value(json_array_get(json_object_get(chains, o->roots[i].h), 0)));
		tree_disk_usage(o->roots[i].rdir_fd, rel, &b);
		*ret_size += b;
	}
	*ret_data = TAKE_PTR(data);
	return 0;
}
