/* test_treecopy_update.c: the create's frozen pass updates its first pass in
 * place (treecopy_update). On a real overlay mount, random workloads run
 * between the first pass and the frozen one: creates, writes, appends,
 * truncates, unlinks, renames of files and dirs (across parents, over
 * others), hard links, symlinks, fifos, xattrs set and removed, chmod,
 * chown, utimes, writes through a mapping made before the first pass and
 * through new mappings. Each round checks that the updated layer equals
 * the upper and equals what the full walk (treecopy_copy linking from the
 * first pass) makes, hard-link groups included, and that the layer of the
 * round before, whose files the first pass links, is unchanged. A second
 * first pass, brought up to date by the tracked frozen pass (change_track:
 * fanotify on the upper's filesystem and /proc, then only the directories
 * that changed), must equal the upper too; a mapping is still held during
 * it in half the rounds. The first ten rounds make no hard links: there the
 * tracked pass may fall back to the walk once at most (later, a changed file
 * with other names makes it walk).
 * CKPTD_SEED=<n> repeats a run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>

#include "backend/change_track.h"
#include "backend/overlay/treecopy.h"
#include "lib/hash.h"
#include "lib/xattr.h"
#include "testlib.h"

static char dir[TESTLIB_DIR_LEN], mnt[TESTLIB_DIR_LEN + 8];
static unsigned long long rng, seed;
static bool no_links; /* rounds that make no hard link: the tracked pass then has no reason to walk */

static unsigned rnd(unsigned n)
{
	rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return n ? (unsigned)((rng >> 33) % n) : 0;
}

static int dir_fd(const char *name)
{
	char p[128];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	mkdir(p, 0755);
	return open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static void put_file(const char *path, size_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return;
	char b[512];
	for (size_t i = 0; i < sizeof(b); i++)
		b[i] = (char)rnd(256);
	for (size_t off = 0; off < size; off += sizeof(b))
		if (write(fd, b, size - off < sizeof(b) ? size - off : sizeof(b)) < 0)
			break;
	close(fd);
}

/* Entries of the merged view (relative paths), dirs apart. */
struct names {
	char p[512][256];
	size_t n;
	char d[128][256];
	size_t nd;
};

static void collect(const char *root, const char *rel, struct names *ns)
{
	char p[512];
	snprintf(p, sizeof(p), "%s%s%s", root, rel[0] ? "/" : "", rel);
	DIR *d = opendir(p);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		char r[512];
		snprintf(r, sizeof(r), "%s%s%s", rel, rel[0] ? "/" : "", de->d_name);
		if (strlen(r) >= 256)
			continue;
		if (de->d_type == DT_DIR) {
			if (ns->nd < 128)
				memcpy(ns->d[ns->nd++], r, strlen(r) + 1); /* < 256, checked above */
			if (strlen(r) < 120)
				collect(root, r, ns);
		} else if (ns->n < 512) {
			memcpy(ns->p[ns->n++], r, strlen(r) + 1);
		}
	}
	if (d)
		closedir(d);
}

static void at(char *out, const char *rel)
{
	snprintf(out, 512, "%s/%s", mnt, rel);
}

/* A dir of the view ("" is the top) and a new name in it. */
static void new_path(struct names *ns, char *out)
{
	unsigned k = rnd(ns->nd + 1);
	char rel[300];
	snprintf(rel, sizeof(rel), "%s%sn%u", k < ns->nd ? ns->d[k] : "", k < ns->nd ? "/" : "", rnd(100000));
	at(out, rel);
}

static void any_path(struct names *ns, char *out, bool dirs_too)
{
	unsigned n = ns->n + (dirs_too ? ns->nd : 0);
	if (!n) {
		at(out, "none");
		return;
	}
	unsigned k = rnd(n);
	at(out, k < ns->n ? ns->p[k] : ns->d[k - ns->n]);
}

static void one_op(struct names *ns, char *map, size_t map_len, int mfd)
{
	char a[512], b[512], v[16];
	int fd;
	switch (rnd(19)) {
	case 0:
		new_path(ns, a);
		put_file(a, rnd(3) ? rnd(3000) : rnd(100000));
		break;
	case 1: /* rewrite in place, size kept: only ctime tells */
		any_path(ns, a, false);
		if ((fd = open(a, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW)) >= 0) {
			char c = (char)rnd(256);
			if (pwrite(fd, &c, 1, rnd(4000)) < 0) {
			}
			close(fd);
		}
		break;
	case 2:
		any_path(ns, a, false);
		if ((fd = open(a, O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW)) >= 0) {
			if (write(fd, "appended", 8) < 0) {
			}
			close(fd);
		}
		break;
	case 3:
		any_path(ns, a, false);
		if (truncate(a, rnd(5000)) < 0) {
		}
		break;
	case 4:
		any_path(ns, a, false);
		unlink(a);
		break;
	case 5:
		new_path(ns, a);
		mkdir(a, 0700 | rnd(077));
		break;
	case 6:
		if (ns->nd && rnd(3) == 0) {
			at(a, ns->d[rnd(ns->nd)]);
			rm_rf_at(AT_FDCWD, a);
		}
		break;
	case 7: /* a file or dir to a new name, anywhere */
		any_path(ns, a, true);
		new_path(ns, b);
		rename(a, b);
		break;
	case 8: /* over an existing name */
		any_path(ns, a, true);
		any_path(ns, b, true);
		rename(a, b);
		break;
	case 9:
		any_path(ns, a, false);
		new_path(ns, b);
		if (!no_links && link(a, b) < 0) {
		}
		break;
	case 10:
		new_path(ns, a);
		if (symlink(rnd(2) ? "target" : "../x/y", a) < 0) {
		}
		break;
	case 11:
		any_path(ns, a, true);
		snprintf(v, sizeof(v), "v%u", rnd(1000));
		setxattr(a, rnd(2) ? "user.a" : "user.b", v, strlen(v), 0);
		break;
	case 12:
		any_path(ns, a, true);
		removexattr(a, rnd(2) ? "user.a" : "user.b");
		break;
	case 13:
		any_path(ns, a, true);
		chmod(a, 0700 | rnd(0100));
		break;
	case 14:
		any_path(ns, a, true);
		if (lchown(a, rnd(3) * 1000, rnd(3) * 1000) < 0) {
		}
		break;
	case 15: {
		any_path(ns, a, true);
		struct timespec ts[2] = { { rnd(100000), rnd(1000) }, { rnd(100000), rnd(1000) } };
		utimensat(AT_FDCWD, a, ts, AT_SYMLINK_NOFOLLOW);
		break;
	}
	case 16:           /* through the mapping made before the first pass */
		if (map) { /* within the file's size now (truncates meanwhile) */
			struct stat st;
			size_t k = rnd(map_len);
			if (fstat(mfd, &st) == 0 && (off_t)k < st.st_size)
				map[k] = (char)rnd(256);
		}
		break;
	case 17: /* a new mapping, written, unmapped */
		any_path(ns, a, false);
		if ((fd = open(a, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW)) >= 0) {
			struct stat st;
			if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
				char *m = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
				if (m != MAP_FAILED) {
					m[rnd(st.st_size)] ^= 1;
					munmap(m, st.st_size);
				}
			}
			close(fd);
		}
		break;
	case 18:
		new_path(ns, a);
		mkfifo(a, 0600);
		break;
	}
}

