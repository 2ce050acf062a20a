/* overlay_mount.h: overlayfs mounts, read-only binds, mountinfo and the
 * processes that keep a mount busy. */
#pragma once
#include <jansson.h>
#include "backend/backend.h"
#include "lib/util.h"

/* Most lower layers overlayfs accepts (base included). */
#define OVERLAY_MAX_LOWERS 500

/* Which overlay runs here and with which options (overlay_probe.c finds
 * them). The kernel's keeps renamed directories with redirect_dir=on;
 * gVisor's takes no option beyond the dirs and copies a renamed directory
 * up whole; userxattr is the kernel's in a user namespace (probed, never
 * used: it refuses redirect_dir=on, so directory renames give EXDEV). */
enum overlay_kind {
	OVERLAY_KERNEL,
	OVERLAY_GVISOR
};
struct overlay_opts {
	enum overlay_kind kind;
	bool redirect_dir;
	bool userxattr;
};
extern const struct overlay_opts overlay_opts_kernel;
const char *overlay_kind_name(enum overlay_kind k);

struct overlay_spec {
	const struct overlay_opts *opts; /* NULL: overlay_opts_kernel */
	const char *target;              /* absolute mount point */
	const char *dir;                 /* absolute dir the names below are relative to */
	int dir_fd;                      /* fd of dir */
	const char *const *lowers;       /* relative names, top first (base last) */
	size_t n_lowers;
	const char *upper, *work; /* relative names */
};

/* Mount with the new mount API (fsconfig lowerdir+) when the kernel has it,
 * else with a legacy option string (escaped; relative short names from a
 * child that chdirs into dir when the absolute string would not fit a page). */
int overlay_mount(const struct overlay_spec *s, ckpt_error *err);
/* Force the legacy path (tests). */
int overlay_mount_legacy(const struct overlay_spec *s, ckpt_error *err);
/* Escape '\\', ',' and ':' for a legacy option value. Returns malloc'd. */
char *overlay_mount_escape(const char *s);

/* Bind src (not recursively) read-only and private onto dst; rw_ok: a
 * writable bind where the system refuses read-only ones (gVisor). */
int overlay_mount_bind_ro(const char *src, const char *dst, bool rw_ok, ckpt_error *err);
/* Detach whatever is mounted on path, if anything (best effort). */
void overlay_umount_detach(const char *path);
/* Stop propagation to and from the mount at path. */
int overlay_mount_private(const char *path);

struct overlay_mountinfo {
	bool found;
	char fstype[32];
	int id;         /* the mount's id (first field) */
	char *upperdir; /* overlay only, unescaped; malloc'd or NULL (gVisor shows none) */
	char *source;
};
void overlay_mountinfo_clear(struct overlay_mountinfo *m);
/* The top mount whose mount point is exactly path (from /proc/self/mountinfo).
 * On failure (<0) ret says not found: callers must not take that as unmounted. */
int overlay_mountinfo_find(const char *path, struct overlay_mountinfo *ret);

/* Unmount path; on EBUSY add the processes that hold it to busy (may be
 * NULL) and detach. */
int overlay_umount(const char *path, struct restore_details *busy, ckpt_error *err);
/* Detach path lazily, adding the processes that hold it to busy (may be
 * NULL), and return in *ret_pin an fd that keeps the detached mount alive
 * (-1 when it is already gone). A plain unmount syncs the upper's whole
 * filesystem; the caller deletes the upper first and closes the pin after,
 * so the upper's dirty pages are dropped instead of written back. */
int overlay_umount_pinned(const char *path, struct restore_details *busy, int *ret_pin, ckpt_error *err);
/* Add the processes with cwd, root, an open fd or a mapping under path to
 * d->busy. -ENOMEM when the list cannot grow. */
int overlay_busy_processes(const char *path, struct restore_details *d);
