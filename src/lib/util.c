/* util.c: errors, time, validation and crash-safe file helpers. */
#include "lib/util.h"
#include "lib/walk.h"

#include <stdatomic.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include "lib/failpoint.h"

static int err_vset(ckpt_error *err, enum ckpt_err_kind kind, int errnum, const char *code, const char *fmt, va_list ap)
{
	if (errnum < 0)
		errnum = -errnum;
	if (errnum == 0)
		errnum = EIO;
	if (err) {
		err->errnum = errnum;
		err->kind = kind;
		err->code = code;
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	}
	return -errnum;
}

int err_set(ckpt_error *err, int errnum, const char *code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = err_vset(err, ERR_UNSET, errnum, code, fmt, ap);
	va_end(ap);
	return r;
}

int err_set_kind(ckpt_error *err, enum ckpt_err_kind kind, int errnum, const char *code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = err_vset(err, kind, errnum, code, fmt, ap);
	va_end(ap);
	return r;
}

int err_mark(ckpt_error *err, enum ckpt_err_kind kind, const char *code, int r)
{
	if (err) {
		err->kind = kind;
		err->code = code;
	}
	return r;
}

int err_prefix(ckpt_error *err, const char *fmt, ...)
{
	if (!err)
		return -EIO;
	char ctx[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ctx, sizeof(ctx), fmt, ap);
	va_end(ap);
	/* "ctx: old", cut at the buffer's end. */
	size_t cl = strlen(ctx), cap = sizeof(err->msg);
	size_t ol = strnlen(err->msg, cap - 1);
	if (cl + 2 + ol > cap - 1)
		ol = cap - 1 - cl - 2;
	memmove(err->msg + cl + 2, err->msg, ol);
	memcpy(err->msg, ctx, cl);
	memcpy(err->msg + cl, ": ", 2);
	err->msg[cl + 2 + ol] = '\0';
	return -(err->errnum ? err->errnum : EIO);
}

int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *fmt_rfc3339_ms(int64_t ms, char *buf, size_t len)
{
	time_t secs = (time_t)(ms / 1000);
	struct tm tm;
	char base[24];

	gmtime_r(&secs, &tm);
	strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%03dZ", base, (int)(ms % 1000));
	return buf;
}