/* One line per entry, sorted walk: type, mode, owner, size, mtime, rdev,
 * symlink target, xattrs, content hash, and the first path of its inode
 * (hard-link groups). */
struct desc {
	char *buf;
	size_t len, cap;
	struct {
		ino_t ino;
		char path[256];
	} seen[2048];
	size_t n_seen;
};

static void addf(struct desc *d, const char *fmt, ...)
{
	va_list ap;
	char line[4096];
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (d->len + n + 1 > d->cap) {
		d->cap = (d->len + n + 1) * 2;
		d->buf = realloc(d->buf, d->cap);
		assert_non_null(d->buf);
	}
	memcpy(d->buf + d->len, line, n + 1);
	d->len += n;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void describe_entry(struct desc *d, int dfd, const char *name, const char *rel);

static void describe_dir(struct desc *d, int fd, const char *rel)
{
	int dup_fd = dup(fd);
	DIR *dd = fdopendir(dup_fd);
	assert_non_null(dd);
	char *names[1024] = { 0 };
	size_t n = 0;
	struct dirent *de;
	while ((de = readdir(dd)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && n < 1024)
			names[n++] = strdup(de->d_name);
	closedir(dd);
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		char r[512];
		snprintf(r, sizeof(r), "%s%s%s", rel, rel[0] ? "/" : "", names[i]);
		describe_entry(d, fd, names[i], r);
		free(names[i]);
	}
}

static void describe_entry(struct desc *d, int dfd, const char *name, const char *rel)
{
	struct stat st;
	assert_int_equal(fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW), 0);
	addf(d, "%s %o %u:%u %lld %lld.%09ld %llx", rel[0] ? rel : ".", st.st_mode, st.st_uid, st.st_gid,
	     S_ISDIR(st.st_mode) ? 0LL : (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
	     (unsigned long long)st.st_rdev);
	struct xattr_ref x;
	char list[4096], val[1024];
	xattr_ref_init(&x, -1, dfd, name);
	ssize_t n = xattr_list(&x, list, sizeof(list));
	char *keys[64] = { 0 };
	size_t nk = 0;
	for (char *k = list; n > 0 && k < list + n && nk < 64; k += strlen(k) + 1)
		keys[nk++] = k;
	qsort(keys, nk, sizeof(*keys), cmp_str);
	for (size_t i = 0; i < nk; i++) {
		ssize_t v = xattr_get(&x, keys[i], val, sizeof(val));
		addf(d, " %s=%llx", keys[i], (unsigned long long)hash_fnv64(HASH_FNV64_INIT, val, v < 0 ? 0 : v));
	}
	if (S_ISLNK(st.st_mode)) {
		char t[512];
		ssize_t k = readlinkat(dfd, name, t, sizeof(t) - 1);
		t[k < 0 ? 0 : k] = 0;
		addf(d, " -> %s", t);
	} else if (S_ISREG(st.st_mode)) {
		int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
		assert_true(fd >= 0);
		uint64_t h = HASH_FNV64_INIT;
		char b[65536];
		ssize_t k;
		while ((k = read(fd, b, sizeof(b))) > 0)
			h = hash_fnv64(h, b, k);
		close(fd);
		const char *first = rel;
		for (size_t i = 0; i < d->n_seen; i++)
			if (d->seen[i].ino == st.st_ino)
				first = d->seen[i].path;
		if (first == rel && d->n_seen < 2048) {
			d->seen[d->n_seen].ino = st.st_ino;
			snprintf(d->seen[d->n_seen++].path, 256, "%s", rel);
		}
		addf(d, " data=%llx group=%s", (unsigned long long)h, first);
	}
	addf(d, "\n");
	if (S_ISDIR(st.st_mode)) {
		int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		assert_true(sub >= 0);
		describe_dir(d, sub, rel);
		close(sub);
	}
}

static char *describe(int fd)
{
	struct desc *d = calloc(1, sizeof(*d));
	assert_non_null(d);
	describe_entry(d, fd, ".", "");
	char *s = d->buf;
	free(d);
	return s;
}

static void assert_same(const char *what, const char *a, const char *b, unsigned round)
{
	if (!strcmp(a, b))
		return;
	size_t i = 0, line = 0;
	while (a[i] && a[i] == b[i])
		i++;
	while (i > 0 && a[i - 1] != '\n')
		i--;
	for (size_t k = 0; k < i; k++)
		line += a[k] == '\n';
	fail_msg("round %u (CKPTD_SEED=%llu): %s differ at line %zu:\n  %.*s\n  %.*s", round, seed, what, line,
		 (int)strcspn(a + i, "\n"), a + i, (int)strcspn(b + i, "\n"), b + i);
}

static void populate_lower(void)
{
	char p[256];
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof(p), "%s/lower/d%d", dir, i);
		mkdir(p, 0755);
		snprintf(p, sizeof(p), "%s/lower/d%d/sub", dir, i);
		mkdir(p, 0755);
		for (int j = 0; j < 6; j++) {
			snprintf(p, sizeof(p), "%s/lower/d%d/f%d", dir, i, j);
			put_file(p, rnd(6000));
			snprintf(p, sizeof(p), "%s/lower/d%d/sub/g%d", dir, i, j);
			put_file(p, rnd(3000));
		}
	}
	snprintf(p, sizeof(p), "%s/lower/top", dir);
	put_file(p, 100);
	setxattr(p, "user.a", "lower", 5, 0);
}

