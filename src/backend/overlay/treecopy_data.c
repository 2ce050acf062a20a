/* treecopy_data.c: one inode of a tree copy: its data (a clone, a
 * copy_file_range, or read and write keeping sparse holes), its owner, mode,
 * xattrs and times, and the comparison that tells whether a layer's copy
 * still matches the source (refresh rewrites only the blocks that differ). */
#include "backend/overlay/treecopy.h"
#include "backend/overlay/treecopy_internal.h"
#include "lib/devino.h"
#include "lib/walk.h"
#include "lib/xattr.h"
#include "backend/backend.h"

#include <limits.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#define TC_REFRESH_CHUNK (256u << 10)
#define TC_REFRESH_BLOCK 4096u

bool treecopy_is_whiteout(const struct stat *st)
{
	return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

static int treecopy_range(int in, int out, off_t off, off_t end)
{
	static __thread bool no_cfr;
	while (off < end) {
		size_t want = (size_t)(end - off);
		ssize_t n = -1;
		if (!no_cfr) {
			loff_t a = off, b = off;
			n = copy_file_range(in, &a, out, &b, want, 0);
			if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL))
				no_cfr = true;
			else if (n < 0)
				return -errno;
		}
		if (no_cfr) {
			char b[1 << 16];
			n = pread(in, b, want < sizeof(b) ? want : sizeof(b), off);
			if (n < 0 || (n > 0 && pwrite(out, b, n, off) != n))
				return -errno ? -errno : -EIO;
		}
		if (n == 0)
			break; /* source shrank under us */
		off += n;
	}
	return 0;
}

/* No SEEK_DATA (gVisor: EINVAL): copy it all, leaving zero blocks as holes. */
static int treecopy_range_zeros(int in, int out, off_t size, uint64_t *ret_copied)
{
	static __thread char b[1 << 16];
	static const char zero[1 << 16];
	for (off_t off = 0; off < size;) {
		ssize_t n = pread(in, b, sizeof(b), off);
		if (n <= 0)
			return n < 0 ? -errno : 0; /* 0: it shrank under us */
		if (memcmp(b, zero, n) != 0 && pwrite(out, b, n, off) != n)
			return -errno ? -errno : -EIO;
		*ret_copied += n;
		off += n;
	}
	return 0;
}

int treecopy_file_data(int in, int out, off_t size, uint64_t *ret_copied)
{
	*ret_copied = 0;
	if (size == 0)
		return 0;
	if (ioctl(out, FICLONE, in) == 0)
		return 0;
	if (ftruncate(out, size) < 0)
		return -errno;
	off_t off = 0;
	while (off < size) {
		off_t data = lseek(in, off, SEEK_DATA);
		if (data < 0 && errno == EINVAL && off == 0)
			return treecopy_range_zeros(in, out, size, ret_copied);
		if (data < 0)
			return errno == ENXIO ? 0 : -errno;
		off_t hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			return -errno;
		if (hole > size)
			hole = size;
		int r = treecopy_range(in, out, data, hole);
		if (r < 0)
			return r;
		*ret_copied += hole - data;
		off = hole;
	}
	return 0;
}

static int treecopy_xattrs(const struct xattr_ref *src, const struct xattr_ref *dst, bool (*skip)(const char *))
{
	char names[XATTR_LIST_BUF];
	static __thread char val[XATTR_VALUE_BUF];
	ssize_t n = xattr_list(src, names, sizeof(names));
	if (n < 0)
		return errno == ENOTSUP ? 0 : -errno;
	for (char *k = names; k < names + n; k += strlen(k) + 1) {
		if (skip && skip(k))
			continue;
		ssize_t v = xattr_get(src, k, val, sizeof(val));
		if (v < 0) {
			if (errno == ENODATA)
				continue;
			return -errno;
		}
		if (xattr_set(dst, k, val, v) < 0 && errno != ENOTSUP)
			return -errno;
	}
	return 0;
}

/* Owner, mode, xattrs, times of a created inode. dfd_entry >= 0 for regular
 * files and dirs; else the entry is addressed by (dfd, name). */
