/* tar_fs.c: xattrs, safe path opening and a private working directory. */
#include "backend/tar/tar_fs.h"

#include <archive.h>
#include <archive_entry.h>

#include <limits.h>
#include <linux/openat2.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <time.h>

#include "lib/walk.h"
#include "lib/xattr.h"

static int xa_cmp(const void *a, const void *b)
{
	return strcmp(((const struct tar_xattr *)a)->name, ((const struct tar_xattr *)b)->name);
}

static int xa_read_one(const struct xattr_ref *ref, const char *n, struct tar_xattr *x)
{
	char buf[XATTR_VALUE_BUF];
	ssize_t len = xattr_get(ref, n, buf, sizeof(buf));
	if (len < 0)
		return -errno;
	x->name = strdup(n);
	x->value = malloc((size_t)len + 1);
	if (!x->name || !x->value)
		return -ENOMEM;
	memcpy(x->value, buf, (size_t)len);
	x->len = (size_t)len;
	return 0;
}

int tar_xattrs_read(int dirfd, const char *name, struct tar_xattr **ret, size_t *ret_n)
{
	char list[XATTR_LIST_BUF];
	struct xattr_ref ref;
	struct tar_xattr *xa = NULL;
	size_t n = 0;

	xattr_ref_init(&ref, -1, dirfd, name);
	ssize_t len = xattr_list(&ref, list, sizeof(list));
	if (len < 0)
		return errno == ENOTSUP || errno == ENODATA ? (*ret = NULL, *ret_n = 0, 0) : -errno;
	for (ssize_t off = 0; off < len; off += (ssize_t)strlen(list + off) + 1) {
		struct tar_xattr *nx = realloc(xa, (n + 1) * sizeof(*nx));
		if (!nx)
			goto nomem;
		xa = nx;
		memset(&xa[n], 0, sizeof(xa[n]));
		int r = xa_read_one(&ref, list + off, &xa[n++]);
		if (r == -ENODATA) { /* removed meanwhile */
			free(xa[--n].name);
			continue;
		}
		if (r < 0) {
			tar_xattrs_free(xa, n);
			return r;
		}
	}
	if (n > 1)
		qsort(xa, n, sizeof(*xa), xa_cmp);
	*ret = xa;
	*ret_n = n;
	return 0;
nomem:
	tar_xattrs_free(xa, n);
	return -ENOMEM;
}

bool tar_xattrs_match(int dirfd, const char *name, uint64_t xhash)
{
	struct tar_xattr *xa = NULL;
	size_t n = 0;
	if (tar_xattrs_read(dirfd, name, &xa, &n) < 0)
		return false;
	uint64_t h = tar_xattrs_hash(xa, n);
	tar_xattrs_free(xa, n);
	return h == xhash;
}

/* With proc (an O_PATH fd's /proc/self/fd link: a fifo or device must not
 * be opened), through that path; else through fd. */
static int tar_xattrs_apply_at(int fd, const char *proc, const struct tar_xattr *xa, size_t n)
{
	char list[XATTR_LIST_BUF];
	ssize_t len = proc ? listxattr(proc, list, sizeof(list)) : flistxattr(fd, list, sizeof(list));

	if (len < 0 && errno != ENOTSUP)
		return proc && !n ? 0 : -errno; /* a /proc link some kernels refuse: nothing to set */
	for (ssize_t off = 0; off < len; off += (ssize_t)strlen(list + off) + 1) {
		bool keep = false;
		for (size_t i = 0; i < n && !keep; i++)
			keep = !strcmp(xa[i].name, list + off);
		if (!keep && (proc ? removexattr(proc, list + off) : fremovexattr(fd, list + off)) < 0 &&
		    errno != ENODATA)
			return -errno;
	}
	for (size_t i = 0; i < n; i++)
		if ((proc ? setxattr(proc, xa[i].name, xa[i].value, xa[i].len, 0)
			  : fsetxattr(fd, xa[i].name, xa[i].value, xa[i].len, 0)) < 0)
			return -errno;
	return 0;
}

