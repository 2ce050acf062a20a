/* procscan.c: /proc/<pid>/{cwd,root,fd/N,maps}, read relative to fds. */
#include "lib/procscan.h"

#include <ctype.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "lib/util.h"
#include "lib/walk.h"

#define DELETED_SUFFIX " (deleted)"

/* Cut the kernel's " (deleted)" mark off path (in place). */
static bool strip_deleted(char *path)
{
	size_t n = strlen(path), k = strlen(DELETED_SUFFIX);
	if (n <= k || strcmp(path + n - k, DELETED_SUFFIX) != 0)
		return false;
	path[n - k] = '\0';
	return true;
}

/* One magic link (cwd, root, fd/N) below dirfd. */
static int scan_link(struct procscan_ref *ref, int dirfd, const char *name, unsigned flags, procscan_fn fn, void *ctx)
{
	char buf[PATH_MAX];
	struct stat st;
	ssize_t n = readlinkat(dirfd, name, buf, sizeof(buf) - 1);
	if (n <= 0 || buf[0] != '/')
		return PROCSCAN_CONTINUE;
	buf[n] = '\0';
	ref->deleted = strip_deleted(buf);
	ref->path = buf;
	ref->has_id = (flags & PROCSCAN_STAT) && fstatat(dirfd, name, &st, 0) == 0;
	ref->dev = ref->has_id ? st.st_dev : 0;
	ref->ino = ref->has_id ? st.st_ino : 0;
	ref->link_dirfd = dirfd;
	ref->link_name = name;
	return fn(ctx, ref);
}

static int scan_fds(struct procscan_ref *ref, unsigned flags, procscan_fn fn, void *ctx)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	int r = PROCSCAN_CONTINUE;
	if (walk_open(ref->pid_fd, "fd", &d) < 0)
		return r; /* gone, or not ours to read */
	ref->kind = PROCSCAN_FD;
	while (r == PROCSCAN_CONTINUE && (de = walk_next(d)))
		r = scan_link(ref, dirfd(d), de->d_name, flags, fn, ctx);
	return r;
}

/* The next field of a maps line after the one at p (spaces skipped). */
static char *parse_map_field(char *p)
{
	p += strcspn(p, " ");
	return p + strspn(p, " ");
}

/* A maps line: "addr perms offset maj:min inode   /path"; the path starts at
 * the first '/' after the inode field (names may hold spaces). */
static bool parse_map(char *line, struct procscan_ref *ref)
{
	char *p = line, *perms, *end;
	line[strcspn(line, "\n")] = '\0';
	/* by hand, not sscanf: a scan parses thousands of lines */
	p = parse_map_field(p); /* the address range */
	perms = p;
	p = parse_map_field(p); /* perms */
	if (p - perms < 5)
		return false;
	p = parse_map_field(p); /* offset */
	unsigned long maj = strtoul(p, &end, 16);
	if (end == p || *end != ':')
		return false;
	p = end + 1;
	unsigned long min = strtoul(p, &end, 16);
	if (end == p || *end != ' ')
		return false;
	p = end + 1;
	unsigned long long ino = strtoull(p, &end, 10);
	if (end == p)
		return false;
	p = end + strspn(end, " ");
	if (*p != '/')
		return false;
	ref->shared_write = perms[1] == 'w' && perms[3] == 's';
	ref->path = p;
	ref->deleted = strip_deleted(p);
	ref->has_id = true;
	ref->dev = makedev(maj, min);
	ref->ino = (ino_t)ino;
	return true;
}