bool id_valid(const char *s)
{
	if (!s || strncmp(s, "cp_", 3) != 0 || strlen(s) != 27)
		return false;
	for (const char *p = s + 3; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

/* Printable means: no C0/C1 control characters, valid UTF-8. */
/* Length of the strictly valid UTF-8 sequence at p (1..4), or 0: no
 * overlong forms, no surrogates, nothing above U+10FFFF (RFC 3629 table 4). */
static size_t utf8_seq_len(const unsigned char *p, size_t avail)
{
	unsigned c = p[0], lo = 0x80, hi = 0xbf;
	size_t n;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4;
	else
		return 0;
	if (c == 0xe0)
		lo = 0xa0; /* overlong */
	else if (c == 0xed)
		hi = 0x9f; /* surrogates */
	else if (c == 0xf0)
		lo = 0x90; /* overlong */
	else if (c == 0xf4)
		hi = 0x8f; /* above U+10FFFF */
	if (n > avail || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	return n;
}

bool utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + len;
	while (p < end) {
		size_t n = utf8_seq_len(p, (size_t)(end - p));
		if (n == 0)
			return false;
		p += n;
	}
	return true;
}

bool name_valid(const char *s)
{
	size_t chars = 0;
	const unsigned char *p = (const unsigned char *)s;

	if (!s)
		return false;
	while (*p) {
		size_t n = utf8_seq_len(p, 4); /* the NUL stops a cut sequence */
		if (n == 0 || *p < 0x20 || *p == 0x7f)
			return false;
		if (n == 2 && p[0] == 0xc2 && p[1] < 0xa0) /* C1 controls */
			return false;
		p += n;
		chars++;
	}
	return chars >= 1 && chars <= 128;
}

int random_hex(char *buf, size_t nbytes)
{
	unsigned char raw[64];
	if (nbytes > sizeof(raw))
		return -EINVAL;
	if (getrandom(raw, nbytes, 0) != (ssize_t)nbytes)
		return -errno;
	for (size_t i = 0; i < nbytes; i++)
		sprintf(buf + 2 * i, "%02x", raw[i]);
	return 0;
}

/* "cp_" + 12 hex digits of ms since the epoch + 12 random hex digits: ids sort
 * by creation time and never repeat. Within a process they strictly grow: a
 * second id in the same millisecond takes the next one (random digits alone
 * would order two quick creates by chance; lists are newest first). */
int id_generate(char *buf, size_t len)
{
	static _Atomic int64_t last;
	char rnd[13];
	int64_t ms, prev, t;
	int r;

	if (len < 28)
		return -EINVAL;
	r = random_hex(rnd, 6);
	if (r < 0)
		return r;
	prev = atomic_load(&last);
	do {
		t = now_ms();
		ms = t > prev ? t : prev + 1;
	} while (!atomic_compare_exchange_weak(&last, &prev, ms));
	snprintf(buf, len, "cp_%012llx%s", (unsigned long long)ms & 0xffffffffffffULL, rnd);
	return 0;
}

int fsync_dirfd(int dirfd)
{
	return fsync(dirfd) < 0 ? -errno : 0;
}

int fsync_path(const char *path)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	return fsync(fd) < 0 ? -errno : 0;
}

static int write_all(int fd, const void *data, size_t len)
{
	const char *p = data;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Write data into a new temp file beside name (its name into tmp), fsynced
 * if sync; removed on failure. */
static int write_file_temp(int dirfd, const char *name, const void *data, size_t len, mode_t mode, bool sync,
			   char tmp[static WRITE_FILE_TMP_MAX])
{
	char rnd[9];
	if (random_hex(rnd, 4) < 0)
		return -EIO;
	if ((size_t)snprintf(tmp, WRITE_FILE_TMP_MAX, ".%s.tmp.%s", name, rnd) >= WRITE_FILE_TMP_MAX)
		return -ENAMETOOLONG;
	_cleanup_close_ int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		return -errno;
	int r = write_all(fd, data, len);
	if (r == 0 && sync && fsync(fd) < 0)
		r = -errno;
	if (r < 0)
		unlinkat(dirfd, tmp, 0);
	return r;
}

/* Rename tmp over name, then fsync the directory if sync; tmp is removed
 * on failure. */
static int write_file_rename(int dirfd, const char *tmp, const char *name, bool sync)
{
	if (renameat(dirfd, tmp, dirfd, name) < 0) {
		int r = -errno;
		unlinkat(dirfd, tmp, 0);
		return r;
	}
	FAILPOINT("file.atomic.renamed"); /* renamed, the directory not yet synced */
	return sync ? fsync_dirfd(dirfd) : 0;
}

static int write_file_put(int dirfd, const char *name, const void *data, size_t len, mode_t mode, bool sync)
{
	char tmp[WRITE_FILE_TMP_MAX];
	int r = write_file_temp(dirfd, name, data, len, mode, sync, tmp);
	if (r < 0)
		return r;
	FAILPOINT("file.atomic.synced"); /* the temp file whole, not yet renamed */
	return write_file_rename(dirfd, tmp, name, sync);
}

int write_file_stage(int dirfd, const char *name, const void *data, size_t len, mode_t mode,
		     char tmp[static WRITE_FILE_TMP_MAX])
{
	return write_file_temp(dirfd, name, data, len, mode, false, tmp);
}

int write_file_commit(int dirfd, const char *tmp, const char *name)
{
	return write_file_rename(dirfd, tmp, name, true);
}

int write_file_atomic(int dirfd, const char *name, const void *data, size_t len, mode_t mode)
{
	return write_file_put(dirfd, name, data, len, mode, true);
}

int write_file_replace(int dirfd, const char *name, const void *data, size_t len, mode_t mode)
{
	return write_file_put(dirfd, name, data, len, mode, false);
}

static bool write_file_atomic_is_temp(const char *n)
{
	const char *t = n[0] == '.' ? strstr(n, ".tmp.") : NULL;
	if (!t || t == n)
		return false;
	t += 5;
	size_t k = strspn(t, "0123456789abcdef");
	return k == 8 && t[k] == 0;
}

int write_file_atomic_sweep(int dirfd)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	_cleanup_closedir_ DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -ENOMEM;
	}
	struct dirent *de;
	int removed = 0;
	while ((de = readdir(d)))
		if (write_file_atomic_is_temp(de->d_name) && unlinkat(dirfd, de->d_name, 0) == 0)
			removed++;
	return removed;
}