int tar_xattrs_apply_fd(int fd, const struct tar_xattr *xa, size_t n)
{
	return tar_xattrs_apply_at(fd, NULL, xa, n);
}

void tar_archive_freep(struct archive **a)
{
	if (*a)
		archive_free(*a);
}

int tar_xattrs_apply_entry(int fd, struct archive_entry *ae, bool opath)
{
	size_t n = (size_t)archive_entry_xattr_reset(ae), i = 0;
	struct tar_xattr *xa = n ? calloc(n, sizeof(*xa)) : NULL;
	const char *name;
	const void *value;
	size_t len;

	if (n && !xa)
		return -ENOMEM;
	while (i < n && archive_entry_xattr_next(ae, &name, &value, &len) == ARCHIVE_OK)
		xa[i++] = (struct tar_xattr){ (char *)name, (void *)value, len };
	char proc[32];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	int r = tar_xattrs_apply_at(fd, opath ? proc : NULL, xa, i);
	free(xa);
	return r;
}

/* libarchive's disk writer sets no system.posix_acl_* xattr (it leaves ACLs
 * to ARCHIVE_EXTRACT_ACL), and an entry made in a directory with a default
 * ACL inherits ACLs: the xattrs of what it made are set again here, exactly
 * the archive's. A directory through its fd; a fifo or device through an
 * O_PATH fd (opening a fifo would wake a writer blocked on it). */