/* The tracked frozen pass on tpre, as overlay_create_frozen_pass does it; false when
 * it had to walk instead. */
static bool tracked_pass(struct chg_track *trk, int upper, int tpre, const struct pathindex *tpre_ix,
			 struct treecopy_dirs *dirs, bool must)
{
	struct stat mst;
	struct pathindex_dirty *dirty = NULL;
	size_t n = 0;
	const char *why = NULL;
	ckpt_error err = { 0 };
	assert_int_equal(stat(mnt, &mst), 0);
	int q = chg_track_collect(trk, mnt, mst.st_dev, &dirty, &n, &why);
	if (q == 0) {
		struct pathindex *tix = pathindex_copy(tpre_ix);
		struct treecopy_opts to = {
			.prev_fd = -1, .prev_ix = tpre_ix, .new_ix = tix, .dirs = dirs, .suspects = trk->suspects
		};
		q = treecopy_update_dirs(upper, tpre, dirty, n, &to, NULL, &err);
		pathindex_free(tix);
		if (q < 0 && q != -EAGAIN)
			fail_msg("tracked pass: %s", err.msg);
	} else {
		assert_int_equal(q, -EAGAIN);
		assert_non_null(why);
	}
	pathindex_dirty_free(dirty, n);
	if (q == 0)
		return true;
	if (must) /* counted: the test allows one such round (a file gone mid-way) */
		print_message("a round without hard links walked: %s\n",
			      why ? why : "a hard link, or a directory no event explains");
	struct pathindex *fix = pathindex_new();
	assert_int_equal(chg_scan_mapped(mnt, mst.st_dev, false, &trk->suspects, &why), 0);
	struct treecopy_opts fo = { .prev_fd = -1, .prev_ix = tpre_ix, .new_ix = fix, .suspects = trk->suspects };
	if (treecopy_update(upper, tpre, &fo, NULL, &err) < 0)
		fail_msg("walk after the tracked pass gave up: %s", err.msg);
	pathindex_free(fix);
	return false;
}

/* The create's second pass (overlay_create_catch_up): what the tracker names so far
 * brought up to date in tpre, not frozen; where it cannot tell, the whole
 * upper compared. *tpre_ix becomes the index after it. */
static void catch_up(struct chg_track *trk, int upper, int tpre, struct pathindex **tpre_ix, struct treecopy_dirs *dirs)
{
	struct stat mst;
	struct pathindex_dirty *dirty = NULL;
	size_t n = 0;
	const char *why = NULL;
	ckpt_error err = { 0 };
	assert_int_equal(stat(mnt, &mst), 0);
	struct pathindex *nix = pathindex_copy(*tpre_ix);
	int q = chg_track_collect(trk, mnt, mst.st_dev, &dirty, &n, &why);
	if (q == 0) {
		struct treecopy_opts o = {
			.prev_fd = -1, .prev_ix = *tpre_ix, .new_ix = nix, .dirs = dirs, .suspects = trk->suspects
		};
		q = treecopy_update_dirs(upper, tpre, dirty, n, &o, NULL, &err);
		if (q < 0 && q != -EAGAIN)
			fail_msg("second pass: %s", err.msg);
	}
	pathindex_dirty_free(dirty, n);
	if (q == -EAGAIN) {
		pathindex_free(nix);
		nix = pathindex_new();
		assert_int_equal(chg_scan_mapped(mnt, mst.st_dev, false, &trk->suspects, &why), 0);
		struct treecopy_opts o = {
			.prev_fd = -1, .prev_ix = *tpre_ix, .new_ix = nix, .suspects = trk->suspects
		};
		if (treecopy_update(upper, tpre, &o, NULL, &err) < 0)
			fail_msg("second pass walking: %s", err.msg);
	}
	pathindex_free(*tpre_ix);
	*tpre_ix = nix;
	assert_int_equal(syncfs(tpre), 0); /* as overlay_create_precopy_root: a mapping's next write faults */
}

