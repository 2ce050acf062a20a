/* overlay_mount.c: overlayfs and bind mounts, mountinfo parsing, busy
 * process discovery. Library code: returns errors, never logs above debug. */
#include "backend/overlay/overlay_mount.h"
#include "lib/procscan.h"

#include <limits.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "lib/failpoint.h"

const struct overlay_opts overlay_opts_kernel = { .kind = OVERLAY_KERNEL, .redirect_dir = true };

const char *overlay_kind_name(enum overlay_kind k)
{
	return k == OVERLAY_GVISOR ? "gvisor" : "kernel";
}

/* The options beyond the dirs, ",opt=val..." or "" (gVisor refuses any). */
static const char *ovl_fixed_opts(const struct overlay_spec *s)
{
	const struct overlay_opts *o = s->opts ? s->opts : &overlay_opts_kernel;
	if (o->kind == OVERLAY_GVISOR)
		return "";
	if (o->userxattr)
		return ",userxattr,index=off,metacopy=off,xino=off";
	return o->redirect_dir ? ",index=off,redirect_dir=on,metacopy=off,xino=off"
			       : ",index=off,redirect_dir=off,metacopy=off,xino=off";
}

char *overlay_mount_escape(const char *s)
{
	char *out = malloc(strlen(s) * 2 + 1), *o = out;
	if (!out)
		return NULL;
	for (; *s; s++) {
		if (*s == '\\' || *s == ',' || *s == ':')
			*o++ = '\\';
		*o++ = *s;
	}
	*o = 0;
	return out;
}

static int ovl_cfg(int fd, const char *key, const char *val, ckpt_error *err)
{
	if (fsconfig(fd, FSCONFIG_SET_STRING, key, val, 0) < 0)
		return err_set(err, errno, NULL, "overlay option %s=%s: %m", key, val);
	return 0;
}

/* Absolute "dir/name" when it is short enough for one fsconfig value,
 * else the same directory reached through our fd of dir. */
static void ovl_layer_path(const struct overlay_spec *s, const char *name, char *buf, size_t len)
{
	if ((size_t)snprintf(buf, len, "%s/%s", s->dir, name) > 255)
		snprintf(buf, len, "/proc/self/fd/%d/%s", s->dir_fd, name);
}

static int ovl_mount_new_opts(int fs, const struct overlay_opts *o, ckpt_error *err)
{
	if (o->userxattr && fsconfig(fs, FSCONFIG_SET_FLAG, "userxattr", NULL, 0) < 0)
		return err_set(err, errno, NULL, "overlay option userxattr: %m");
	if (!o->userxattr && ovl_cfg(fs, "redirect_dir", o->redirect_dir ? "on" : "off", err) < 0)
		return -err->errnum;
	static const char *const off[] = { "index", "metacopy", "xino" };
	for (size_t i = 0; i < ARRAY_SIZE(off); i++)
		if (ovl_cfg(fs, off[i], "off", err) < 0)
			return -err->errnum;
	return 0;
}

static int ovl_mount_new_api(const struct overlay_spec *s, ckpt_error *err)
{
	char p[PATH_MAX * 2];
	_cleanup_close_ int fs = fsopen("overlay", FSOPEN_CLOEXEC);
	if (fs < 0)
		return err_set(err, errno, NULL, "fsopen overlay: %m");
	if (ovl_mount_new_opts(fs, s->opts ? s->opts : &overlay_opts_kernel, err) < 0)
		return -err->errnum;
	for (size_t i = 0; i < s->n_lowers; i++) {
		ovl_layer_path(s, s->lowers[i], p, sizeof(p));
		if (ovl_cfg(fs, "lowerdir+", p, err) < 0)
			return -err->errnum;
	}
	ovl_layer_path(s, s->upper, p, sizeof(p));
	if (ovl_cfg(fs, "upperdir", p, err) < 0)
		return -err->errnum;
	ovl_layer_path(s, s->work, p, sizeof(p));
	if (ovl_cfg(fs, "workdir", p, err) < 0)
		return -err->errnum;
	if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
		return err_set(err, errno, NULL, "create overlay for '%s': %m", s->target);
	_cleanup_close_ int mnt = fsmount(fs, FSMOUNT_CLOEXEC, 0);
	if (mnt < 0)
		return err_set(err, errno, NULL, "fsmount overlay: %m");
	if (move_mount(mnt, "", AT_FDCWD, s->target, MOVE_MOUNT_F_EMPTY_PATH) < 0)
		return err_set(err, errno, NULL, "move overlay onto '%s': %m", s->target);
	return 0;
}