int tar_xattrs_fix_made(int pfd, const char *leaf, struct archive_entry *ae)
{
	bool dir = archive_entry_filetype(ae) == AE_IFDIR;
	_cleanup_close_ int fd = openat(pfd, leaf, (dir ? O_RDONLY | O_DIRECTORY : O_PATH) | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : tar_xattrs_apply_entry(fd, ae, !dir);
}

static atomic_bool tar_no_openat2;

/* The directory path[0..len) below root_fd in one call: openat2 follows no
 * symlink and never leaves root_fd, as the walk of tar_open_parent. < 0
 * when it cannot (no openat2: an old kernel, gVisor, a seccomp filter), or
 * on any error: the walk then reports it as it always did. */
static int tar_open_dir_at_once(int root_fd, const char *path, size_t len)
{
	struct open_how how = { .flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
				.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
	char dir[PATH_MAX];
	if (atomic_load(&tar_no_openat2) || len >= sizeof(dir))
		return -1;
	memcpy(dir, path, len);
	dir[len] = '\0';
	int fd = (int)syscall(SYS_openat2, root_fd, dir, &how, sizeof(how));
	if (fd < 0 && (errno == ENOSYS || errno == EPERM))
		atomic_store(&tar_no_openat2, true);
	return fd;
}

int tar_open_parent(int root_fd, const char *path, const char **leaf)
{
	const char *slash = strrchr(path, '/');
	char comp[NAME_MAX + 1];

	*leaf = slash ? slash + 1 : path;
	int fd = slash ? tar_open_dir_at_once(root_fd, path, (size_t)(slash - path)) : -1;
	if (fd >= 0)
		return fd;
	fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return -errno;
	for (const char *p = path; slash && p < slash;) {
		const char *e = strchr(p, '/');
		size_t len = (size_t)(e - p);
		if (len > NAME_MAX) {
			close(fd);
			return -ENAMETOOLONG;
		}
		memcpy(comp, p, len);
		comp[len] = '\0';
		int nfd = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		int e2 = errno;
		close(fd);
		if (nfd < 0)
			return -e2;
		fd = nfd;
		p = e + 1;
	}
	return fd;
}

int tar_cwd_enter(int dir_fd, int *ret_saved)
{
	if (unshare(CLONE_FS) < 0)
		return -errno;
	int saved = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (saved < 0)
		saved = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (saved < 0)
		return -errno;
	if (fchdir(dir_fd) < 0) {
		int e = errno;
		close(saved);
		return -e;
	}
	*ret_saved = saved;
	return 0;
}

void tar_cwd_leave(int *saved)
{
	if (*saved >= 0) {
		if (fchdir(*saved) < 0 && chdir("/") < 0)
			log_debug("tar: cannot return to the saved working directory: %m");
		close(*saved);
		*saved = -1;
	}
}

struct tar_count {
	dev_t skip_dev;
	ino_t skip_ino;
	const struct rootexcl *excl;
	const atomic_bool *stop;
	uint64_t *files, *bytes;
};

static int tar_count_pre(void *ctx, struct walk_entry *e)
{
	struct tar_count *c = ctx;
	if (c->stop && atomic_load(c->stop))
		return WALK_STOP;
	if (tar_skipped(&e->st, c->skip_dev, c->skip_ino, c->excl))
		return WALK_SKIP;
	(*c->files)++;
	if (S_ISREG(e->st.st_mode))
		*c->bytes += (uint64_t)e->st.st_size;
	return 0;
}

void tar_count_tree(int dirfd, dev_t skip_dev, ino_t skip_ino, const struct rootexcl *excl, const atomic_bool *stop,
		    uint64_t *files, uint64_t *bytes)
{
	struct tar_count c = { skip_dev, skip_ino, excl, stop, files, bytes };
	/* a count is an estimate: what cannot be read is left out, quietly */
	struct walk_opts o = { .flags = WALK_STAT, .pre = tar_count_pre, .fail = walk_fail_ignore, .ctx = &c };
	walk_tree(dirfd, NULL, &o);
}

void tar_ts_max(struct timespec *acc, struct timespec t)
{
	if (t.tv_sec > acc->tv_sec || (t.tv_sec == acc->tv_sec && t.tv_nsec > acc->tv_nsec))
		*acc = t;
}

void tar_wait_past(struct timespec t)
{
	for (int i = 0; i < 1000; i++) { /* a tick is at most 10 ms; bound it anyway */
		struct timespec now, pause = { 0, 500000 };
		clock_gettime(CLOCK_REALTIME_COARSE, &now);
		if (now.tv_sec > t.tv_sec || (now.tv_sec == t.tv_sec && now.tv_nsec > t.tv_nsec))
			return;
		nanosleep(&pause, NULL);
	}
}

int tar_walk_failed(ckpt_error *err, const struct walk_entry *e, int r)
{
	const char *at = e->path[0] ? e->path : "."; /* the root of a walk: its prefix */
	switch (e->step) {
	case WALK_AT_PATH:
		return err_set(err, ENAMETOOLONG, NULL, "path too long below '%s'", at);
	case WALK_AT_STAT:
		return err_set(err, -r, NULL, "cannot stat '%s': %s", at, strerror(-r));
	case WALK_AT_DEPTH:
		return err_set(err, ELOOP, NULL, "'%s' is more than %d directories deep", at, WALK_DEPTH_MAX);
	case WALK_AT_OPEN:
		return err_set(err, -r, NULL, "cannot open '%s': %s", at, strerror(-r));
	default:
		return err_set(err, -r, NULL, "cannot list '%s': %s", at, strerror(-r));
	}
}

int tar_walk_root(int dirfd, const struct walk_opts *o, ckpt_error *err)
{
	_cleanup_close_ int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errno, NULL, "cannot open '.': %m");
	int r = walk_tree(fd, NULL, o);
	return r == -ENOMEM ? err_set(err, ENOMEM, NULL, "out of memory") : r;
}

int tar_walk_fail_gone(void *ctx, const struct walk_entry *e, int err)
{
	struct tar_walk *w = ctx;
	if (e->step == WALK_AT_STAT && err == -ENOENT)
		return 0;
	w->failed = true;
	return tar_walk_failed(w->err, e, err);
}

int tar_walk_below(int dirfd, const char *rel, struct walk_opts *o, struct tar_walk *w)
{
	o->path_max = PATH_MAX;
	o->prefix = rel;
	o->fail = tar_walk_fail_gone;
	int r = walk_tree(dirfd, NULL, o);
	if (r >= 0 || w->failed)
		return r;
	if (r == -ENOMEM)
		return err_set(w->err, ENOMEM, NULL, "out of memory");
	return err_set(w->err, -r, NULL, "cannot open '%s': %s", rel ? rel : ".", strerror(-r));
}