static int scan_maps(struct procscan_ref *ref, unsigned flags, procscan_fn fn, void *ctx)
{
	int fd = openat(ref->pid_fd, "maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return PROCSCAN_CONTINUE;
	_cleanup_fclose_ FILE *f = fdopen(fd, "re");
	if (!f) {
		close(fd);
		return -ENOMEM;
	}
	/* one read for most maps files, not one per 4 KiB */
	setvbuf(f, NULL, _IOFBF, 64 << 10);
	_cleanup_free_ char *line = NULL, *prev = NULL;
	size_t cap = 0;
	bool prev_sw = false;
	int r = PROCSCAN_CONTINUE;
	ref->kind = PROCSCAN_MAP;
	ref->link_dirfd = -1;
	ref->link_name = NULL;
	while (r == PROCSCAN_CONTINUE && getline(&line, &cap, f) > 0) {
		/* a run of lines of one file is given once, again where it
		 * becomes a shared writable mapping */
		if (!parse_map(line, ref) || (prev && !strcmp(prev, ref->path) && (prev_sw || !ref->shared_write)))
			continue;
		prev_sw = ref->shared_write;
		free(prev);
		if (!(prev = strdup(ref->path)))
			return -ENOMEM;
		ref->has_id = ref->has_id && (flags & (PROCSCAN_STAT | PROCSCAN_MNTNS));
		r = fn(ctx, ref);
	}
	return r;
}

int procscan_ref_stat(struct procscan_ref *ref)
{
	struct stat st;
	if (ref->has_id)
		return 0;
	if (ref->link_dirfd < 0 || !ref->link_name)
		return -EINVAL;
	if (fstatat(ref->link_dirfd, ref->link_name, &st, 0) < 0)
		return -errno;
	ref->has_id = true;
	ref->dev = st.st_dev;
	ref->ino = st.st_ino;
	return 0;
}

/* Whether the process of pid_fd is in the mount namespace own (the
 * scanner's ns/mnt), by the identity of its ns/mnt link. */
static bool same_mntns(int pid_fd, const struct stat *own)
{
	struct stat st;
	return own->st_ino && fstatat(pid_fd, "ns/mnt", &st, 0) == 0 && st.st_dev == own->st_dev &&
		st.st_ino == own->st_ino;
}

static int scan_pid(int pid_fd, pid_t pid, unsigned flags, const struct stat *own_ns, procscan_fn fn, void *ctx)
{
	struct procscan_ref ref = { .pid = pid, .pid_fd = pid_fd, .kind = PROCSCAN_CWD };
	ref.same_mntns = (flags & PROCSCAN_MNTNS) && same_mntns(pid_fd, own_ns);
	if (flags & PROCSCAN_MAPS_ONLY) {
		int r = scan_maps(&ref, flags, fn, ctx);
		return r < 0 ? r : 0;
	}
	int r = flags & PROCSCAN_NO_DIRS ? PROCSCAN_CONTINUE : scan_link(&ref, pid_fd, "cwd", flags, fn, ctx);
	if (r == PROCSCAN_CONTINUE && !(flags & PROCSCAN_NO_DIRS)) {
		ref.kind = PROCSCAN_ROOT;
		r = scan_link(&ref, pid_fd, "root", flags, fn, ctx);
	}
	if (r == PROCSCAN_CONTINUE)
		r = scan_fds(&ref, flags, fn, ctx);
	if (r == PROCSCAN_CONTINUE)
		r = scan_maps(&ref, flags, fn, ctx);
	return r < 0 ? r : 0;
}

static pid_t pid_of(const char *s)
{
	char *end;
	if (!isdigit((unsigned char)*s))
		return 0;
	errno = 0;
	long v = strtol(s, &end, 10);
	return *end || errno || v <= 0 || v > INT_MAX ? 0 : (pid_t)v;
}

int procscan_each(const char *proc, pid_t skip_pid, unsigned flags, procscan_fn fn, void *ctx)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	struct stat own_ns = { 0 };
	int r = walk_open(AT_FDCWD, proc, &d);
	if (r < 0)
		return r;
	if ((flags & PROCSCAN_MNTNS) && fstatat(dirfd(d), "self/ns/mnt", &own_ns, 0) < 0)
		own_ns.st_ino = 0; /* then no process is taken as sharing it */
	while ((de = walk_next(d))) {
		pid_t pid = pid_of(de->d_name);
		if (pid == 0 || pid == skip_pid)
			continue;
		_cleanup_close_ int pfd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pfd >= 0 && (r = scan_pid(pfd, pid, flags, &own_ns, fn, ctx)) < 0)
			return r;
	}
	return 0;
}

