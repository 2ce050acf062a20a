/* procscan.c: /proc/<pid>/{cwd,root,fd/N,maps}, read relative to fds. */
#include "lib/procscan.h"

#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "lib/util.h"
#include "lib/walk.h"

#define DELETED_SUFFIX " (deleted)"

/* The maps ioctl of Linux 6.11 (uapi/linux/fs.h), for older headers. */
struct procscan_vma_query {
	uint64_t size, query_flags, query_addr;
	uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
	uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
	uint64_t vma_name_addr, build_id_addr;
};
#define PROCSCAN_VMA_QUERY _IOWR('f', 17, struct procscan_vma_query)
#define PROCSCAN_VMA_WRITABLE 0x02
#define PROCSCAN_VMA_SHARED 0x08
#define PROCSCAN_VMA_COVERING_OR_NEXT 0x10
#define PROCSCAN_VMA_FILE_BACKED 0x20

/* Cut the kernel's " (deleted)" mark off path (in place). */
static bool strip_deleted(char *path)
{
	size_t n = strlen(path), k = strlen(DELETED_SUFFIX);
	if (n <= k || strcmp(path + n - k, DELETED_SUFFIX) != 0)
		return false;
	path[n - k] = '\0';
	return true;
}

/* One scan of a proc filesystem: its fd, what was asked, and one buffer
 * for the listings and maps files it reads (grown as needed). */
struct scan {
	int proc_fd;
	unsigned flags;
	procscan_fn fn;
	void *ctx;
	struct stat own_ns; /* the scanner's ns/mnt (PROCSCAN_MNTNS); st_ino 0: unknown */
	bool no_query;      /* the kernel has no maps ioctl (older, gVisor): read the text */
	char *buf;
	size_t cap;
};

/* What a reference's process is, for procscan_ref_same_mntns. */
struct procscan_pid {
	const struct scan *s;
	char name[28];     /* "<pid>", or "<pid>/task/<tid>" (scan_pid_task) */
	signed char mntns; /* -1 not read yet, else 0 or 1 */
};

/* Room for "<name>/<what>", what up to "fd/2147483647". */
#define PID_PATH_MAX 48

/* "<pid>/<what>", relative to the proc fd. */
static void pid_path(char *buf, size_t size, const struct procscan_pid *p, const char *what)
{
	snprintf(buf, size, "%s/%s", p->name, what);
}

/* One magic link (cwd, root, fd/N): name below dirfd. *denied when the
 * kernel refuses to read it (ptrace access to the process, the same for
 * every link of it). */