int treecopy_copy_meta(int sfd, int dfd, const char *name, int sfd_entry, int dfd_entry, const struct stat *st)
{
	return treecopy_copy_meta_but(sfd, dfd, name, sfd_entry, dfd_entry, st, NULL);
}

int treecopy_copy_meta_but(int sfd, int dfd, const char *name, int sfd_entry, int dfd_entry, const struct stat *st,
			   bool (*skip)(const char *))
{
	struct xattr_ref xs, xd;
	struct timespec ts[2] = { st->st_atim, st->st_mtim };
	bool lnk = S_ISLNK(st->st_mode);

	if (dfd_entry >= 0 ? fchown(dfd_entry, st->st_uid, st->st_gid)
			   : fchownat(dfd, name, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW))
		return -errno;
	if (!lnk &&
	    (dfd_entry >= 0 ? fchmod(dfd_entry, st->st_mode & 07777) : fchmodat(dfd, name, st->st_mode & 07777, 0)))
		return -errno;
	xattr_ref_init(&xs, sfd_entry, sfd, name);
	xattr_ref_init(&xd, dfd_entry, dfd, name);
	int r = treecopy_xattrs(&xs, &xd, skip);
	if (r < 0)
		return r;
	if (dfd_entry >= 0 ? futimens(dfd_entry, ts) : utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW))
		return -errno;
	return 0;
}

/* A directory's metadata as a fresh copy would have it: src's, and of the
 * xattrs exactly src's (those the LSM sets, security.*, left alone). */
int treecopy_update_meta(int s, int d, const struct stat *st)
{
	char have[XATTR_LIST_BUF], want[XATTR_LIST_BUF];
	ssize_t n = flistxattr(d, have, sizeof(have)), m = flistxattr(s, want, sizeof(want));
	if (n < 0 || m < 0) {
		if (errno != ENOTSUP)
			return -errno;
		n = n < 0 ? 0 : n, m = m < 0 ? 0 : m;
	}
	for (char *k = have; k < have + n; k += strlen(k) + 1) {
		bool keep = !strncmp(k, "security.", 9);
		for (char *w = want; w < want + m && !keep; w += strlen(w) + 1)
			keep = !strcmp(k, w);
		if (!keep && fremovexattr(d, k) < 0 && errno != ENODATA)
			return -errno;
	}
	return treecopy_copy_meta(s, d, ".", s, d, st);
}

/* A symlink, device, fifo or whiteout in dst just like the one in src (its
 * copy is made again all the same, but that changes nothing). */
bool treecopy_special_same(int sfd, int dfd, const char *name, const struct stat *st)
{
	struct stat ds;
	char a[PATH_MAX], b[PATH_MAX];
	if (fstatat(dfd, name, &ds, AT_SYMLINK_NOFOLLOW) < 0 || ds.st_mode != st->st_mode || ds.st_uid != st->st_uid ||
	    ds.st_gid != st->st_gid || ds.st_rdev != st->st_rdev || ds.st_mtim.tv_sec != st->st_mtim.tv_sec ||
	    ds.st_mtim.tv_nsec != st->st_mtim.tv_nsec)
		return false;
	if (!S_ISLNK(st->st_mode))
		return true;
	ssize_t n = readlinkat(sfd, name, a, sizeof(a)), m = readlinkat(dfd, name, b, sizeof(b));
	return n >= 0 && n == m && !memcmp(a, b, n);
}

/* out, an earlier copy of in, brought to in's first size bytes by writing
 * only the 4 KiB blocks that differ. Reading both from the page cache costs
 * far less than writing a whole file again when little of it changed: a log
 * appended to, a table with a few pages rewritten. out, ckptd's own file, is
 * read through a mapping (no copy); in, which another program may truncate
 * meanwhile, by pread. A hole of in would be filled: the caller checks in
 * has none. */
