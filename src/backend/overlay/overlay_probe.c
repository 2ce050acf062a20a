/* overlay_probe.c: which overlay keeps every promise of a managed root here.
 * Tried option by option on a tiny tree in the state dir, each mount proved
 * by what a root needs: a directory of the lower renamed, a file of the lower
 * deleted (a whiteout in the upper). Library code: returns errors, never logs. */
#include "backend/overlay/overlay_probe.h"
#include "backend/overlay/overlay_mount.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

static const struct overlay_opts ovl_probe_gvisor = { .kind = OVERLAY_GVISOR };
static const struct overlay_opts ovl_probe_userxattr = { .kind = OVERLAY_KERNEL, .userxattr = true };

/* dir/{l/d/f, l/g, u, w, m}: a lower with a directory and a file. */
static int ovl_probe_tree(int fd)
{
	static const char *const dirs[] = { "l", "l/d", "u", "w", "m" };
	for (size_t i = 0; i < ARRAY_SIZE(dirs); i++)
		if (mkdirat(fd, dirs[i], 0700) < 0)
			return -errno;
	static const char *const files[] = { "l/d/f", "l/g" };
	for (size_t i = 0; i < ARRAY_SIZE(files); i++) {
		int f = openat(fd, files[i], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (f < 0)
			return -errno;
		close(f);
	}
	return 0;
}

/* What a root needs of the mount at m: rename a lower directory (its file
 * goes along), delete a lower file. */
static int ovl_probe_use(const char *m, ckpt_error *err)
{
	_cleanup_close_ int fd = open(m, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errno, NULL, "open the test mount: %m");
	if (renameat(fd, "d", fd, "e") < 0)
		return err_set(err, errno, "rename", "renaming a directory of the lower fails: %m");
	if (faccessat(fd, "e/f", F_OK, AT_SYMLINK_NOFOLLOW) < 0)
		return err_set(err, errno, "rename", "a renamed directory of the lower lost its file: %m");
	if (unlinkat(fd, "g", 0) < 0)
		return err_set(err, errno, "whiteout",
			       "deleting a file of the lower (a whiteout in the upper) fails: %m");
	return 0;
}

struct ovl_probe_seen {
	bool mounted; /* the test mount was made */
	bool gvisor;  /* its mountinfo names no upperdir: gVisor's overlay */
};

/* gVisor's overlay makes a whiteout with its caller's mknod, and when that
 * fails in a rename it panics the whole sandbox ("unrecoverable overlayfs
 * inconsistency"): try the mknod itself before mounting. */
static int ovl_probe_whiteout(int fd, ckpt_error *err)
{
	if (mknodat(fd, "wh", S_IFCHR | 0600, makedev(0, 0)) < 0)
		return err_set(err, errno, "whiteout", "a whiteout (a character device 0/0) cannot be made: %m");
	unlinkat(fd, "wh", 0);
	return 0;
}

/* Mount the test tree in a fresh dir/<n> with opts and use it. 0: both worked. */
static int ovl_probe_try(const char *odir, int ofd, const struct overlay_opts *opts, struct ovl_probe_seen *seen,
			 ckpt_error *err)
{
	char rnd[9], name[16];
	random_hex(rnd, 4);
	snprintf(name, sizeof(name), ".probe-%s", rnd);
	*seen = (struct ovl_probe_seen){ 0 };
	if (mkdirat(ofd, name, 0700) < 0)
		return err_set(err, errno, NULL, "overlay probe: create '%s/%s': %m", odir, name);
	_cleanup_free_ char *dir = path_join(odir, name), *m = dir ? path_join(dir, "m") : NULL;
	_cleanup_close_ int fd = openat(ofd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = fd < 0 || !m ? err_set(err, fd < 0 ? errno : ENOMEM, NULL, "overlay probe: open '%s'", name) : 0;
	if (q == 0 && (q = ovl_probe_tree(fd)) < 0)
		err_set(err, -q, NULL, "overlay probe: make a test tree in '%s': %s", dir, strerror(-q));
	const char *lowers[] = { "l" };
	struct overlay_spec s = { .opts = opts,
				  .target = m,
				  .dir = dir,
				  .dir_fd = fd,
				  .lowers = lowers,
				  .n_lowers = 1,
				  .upper = "u",
				  .work = "w" };
	if (q == 0 && (q = overlay_mount(&s, err)) == 0) {
		struct overlay_mountinfo mi;
		seen->mounted = true;
		seen->gvisor = overlay_mountinfo_find(m, &mi) == 0 && mi.found && !mi.upperdir;
		overlay_mountinfo_clear(&mi);
		q = seen->gvisor ? ovl_probe_whiteout(fd, err) : 0;
		if (q == 0)
			q = ovl_probe_use(m, err);
		ckpt_error e;
		overlay_umount(m, NULL, &e);
	}
	rm_rf_at(ofd, name);
	return q;
}

/* The options that keep every promise, or <0 with err naming what was
 * tried and why each falls short. */
int overlay_probe(const char *state_dir, struct overlay_opts *ret, ckpt_error *err)
{
	_cleanup_free_ char *odir = path_join(state_dir, "overlay");
	int q = odir ? mkdir_p(odir, 0700) : -ENOMEM;
	if (q < 0)
		return err_set(err, -q, NULL, "overlay probe: create '%s': %s", odir ? odir : state_dir, strerror(-q));
	_cleanup_close_ int ofd = open(odir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (ofd < 0)
		return err_set(err, errno, NULL, "overlay probe: open '%s': %m", odir);
	ckpt_error k = { 0 }, g = { 0 }, u = { 0 };
	struct ovl_probe_seen ks, gs, us;
	if (ovl_probe_try(odir, ofd, &overlay_opts_kernel, &ks, &k) == 0) {
		*ret = overlay_opts_kernel;
		return 0;
	}
	if (ks.mounted) /* redirect_dir=on mounts, yet a root's use fails */
		return err_set(err, k.errnum, NULL, "overlayfs with redirect_dir=on: %s", k.msg);
	int q2 = ovl_probe_try(odir, ofd, &ovl_probe_gvisor, &gs, &g);
	if (q2 == 0 && gs.gvisor) {
		*ret = ovl_probe_gvisor;
		return 0;
	}
	if (gs.gvisor && g.code && !strcmp(g.code, "whiteout"))
		return err_set(err, g.errnum, NULL,
			       "gVisor's overlay mounts here, but %s in '%s': the state dir must be on a filesystem of "
			       "the sandbox's own, such as a tmpfs mounted inside it",
			       g.msg, odir);
	if (gs.gvisor)
		return err_set(err, g.errnum, NULL, "gVisor's overlay mounts here, but %s", g.msg);
	ovl_probe_try(odir, ofd, &ovl_probe_userxattr, &us, &u);
	if (us.mounted || gs.mounted)
		return err_set(err, EXDEV, NULL,
			       "overlayfs refuses redirect_dir=on here (%s; a user namespace?); it mounts%s%s%s, but "
			       "renaming a directory of the base then fails (%s)",
			       k.msg, us.mounted ? " with userxattr" : "", us.mounted && gs.mounted ? " or" : "",
			       gs.mounted ? " without options" : "",
			       us.mounted        ? u.msg
				       : q2 == 0 ? "the kernel copies no directory up"
						 : g.msg);
	return err_set(err, k.errnum, NULL, "overlayfs refused a test mount: %s", k.msg);
}
