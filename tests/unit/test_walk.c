/* Unit tests of walk_tree (src/lib/walk.c), the one recursive walk: sorted
 * order, pre- and post-order, skip and stop, the depth bound, the path bound,
 * symlinks never followed, a directory it cannot read, a directory pre
 * opened; and of walk_merge, the walk of several trees' union. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "lib/util.h"
#include "lib/walk.h"
#include "testlib.h"
#include "testlib_readdir.h"

static char dir[TESTLIB_DIR_LEN];
static int dfd = -1;

/* What the hooks saw, one "pre path", "post path" or "fail path err" a line. */
struct seen {
	char log[4096];
	const char *skip; /* pre answers WALK_SKIP here */
	const char *stop; /* pre answers WALK_STOP here */
	int post_err;     /* the last e->err post saw that was not 0 */
	int fail_answer;  /* what fail answers */
	bool hook;        /* walk_as_nobody: with seen_fail */
};

static void seen_add(struct seen *s, const char *what, const char *path)
{
	size_t n = strlen(s->log);
	snprintf(s->log + n, sizeof(s->log) - n, "%s %s\n", what, path);
}

static int seen_pre(void *ctx, struct walk_entry *e)
{
	struct seen *s = ctx;
	seen_add(s, e->type == DT_LNK ? "link" : "pre", e->path);
	if (s->skip && !strcmp(e->path, s->skip))
		return WALK_SKIP;
	return s->stop && !strcmp(e->path, s->stop) ? WALK_STOP : 0;
}

static int seen_post(void *ctx, struct walk_entry *e)
{
	struct seen *s = ctx;
	assert_true(e->fd >= 0 || e->err < 0); /* -1: it could not be entered */
	if (e->err)
		s->post_err = e->err;
	seen_add(s, "post", e->path);
	return 0;
}

static int seen_fail(void *ctx, const struct walk_entry *e, int err)
{
	struct seen *s = ctx;
	char what[32];
	static const char *const steps[] = { "", "path", "stat", "depth", "open", "read" };
	snprintf(what, sizeof(what), "fail %s %d", steps[e->step], -err);
	seen_add(s, what, e->path);
	return s->fail_answer;
}