int pwrite_all(int fd, const void *buf_, size_t len, off_t off)
{
	const char *buf = buf_;
	while (len > 0) {
		ssize_t n = pwrite(fd, buf, len, off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENOSPC;
		buf += n, len -= (size_t)n, off += n;
	}
	return 0;
}

int read_file_at(int dirfd, const char *name, size_t max, char **ret, size_t *ret_len)
{
	_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	_cleanup_free_ char *buf = NULL;
	size_t len = 0, cap = 0;

	if (fd < 0)
		return -errno;
	for (;;) {
		if (len + 4096 + 1 > cap) {
			cap = cap ? cap * 2 : 8192;
			char *n = realloc(buf, cap);
			if (!n)
				return -ENOMEM;
			buf = n;
		}
		ssize_t k = read(fd, buf + len, cap - len - 1);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			break;
		len += (size_t)k;
		if (len > max)
			return -EFBIG;
	}
	buf[len] = '\0';
	*ret = TAKE_PTR(buf);
	if (ret_len)
		*ret_len = len;
	return 0;
}

int mkdirat_durable(int dirfd, const char *name, mode_t mode)
{
	if (mkdirat(dirfd, name, mode) < 0)
		return errno == EEXIST ? 0 : -errno;
	return fsync_dirfd(dirfd);
}

/* mkdir p (cut at its last '/' by the caller: parent, name) and, when it
 * was made, fsync its parent. */
static int mkdir_p_one(const char *p, char *last, mode_t mode)
{
	if (mkdir(p, mode) < 0)
		return errno == EEXIST ? 0 : -errno;
	char c = *last;
	*last = '\0';
	int r = fsync_path(last == p ? "/" : p);
	*last = c;
	if (r < 0)
		errno = -r;
	return r;
}

int mkdir_p(const char *path, mode_t mode)
{
	_cleanup_free_ char *p = strdup(path);
	char *last = NULL;
	int r;
	if (!p)
		return -ENOMEM;
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		if ((r = mkdir_p_one(p, last ? last : p, mode)) < 0)
			return r;
		*s = '/';
		last = s;
	}
	return mkdir_p_one(p, last ? last : p, mode);
}

/* rm_rf_at's walk. Every entry is tried; the first failure is kept, and
 * a directory whose data says something below it stayed is kept too. */
struct rm {
	dev_t dev; /* the tree's: a directory on another is a mount point */
	int first;
	const struct walk_entry *unread; /* a directory not read to its end */
};

#define RM_KEPT 1

static void rm_note(struct rm *rm, struct walk_entry *dir, int err)
{
	if (rm->first == 0)
		rm->first = err;
	dir->data |= RM_KEPT;
}

/* Files go at once; a directory after what it holds (rm_dir). */
static int rm_entry(void *ctx, struct walk_entry *e)
{
	struct rm *rm = ctx;
	struct stat st;
	if (e->type == DT_DIR && fstatat(e->dirfd, e->name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno != ENOENT)
			rm_note(rm, e->parent, -errno);
		return WALK_SKIP;
	}
	if (e->type != DT_DIR || !S_ISDIR(st.st_mode)) {
		if (unlinkat(e->dirfd, e->name, 0) < 0 && errno != ENOENT)
			rm_note(rm, e->parent, -errno);
		return WALK_SKIP;
	}
	if (st.st_dev != rm->dev) {
		rm_note(rm, e->parent, -EXDEV); /* a mount point: never descend into another filesystem */
		return WALK_SKIP;
	}
	return 0;
}