/* prefix + name, escaped for a legacy option value; NULL when out of memory. */
static char *ovl_legacy_value(const char *prefix, const char *name)
{
	size_t len = strlen(prefix) + strlen(name) + 1;
	_cleanup_free_ char *full = malloc(len);
	if (!full)
		return NULL;
	snprintf(full, len, "%s%s", prefix, name);
	return overlay_mount_escape(full);
}

/* Option string; prefix "" gives relative names (for a child in dir). NULL
 * when out of memory. */
static char *ovl_legacy_opts(const struct overlay_spec *s, const char *prefix)
{
	size_t cap = 256;
	for (size_t i = 0; i < s->n_lowers; i++)
		cap += 2 * (strlen(prefix) + strlen(s->lowers[i]) + 2);
	cap += 4 * (strlen(prefix) + strlen(s->upper) + strlen(s->work) + 4);
	_cleanup_free_ char *o = malloc(cap);
	if (!o)
		return NULL;
	size_t n = snprintf(o, cap, "lowerdir=");
	for (size_t i = 0; i < s->n_lowers; i++) {
		_cleanup_free_ char *e = ovl_legacy_value(prefix, s->lowers[i]);
		if (!e)
			return NULL;
		n += snprintf(o + n, cap - n, "%s%s", i ? ":" : "", e);
	}
	_cleanup_free_ char *ue = ovl_legacy_value(prefix, s->upper), *we = ovl_legacy_value(prefix, s->work);
	if (!ue || !we)
		return NULL;
	snprintf(o + n, cap - n, ",upperdir=%s,workdir=%s%s", ue, we, ovl_fixed_opts(s));
	return TAKE_PTR(o);
}