static void test_update_equals_full_walk(void **state)
{
	(void)state;
	const char *s = getenv("CKPTD_SEED");
	rng = seed = s ? strtoull(s, NULL, 10) : (unsigned long long)time(NULL);
	print_message("CKPTD_SEED=%llu\n", seed);
	assert_int_equal(testlib_mkdir(dir, "tcupdate"), 0);
	int lower = dir_fd("lower"), upper = dir_fd("upper"), work = dir_fd("work");
	assert_true(lower >= 0 && upper >= 0 && work >= 0);
	populate_lower();
	snprintf(mnt, sizeof(mnt), "%s/m", dir);
	mkdir(mnt, 0755);
	char opts[512];
	snprintf(opts, sizeof(opts),
		 "lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work,index=off,redirect_dir=on,metacopy=off,xino=off",
		 dir, dir, dir);
	assert_int_equal(mount("overlay", mnt, "overlay", 0, opts), 0);

	struct pathindex *ix = NULL; /* the last layer's index, as r->ix */
	int prev = -1;
	char *prev_desc = NULL;
	unsigned tracked = 0, no_link_rounds = 0;
	uint64_t refreshed = 0;
	for (unsigned round = 0; round < 30; round++) {
		no_links = round < 10; /* no hard link exists yet: no reason to walk */
		no_link_rounds += no_links;
		struct names *ns = calloc(1, sizeof(*ns));
		assert_non_null(ns);
		collect(mnt, "", ns);
		/* a writable shared mapping that lives across the first pass */
		char *map = NULL, a[512];
		size_t map_len = 0;
		any_path(ns, a, false);
		int mfd = open(a, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
		struct stat st;
		if (mfd >= 0 && fstat(mfd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
			map = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
			map_len = st.st_size;
			if (map == MAP_FAILED)
				map = NULL;
			else
				map[0] ^= 1;
		}
		for (unsigned i = rnd(8); i > 0; i--) /* before the first pass */
			one_op(ns, map, map_len, mfd);

		char name[32];
		snprintf(name, sizeof(name), "pre%u", round);
		int pre = dir_fd(name);
		struct pathindex *pre_ix = pathindex_new();
		struct treecopy_opts o = { .mode = TREECOPY_NEW, .prev_fd = prev, .prev_ix = ix, .new_ix = pre_ix };
		ckpt_error err = { 0 };
		struct chg_track trk = CHG_TRACK_INIT; /* armed before the first pass, as overlay_create_precopy_root */
		assert_int_equal(chg_track_arm(&trk, upper), 0);
		assert_int_equal(treecopy_copy(upper, pre, &o, NULL, &err), 0);
		snprintf(name, sizeof(name), "tpre%u", round);
		int tpre = dir_fd(name);
		struct pathindex *tpre_ix = pathindex_new();
		/* the directories of the first pass, checked by path in odd rounds
		 * (as overlay_create_frozen_pass does), found by reading them in even ones */
		struct treecopy_dirs tdirs = { 0 };
		struct treecopy_opts to = {
			.mode = TREECOPY_NEW, .prev_fd = prev, .prev_ix = ix, .new_ix = tpre_ix, .dirs = &tdirs
		};
		assert_int_equal(treecopy_copy(upper, tpre, &to, NULL, &err), 0);
		assert_true(tdirs.n >= 1 && !strcmp(tdirs.v[0], "")); /* the top first */
		assert_int_equal(syncfs(pre), 0);                     /* as overlay_create_precopy_root */
		/* the events so far read before the workload (as overlay_create_precopy_root
		 * does), and in some rounds again halfway through it: what they
		 * named may be renamed or removed after being read */
		if (round % 3)
			chg_track_drain(&trk);

		unsigned n_ops = round % 5 == 0 ? 0 : 1 + rnd(60);
		for (unsigned i = 0; i < n_ops; i++) {
			if (round % 3 == 1 && i == n_ops / 2)
				chg_track_drain(&trk);
			if (round % 4 == 3 && i == n_ops / 3) /* a second pass, as after a long first one */
				catch_up(&trk, upper, tpre, &tpre_ix, round % 2 ? &tdirs : NULL);
			if (i % 8 == 0) {
				memset(ns, 0, sizeof(*ns));
				collect(mnt, "", ns);
			}
			one_op(ns, map, map_len, mfd);
		}
		bool held = round % 2 == 0; /* the mapping outlives the frozen pass */
		if (map && !held)
			munmap(map, map_len);
		if (mfd >= 0 && !held)
			close(mfd);
		free(ns);

		/* the full walk, linking from the first pass; then the update */
		snprintf(name, sizeof(name), "full%u", round);
		int full = dir_fd(name);
		struct pathindex *full_ix = pathindex_new(), *upd_ix = pathindex_new();
		struct treecopy_opts fo = { .mode = TREECOPY_NEW, .prev_fd = pre, .prev_ix = pre_ix, .new_ix = full_ix };
		assert_int_equal(treecopy_copy(upper, full, &fo, NULL, &err), 0);
		struct treecopy_opts uo = { .prev_fd = -1, .prev_ix = pre_ix, .new_ix = upd_ix };
		struct treecopy_stats stats = { 0 };
		int q = treecopy_update(upper, pre, &uo, &stats, &err);
		if (q < 0)
			fail_msg("round %u: update: %s", round, err.msg);
		refreshed += stats.refreshed;

		tracked += tracked_pass(&trk, upper, tpre, tpre_ix, round % 2 ? &tdirs : NULL, no_links);
		treecopy_dirs_free(&tdirs);
		chg_track_disarm(&trk);
		if (map && held)
			munmap(map, map_len);
		if (mfd >= 0 && held)
			close(mfd);

		char *du = describe(upper), *df = describe(full), *dp = describe(pre), *dt = describe(tpre);
		assert_same("upper and updated layer", du, dp, round);
		assert_same("full walk and updated layer", df, dp, round);
		assert_same("upper and the tracked pass's layer", du, dt, round);
		free(dt);
		pathindex_free(tpre_ix);
		close(tpre);
		assert_int_equal(pathindex_count(full_ix), pathindex_count(upd_ix));
		if (prev >= 0) { /* the first pass linked its files: never changed */
			char *again = describe(prev);
			assert_same("previous layer", prev_desc, again, round);
			free(again);
		}
		free(prev_desc);
		prev_desc = dp;
		free(du);
		free(df);
		pathindex_free(full_ix);
		pathindex_free(pre_ix);
		pathindex_free(ix);
		ix = upd_ix;
		if (prev >= 0)
			close(prev);
		prev = pre;
		close(full);
	}
	print_message(
		"tracked frozen passes: %u of 30 rounds (%u without hard links); files refreshed in place: %llu\n",
		tracked, no_link_rounds, (unsigned long long)refreshed);
	assert_true(refreshed > 0);                 /* the in-place path was compared with the full walk */
	assert_true(tracked + 1 >= no_link_rounds); /* it walked where it need not */
	free(prev_desc);
	pathindex_free(ix);
	close(prev);
	close(lower);
	close(upper);
	close(work);
}

/* A fresh overlay at mnt over populate_lower's tree (seeded with s), in
 * test dir name; its upper, work and lower dirs open in fds[0..2]. */
static void mount_small_overlay(const char *name, unsigned long long s, int fds[3])
{
	rng = seed = s;
	assert_int_equal(testlib_mkdir(dir, name), 0);
	fds[0] = dir_fd("upper"), fds[1] = dir_fd("work"), fds[2] = dir_fd("lower");
	assert_true(fds[0] >= 0 && fds[1] >= 0 && fds[2] >= 0);
	populate_lower();
	snprintf(mnt, sizeof(mnt), "%s/m", dir);
	mkdir(mnt, 0755);
	char opts[512];
	snprintf(opts, sizeof(opts), "lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work,redirect_dir=on", dir, dir,
		 dir);
	assert_int_equal(mount("overlay", mnt, "overlay", 0, opts), 0);
}

/* The write no event reports: through a shared mapping held across the
 * frozen pass, into a file whose directory nothing else touches. The /proc
 * scan must name that directory, and the tracked pass copy the new bytes. */
static void test_tracked_pass_sees_a_held_mapping(void **state)
{
	(void)state;
	int fds[3];
	mount_small_overlay("tcmap", 1, fds);
	int upper = fds[0], work = fds[1], lower = fds[2];
	char p[600];
	snprintf(p, sizeof(p), "%s/d2/sub/g1", mnt);
	int fd = open(p, O_RDWR | O_CLOEXEC); /* copied up now, before the first pass */
	assert_true(fd >= 0);
	char *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(map != MAP_FAILED);
	map[0] = 'a';

	struct chg_track trk = CHG_TRACK_INIT;
	assert_int_equal(chg_track_arm(&trk, upper), 0);
	int pre = dir_fd("pre");
	struct pathindex *pre_ix = pathindex_new();
	struct treecopy_opts o = { .mode = TREECOPY_NEW, .prev_fd = -1, .new_ix = pre_ix };
	ckpt_error err = { 0 };
	assert_int_equal(treecopy_copy(upper, pre, &o, NULL, &err), 0);
	assert_int_equal(syncfs(pre), 0); /* cleans the page: the next write faults */
	char want[2] = { 'a', (char)(map[1] ^ 0x5a) };
	map[1] = want[1]; /* no event */
	assert_true(tracked_pass(&trk, upper, pre, pre_ix, NULL, true));
	char got[2];
	snprintf(p, sizeof(p), "%s/pre/d2/sub/g1", dir);
	int c = open(p, O_RDONLY | O_CLOEXEC);
	assert_true(c >= 0);
	assert_int_equal(read(c, got, 2), 2);
	assert_memory_equal(got, want, 2);
	close(c);
	munmap(map, 4096);
	close(fd);
	chg_track_disarm(&trk);
	pathindex_free(pre_ix);
	close(pre);
	close(upper);
	close(work);
	close(lower);
}

/* A rename refused with ENOTEMPTY still copies the lower directory up, and
 * the upper's directories change under it: the tracked pass, its directory
 * metadata checked from the first pass's list, must leave the layer equal
 * to the upper. */
static void test_tracked_pass_after_a_refused_rename(void **state)
{
	(void)state;
	int fds[3];
	mount_small_overlay("tcren", 2, fds);
	int upper = fds[0];
	char a[600], b[600];
	snprintf(b, sizeof(b), "%s/full/x", mnt);
	assert_int_equal(mkdir_p(b, 0755), 0);
	snprintf(b, sizeof(b), "%s/full/x/f", mnt);
	put_file(b, 10);
	usleep(20 * 1000); /* a later mtime is a different one */

	struct chg_track trk = CHG_TRACK_INIT;
	assert_int_equal(chg_track_arm(&trk, upper), 0);
	int pre = dir_fd("pre");
	struct pathindex *pre_ix = pathindex_new();
	struct treecopy_dirs dirs = { 0 };
	struct treecopy_opts o = { .mode = TREECOPY_NEW, .prev_fd = -1, .new_ix = pre_ix, .dirs = &dirs };
	ckpt_error err = { 0 };
	assert_int_equal(treecopy_copy(upper, pre, &o, NULL, &err), 0);
	assert_int_equal(syncfs(pre), 0);
	chg_track_drain(&trk);
	for (int i = 0; i < 4; i++) { /* lower dirs, and an upper one, onto a full one */
		snprintf(a, sizeof(a), "%s/d%d%s", mnt, i, i == 3 ? "/sub" : "");
		snprintf(b, sizeof(b), "%s/full", mnt);
		assert_int_equal(rename(a, b), -1);
		assert_true(errno == ENOTEMPTY || errno == EEXIST);
	}
	assert_true(tracked_pass(&trk, upper, pre, pre_ix, &dirs, true));
	char *du = describe(upper), *dp = describe(pre);
	assert_same("upper and the tracked pass's layer", du, dp, 0);
	free(du);
	free(dp);
	snprintf(b, sizeof(b), "%s/m", dir);
	umount2(b, MNT_DETACH);
	treecopy_dirs_free(&dirs);
	chg_track_disarm(&trk);
	pathindex_free(pre_ix);
	close(pre);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
}

static void write_at(const char *rel, off_t off, const void *buf, size_t n, int flags)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | flags, 0644);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, buf, n, off), (ssize_t)n);
	close(fd);
}