bool procscan_path_under(const char *path, const char *root)
{
	size_t n = strlen(root);
	while (n > 1 && root[n - 1] == '/')
		n--;
	if (n == 1 && root[0] == '/')
		return path[0] == '/';
	return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

struct under {
	char *const *roots;
	size_t n_roots;
	pid_t *v;
	size_t n, cap;
};

static int under_ref(void *ctx, const struct procscan_ref *ref)
{
	struct under *u = ctx;
	size_t i = 0;
	while (i < u->n_roots && !procscan_path_under(ref->path, u->roots[i]))
		i++;
	if (i == u->n_roots)
		return PROCSCAN_CONTINUE;
	if (u->n == u->cap) {
		size_t cap = u->cap ? u->cap * 2 : 16;
		pid_t *v = realloc(u->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		u->v = v;
		u->cap = cap;
	}
	u->v[u->n++] = ref->pid;
	return PROCSCAN_NEXT_PID;
}

int procscan_pids_under(const char *proc, char *const *roots, size_t n_roots, pid_t skip_pid, pid_t **ret,
			size_t *ret_n)
{
	struct under u = { .roots = roots, .n_roots = n_roots };
	int r = procscan_each(proc, skip_pid, 0, under_ref, &u);
	if (r < 0) {
		free(u.v);
		return r;
	}
	*ret = u.v;
	*ret_n = u.n;
	return 0;
}

void procscan_comm(const char *proc, pid_t pid, char *buf, size_t len)
{
	char p[PATH_MAX];
	buf[0] = '\0';
	snprintf(p, sizeof(p), "%s/%d/comm", proc, (int)pid);
	_cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 && len > 1 ? read(fd, buf, len - 1) : 0;
	buf[n > 0 ? n : 0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
}

static int target_of_id(const struct stat *st, const struct procscan_target *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (st->st_dev == t[i].dev && st->st_ino == t[i].ino)
			return (int)i;
	return -1;
}

/* Walk up from a directory by "..": the kernel follows the dentries, not
 * the path the link reads (but steps onto a mount over the parent it
 * reaches). -2 when the link is not a directory. */
static int dir_target(const struct procscan_ref *ref, const struct procscan_target *t, size_t n)
{
	int fd = openat(ref->link_dirfd, ref->link_name, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -2;
	struct stat st, up;
	int hit = -1;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return -1;
	}
	dev_t below = st.st_dev;
	for (int depth = 0; depth < 4096; depth++) {
		if ((hit = target_of_id(&st, t, n)) >= 0) {
			/* ".." from the top of a directory a mount hides lands on the
			 * mount: the device of the step below tells them apart. */
			for (size_t j = 0; below != t[hit].dev && j < n; j++)
				if (t[j].dev == below && !strcmp(t[j].path, t[hit].path))
					hit = (int)j;
			break;
		}
		below = st.st_dev;
		int pfd = openat(fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
		close(fd);
		fd = pfd;
		if (fd < 0 || fstat(fd, &up) < 0 || (up.st_dev == st.st_dev && up.st_ino == st.st_ino))
			break; /* the top of what we can see */
		st = up;
	}
	if (fd >= 0)
		close(fd);
	return hit;
}

static int path_target(const char *path, const struct procscan_target *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (procscan_path_under(path, t[i].path))
			return (int)i;
	return -1;
}

int procscan_ref_target(const struct procscan_ref *ref, const struct procscan_target *t, size_t n)
{
	struct stat st = { .st_dev = ref->dev, .st_ino = ref->ino };
	int any = path_target(ref->path, t, n);
	/* cwd and root always by identity; an fd (costly to stat, and rarely a
	 * directory) only when its path reads below a target. */
	if (ref->link_name && (ref->kind != PROCSCAN_FD || any >= 0)) {
		int d = dir_target(ref, t, n);
		if (d != -2)
			return d;
	}
	if (any < 0)
		return -1;
	bool has_id = ref->has_id || (ref->link_name && fstatat(ref->link_dirfd, ref->link_name, &st, 0) == 0);
	for (size_t i = 0; has_id && i < n; i++)
		if (st.st_dev == t[i].dev && procscan_path_under(ref->path, t[i].path))
			return (int)i;
	return any;
}

struct users {
	const struct procscan_target *t;
	size_t n_t;
	struct procscan_user *v;
	size_t n, cap;
};

static int users_ref(void *ctx, const struct procscan_ref *ref)
{
	struct users *u = ctx;
	int i = procscan_ref_target(ref, u->t, u->n_t);
	if (i < 0)
		return PROCSCAN_CONTINUE;
	if (u->n == u->cap) {
		size_t cap = u->cap ? u->cap * 2 : 16;
		struct procscan_user *v = realloc(u->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		u->v = v;
		u->cap = cap;
	}
	u->v[u->n++] = (struct procscan_user){ .pid = ref->pid, .tag = u->t[i].tag };
	return PROCSCAN_NEXT_PID;
}

int procscan_users(const char *proc, const struct procscan_target *t, size_t n, pid_t skip_pid,
		   struct procscan_user **ret, size_t *ret_n)
{
	struct users u = { .t = t, .n_t = n };
	int r = procscan_each(proc, skip_pid, 0, users_ref, &u); /* stat only what matters */
	if (r < 0) {
		free(u.v);
		return r;
	}
	*ret = u.v;
	*ret_n = u.n;
	return 0;
}