int overlay_mount_legacy(const struct overlay_spec *s, ckpt_error *err)
{
	_cleanup_free_ char *prefix = path_join(s->dir, "");
	_cleanup_free_ char *abs = prefix ? ovl_legacy_opts(s, prefix) : NULL;
	if (!abs)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (strlen(abs) < (size_t)sysconf(_SC_PAGESIZE)) {
		if (mount("overlay", s->target, "overlay", 0, abs) < 0)
			return err_set(err, errno, NULL, "mount overlay on '%s': %m", s->target);
		return 0;
	}
	/* Too long: short relative names from a child whose cwd is dir. */
	_cleanup_free_ char *rel = ovl_legacy_opts(s, "");
	if (!rel || strlen(rel) >= (size_t)sysconf(_SC_PAGESIZE))
		return err_set(err, E2BIG, NULL, "overlay options for %zu layers exceed a page", s->n_lowers);
	pid_t pid = fork();
	if (pid < 0)
		return err_set(err, errno, NULL, "fork: %m");
	if (pid == 0) {
		if (fchdir(s->dir_fd) < 0 || mount("overlay", s->target, "overlay", 0, rel) < 0)
			_exit(errno & 0xff);
		_exit(0);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return err_set(err, errno, NULL, "waitpid: %m");
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return err_set(err, WIFEXITED(status) ? WEXITSTATUS(status) : EIO, NULL, "mount overlay on '%s': %s",
			       s->target, strerror(WEXITSTATUS(status)));
	return 0;
}

int overlay_mount(const struct overlay_spec *s, ckpt_error *err)
{
	if (s->n_lowers > OVERLAY_MAX_LOWERS)
		return err_set(err, E2BIG, NULL, "%zu lower layers exceed overlayfs' %d", s->n_lowers,
			       OVERLAY_MAX_LOWERS);
	FAILPOINT("overlay.mount.before");
	if (s->opts && s->opts->kind == OVERLAY_GVISOR) /* it has no fsopen */
		return overlay_mount_legacy(s, err);
	int r = ovl_mount_new_api(s, err);
	/* ENOSYS: no new mount API; EINVAL on "lowerdir+": a kernel before 6.8. */
	if (r == -ENOSYS || r == -EINVAL || r == -EPERM)
		r = overlay_mount_legacy(s, err);
	FAILPOINT("overlay.mount.after");
	return r;
}

/* Private once attached (attaching under a shared parent makes it shared): a
 * mount made later on or under src must not propagate onto base, which is
 * meant to show src's original contents. */
int overlay_mount_bind_ro(const char *src, const char *dst, bool rw_ok, ckpt_error *err)
{
	bool attached = false;
	_cleanup_close_ int t = open_tree(AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
	if (t >= 0) {
		struct mount_attr a = { .attr_set = MOUNT_ATTR_RDONLY };
		attached = mount_setattr(t, "", AT_EMPTY_PATH, &a, sizeof(a)) == 0 &&
			move_mount(t, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) == 0;
	}
	FAILPOINT("overlay.base.bind.before");
	if (!attached && mount(src, dst, NULL, MS_BIND, NULL) < 0)
		return err_set(err, errno, NULL, "bind '%s' on '%s': %m", src, dst);
	/* gVisor (2022) refuses to make a bind read-only (EINVAL): there base
	 * stays writable, and only its overlay writes into the roots' state. */
	bool ro = attached || mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) == 0 ||
		(errno == EINVAL && rw_ok);
	if (!ro || mount(NULL, dst, NULL, MS_PRIVATE, NULL) < 0) {
		int e = errno;
		umount2(dst, MNT_DETACH);
		return err_set(err, e, NULL, "make '%s' read-only and private: %s", dst, strerror(e));
	}
	FAILPOINT("overlay.base.bind.after");
	return 0;
}

void overlay_umount_detach(const char *path)
{
	umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW);
}

int overlay_mount_private(const char *path)
{
	return mount(NULL, path, NULL, MS_PRIVATE, NULL) < 0 ? -errno : 0;
}

/* mountinfo escapes ' ', '\t', '\n', '\\' as \ooo; overlay's options also
 * escape ','. Decode in place. */
static void ovl_unescape(char *s)
{
	char *o = s;
	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '7' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' &&
		    s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else if (s[0] == '\\' && s[1]) {
			*o++ = *++s;
		} else {
			*o++ = *s;
		}
	}
	*o = 0;
}

void overlay_mountinfo_clear(struct overlay_mountinfo *m)
{
	free(m->upperdir);
	free(m->source);
	memset(m, 0, sizeof(*m));
}

/* "upperdir=" value from super options (up to an unescaped ','). */
static char *ovl_opt_value(const char *opts, const char *key)
{
	size_t kl = strlen(key);
	for (const char *p = opts; p && *p;) {
		if (!strncmp(p, key, kl) && p[kl] == '=') {
			const char *v = p + kl + 1, *e = v;
			while (*e && *e != ',') {
				if (*e == '\\' && e[1])
					e++;
				e++;
			}
			char *r = strndup(v, e - v);
			if (r)
				ovl_unescape(r);
			return r;
		}
		while (*p && *p != ',') {
			if (*p == '\\' && p[1])
				p++;
			p++;
		}
		if (*p == ',')
			p++;
	}
	return NULL;
}