static struct stat stat_of(const char *rel)
{
	char p[600];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	assert_int_equal(lstat(p, &st), 0);
	return st;
}

static uint64_t hash_of(const char *rel)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	uint64_t h = 1469598103934665603ULL;
	char b[65536];
	ssize_t n;
	while ((n = read(fd, b, sizeof(b))) > 0)
		for (ssize_t i = 0; i < n; i++)
			h = (h ^ (unsigned char)b[i]) * 1099511628211ULL;
	close(fd);
	return h;
}

/* The frozen pass rewrites a big file of the first pass in place, only
 * where it differs (a log appended to, a block rewritten, a shrink), and
 * takes src's xattrs and mode; a file the first pass linked from the
 * previous layer, or a sparse one, is copied anew, the previous layer
 * unchanged and the holes kept. */
static void test_update_refreshes_changed_blocks(void **state)
{
	(void)state;
	rng = seed = 3;
	assert_int_equal(testlib_mkdir(dir, "tcrefresh"), 0);
	int src = dir_fd("src"), prev = dir_fd("prev"), pre = dir_fd("pre");
	assert_true(src >= 0 && prev >= 0 && pre >= 0);
	static char mb[1 << 20];
	for (size_t i = 0; i < sizeof(mb); i++)
		mb[i] = (char)rnd(256);
	for (int i = 0; i < 3; i++)
		write_at("src/big", (off_t)i << 20, mb, sizeof(mb), 0);
	write_at("src/shrunk", 0, mb, sizeof(mb), 0);
	write_at("src/shrunk", 1 << 20, mb, sizeof(mb), 0);
	write_at("src/linked", 0, mb, sizeof(mb), 0);
	char p[600];
	snprintf(p, sizeof(p), "%s/src/big", dir);
	assert_int_equal(setxattr(p, "user.a", "1", 1, 0), 0);

	/* prev: every file; pre (the first pass) links linked from it and
	 * copies the others, changed since (sparse is new) */
	ckpt_error err = { 0 };
	struct pathindex *prev_ix = pathindex_new(), *pre_ix = pathindex_new();
	struct treecopy_opts o = { .mode = TREECOPY_NEW, .prev_fd = -1, .new_ix = prev_ix };
	assert_int_equal(treecopy_copy(src, prev, &o, NULL, &err), 0);
	write_at("src/big", 0, "B", 1, 0);
	write_at("src/shrunk", 0, "S", 1, 0);
	write_at("src/sparse", 2 << 20, "tail", 4, 0);
	struct treecopy_opts po = { .mode = TREECOPY_NEW, .prev_fd = prev, .prev_ix = prev_ix, .new_ix = pre_ix };
	struct treecopy_stats ps = { 0 };
	assert_int_equal(treecopy_copy(src, pre, &po, &ps, &err), 0);
	assert_int_equal(ps.linked, 1);
	struct stat big0 = stat_of("pre/big"), shrunk0 = stat_of("pre/shrunk"), linked0 = stat_of("pre/linked");
	uint64_t prev_linked = hash_of("prev/linked");

	/* the workload during the first pass */
	write_at("src/big", (3 << 20) + 10, "0123456789", 10, 0); /* appended past a gap of 10 bytes */
	write_at("src/big", (1 << 20) + 5000, "x", 1, 0);         /* one byte in the second block of MiB 1 */
	assert_int_equal(removexattr(p, "user.a"), 0);
	assert_int_equal(setxattr(p, "user.b", "2", 1, 0), 0);
	assert_int_equal(chmod(p, 0600), 0);
	snprintf(p, sizeof(p), "%s/src/shrunk", dir);
	assert_int_equal(truncate(p, (1 << 20) - 100), 0);
	write_at("src/linked", 7, "L", 1, 0);
	write_at("src/sparse", 0, "head", 4, 0);

	struct pathindex *ix = pathindex_new();
	struct treecopy_opts uo = { .prev_fd = -1, .prev_ix = pre_ix, .new_ix = ix };
	struct treecopy_stats st = { 0 };
	assert_int_equal(treecopy_update(src, pre, &uo, &st, &err), 0);

	assert_int_equal(st.refreshed, 2); /* big and shrunk */
	assert_int_equal(stat_of("pre/big").st_ino, big0.st_ino);
	assert_int_equal(stat_of("pre/shrunk").st_ino, shrunk0.st_ino);
	/* linked: a copy of its own now (an inode number can come back) */
	assert_int_equal(linked0.st_nlink, 2);
	assert_int_equal(stat_of("pre/linked").st_nlink, 1);
	assert_int_equal(stat_of("prev/linked").st_nlink, 1);
	/* big: its block at 1 MiB + 4 KiB, and the blocks from 3 MiB (20
	 * bytes); linked: all of it; sparse: its data, not its hole */
	uint64_t sparse_data = (uint64_t)stat_of("pre/sparse").st_blocks * 512;
	assert_true(sparse_data < (1 << 20));
	assert_in_range(st.bytes_copied, 4096 + 20 + (1 << 20), 4096 + 20 + (1 << 20) + sparse_data);
	const char *names[] = { "big", "shrunk", "linked", "sparse" };
	for (size_t i = 0; i < 4; i++) {
		char a[64], b[64];
		snprintf(a, sizeof(a), "src/%s", names[i]);
		snprintf(b, sizeof(b), "pre/%s", names[i]);
		struct stat sa = stat_of(a), sb = stat_of(b);
		assert_int_equal(sa.st_size, sb.st_size);
		assert_int_equal(sa.st_mode, sb.st_mode);
		assert_int_equal(sa.st_mtim.tv_nsec, sb.st_mtim.tv_nsec);
		assert_true(hash_of(a) == hash_of(b));
		assert_true(pathindex_match(ix, names[i], &sa));
	}
	assert_true(hash_of("prev/linked") == prev_linked);
	char v[8];
	snprintf(p, sizeof(p), "%s/pre/big", dir);
	assert_int_equal(getxattr(p, "user.a", v, sizeof(v)), -1);
	assert_int_equal(getxattr(p, "user.b", v, sizeof(v)), 1);
	pathindex_free(ix);
	pathindex_free(pre_ix);
	pathindex_free(prev_ix);
	close(src);
	close(prev);
	close(pre);
}