static void mk(const char *rel, bool is_dir)
{
	if (is_dir)
		assert_int_equal(mkdirat(dfd, rel, 0755), 0);
	else {
		int fd = openat(dfd, rel, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		assert_true(fd >= 0);
		close(fd);
	}
}

static int setup(void **state)
{
	(void)state;
	if (testlib_mkdir(dir, "walk") < 0 || (dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	close(dfd);
	testlib_rmdir(dir);
	return 0;
}

static int walk_seen(struct seen *s, unsigned flags, int max_depth)
{
	struct walk_opts o = { .flags = flags, .max_depth = max_depth, .pre = seen_pre, .post = seen_post, .ctx = s };
	return walk_tree(dfd, "t", &o);
}

/* t/{c/{z,y},a,b/} made out of order: sorted, each directory before its
 * contents and its post after them. */
static void test_walk_sorted_pre_post(void **state)
{
	(void)state;
	struct seen s = { 0 };
	mk("t", true), mk("t/c", true), mk("t/c/z", false), mk("t/c/y", false), mk("t/a", false), mk("t/b", true);
	assert_int_equal(walk_seen(&s, WALK_SORTED | WALK_STAT, 0), 0);
	assert_string_equal(s.log, "pre a\npre b\npost b\npre c\npre c/y\npre c/z\npost c\n");
	/* A prefix starts every path; WALK_DIRS leaves files out. */
	memset(&s, 0, sizeof(s));
	struct walk_opts o = { .flags = WALK_SORTED | WALK_DIRS, .prefix = "top", .pre = seen_pre, .ctx = &s };
	assert_int_equal(walk_tree(dfd, "t", &o), 0);
	assert_string_equal(s.log, "pre top/b\npre top/c\n");
}

/* WALK_SKIP keeps the walk out of one directory; WALK_STOP ends it, and the
 * posts of the directories it was in still run (to release). */
static void test_walk_skip_stop(void **state)
{
	(void)state;
	mk("t", true), mk("t/a", true), mk("t/a/x", false), mk("t/b", true), mk("t/b/y", false), mk("t/c", false);
	struct seen s = { .skip = "a" };
	assert_int_equal(walk_seen(&s, WALK_SORTED, 0), 0);
	assert_string_equal(s.log, "pre a\npre b\npre b/y\npost b\npre c\n");
	memset(&s, 0, sizeof(s));
	s.stop = "b/y";
	assert_int_equal(walk_seen(&s, WALK_SORTED, 0), WALK_STOP);
	assert_string_equal(s.log, "pre a\npre a/x\npost a\npre b\npre b/y\npost b\n");
	assert_int_equal(s.post_err, WALK_STOP);
}

/* Directories down to max_depth are listed; one deeper is -ELOOP, which a
 * fail hook may turn into skipping that directory. */
static void test_walk_depth(void **state)
{
	(void)state;
	mk("t", true), mk("t/d", true), mk("t/d/d", true), mk("t/d/d/d", true), mk("t/d/d/d/f", false);
	struct seen s = { 0 };
	assert_int_equal(walk_seen(&s, 0, 3), 0);
	assert_non_null(strstr(s.log, "pre d/d/d/f\n"));
	memset(&s, 0, sizeof(s));
	assert_int_equal(walk_seen(&s, 0, 2), -ELOOP);
	assert_null(strstr(s.log, "pre d/d/d/f"));
	assert_int_equal(s.post_err, -ELOOP);
	memset(&s, 0, sizeof(s));
	struct walk_opts o = { .max_depth = 2, .pre = seen_pre, .fail = seen_fail, .ctx = &s };
	assert_int_equal(walk_tree(dfd, "t", &o), 0);
	assert_string_equal(s.log, "pre d\npre d/d\npre d/d/d\nfail depth 40 d/d/d\n");
	/* The default bound is WALK_DEPTH_MAX: this shallow tree is within it. */
	memset(&s, 0, sizeof(s));
	assert_int_equal(walk_seen(&s, 0, 0), 0);
}

/* A path of path_max bytes or more fails with -ENAMETOOLONG. */
static void test_walk_path_max(void **state)
{
	(void)state;
	mk("t", true), mk("t/abc", true), mk("t/abc/defg", false);
	struct seen s = { 0 };
	struct walk_opts o = { .path_max = 8, .pre = seen_pre, .ctx = &s };
	assert_int_equal(walk_tree(dfd, "t", &o), -ENAMETOOLONG);
	assert_string_equal(s.log, "pre abc\n");
	o.path_max = 9; /* "abc/defg" and its NUL */
	assert_int_equal(walk_tree(dfd, "t", &o), 0);
}

/* A symlink to a directory is an entry, never entered; a root that is a
 * symlink is not opened. */
static void test_walk_symlink(void **state)
{
	(void)state;
	mk("t", true), mk("out", true), mk("out/secret", false);
	assert_int_equal(symlinkat("../out", dfd, "t/l"), 0);
	assert_int_equal(symlinkat("out", dfd, "lt"), 0);
	struct seen s = { 0 };
	assert_int_equal(walk_seen(&s, WALK_STAT, 0), 0);
	assert_string_equal(s.log, "link l\n");
	memset(&s, 0, sizeof(s));
	assert_int_equal(walk_seen(&s, 0, 0), 0); /* by d_type alone, too */
	assert_string_equal(s.log, "link l\n");
	struct walk_opts o = { .pre = seen_pre, .ctx = &s };
	assert_int_equal(walk_tree(dfd, "lt", &o), -ENOTDIR);
}

/* As an unprivileged user (a root walk reads any mode): a directory it may
 * not open fails the walk with -EACCES, its own post and its parent's still
 * run (to release), or it is skipped by a fail hook answering 0. The
 * child's exit code tells. */
static int walk_as_nobody(struct seen *s)
{
	pid_t pid = fork();
	if (pid == 0) {
		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(100);
		struct walk_opts o = { .flags = WALK_SORTED, .pre = seen_pre, .post = seen_post, .ctx = s };
		if (s->hook)
			o.fail = seen_fail;
		int r = walk_tree(dfd, "t", &o);
		if (o.fail && r == 0 && strstr(s->log, "fail open 13 a/locked\n") && strstr(s->log, "pre b\n"))
			_exit(0);
		_exit(r == -EACCES && strstr(s->log, "post a/locked\npost a\n") && !strstr(s->log, "pre b") ? 13 : 101);
	}
	int status;
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

static void test_walk_unreadable(void **state)
{
	(void)state;
	mk("t", true), mk("t/a", true), mk("t/a/locked", true), mk("t/a/locked/x", false), mk("t/b", false);
	assert_int_equal(fchmodat(dfd, "t/a/locked", 0, 0), 0);
	assert_int_equal(fchmodat(dfd, ".", 0755, 0), 0);
	struct seen s = { 0 };
	assert_int_equal(walk_as_nobody(&s), 13);
	memset(&s, 0, sizeof(s));
	s.hook = true;
	assert_int_equal(walk_as_nobody(&s), 0);
	assert_int_equal(fchmodat(dfd, "t/a/locked", 0700, 0), 0);
}

/* data set by a directory's pre reaches its entries through parent and its
 * own post; the root's comes from the options. */
static int data_pre(void *ctx, struct walk_entry *e)
{
	(void)ctx;
	assert_int_equal(e->dirfd, e->parent->fd);
	e->data = e->parent->data + 1;
	return 0;
}

static int data_post(void *ctx, struct walk_entry *e)
{
	int *max = ctx;
	assert_int_equal(e->data, e->depth + 10);
	if (e->data > *max)
		*max = (int)e->data;
	return 0;
}

static void test_walk_data(void **state)
{
	(void)state;
	mk("t", true), mk("t/a", true), mk("t/a/b", true);
	int max = 0;
	struct walk_opts o = { .data = 10, .pre = data_pre, .post = data_post, .ctx = &max };
	assert_int_equal(walk_tree(dfd, "t", &o), 0);
	assert_int_equal(max, 12);
	assert_int_equal(walk_tree(dfd, "missing", &o), -ENOENT);
}

/* pre may hand the walk a directory it opened itself: the walk reads
 * through that fd (post sees it) and closes it, also when pre skips. */
struct handed {
	int fd[8];
	size_t n;
};

static int handed_pre(void *ctx, struct walk_entry *e)
{
	struct handed *h = ctx;
	if (e->type != DT_DIR)
		return 0;
	e->fd = openat(e->dirfd, e->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(e->fd >= 0 && h->n < 8);
	h->fd[h->n++] = e->fd;
	return strcmp(e->name, "skip") ? 0 : WALK_SKIP;
}

static int handed_post(void *ctx, struct walk_entry *e)
{
	struct handed *h = ctx;
	assert_int_equal(e->fd, h->fd[0]); /* only "a" is entered: "skip" was skipped */
	return 0;
}

static void test_walk_handed_fd(void **state)
{
	(void)state;
	mk("t", true), mk("t/a", true), mk("t/a/skip", true), mk("t/a/skip/x", false);
	struct handed h = { 0 };
	struct walk_opts o = { .pre = handed_pre, .post = handed_post, .ctx = &h };
	assert_int_equal(walk_tree(dfd, "t", &o), 0);
	assert_int_equal(h.n, 2);
	for (size_t i = 0; i < h.n; i++)
		assert_int_equal(fcntl(h.fd[i], F_GETFD), -1); /* closed by the walk */
}

/* walk_merge: what the hooks saw, "pre HELD path" with HELD a letter per
 * tree (d, f, or - where it lacks the name), "post path", "fail step tree
 * err path". */
static int merge_pre(void *ctx, struct walk_merge_entry *e)
{
	struct seen *s = ctx;
	char what[32] = "pre ";
	for (size_t i = 0; i < e->n; i++)
		what[4 + i] = e->side[i].held ? (S_ISDIR(e->side[i].st.st_mode) ? 'd' : 'f') : '-';
	seen_add(s, what, e->path);
	if (s->skip && !strcmp(e->path, s->skip))
		e->side[0].descend = false; /* below it in the other trees only */
	return s->stop && !strcmp(e->path, s->stop) ? WALK_STOP : 0;
}

static int merge_post(void *ctx, struct walk_merge_entry *e)
{
	struct seen *s = ctx;
	if (e->err)
		s->post_err = e->err;
	seen_add(s, "post", e->path);
	return 0;
}

static int merge_fail(void *ctx, const struct walk_merge_entry *e, int err)
{
	struct seen *s = ctx;
	char what[48];
	static const char *const steps[] = { "", "path", "stat", "depth", "open", "read" };
	snprintf(what, sizeof(what), "fail %s %d %d", steps[e->step], e->tree, -err);
	seen_add(s, what, e->path);
	return s->fail_answer;
}

static int merge_roots(struct seen *s, const char *a, const char *b, int max_depth)
{
	int fds[2] = { a ? openat(dfd, a, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1,
		       b ? openat(dfd, b, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1 };
	struct walk_merge_opts o = {
		.max_depth = max_depth, .pre = merge_pre, .post = merge_post, .fail = merge_fail, .ctx = s
	};
	int r = walk_merge(fds, 2, &o);
	for (int i = 0; i < 2; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return r;
}

/* Each name once, in strcmp order, with the trees holding it; below a
 * name wherever it is a directory, and only there. */
static void test_walk_merge_union(void **state)
{
	(void)state;
	mk("A", true), mk("A/d", false), mk("A/b", true), mk("A/b/x", false), mk("A/a", false), mk("A/e", true);
	mk("A/e/in", false);
	mk("B", true), mk("B/c", false), mk("B/b", true), mk("B/b/y", false), mk("B/d", true), mk("B/d/z", false);
	mk("B/e", true), mk("B/e/in", false);
	struct seen s = { 0 };
	assert_int_equal(merge_roots(&s, "A", "B", 0), 0);
	assert_string_equal(s.log,
			    "pre f- a\npre dd b\npre f- b/x\npre -f b/y\npost b\npre -f c\n"
			    "pre fd d\npre -f d/z\npost d\npre dd e\npre ff e/in\npost e\n");
	/* pre leaves a tree out; WALK_STOP ends the walk, posts still run */
	memset(&s, 0, sizeof(s));
	s.skip = "b";
	s.stop = "d/z";
	assert_int_equal(merge_roots(&s, "A", "B", 0), WALK_STOP);
	assert_string_equal(s.log, "pre f- a\npre dd b\npre -f b/y\npost b\npre -f c\npre fd d\npre -f d/z\npost d\n");
	/* a tree without a root: the other alone */
	memset(&s, 0, sizeof(s));
	assert_int_equal(merge_roots(&s, NULL, "A", 0), 0);
	assert_string_equal(s.log, "pre -f a\npre -d b\npre -f b/x\npost b\npre -f d\npre -d e\npre -f e/in\npost e\n");
	/* the depth bound, as walk_tree's */
	memset(&s, 0, sizeof(s));
	assert_int_equal(merge_roots(&s, "A", "B", 1), 0);
	memset(&s, 0, sizeof(s));
	s.fail_answer = -ELOOP;
	mk("A/b/deep", true);
	assert_int_equal(merge_roots(&s, "A", "B", 1), -ELOOP);
	assert_non_null(strstr(s.log, "fail depth -1 40 b/deep\npost b/deep\npost b\n"));
	memset(&s, 0, sizeof(s));
	int fds[2] = { -1, -1 };
	struct walk_merge_opts o = { .pre = merge_pre, .ctx = &s };
	assert_int_equal(walk_merge(fds, 2, &o), 0);
	assert_string_equal(s.log, "");
}

/* Where a tree's directory cannot be opened, fail's 0 goes on without
 * that tree, WALK_SKIP skips the entry in all (its post runs with the
 * error); else the walk ends with fail's answer. As nobody, as
 * test_walk_unreadable. */
static void test_walk_merge_unreadable(void **state)
{
	(void)state;
	mk("A", true), mk("A/l", true), mk("A/l/x", false), mk("A/m", false);
	mk("B", true), mk("B/l", true), mk("B/l/y", false);
	assert_int_equal(fchmodat(dfd, "A/l", 0, 0), 0);
	assert_int_equal(fchmodat(dfd, ".", 0755, 0), 0);
	pid_t pid = fork();
	if (pid == 0) {
		struct seen s = { 0 };
		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(100);
		int r = merge_roots(&s, "A", "B", 0);
		if (r != 0 || strcmp(s.log, "pre dd l\nfail open 0 13 l\npre -f l/y\npost l\npre f- m\n"))
			_exit(101);
		memset(&s, 0, sizeof(s));
		s.fail_answer = WALK_SKIP;
		r = merge_roots(&s, "A", "B", 0);
		if (r != 0 || strcmp(s.log, "pre dd l\nfail open 0 13 l\npost l\npre f- m\n") || s.post_err != -EACCES)
			_exit(103);
		memset(&s, 0, sizeof(s));
		s.fail_answer = -EACCES;
		r = merge_roots(&s, "A", "B", 0);
		_exit(r == -EACCES && !strcmp(s.log, "pre dd l\nfail open 0 13 l\npost l\n") ? 0 : 102);
	}
	int status;
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(fchmodat(dfd, "A/l", 0700, 0), 0);
}

/* Open fds of this process: a walk that ends any way leaves none behind. */
static int fds_open(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	assert_non_null(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* A name too long for path_max: fail's 0 or WALK_SKIP skips that name
 * alone; the names after it in its directory are walked (WALK_SKIP used to
 * end the directory's listing there, and reach walk_merge's answer). The
 * longest name a directory holds (255 bytes) is walked as any other. */
static void test_walk_long_name_skip(void **state)
{
	(void)state;
	char lname[256], path[300];
	memset(lname, 'l', 255);
	lname[255] = '\0';
	mk("A", true), mk("A/a", false), mk("A/z", false), mk("B", true);
	snprintf(path, sizeof(path), "A/%s", lname);
	mk(path, false);
	snprintf(path, sizeof(path), "B/%s", lname);
	mk(path, true);
	struct seen s = { .fail_answer = WALK_SKIP };
	int fds[2] = { openat(dfd, "A", O_RDONLY | O_DIRECTORY | O_CLOEXEC),
		       openat(dfd, "B", O_RDONLY | O_DIRECTORY | O_CLOEXEC) };
	struct walk_merge_opts o = { .path_max = 100, .pre = merge_pre, .fail = merge_fail, .ctx = &s };
	int before = fds_open();
	assert_int_equal(walk_merge(fds, 2, &o), 0);
	assert_string_equal(s.log, "pre f- a\nfail path -1 36 \npre f- z\n");
	/* fail's error ends the walk there, every fd closed */
	memset(&s, 0, sizeof(s));
	s.fail_answer = -ENAMETOOLONG;
	assert_int_equal(walk_merge(fds, 2, &o), -ENAMETOOLONG);
	assert_string_equal(s.log, "pre f- a\nfail path -1 36 \n");
	assert_int_equal(fds_open(), before);
	memset(&s, 0, sizeof(s));
	o.path_max = 0; /* unbounded: the 255-byte name is one like any */
	assert_int_equal(walk_merge(fds, 2, &o), 0);
	snprintf(path, sizeof(path), "pre f- a\npre fd %s\npre f- z\n", lname);
	assert_string_equal(s.log, path);
	/* walk_tree the same */
	memset(&s, 0, sizeof(s));
	s.fail_answer = WALK_SKIP;
	struct walk_opts wo = { .flags = WALK_SORTED, .path_max = 100, .pre = seen_pre, .fail = seen_fail, .ctx = &s };
	assert_int_equal(walk_tree(dfd, "A", &wo), 0);
	assert_string_equal(s.log, "pre a\nfail path 36 \npre z\n");
	close(fds[0]);
	close(fds[1]);
}

/* A name listed, then gone before its stat (pre of an earlier name removes
 * it): fail at WALK_AT_STAT for that tree, whose 0 takes it as not held
 * there; held by no tree, it reaches no pre. A directory gone between its
 * stat and its open: fail at WALK_AT_OPEN with ENOENT. */
struct vanish {
	struct seen s;
	int fd[2];
};

static int vanish_pre(void *ctx, struct walk_merge_entry *e)
{
	struct vanish *v = ctx;
	if (!strcmp(e->path, "a")) {
		assert_int_equal(unlinkat(v->fd[0], "b", 0), 0);   /* in A only */
		assert_int_equal(unlinkat(v->fd[0], "c", 0), 0);   /* A's c; B keeps its own */
		assert_int_equal(unlinkat(v->fd[1], "d/x", 0), 0); /* d: emptied, then gone */
		assert_int_equal(unlinkat(v->fd[1], "d", AT_REMOVEDIR), 0);
	}
	return merge_pre(&v->s, e);
}

static int vanish_fail(void *ctx, const struct walk_merge_entry *e, int err)
{
	struct vanish *v = ctx;
	return merge_fail(&v->s, e, err);
}

static void test_walk_merge_vanished(void **state)
{
	(void)state;
	mk("A", true), mk("A/a", false), mk("A/b", false), mk("A/c", false);
	mk("B", true), mk("B/c", false), mk("B/d", true), mk("B/d/x", false);
	struct vanish v = { 0 };
	v.fd[0] = openat(dfd, "A", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	v.fd[1] = openat(dfd, "B", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct walk_merge_opts o = { .pre = vanish_pre, .post = merge_post, .fail = vanish_fail, .ctx = &v };
	int before = fds_open();
	assert_int_equal(walk_merge(v.fd, 2, &o), 0);
	assert_string_equal(v.s.log, "pre f- a\nfail stat 0 2 b\nfail stat 0 2 c\npre -f c\nfail stat 1 2 d\n");
	assert_int_equal(fds_open(), before);
	/* without a fail hook the race ends the walk, with its errno */
	mk("A/b", false);
	memset(&v.s, 0, sizeof(v.s));
	o.fail = NULL;
	mk("A/c", false), mk("B/d", true), mk("B/d/x", false);
	assert_int_equal(walk_merge(v.fd, 2, &o), -ENOENT);
	assert_int_equal(fds_open(), before);
	close(v.fd[0]);
	close(v.fd[1]);
}

/* A directory removed after its stat, before the walk opens it. */
static int gone_pre(void *ctx, struct walk_merge_entry *e)
{
	struct vanish *v = ctx;
	if (!strcmp(e->path, "d")) {
		assert_int_equal(unlinkat(e->side[0].dirfd, "d/x", 0), 0);
		assert_int_equal(unlinkat(e->side[0].dirfd, "d", AT_REMOVEDIR), 0);
	}
	return merge_pre(&v->s, e);
}

static void test_walk_merge_gone_before_open(void **state)
{
	(void)state;
	mk("A", true), mk("A/d", true), mk("A/d/x", false), mk("B", true), mk("B/d", true), mk("B/d/y", false);
	struct vanish v = { 0 };
	v.fd[0] = openat(dfd, "A", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	v.fd[1] = openat(dfd, "B", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct walk_merge_opts o = { .pre = gone_pre, .post = merge_post, .fail = vanish_fail, .ctx = &v };
	assert_int_equal(walk_merge(v.fd, 2, &o), 0);
	assert_string_equal(v.s.log, "pre dd d\nfail open 0 2 d\npre -f d/y\npost d\n");
	close(v.fd[0]);
	close(v.fd[1]);
}

/* Out of fds (EMFILE) deep in the trees: fail at WALK_AT_OPEN with EMFILE,
 * the walk ends with fail's answer, and every fd it opened is closed again
 * (post runs for each directory it was in). In a child, whose fd limit is
 * lowered. */
static void test_walk_merge_emfile(void **state)
{
	(void)state;
	char path[512] = "A";
	mk("A", true), mk("B", true);
	for (int i = 0; i < 40; i++) {
		strcat(path, "/d");
		mk(path, true);
		path[0] = 'B';
		mk(path, true);
		path[0] = 'A';
	}
	pid_t pid = fork();
	if (pid == 0) {
		struct seen s = { .fail_answer = -EMFILE };
		int fds[2] = { openat(dfd, "A", O_RDONLY | O_DIRECTORY | O_CLOEXEC),
			       openat(dfd, "B", O_RDONLY | O_DIRECTORY | O_CLOEXEC) };
		int before = fds_open() - 1; /* opendir's own in fds_open */
		struct rlimit rl, was;
		if (getrlimit(RLIMIT_NOFILE, &was) < 0)
			_exit(100);
		rl = was;
		rl.rlim_cur = (rlim_t)before + 40; /* the trees need 2 a level, 80 */
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			_exit(100);
		struct walk_merge_opts o = { .pre = merge_pre, .post = merge_post, .fail = merge_fail, .ctx = &s };
		int r = walk_merge(fds, 2, &o);
		setrlimit(RLIMIT_NOFILE, &was);
		if (r != -EMFILE || !strstr(s.log, "fail open") || !strstr(s.log, " 24 d/d/d"))
			_exit(101);
		if (s.post_err != -EMFILE && s.post_err != -ENOMEM)
			_exit(102);
		_exit(fds_open() - 1 == before ? 0 : 103);
	}
	int status;
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* The names a merge walk gives, checked in order as they come. */
struct order {
	char last[32];
	int n, bad;
	char held[300][2];
};

static int order_pre(void *ctx, struct walk_merge_entry *e)
{
	struct order *o = ctx;
	int k = atoi(e->name + 1);
	if ((o->n && strcmp(o->last, e->name) >= 0) || k < 0 || k >= 300)
		o->bad++;
	else
		for (size_t i = 0; i < 2; i++)
			o->held[k][i] = e->side[i].held ? 'f' : '-';
	snprintf(o->last, sizeof(o->last), "%s", e->name);
	o->n++;
	return 0;
}

/* Many names, made in an order readdir does not keep: each tree's list is
 * sorted before the merge, each name comes once, in strcmp order. */
static void test_walk_merge_unsorted(void **state)
{
	(void)state;
	char name[32];
	mk("A", true), mk("B", true);
	for (int i = 0; i < 300; i++) {
		int k = (i * 7919) % 300; /* a scrambled order of making */
		snprintf(name, sizeof(name), "%c/n%03d", k % 3 == 0 ? 'A' : 'B', k);
		mk(name, false);
		if (k % 5 == 0) {
			name[0] = name[0] == 'A' ? 'B' : 'A';
			mk(name, false);
		}
	}
	struct order ord = { 0 };
	int fds[2] = { openat(dfd, "A", O_RDONLY | O_DIRECTORY | O_CLOEXEC),
		       openat(dfd, "B", O_RDONLY | O_DIRECTORY | O_CLOEXEC) };
	struct walk_merge_opts o = { .pre = order_pre, .ctx = &ord };
	assert_int_equal(walk_merge(fds, 2, &o), 0);
	assert_int_equal(ord.bad, 0);
	assert_int_equal(ord.n, 300);
	for (int k = 0; k < 300; k++) {
		bool a = k % 3 == 0 || k % 5 == 0, b = k % 3 != 0 || k % 5 == 0;
		assert_int_equal(ord.held[k][0], a ? 'f' : '-');
		assert_int_equal(ord.held[k][1], b ? 'f' : '-');
	}
	close(fds[0]);
	close(fds[1]);
}

/* A name readdir gives twice reaches the hooks once: walk_merge's "each
 * name once", and walk_tree's sorted order (it came twice before). */
static void test_walk_repeated_name(void **state)
{
	(void)state;
	mk("A", true), mk("A/a", false), mk("A/b", false), mk("A/c", false), mk("B", true), mk("B/b", false);
	struct seen s = { 0 };
	rd_twice = "b"; /* in A, read first */
	assert_int_equal(merge_roots(&s, "A", "B", 0), 0);
	assert_null(rd_twice);
	assert_string_equal(s.log, "pre f- a\npre ff b\npre f- c\n");
	memset(&s, 0, sizeof(s));
	rd_twice = "b";
	struct walk_opts o = { .flags = WALK_SORTED, .pre = seen_pre, .ctx = &s };
	assert_int_equal(walk_tree(dfd, "A", &o), 0);
	assert_null(rd_twice);
	assert_string_equal(s.log, "pre a\npre b\npre c\n");
}

/* A read error fail answers WALK_SKIP: that directory's entries are
 * skipped, its post sees the read error, and the walk goes on; at a root
 * the walk ends with 0 (walk_merge and walk_tree answered WALK_SKIP, 1,
 * and walk_tree's post saw 1 as the error). */
static void test_walk_read_error_skip(void **state)
{
	(void)state;
	mk("t", true), mk("t/a", true), mk("t/a/x", false), mk("t/b", false), mk("B", true), mk("B/y", false);
	struct seen s = { .fail_answer = WALK_SKIP };
	rd_fail = 1; /* the root of tree 0, t */
	assert_int_equal(merge_roots(&s, "t", "B", 0), 0);
	assert_string_equal(s.log, "fail read 0 5 \n");
	memset(&s, 0, sizeof(s));
	s.fail_answer = WALK_SKIP;
	rd_fail = 1;
	struct walk_opts o = { .pre = seen_pre, .post = seen_post, .fail = seen_fail, .ctx = &s };
	for (unsigned flags = 0; flags <= WALK_SORTED; flags += WALK_SORTED) { /* listed as read, or sorted */
		memset(&s, 0, sizeof(s));
		s.fail_answer = WALK_SKIP;
		o.flags = flags;
		rd_fail = 1;
		assert_int_equal(walk_tree(dfd, "t", &o), 0);
		assert_string_equal(s.log, "fail read 5 \n");
	}
	memset(&s, 0, sizeof(s));
	s.fail_answer = WALK_SKIP;
	o.flags = WALK_SORTED;
	rd_fail = 6; /* ., .., a, b and the end of t: then a's first */
	assert_int_equal(walk_tree(dfd, "t", &o), 0);
	assert_string_equal(s.log, "pre a\nfail read 5 a\npost a\npre b\n");
	assert_int_equal(s.post_err, -EIO);
	assert_int_equal(rd_fail, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_walk_sorted_pre_post, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_skip_stop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_depth, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_path_max, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_symlink, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_unreadable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_data, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_handed_fd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_merge_union, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_merge_unreadable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_long_name_skip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_merge_vanished, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_merge_gone_before_open, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_merge_emfile, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_merge_unsorted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_repeated_name, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_read_error_skip, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