/* -ENOMEM when the line names path but cannot be copied. */
static int ovl_parse_line(char *line, const char *path, struct overlay_mountinfo *ret)
{
	char *save = NULL, *f[6] = { 0 };
	char *tok = strtok_r(line, " ", &save);
	for (int i = 0; tok && i < 6; i++, tok = strtok_r(NULL, " ", &save))
		f[i] = tok;
	if (!f[4])
		return 0;
	ovl_unescape(f[4]);
	if (strcmp(f[4], path) != 0)
		return 0;
	while (tok && strcmp(tok, "-") != 0)
		tok = strtok_r(NULL, " ", &save);
	char *fstype = strtok_r(NULL, " ", &save), *source = strtok_r(NULL, " ", &save);
	char *opts = strtok_r(NULL, " \n", &save);
	overlay_mountinfo_clear(ret);
	ret->found = true;
	ret->id = atoi(f[0]);
	snprintf(ret->fstype, sizeof(ret->fstype), "%s", fstype ? fstype : "");
	ret->source = source ? strdup(source) : NULL;
	if (source && !ret->source)
		return -ENOMEM;
	if (fstype && !strcmp(fstype, "overlay") && opts) {
		ret->upperdir = ovl_opt_value(opts, "upperdir");
		if (!ret->upperdir && strstr(opts, "upperdir="))
			return -ENOMEM;
	}
	return 0;
}

int overlay_mountinfo_find(const char *path, struct overlay_mountinfo *ret)
{
	memset(ret, 0, sizeof(*ret));
	_cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	_cleanup_free_ char *line = NULL;
	size_t cap = 0;
	while (getline(&line, &cap, f) > 0) /* later lines are mounted on top */
		if (ovl_parse_line(line, path, ret) < 0) {
			overlay_mountinfo_clear(ret);
			return -ENOMEM;
		}
	return 0;
}

/* The processes holding the mount at path, by identity: not those on the
 * directory it hides, whose paths read the same. */
int overlay_busy_processes(const char *path, struct restore_details *busy)
{
	struct stat st;
	if (stat(path, &st) < 0)
		return -errno;
	struct procscan_target t = { .path = path, .dev = st.st_dev, .ino = st.st_ino };
	_cleanup_free_ struct procscan_user *users = NULL;
	size_t n = 0;
	int r = procscan_users("/proc", &t, 1, getpid(), &users, &n);
	if (r < 0)
		return r;
	struct busy_process *arr = n ? realloc(busy->busy, (busy->n_busy + n) * sizeof(*arr)) : busy->busy;
	if (n && !arr)
		return -ENOMEM;
	busy->busy = arr;
	for (size_t i = 0; i < n; i++) {
		struct busy_process *b = &busy->busy[busy->n_busy++];
		*b = (struct busy_process){ .pid = users[i].pid };
		procscan_comm("/proc", users[i].pid, b->command, sizeof(b->command));
	}
	return 0;
}

int overlay_umount(const char *path, struct restore_details *busy, ckpt_error *err)
{
	if (FAILPOINT_AROUND("overlay.umount", umount2(path, UMOUNT_NOFOLLOW)) == 0)
		return 0;
	if (errno != EBUSY)
		return err_set(err, errno, NULL, "unmount '%s': %m", path);
	if (busy && overlay_busy_processes(path, busy) < 0)
		log_debug("cannot list the processes holding '%s'", path);
	if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
		return err_set(err, errno, NULL, "detach '%s': %m", path);
	return 0;
}

int overlay_umount_pinned(const char *path, struct restore_details *busy, int *ret_pin, ckpt_error *err)
{
	*ret_pin = -1;
	/* MNT_EXPIRE unmounts nothing the first time: EAGAIN when unused, EBUSY
	 * when held; a mark left from an earlier call would unmount (synced). */
	if (umount2(path, MNT_EXPIRE | UMOUNT_NOFOLLOW) == 0)
		return 0;
	/* gVisor has no MNT_EXPIRE (EINVAL): a plain unmount tells busy (EBUSY)
	 * from not; its upper is a tmpfs, with nothing to write back. */
	if (errno == EINVAL && umount2(path, UMOUNT_NOFOLLOW) == 0)
		return 0;
	if (errno == EBUSY && busy && overlay_busy_processes(path, busy) < 0)
		log_debug("cannot list the processes holding '%s'", path);
	int pin = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0) {
		int e = errno;
		if (pin >= 0)
			close(pin);
		return err_set(err, e, NULL, "detach '%s': %s", path, strerror(e));
	}
	*ret_pin = pin;
	return 0;
}