/* A write through a shared mapping into a page already dirty makes no fault,
 * so no new ctime: one that lands after a pass copied the file and before
 * the syncfs that follows leaves inode, size and ctime as the index has
 * them. The next pass must compare such a file's data: one still mapped
 * (the /proc scan names it) and one unmapped and closed since (its
 * CLOSE_WRITE), with tracking; one still mapped without; and the index
 * records them untrusted, so a later copy does not link them. */
static void test_silent_mapped_writes_are_compared(void **state)
{
	(void)state;
	int fds[3];
	mount_small_overlay("tcsilent", 4, fds);
	int upper = fds[0];
	for (int tracked = 1; tracked >= 0; tracked--) {
		char p[2][600], name[16];
		int fd[2];
		char *map[2];
		for (int i = 0; i < 2; i++) {
			snprintf(p[i], sizeof(p[i]), "%s/d%d/mapped%d", mnt, i, tracked);
			put_file(p[i], 8192);
			fd[i] = open(p[i], O_RDWR | O_CLOEXEC);
			assert_true(fd[i] >= 0);
			map[i] = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd[i], 0);
			assert_true(map[i] != MAP_FAILED);
			map[i][0] ^= 1; /* the page is dirty and writable from now on */
		}
		struct chg_track trk = CHG_TRACK_INIT;
		if (tracked)
			assert_int_equal(chg_track_arm(&trk, upper), 0);
		int pre = -1;
		struct pathindex *pre_ix = NULL;
		ckpt_error err = { 0 };
		char rel[64];
		struct stat st;
		snprintf(rel, sizeof(rel), "d0/mapped%d", tracked);
		/* The second write is silent only if the page stayed dirty since
		 * the first: writeback the kernel starts meanwhile (other writers
		 * on the machine) cleans it, and the write then faults and sets a
		 * new ctime. Tried again with the page dirtied again: the case
		 * under test must happen, not be assumed. */
		for (int attempt = 0;; attempt++) {
			snprintf(name, sizeof(name), "pre%d-%d", tracked, attempt);
			pre = dir_fd(name);
			pre_ix = pathindex_new();
			struct treecopy_opts o = { .mode = TREECOPY_NEW, .prev_fd = -1, .new_ix = pre_ix };
			assert_int_equal(treecopy_copy(upper, pre, &o, NULL, &err), 0);
			for (int i = 0; i < 2; i++)
				map[i][1] ^= 0x5a; /* no fault: no new ctime */
			assert_int_equal(fstatat(upper, rel, &st, 0), 0);
			if (pathindex_match(pre_ix, rel, &st))
				break; /* the write was silent */
			assert_true(attempt < 50);
			pathindex_free(pre_ix);
			close(pre);
			for (int i = 0; i < 2; i++)
				map[i][0] ^= 1; /* dirty again */
		}
		assert_int_equal(syncfs(pre), 0);
		if (tracked) {
			chg_track_drain(&trk);
			munmap(map[1], 8192); /* d1's: unmapped and closed, its CLOSE_WRITE */
			close(fd[1]);
			assert_true(tracked_pass(&trk, upper, pre, pre_ix, NULL, true));
		} else {
			struct stat mst;
			const char *why = NULL;
			struct pathindex *sus = NULL, *ix = pathindex_new();
			assert_int_equal(stat(mnt, &mst), 0);
			assert_int_equal(chg_scan_mapped(mnt, mst.st_dev, false, &sus, &why), 0);
			assert_true(pathindex_has(sus, rel));
			struct treecopy_opts uo = { .prev_fd = -1, .prev_ix = pre_ix, .new_ix = ix, .suspects = sus };
			assert_int_equal(treecopy_update(upper, pre, &uo, NULL, &err), 0);
			/* recorded untrusted: matched only as such */
			assert_false(pathindex_match(ix, rel, &st));
			assert_true(pathindex_match_untrusted(ix, rel, &st));
			/* and a copy linking from pre copies it rather than link it */
			int again = dir_fd("again");
			struct treecopy_opts co = { .mode = TREECOPY_NEW, .prev_fd = pre, .prev_ix = ix };
			assert_int_equal(treecopy_copy(upper, again, &co, NULL, &err), 0);
			struct stat a;
			char q[700];
			snprintf(q, sizeof(q), "%s/again/%s", dir, rel);
			assert_int_equal(stat(q, &a), 0);
			assert_int_equal(a.st_nlink, 1);
			close(again);
			pathindex_free(ix);
			pathindex_free(sus);
			munmap(map[1], 8192);
			close(fd[1]);
		}
		char *du = describe(upper), *dp = describe(pre);
		assert_same("upper and the pass's layer", du, dp, tracked);
		free(du);
		free(dp);
		munmap(map[0], 8192);
		close(fd[0]);
		chg_track_disarm(&trk);
		pathindex_free(pre_ix);
		close(pre);
	}
	for (int i = 0; i < 3; i++)
		close(fds[i]);
}

