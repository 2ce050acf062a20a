/* test_walk_hooks.c: whole-tree walks whose fail hooks once took any
 * failure as "leave it out" now fail on one that says nothing about the
 * tree: the overlay delta's list of directories a full layer holds
 * (overlay_delta_dirs_read), its times pass (overlay_delta_dir_meta), a
 * tracked layer update's metadata pass (treecopy_update_dirs), the scan
 * of a directory new since the last layer, a layer's record
 * (overlay_record_write), the inotify tracker's scan, and the overlay and
 * tar track checks (overlay_check_layer, tar_create_check). Out of fds:
 * in a child whose fd limit is lowered below what a deep tree needs; a
 * read or stat error: readdir or fstatat interposed in this binary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "backend/change_track_internal.h"
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/treecopy.h"
#include "backend/tar/tar_create.h"
#include "testlib.h"
#include "testlib_readdir.h"

#define DEPTH 60

/* fstatat as the code calls it: the real one, save that a stat of the
 * name st_fail fails with EIO. */
static const char *st_fail;

int fstatat(int fd, const char *restrict name, struct stat *restrict st, int flags)
{
	static int (*real)(int, const char *restrict, struct stat *restrict, int);
	if (!real)
		real = (int (*)(int, const char *restrict, struct stat *restrict, int))dlsym(RTLD_NEXT, "fstatat");
	if (st_fail && !strcmp(name, st_fail)) {
		errno = EIO;
		return -1;
	}
	return real(fd, name, st, flags);
}

static char dir[TESTLIB_DIR_LEN];

static int setup(void **state)
{
	(void)state;
	return testlib_mkdir(dir, "walkhooks");
}

static int teardown(void **state)
{
	(void)state;
	testlib_rmdir(dir);
	return 0;
}