static int scan_link(struct procscan_ref *ref, int dirfd, const char *name, unsigned flags, procscan_fn fn, void *ctx,
		     bool *denied)
{
	char buf[PATH_MAX];
	struct stat st;
	ssize_t n = readlinkat(dirfd, name, buf, sizeof(buf) - 1);
	if (n < 0 && (errno == EACCES || errno == EPERM))
		*denied = true;
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

/* Room for at least want bytes in s->buf. */
static int scan_reserve(struct scan *s, size_t want)
{
	if (s->cap >= want)
		return 0;
	size_t cap = s->cap ? s->cap : 64 << 10;
	while (cap < want)
		cap *= 2;
	char *b = realloc(s->buf, cap);
	if (!b)
		return -ENOMEM;
	s->buf = b;
	s->cap = cap;
	return 0;
}

/* The fds, read with getdents64 into the scan's buffer (no stdio DIR: a
 * scan opens one fd directory per process). The first link the kernel
 * refuses ends them: it refuses every one of that process. */
static int scan_fds(struct scan *s, struct procscan_ref *ref, const struct procscan_pid *p)
{
	char path[PID_PATH_MAX];
	pid_path(path, sizeof(path), p, "fd");
	_cleanup_close_ int dfd = openat(s->proc_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return PROCSCAN_CONTINUE; /* gone, or not ours to read */
	ref->kind = PROCSCAN_FD;
	int r = PROCSCAN_CONTINUE;
	bool denied = false;
	if (scan_reserve(s, 32 << 10) < 0)
		return -ENOMEM;
	while (r == PROCSCAN_CONTINUE && !denied) {
		ssize_t n = getdents64(dfd, s->buf, s->cap);
		if (n <= 0)
			break;
		for (ssize_t off = 0; off < n && r == PROCSCAN_CONTINUE && !denied;) {
			struct dirent64 *de = (struct dirent64 *)(s->buf + off);
			off += de->d_reclen;
			if (de->d_name[0] != '.')
				r = scan_link(ref, dfd, de->d_name, s->flags, s->fn, s->ctx, &denied);
		}
	}
	return r;
}

/* The next field of a maps line after the one at p (spaces skipped). */
static char *parse_map_field(char *p)
{
	p += strcspn(p, " ");
	return p + strspn(p, " ");
}

/* A maps line (NUL-terminated): "addr perms offset maj:min inode   /path";
 * the path starts at the first '/' after the inode field (names may hold
 * spaces). */
static bool parse_map(char *line, struct procscan_ref *ref)
{
	char *p = line, *perms, *end;
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
	ref->shared = perms[3] == 's';
	ref->shared_write = perms[1] == 'w' && ref->shared;
	ref->path = p;
	ref->deleted = strip_deleted(p);
	ref->has_id = true;
	ref->dev = makedev(maj, min);
	ref->ino = (ino_t)ino;
	return true;
}

/* The whole maps file into s->buf, NUL-terminated; its length, or < 0. */
static ssize_t read_maps(struct scan *s, int fd)
{
	size_t len = 0;
	for (;;) {
		if (scan_reserve(s, len + 4096 + 1) < 0)
			return -ENOMEM;
		ssize_t n = read(fd, s->buf + len, s->cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		len += (size_t)n;
	}
	s->buf[len] = '\0';
	return (ssize_t)len;
}

/* The shared file mappings, asked one at a time: the kernel skips the
 * private ones itself (what maps says of them: "s" is VM_MAYSHARE, the flag
 * asked; "w" is VM_WRITE, answered in vma_flags). A read-only shared mapping
 * is given too: a process may have written through it before an mprotect
 * took the write away, and the page it dirtied faults no more. *text when
 * the kernel cannot answer: read the text instead. */
static int scan_maps_query(struct scan *s, struct procscan_ref *ref, int fd, bool *text)
{
	char name[PATH_MAX], prev[PATH_MAX] = "";
	bool prev_sw = false;
	name[0] = '\0'; /* the kernel writes it (vma_name_addr) */
	ref->kind = PROCSCAN_MAP;
	ref->link_dirfd = -1;
	ref->link_name = NULL;
	int r = PROCSCAN_CONTINUE;
	for (uint64_t addr = 0; r == PROCSCAN_CONTINUE;) {
		struct procscan_vma_query q = {
			.size = sizeof(q),
			.query_flags = PROCSCAN_VMA_SHARED | PROCSCAN_VMA_COVERING_OR_NEXT | PROCSCAN_VMA_FILE_BACKED,
			.query_addr = addr,
			.vma_name_size = sizeof(name),
			.vma_name_addr = (uintptr_t)name,
		};
		if (ioctl(fd, PROCSCAN_VMA_QUERY, &q) < 0) {
			if (errno == ENOENT || errno == ESRCH) /* no more; no memory map (a kernel thread) */
				return PROCSCAN_CONTINUE;
			/* the text then (what was given already is given again) */
			s->no_query |= errno == ENOTTY || errno == EINVAL || errno == EOPNOTSUPP;
			*text = true;
			return PROCSCAN_CONTINUE;
		}
		addr = q.vma_end;
		bool sw = q.vma_flags & PROCSCAN_VMA_WRITABLE;
		/* a run of one file is given once, again where it becomes writable */
		if (!q.vma_name_size || name[0] != '/' || (!strcmp(prev, name) && (prev_sw || !sw)))
			continue;
		snprintf(prev, sizeof(prev), "%s", name);
		prev_sw = sw;
		ref->path = name;
		ref->deleted = strip_deleted(name);
		ref->has_id = s->flags & (PROCSCAN_STAT | PROCSCAN_MNTNS);
		ref->dev = makedev(q.dev_major, q.dev_minor);
		ref->ino = (ino_t)q.inode;
		ref->shared = true;
		ref->shared_write = sw;
		r = s->fn(s->ctx, ref);
	}
	return r;
}

/* maps_fd: the process's maps, open (neither the query nor the text moves
 * the other's offset), or -1: gone, or not ours to read. */
static int scan_maps(struct scan *s, struct procscan_ref *ref, int maps_fd)
{
	if (maps_fd < 0)
		return PROCSCAN_CONTINUE;
	if ((s->flags & PROCSCAN_SHARED_MAPS) && !s->no_query) {
		bool text = false;
		int q = scan_maps_query(s, ref, maps_fd, &text);
		if (!text)
			return q;
	}
	ssize_t len = read_maps(s, maps_fd);
	if (len == -ENOMEM)
		return -ENOMEM;
	if (len <= 0)
		return PROCSCAN_CONTINUE; /* gone, not ours to read, or no memory map (a kernel thread) */
	const char *prev = NULL;          /* the last path given: they point into s->buf, which stays */
	bool prev_sw = false;
	int r = PROCSCAN_CONTINUE;
	ref->kind = PROCSCAN_MAP;
	ref->link_dirfd = -1;
	ref->link_name = NULL;
	for (char *line = s->buf, *next; r == PROCSCAN_CONTINUE && line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		/* a run of lines of one file is given once, again where it
		 * becomes a shared writable mapping */
		if (!parse_map(line, ref) || (prev && !strcmp(prev, ref->path) && (prev_sw || !ref->shared_write)))
			continue;
		if ((s->flags & PROCSCAN_SHARED_MAPS) && !ref->shared)
			continue;
		prev_sw = ref->shared_write;
		prev = ref->path;
		ref->has_id = ref->has_id && (s->flags & (PROCSCAN_STAT | PROCSCAN_MNTNS));
		r = s->fn(s->ctx, ref);
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

/* Read at the first call for a process, by the identity of its ns/mnt
 * link: most scans never ask (a tar root, or no fd outside the root). */
bool procscan_ref_same_mntns(const struct procscan_ref *ref)
{
	struct procscan_pid *p = ref->pid_state;
	if (!p || !(p->s->flags & PROCSCAN_MNTNS))
		return false;
	if (p->mntns < 0) {
		char path[PID_PATH_MAX];
		struct stat st;
		pid_path(path, sizeof(path), p, "ns/mnt");
		p->mntns = p->s->own_ns.st_ino && fstatat(p->s->proc_fd, path, &st, 0) == 0 &&
			st.st_dev == p->s->own_ns.st_dev && st.st_ino == p->s->own_ns.st_ino;
	}
	return p->mntns > 0;
}

/* Whether the kernel refuses p's links, asked of its fd 0 when its maps
 * were refused (the same ptrace check guards both on Linux; the link is
 * asked all the same, so that a proc that checks them apart, such as
 * gVisor's, loses nothing). A process that cannot be read then costs no
 * listing of its fds: the kernel makes an entry for each as it lists them,
 * and a sandbox's init here held 252 (half of a cold scan, 1 of 2 ms). */
static bool links_refused(const struct scan *s, const struct procscan_pid *p)
{
	char path[PID_PATH_MAX], buf[8];
	pid_path(path, sizeof(path), p, "fd/0");
	return readlinkat(s->proc_fd, path, buf, sizeof(buf)) < 0 && (errno == EACCES || errno == EPERM);
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

/* Which task stands for process p in the scan, from p->name "<pid>". Its
 * exe names the file of its memory map; the kernel answers ENOENT where the
 * first thread has none. Then "<pid>/task" counts the threads (its link
 * count is 2 plus their number):
 * - one: a kernel thread, or a process whose every thread has left its map
 *   on the way out. It runs no code that could write a file, through an fd
 *   or a mapping: false, and a collect's scan (PROCSCAN_NO_DIRS) skips it.
 *   A VM's /proc holds dozens of kernel threads; listing their fds was most
 *   of the scan.
 * - more: the first thread has exited (pthread_exit) while others run. The
 *   process's own maps, fds, cwd and root are then empty, though the others
 *   still write through them; another thread's are read instead, p->name
 *   becoming "<pid>/task/<tid>".
 * True: read p->name. */
static bool scan_pid_task(const struct scan *s, struct procscan_pid *p)
{
	char path[PID_PATH_MAX], buf[8];
	struct stat st;
	pid_path(path, sizeof(path), p, "exe");
	if (readlinkat(s->proc_fd, path, buf, sizeof(buf)) >= 0 || errno != ENOENT)
		return true;
	pid_path(path, sizeof(path), p, "task");
	if (fstatat(s->proc_fd, path, &st, 0) < 0 || st.st_nlink <= 3)
		return !(s->flags & PROCSCAN_NO_DIRS);
	_cleanup_closedir_ DIR *d = NULL;
	if (walk_open(s->proc_fd, path, &d) < 0)
		return true;
	const struct dirent *de;
	char pid[sizeof(p->name)];
	memcpy(pid, p->name, sizeof(pid));
	while ((de = walk_next(d))) {
		int n = pid_of(de->d_name) && strcmp(de->d_name, pid)
			? snprintf(p->name, sizeof(p->name), "%s/task/%s", pid, de->d_name)
			: -1;
		if (n < 0 || (size_t)n >= sizeof(p->name))
			continue;
		pid_path(path, sizeof(path), p, "exe");
		if (readlinkat(s->proc_fd, path, buf, sizeof(buf)) >= 0 || errno != ENOENT)
			return true;
	}
	memcpy(p->name, pid, sizeof(pid)); /* every thread on its way out */
	return !(s->flags & PROCSCAN_NO_DIRS);
}

/* One process: its cwd and root (as "<pid>/cwd" below the proc fd), fds
 * and maps, each read by a path below the proc fd. Its maps are opened
 * first: a process whose maps the kernel refuses may refuse its links. */
static int scan_pid(struct scan *s, pid_t pid)
{
	struct procscan_pid p = { .s = s, .mntns = -1 };
	struct procscan_ref ref = { .pid = pid, .kind = PROCSCAN_CWD, .pid_state = &p };
	char cwd[PID_PATH_MAX], root[PID_PATH_MAX], maps[PID_PATH_MAX];
	bool denied = false;
	int r = PROCSCAN_CONTINUE;
	snprintf(p.name, sizeof(p.name), "%d", (int)pid); /* as proc lists it (pid_of took it whole) */
	if (!scan_pid_task(s, &p))
		return 0;
	pid_path(maps, sizeof(maps), &p, "maps");
	_cleanup_close_ int maps_fd = openat(s->proc_fd, maps, O_RDONLY | O_CLOEXEC);
	bool maps_refused = maps_fd < 0 && (errno == EACCES || errno == EPERM);
	if (!(s->flags & (PROCSCAN_MAPS_ONLY | PROCSCAN_NO_DIRS))) {
		pid_path(cwd, sizeof(cwd), &p, "cwd");
		pid_path(root, sizeof(root), &p, "root");
		r = scan_link(&ref, s->proc_fd, cwd, s->flags, s->fn, s->ctx, &denied);
		ref.kind = PROCSCAN_ROOT;
		if (r == PROCSCAN_CONTINUE && !denied)
			r = scan_link(&ref, s->proc_fd, root, s->flags, s->fn, s->ctx, &denied);
	} else if (maps_refused && !(s->flags & PROCSCAN_MAPS_ONLY)) {
		denied = links_refused(s, &p);
	}
	if (r == PROCSCAN_CONTINUE && !denied && !(s->flags & PROCSCAN_MAPS_ONLY))
		r = scan_fds(s, &ref, &p);
	if (r == PROCSCAN_CONTINUE)
		r = scan_maps(s, &ref, maps_fd);
	return r < 0 ? r : 0;
}

int procscan_each(const char *proc, pid_t skip_pid, unsigned flags, procscan_fn fn, void *ctx)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	struct scan s = { .flags = flags, .fn = fn, .ctx = ctx };
	int r = walk_open(AT_FDCWD, proc, &d);
	if (r < 0)
		return r;
	s.proc_fd = dirfd(d);
	if ((flags & PROCSCAN_MNTNS) && fstatat(s.proc_fd, "self/ns/mnt", &s.own_ns, 0) < 0)
		s.own_ns.st_ino = 0; /* then no process is taken as sharing it */
	while ((de = walk_next(d))) {
		pid_t pid = pid_of(de->d_name);
		if (pid == 0 || pid == skip_pid)
			continue;
		if ((r = scan_pid(&s, pid)) < 0)
			break;
	}
	free(s.buf);
	return r < 0 ? r : 0;
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

struct dir_hit {
	const struct procscan_target *t;
	size_t n;
};

/* The target a directory is (dir_walk_up's fn). ".." from the top of a
 * directory a mount hides lands on the mount: the device of the step below
 * tells them apart. */
static int dir_hit(void *ctx, const struct stat *st, dev_t below)
{
	const struct dir_hit *h = ctx;
	int hit = target_of_id(st, h->t, h->n);
	for (size_t j = 0; hit >= 0 && below != h->t[hit].dev && j < h->n; j++)
		if (h->t[j].dev == below && !strcmp(h->t[j].path, h->t[hit].path))
			hit = (int)j;
	return hit;
}

/* Walk up from a directory by "..": the kernel follows the dentries, not
 * the path the link reads (but steps onto a mount over the parent it
 * reaches). -2 when the link is not a directory. */
static int dir_target(const struct procscan_ref *ref, const struct procscan_target *t, size_t n)
{
	_cleanup_close_ int fd = openat(ref->link_dirfd, ref->link_name, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -2;
	struct dir_hit h = { t, n };
	int hit = dir_walk_up(fd, 4096, dir_hit, &h);
	return hit < 0 ? -1 : hit;
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