int treecopy_refresh_data(int in, int out, off_t size, bool write, uint64_t *ret_written)
{
	size_t cap = size < (off_t)TC_REFRESH_CHUNK ? (size_t)size : TC_REFRESH_CHUNK;
	_cleanup_free_ char *a = malloc(cap), *buf = NULL;
	*ret_written = 0;
	if (!a)
		return -ENOMEM;
	struct stat os;
	if (fstat(out, &os) < 0)
		return -errno;
	off_t have = os.st_size < size ? os.st_size : size; /* what out has to compare */
	if (!write && os.st_size != size) {
		*ret_written = 1;
		return 0;
	}
	if (write && ftruncate(out, size) < 0)
		return -errno;
	char *map = have > 0 ? mmap(NULL, (size_t)have, PROT_READ, MAP_SHARED, out, 0) : MAP_FAILED;
	if (map == MAP_FAILED && have > 0 && !(buf = malloc(cap)))
		return -ENOMEM;
	int r = 0;
	for (off_t off = 0; r == 0 && off < size;) {
		size_t want = size - off < (off_t)cap ? (size_t)(size - off) : cap;
		ssize_t n = pread(in, a, want, off), m = 0;
		if (n <= 0) {
			r = n < 0 ? -errno : 0;
			break; /* 0: the source shrank under us */
		}
		const char *b = map != MAP_FAILED ? map + off : buf;
		if (off < have)
			m = map != MAP_FAILED ? (have - off < n ? have - off : n) : pread(out, buf, n, off);
		if (m < 0) {
			r = -errno;
			break;
		}
		for (size_t i = 0, len = 0; r == 0 && i < (size_t)n;) {
			size_t j = i;
			/* the run of differing blocks from i (none when i's is the same) */
			while (j < (size_t)n) {
				len = (size_t)n - j < TC_REFRESH_BLOCK ? (size_t)n - j : TC_REFRESH_BLOCK;
				if (j + len <= (size_t)m && !memcmp(a + j, b + j, len))
					break;
				j += len;
			}
			if (j > i && !write) {
				*ret_written += j - i; /* compare only: a difference is enough */
				off = size;
				break;
			}
			if (j > i) {
				ssize_t w = pwrite(out, a + i, j - i, off + (off_t)i);
				if (w != (ssize_t)(j - i))
					r = w < 0 ? -errno : -EIO;
				*ret_written += j - i;
				i = j;
			} else {
				i += len;
			}
		}
		if (off < size)
			off += n;
	}
	if (map != MAP_FAILED)
		munmap(map, (size_t)have);
	return r;
}

/* update: whether dst's copy of a suspect whose index entry matches still
 * holds src's data (a write through a mapping may have changed it with no
 * new ctime). An error counts as a difference: the file is copied again. */
bool treecopy_same_data(int sfd, int dfd, const char *name, const struct stat *st)
{
	_cleanup_close_ int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOATIME);
	if (in < 0 && errno == EPERM)
		in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_close_ int out = in < 0 ? -1 : openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	uint64_t differ = 1;
	if (out >= 0 && st->st_size == 0)
		return true;
	return out >= 0 && treecopy_refresh_data(in, out, st->st_size, false, &differ) == 0 && differ == 0;
}

/* The same xattr names and values on (afd, a) and (bfd, b). */
bool treecopy_same_xattrs(int afd, const char *a, int bfd, const char *b)
{
	static __thread char la[XATTR_LIST_BUF], lb[XATTR_LIST_BUF], va[XATTR_VALUE_BUF], vb[XATTR_VALUE_BUF];
	struct xattr_ref xa, xb;
	xattr_ref_init(&xa, -1, afd, a);
	xattr_ref_init(&xb, -1, bfd, b);
	ssize_t na = xattr_list(&xa, la, sizeof(la)), nb = xattr_list(&xb, lb, sizeof(lb));
	if (na < 0 || nb < 0 || na != nb)
		return na < 0 && nb < 0; /* no xattrs on this filesystem */
	for (char *k = la; k < la + na; k += strlen(k) + 1) {
		ssize_t x = xattr_get(&xa, k, va, sizeof(va)), y = xattr_get(&xb, k, vb, sizeof(vb));
		if (x < 0 || x != y || memcmp(va, vb, x) != 0)
			return false;
	}
	return true;
}