/* name below dir, DEPTH directories deep ("name/d/d/..."); its fd. */
static int deep_tree(const char *name)
{
	char p[TESTLIB_DIR_LEN + 16 + 2 * DEPTH];
	int n = snprintf(p, sizeof(p), "%s/%s", dir, name);
	assert_int_equal(mkdir(p, 0755), 0);
	for (int i = 0; i < DEPTH; i++) {
		n += snprintf(p + n, sizeof(p) - (size_t)n, "/d");
		assert_int_equal(mkdir(p, 0755), 0);
	}
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static int fds_open(void)
{
	int n = -1; /* opendir's own */
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 2; /* . and .. */
}

/* In a child allowed `spare` fds more than it has: fn's answer, or 100+ on
 * a failure of the child itself. */
static int with_fds(int spare, int (*fn)(void *), void *arg)
{
	pid_t pid = fork();
	if (pid == 0) {
		struct rlimit rl;
		if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
			_exit(100);
		rl.rlim_cur = (rlim_t)(fds_open() + 3 + spare); /* 0, 1, 2 below the count too */
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			_exit(101);
		int r = fn(arg);
		_exit(r == -EMFILE ? 0 : r == 0 ? 1 : 2);
	}
	int status;
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

static int dirs_read(void *arg)
{
	struct ovl_delta_dirs d = { 0 };
	int r = overlay_delta_dirs_read(*(int *)arg, &d);
	overlay_delta_dirs_free(&d);
	return r;
}

/* Every directory of a full layer is listed, or the read fails: a
 * directory left out (it used to be, out of fds) is one whose chmod the
 * next deltas would not see. With fds enough, all DEPTH + 1 are listed. */
static void test_dirs_read_out_of_fds(void **state)
{
	(void)state;
	int fd = deep_tree("layer");
	assert_true(fd >= 0);
	assert_int_equal(with_fds(DEPTH / 2, dirs_read, &fd), 0);
	struct ovl_delta_dirs d = { 0 };
	assert_int_equal(overlay_delta_dirs_read(fd, &d), 0);
	assert_int_equal(d.n, DEPTH + 1);
	overlay_delta_dirs_free(&d);
	close(fd);
}

struct times_arg {
	int up, dst;
};

static int dir_meta(void *arg)
{
	struct times_arg *a = arg;
	struct ovl_delta_dirs dirs = { 0 };
	struct treecopy_stats st = { 0 };
	ckpt_error err = { 0 };
	struct ovl_delta_opts o = { .up = a->up, .n_prev = 1 };
	int r = overlay_delta_dir_meta(&o, a->dst, &dirs, &st, &err);
	return r == -EAGAIN ? -EMFILE : r; /* the upper's twin not opened: a full layer, no loss either */
}

/* The times pass gives every directory of the delta its twin's times in
 * the upper, or fails: a directory it cannot open (out of fds) used to
 * keep the create's times, and the create succeeded. Each level takes two
 * fds (the delta's and the upper's): both parities of the limit are
 * tried, so the walk's own open is the one refused in one of them. */
static void test_dir_meta_out_of_fds(void **state)
{
	(void)state;
	struct times_arg a = { deep_tree("up"), deep_tree("delta") };
	assert_true(a.up >= 0 && a.dst >= 0);
	assert_int_equal(with_fds(DEPTH / 2, dir_meta, &a), 0);
	assert_int_equal(with_fds(DEPTH / 2 + 1, dir_meta, &a), 0);
	/* with fds enough, the deepest directory takes the upper's times */
	struct timespec ts[2] = { { 1000000000, 0 }, { 1000000000, 0 } };
	char p[2 * DEPTH + 1] = "";
	for (int i = 0; i < DEPTH; i++)
		strcat(p, i ? "/d" : "d");
	assert_int_equal(utimensat(a.up, p, ts, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(dir_meta(&a), 0);
	struct stat s;
	assert_int_equal(fstatat(a.dst, p, &s, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(s.st_mtim.tv_sec, 1000000000);
	close(a.up);
	close(a.dst);
}

static int update_dirs(void *arg)
{
	struct times_arg *a = arg;
	struct treecopy_opts o = { 0 };
	ckpt_error err = { 0 };
	int r = treecopy_update_dirs(a->up, a->dst, NULL, 0, &o, NULL, &err);
	return r == -EAGAIN ? -EMFILE : r; /* dst's twin not opened: the full walk decides, no loss */
}

/* A tracked update of a full layer ends with every directory's own
 * metadata from the upper. A directory it could not open (out of fds) was
 * left with its subtree as it was, and the update succeeded: a chmod of
 * it, or below, was lost. Both parities of the limit, as above. */
static void test_update_dirs_out_of_fds(void **state)
{
	(void)state;
	struct times_arg a = { deep_tree("up"), deep_tree("layer") };
	assert_true(a.up >= 0 && a.dst >= 0);
	char p[2 * DEPTH + 1] = "";
	for (int i = 0; i < DEPTH; i++)
		strcat(p, i ? "/d" : "d");
	assert_int_equal(fchmodat(a.up, p, 0700, 0), 0);
	assert_int_equal(with_fds(DEPTH / 2, update_dirs, &a), 0);
	assert_int_equal(with_fds(DEPTH / 2 + 1, update_dirs, &a), 0);
	assert_int_equal(update_dirs(&a), 0); /* with fds enough, the chmod is taken */
	struct stat s;
	assert_int_equal(fstatat(a.dst, p, &s, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(s.st_mode & 07777, 0700);
	close(a.up);
	close(a.dst);
}

/* A directory new since the last layer is scanned (its files into dix,
 * its directories into dirs) before it is copied whole. A read error in
 * the scan ended the listing quietly: the delta was made, and dirs lacked
 * the directories below, whose chmod the next deltas would not see. It now
 * makes a full layer (-EAGAIN). */
static void test_delta_new_dir_read_error(void **state)
{
	(void)state;
	int up = deep_tree("up"), prev = deep_tree("prev"), dst = deep_tree("dst");
	assert_true(up >= 0 && prev >= 0 && dst >= 0);
	assert_int_equal(mkdirat(up, "new", 0755), 0);
	assert_int_equal(mkdirat(up, "new/sub", 0755), 0);
	struct ovl_delta_dirs dirs = { 0 };
	_cleanup_(pathindex_freep) struct pathindex *ix = pathindex_new(), *dix = pathindex_new();
	struct ovl_delta_opts o = { .up = up, .prev = &prev, .n_prev = 1, .ix = ix, .dix = dix, .dirs = &dirs };
	struct pathindex_dirty dirty = { .path = "new", .deep = true };
	struct treecopy_stats st = { 0 };
	ckpt_error err = { 0 };
	rd_fail = 1; /* the scan's first read: "new" */
	assert_int_equal(overlay_delta_dirs(&o, dst, &dirty, 1, &st, &err), -EAGAIN);
	assert_int_equal(rd_fail, 0);
	overlay_delta_dirs_free(&dirs);
	assert_int_equal(overlay_delta_dirs(&o, dst, &dirty, 1, &st, &err), 0);
	assert_int_equal(dirs.n, 2); /* new and new/sub */
	overlay_delta_dirs_free(&dirs);
	close(up);
	close(prev);
	close(dst);
}

/* A layer's record lists every entry the layer holds: a read error used
 * to end a listing quietly, and the record written lacked those entries
 * (every later verify would report them). Now the write fails. */
static void test_record_read_error(void **state)
{
	(void)state;
	char p[TESTLIB_DIR_LEN + 8];
	snprintf(p, sizeof(p), "%s/rec", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	struct ovl_root r = { .rdir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) };
	int layer = deep_tree("layer");
	assert_true(r.rdir_fd >= 0 && layer >= 0);
	rd_fail = 1; /* the layer's top */
	assert_int_equal(overlay_record_write(&r, layer, "L", false), -EIO);
	assert_int_equal(faccessat(r.rdir_fd, "rec/L", F_OK, 0), -1);
	assert_int_equal(overlay_record_write(&r, layer, "L", false), 0);
	close(layer);
	close(r.rdir_fd);
}

/* The inotify tracker watches every directory it scans: a read error
 * used to end a listing quietly, and arming succeeded with the directories
 * below unwatched, their changes never seen. Now arming fails (tracking
 * is given up: every create reads the whole tree). */
static void test_inotify_scan_read_error(void **state)
{
	(void)state;
	char p[TESTLIB_DIR_LEN + 8];
	snprintf(p, sizeof(p), "%s/root", dir);
	struct chg_track t = { .fan = -1, .upper = deep_tree("root"), .path = p, .len = strlen(p) };
	assert_true(t.upper >= 0);
	rd_fail = 1; /* the root's listing */
	assert_int_equal(chg_inotify_arm(&t), -EIO);
	chg_inotify_free(t.ino);
	t.ino = NULL;
	assert_int_equal(chg_inotify_arm(&t), 0);
	chg_inotify_free(t.ino);
	close(t.upper);
}

/* The overlay track check took any failed stat as "missing on that side":
 * the difference was then excused (here: no tracker, every difference is),
 * or, failing on both sides, the name was never compared; the check
 * passed. A stat's EIO now fails the check. */
static void test_overlay_check_stat_error(void **state)
{
	(void)state;
	struct ovl_root r = { .path = dir, .trk = { .fan = -1 } };
	int up = deep_tree("up"), dst = deep_tree("layer");
	assert_true(up >= 0 && dst >= 0);
	ckpt_error err = { 0 };
	assert_int_equal(overlay_check_layer(&r, up, dst, &err), 0); /* differences, all excused */
	st_fail = "d";
	int q = overlay_check_layer(&r, up, dst, &err);
	st_fail = NULL;
	assert_int_equal(q, -EIO);
	close(up);
	close(dst);
}

struct check_arg {
	int root, out;
	struct timespec since;
};

static int tar_check(void *arg)
{
	struct check_arg *a = arg;
	struct tar_create_opts o = { 0 };
	ckpt_error err = { 0 };
	return tar_create_check(a->root, a->out, "m", &o, a->since, &err);
}

/* The tar track check compares every entry of the tree with the manifest
 * just written, or fails: a directory it could not open (out of fds) used
 * to be skipped with its subtree unchecked, and the check passed. */
static void test_tar_check_out_of_fds(void **state)
{
	(void)state;
	struct check_arg a = { .root = deep_tree("root") };
	char p[TESTLIB_DIR_LEN + 8];
	snprintf(p, sizeof(p), "%s/out", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	a.out = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(a.root >= 0 && a.out >= 0);
	struct tar_create_opts o = { 0 };
	ckpt_error err = { 0 };
	assert_int_equal(tar_create_root(a.root, a.out, "a", "m", &o, &err), 0);
	clock_gettime(CLOCK_REALTIME, &a.since);
	a.since.tv_sec += 10; /* every entry settled before it: each is compared */
	assert_int_equal(with_fds(DEPTH / 2, tar_check, &a), 0);
	assert_int_equal(tar_check(&a), 0); /* with fds enough: nothing missed */
	close(a.root);
	close(a.out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_dirs_read_out_of_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_meta_out_of_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_update_dirs_out_of_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tar_check_out_of_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_delta_new_dir_read_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_record_read_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inotify_scan_read_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_overlay_check_stat_error, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