static int rm_dir(void *ctx, struct walk_entry *e)
{
	if (e->err)
		return 0;
	struct rm *rm = ctx;
	if ((e->data & RM_KEPT) || e == rm->unread)
		e->parent->data |= RM_KEPT;
	else if (unlinkat(e->dirfd, e->name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		rm_note(rm, e->parent, -errno);
	return 0;
}

/* rm_deep: what lies past the walk's depth bound, removed with one open
 * directory at a time. It goes down by openat and back up by "..", whose
 * identity it checks against the one it left, so a directory moved away
 * meanwhile ends it (-ESTALE) instead of removing elsewhere. */
struct rm_level {
	dev_t dev;
	ino_t ino;
	char *name; /* this directory's name in its parent */
};

/* The first subdirectory of fd once its other entries are gone; NULL when
 * fd is empty. *err: the first failure. */
static char *rm_deep_clear(int fd, dev_t dev, int *err)
{
	DIR *d;
	int r = walk_open(fd, NULL, &d);
	if (r < 0) {
		*err = r;
		return NULL;
	}
	char *sub = NULL;
	struct dirent *de;
	struct stat st;
	while (!sub && (de = walk_next(d))) {
		if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT)
				*err = -errno;
		} else if (!S_ISDIR(st.st_mode)) {
			if (unlinkat(fd, de->d_name, 0) < 0 && errno != ENOENT)
				*err = -errno;
		} else if (st.st_dev != dev) {
			*err = -EXDEV; /* a mount point: never into another filesystem */
		} else if (!(sub = strdup(de->d_name))) {
			*err = -ENOMEM;
		}
	}
	if (!sub && !de && errno)
		*err = -errno;
	closedir(d);
	return *err < 0 ? (free(sub), NULL) : sub;
}