/* The child of one round: map p shared, no fd kept, write through the
 * mapping, say so, then unmap (its last reference: CLOSE_WRITE) at a
 * random moment after the parent's go, while the parent collects. */
static void collect_race_child(const char *p, int ready, int go, unsigned delay_us)
{
	int fd = open(p, O_RDWR | O_CLOEXEC);
	char *map = fd >= 0 ? mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
	if (fd >= 0)
		close(fd);
	char c = map == MAP_FAILED ? 'n' : 'y';
	if (map != MAP_FAILED)
		map[0] ^= 0x5a;
	if (write(ready, &c, 1) != 1 || read(go, &c, 1) != 1)
		_exit(1);
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do /* a spin, not a sleep: the moment is what is random */
		clock_gettime(CLOCK_MONOTONIC, &t);
	while ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 < delay_us);
	if (map != MAP_FAILED)
		munmap(map, 4096);
	_exit(0);
}

/* A file written through a shared mapping before a collect began, by a
 * process that is not frozen, and unmapped while the collect runs: the
 * /proc scan sees it mapped, or its CLOSE_WRITE is queued before the scan
 * ends and read after it. Read in the other order (the events, then /proc),
 * an unmap between the two is in neither, and some of these rounds, which
 * unmap at random moments of the collect, would miss the file (3 or 4 of
 * 24 did). Every other round scans on a thread (chg_track_scan_start).
 * One miss is allowed: the kernel queues CLOSE_WRITE when the unmapping
 * task returns to user space (its last fput is task work), after the
 * mapping left /proc; a task preempted in between is in neither, for a
 * moment (once in about 800 rounds on this loaded 2-vCPU VM). A frozen
 * task has none pending: the freezer stops it after its task work. */
