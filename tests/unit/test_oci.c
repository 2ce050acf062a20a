/* Unit tests of the registry code's pure parts: the pipe that makes a layer
 * on two threads (oci_pipe.c) and the tree of hard links a pull starts
 * from (oci_clone.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include "engine/oci_clone.h"
#include "engine/oci_pipe.h"
#include "testlib.h"

struct sink {
	unsigned char *got;
	size_t len, ends, fail_at;
};

static int sink_consume(void *ctx, const void *buf, size_t len, bool end)
{
	struct sink *s = ctx;
	if (end) {
		s->ends++;
		return 0;
	}
	if (s->fail_at && s->len + len >= s->fail_at)
		return -ENOSPC;
	memcpy(s->got + s->len, buf, len);
	s->len += len;
	return 0;
}

/* Blocks of every size, more than the pipe holds: all arrive, in order,
 * then one end. */
static void test_pipe_order(void **state)
{
	(void)state;
	size_t total = 0, cap = 8u << 20;
	unsigned char *want = malloc(cap);
	struct sink s = { .got = malloc(cap) };
	struct oci_pipe *p;
	for (size_t i = 0; i < cap; i++)
		want[i] = (unsigned char)(i * 7 + i / 251);
	assert_int_equal(oci_pipe_start(sink_consume, &s, &p), 0);
	for (size_t n = 1; total + n <= cap; n = n * 3 + 1) {
		assert_int_equal(oci_pipe_put(p, want + total, n), 0);
		total += n;
	}
	assert_int_equal(oci_pipe_finish(p, false), 0);
	assert_int_equal(s.len, total);
	assert_int_equal(s.ends, 1);
	assert_memory_equal(s.got, want, total);
	free(want);
	free(s.got);
}

/* The consumer's error reaches the producer and the finish; no end then. */
static void test_pipe_error_and_cancel(void **state)
{
	(void)state;
	static unsigned char block[64 * 1024];
	struct sink s = { .got = malloc(4u << 20), .fail_at = 1u << 20 };
	struct oci_pipe *p;
	int q = 0;
	assert_int_equal(oci_pipe_start(sink_consume, &s, &p), 0);
	for (size_t i = 0; i < 64 && q == 0; i++)
		q = oci_pipe_put(p, block, sizeof(block));
	assert_int_equal(q, -ENOSPC);
	assert_int_equal(oci_pipe_finish(p, false), -ENOSPC);
	assert_int_equal(s.ends, 0);

	struct sink c = { .got = s.got };
	assert_int_equal(oci_pipe_start(sink_consume, &c, &p), 0);
	assert_int_equal(oci_pipe_put(p, block, sizeof(block)), 0);
	assert_int_equal(oci_pipe_finish(p, true), 0);
	assert_int_equal(c.ends, 0); /* cancelled: no end */
	free(s.got);
}

/* Files linked, the rest made anew with the same metadata, the top's too. */
static void test_clone(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN], src[128], dst[128], p[256];
	struct stat a, b;
	assert_int_equal(testlib_mkdir(dir, "oci-clone"), 0);
	snprintf(src, sizeof(src), "%s/src", dir);
	snprintf(dst, sizeof(dst), "%s/dst", dir);
	assert_int_equal(mkdir(src, 0750), 0);
	assert_int_equal(mkdir(dst, 0700), 0);
	snprintf(p, sizeof(p), "%s/sub", src);
	assert_int_equal(mkdir(p, 0711), 0);
	snprintf(p, sizeof(p), "%s/sub/f", src);
	int f = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
	assert_true(f >= 0 && write(f, "data", 4) == 4);
	close(f);
	assert_int_equal(setxattr(p, "user.k", "v", 1, 0), 0);
	snprintf(p, sizeof(p), "%s/link", src);
	assert_int_equal(symlink("sub/f", p), 0);
	snprintf(p, sizeof(p), "%s/fifo", src);
	assert_int_equal(mkfifo(p, 0600), 0);
	snprintf(p, sizeof(p), "%s/sub", src);
	struct timespec ts[2] = { { 1000, 5 }, { 2000, 7 } };
	assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);

	int fd = open(dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ckpt_error err = { 0 };
	assert_int_equal(oci_clone_tree(src, fd, &err), 0);
	close(fd);

	snprintf(p, sizeof(p), "%s/sub/f", src);
	assert_int_equal(stat(p, &a), 0);
	snprintf(p, sizeof(p), "%s/sub/f", dst);
	assert_int_equal(stat(p, &b), 0);
	assert_true(a.st_ino == b.st_ino && b.st_nlink == 2); /* linked */
	char v[8];
	assert_int_equal(getxattr(p, "user.k", v, sizeof(v)), 1);
	snprintf(p, sizeof(p), "%s/sub", dst);
	assert_int_equal(stat(p, &b), 0);
	assert_int_equal(b.st_mode & 07777, 0711);
	assert_true(b.st_mtim.tv_sec == 2000 && b.st_mtim.tv_nsec == 7);
	assert_int_equal(stat(dst, &b), 0);
	assert_int_equal(b.st_mode & 07777, 0750);
	snprintf(p, sizeof(p), "%s/link", dst);
	char t[32] = "";
	assert_int_equal(readlink(p, t, sizeof(t) - 1), 5);
	assert_string_equal(t, "sub/f");
	snprintf(p, sizeof(p), "%s/fifo", dst);
	assert_int_equal(lstat(p, &b), 0);
	assert_true(S_ISFIFO(b.st_mode));
	testlib_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pipe_order),
		cmocka_unit_test(test_pipe_error_and_cancel),
		cmocka_unit_test(test_clone),
	};
	return cmocka_run_group_tests_name("oci", tests, NULL, NULL);
}