static int rm_deep(int dirfd, const char *name, dev_t dev)
{
	struct rm_level *v = NULL;
	size_t n = 0, cap = 0;
	int err = 0, fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	while (err == 0) {
		struct stat st;
		char *sub = rm_deep_clear(fd, dev, &err);
		if (err == 0 && sub) { /* down one */
			if (n == cap) {
				struct rm_level *nv = realloc(v, (cap = cap ? cap * 2 : 64) * sizeof(*v));
				if (!nv) {
					free(sub);
					err = -ENOMEM;
					break;
				}
				v = nv;
			}
			int c = openat(fd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (c < 0 || fstat(fd, &st) < 0) {
				err = -errno;
				free(sub);
				if (c >= 0)
					close(c);
				break;
			}
			v[n++] = (struct rm_level){ st.st_dev, st.st_ino, sub };
			close(fd);
			fd = c;
			continue;
		}
		if (err < 0 || n == 0)
			break;
		/* fd is empty: up one, to the directory it was entered from */
		int up = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (up < 0 || fstat(up, &st) < 0)
			err = -errno;
		else if (st.st_dev != v[n - 1].dev || st.st_ino != v[n - 1].ino)
			err = -ESTALE;
		else if (unlinkat(up, v[n - 1].name, AT_REMOVEDIR) < 0 && errno != ENOENT)
			err = -errno;
		close(fd);
		fd = up;
		free(v[--n].name);
	}
	while (n > 0)
		free(v[--n].name);
	free(v);
	if (fd >= 0)
		close(fd);
	if (err == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		err = -errno;
	return err;
}

/* Reading the top fails the whole; below it a failure keeps that part. */
static int rm_fail(void *ctx, const struct walk_entry *e, int err)
{
	struct rm *rm = ctx;
	if (e->step == WALK_AT_STAT && err == -ENOENT)
		return 0;
	if (e->step == WALK_AT_DEPTH && (err = rm_deep(e->dirfd, e->name, rm->dev)) == 0)
		return 0; /* removed; its post sees -ELOOP and leaves it */
	if (e->step != WALK_AT_READ) {
		rm_note(rm, e->parent, err);
		return 0;
	}
	if (e->depth == 0)
		return err;
	rm->unread = e; /* its post keeps it, and its parent */
	if (rm->first == 0)
		rm->first = err;
	return 0;
}

int dir_walk_up(int dirfd, int max, int (*fn)(void *ctx, const struct stat *st, dev_t below), void *ctx)
{
	struct stat st, up;
	_cleanup_close_ int cur = -1;
	if (fstat(dirfd, &st) < 0)
		return -2;
	dev_t below = st.st_dev;
	for (int at = dirfd, n = 0; n < max; n++) {
		int r = fn(ctx, &st, below);
		if (r >= 0)
			return r;
		below = st.st_dev;
		int p = openat(at, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (p < 0 || fstat(p, &up) < 0) {
			if (p >= 0)
				close(p);
			return -2;
		}
		if (up.st_dev == st.st_dev && up.st_ino == st.st_ino) {
			close(p);
			return -1;
		}
		if (cur >= 0)
			close(cur);
		at = cur = p, st = up;
	}
	return -2;
}

int rm_rf_at(int dirfd, const char *name)
{
	struct stat st, parent;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
	if (fstat(dirfd, &parent) == 0 && parent.st_dev != st.st_dev)
		return -EXDEV; /* a mount point: never descend into another filesystem */
	struct rm rm = { .dev = st.st_dev };
	struct walk_opts o = { .pre = rm_entry, .post = rm_dir, .fail = rm_fail, .ctx = &rm };
	int r = walk_tree(dirfd, name, &o);
	if (r < 0 || rm.first < 0)
		return r < 0 ? r : rm.first;
	return unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT ? -errno : 0;
}

char *path_join(const char *a, const char *b)
{
	char *out;
	size_t la = strlen(a);
	while (la > 0 && a[la - 1] == '/')
		la--;
	while (*b == '/')
		b++;
	if (asprintf(&out, "%.*s/%s", (int)la, a, b) < 0)
		return NULL;
	return out;
}

struct inode_set {
	ino_t *v;
	size_t n, cap;
};

static bool inode_seen(struct inode_set *s, ino_t ino)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i] == ino)
			return true;
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		ino_t *n = realloc(s->v, cap * sizeof(*n));
		if (!n)
			return false;
		s->v = n;
		s->cap = cap;
	}
	s->v[s->n++] = ino;
	return false;
}

struct du {
	struct inode_set links;
	uint64_t sum;
};

/* A file of several names counts once. */
static void du_count(struct du *du, const struct stat *st)
{
	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1 && inode_seen(&du->links, st->st_ino))
		return;
	du->sum += (uint64_t)st->st_blocks * 512;
}

static int du_entry(void *ctx, struct walk_entry *e)
{
	du_count(ctx, &e->st);
	return 0;
}

/* An entry gone since listed counts nothing; any other failure is the
 * caller's. */
static int du_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	return e->step == WALK_AT_STAT && err == -ENOENT ? 0 : err;
}

int tree_disk_usage(int dirfd, const char *name, uint64_t *ret)
{
	struct du du = { 0 };
	struct stat st;
	struct walk_opts o = { .flags = WALK_STAT, .pre = du_entry, .fail = du_fail, .ctx = &du };
	int r = 0;
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		r = errno == ENOENT ? 0 : -errno;
	} else {
		du_count(&du, &st);
		if (S_ISDIR(st.st_mode))
			r = walk_tree(dirfd, name, &o);
	}
	free(du.links.v);
	if (r >= 0)
		*ret = du.sum;
	return r;
}

bool secure_streq(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char diff = la != lb;
	for (size_t i = 0; i < la; i++)
		diff |= (unsigned char)a[i] ^ (unsigned char)b[lb ? i % lb : 0];
	return diff == 0;
}