static void test_collect_sees_a_mapping_gone_during_it(void **state)
{
	(void)state;
	int fds[3];
	mount_small_overlay("tcrace", 4, fds);
	char p[600];
	snprintf(p, sizeof(p), "%s/d1/sub/g2", mnt);
	int fd = open(p, O_RDWR | O_CLOEXEC); /* copied up now, before the tracker */
	assert_true(fd >= 0);
	close(fd);
	struct stat mst;
	assert_int_equal(stat(mnt, &mst), 0);
	struct chg_track trk = CHG_TRACK_INIT;
	trk.skip_self = true;
	assert_int_equal(chg_track_arm(&trk, fds[0]), 0);
	int missed = 0, rounds = 48;
	for (int i = 0; i < rounds; i++) {
		int ready[2], go[2];
		assert_int_equal(pipe(ready), 0);
		assert_int_equal(pipe(go), 0);
		unsigned delay = rnd(2000);
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0)
			collect_race_child(p, ready[1], go[0], delay);
		char c = 0;
		assert_int_equal(read(ready[0], &c, 1), 1);
		assert_int_equal(c, 'y');
		struct pathindex_dirty *dirty = NULL;
		size_t n = 0;
		const char *why = NULL;
		/* what came before (the copy-up, earlier rounds): not this round's */
		assert_int_equal(chg_track_collect_events(&trk, &dirty, &n, &why), 0);
		pathindex_dirty_free(dirty, n);
		assert_int_equal(write(go[1], "g", 1), 1);
		if (i % 2) { /* the scan on a thread of its own, as a delta's frozen pass has it */
			assert_int_equal(chg_track_scan_start(&trk, mnt, mst.st_dev), 0);
			assert_int_equal(chg_track_collect_scanned(&trk, &dirty, &n, &why), 0);
		} else {
			assert_int_equal(chg_track_collect(&trk, mnt, mst.st_dev, &dirty, &n, &why), 0);
		}
		int status;
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		missed += !pathindex_dirty_find(dirty, n, "d1/sub") || !pathindex_has(trk.suspects, "d1/sub/g2");
		pathindex_dirty_free(dirty, n);
		for (int k = 0; k < 2; k++)
			close(ready[k]), close(go[k]);
	}
	assert_in_range(missed, 0, 1);
	chg_track_disarm(&trk);
	snprintf(p, sizeof(p), "%s/m", dir);
	umount2(p, MNT_DETACH);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
}

/* Also after a failed check: no mount or tree left behind. */
static int teardown(void **state)
{
	(void)state;
	testlib_rmdir(dir);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_update_equals_full_walk, teardown),
		cmocka_unit_test_teardown(test_tracked_pass_after_a_refused_rename, teardown),
		cmocka_unit_test_teardown(test_tracked_pass_sees_a_held_mapping, teardown),
		cmocka_unit_test_teardown(test_update_refreshes_changed_blocks, teardown),
		cmocka_unit_test_teardown(test_silent_mapped_writes_are_compared, teardown),
		cmocka_unit_test_teardown(test_collect_sees_a_mapping_gone_during_it, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
