/* Unit tests of validation and small helpers in util.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "lib/util.h"
#include "lib/walk.h"
#include "testlib.h"

static void test_name_valid(void **state)
{
	(void)state;
	char long_ok[129], long_bad[130];
	memset(long_ok, 'a', 128), long_ok[128] = '\0';
	memset(long_bad, 'a', 129), long_bad[129] = '\0';
	assert_true(name_valid("baseline"));
	assert_true(name_valid("step 1: install deps"));
	assert_true(name_valid("ünïcödé ✓"));
	assert_true(name_valid(long_ok));
	assert_false(name_valid(long_bad));
	assert_false(name_valid(""));
	assert_false(name_valid(NULL));
	assert_false(name_valid("tab\there"));
	assert_false(name_valid("nl\n"));
	assert_false(name_valid("del\x7f"));
	assert_false(name_valid("bad utf8 \xff"));
	assert_false(name_valid("overlong \xc0\xaf"));
	assert_false(name_valid("c1 \xc2\x85"));
	assert_false(name_valid("cut \xe2\x82"));
	/* strictly valid UTF-8 only (issue 13), as jansson takes it */
	assert_true(name_valid("\xed\x9f\xbf \xee\x80\x80 \xf4\x8f\xbf\xbf \xf0\x90\x80\x80"));
	assert_false(name_valid("surrogate \xed\xa0\x80"));
	assert_false(name_valid("surrogate \xed\xb7\xa9"));
	assert_false(name_valid("overlong3 \xe0\x80\xaf"));
	assert_false(name_valid("overlong3 \xe0\x9f\xbf"));
	assert_false(name_valid("overlong4 \xf0\x8f\xbf\xbf"));
	assert_false(name_valid("too big \xf4\x90\x80\x80"));
	assert_false(name_valid("too big \xf5\x80\x80\x80"));
	assert_false(name_valid("lone continuation \x80"));
	assert_false(name_valid("cut4 \xf0\x90\x80"));
}

static void test_utf8_valid(void **state)
{
	(void)state;
	assert_true(utf8_valid("", 0));
	assert_true(utf8_valid("a\0b", 3)); /* NUL is valid UTF-8; callers refuse controls */
	assert_true(utf8_valid("\xf0\x9f\x98\x80", 4));
	assert_false(utf8_valid("\xf0\x9f\x98\x80", 3)); /* cut by the length, not read past it */
	assert_false(utf8_valid("\xed\xb7\xa9", 3));
	assert_false(utf8_valid("\xc0\xaf", 2));
	assert_false(utf8_valid("\xff", 1));
	assert_false(utf8_valid("\xf4\x90\x80\x80", 4));
}

static void test_id(void **state)
{
	(void)state;
	char a[32], b[32];
	assert_int_equal(id_generate(a, sizeof(a)), 0);
	assert_int_equal(id_generate(b, sizeof(b)), 0);
	assert_true(id_valid(a));
	assert_true(id_valid(b));
	assert_string_not_equal(a, b);
	assert_false(id_valid("cp_../../etc/passwd000000"));
	assert_false(id_valid("cp_ABCDEF0123456789abcdef01"));
	assert_false(id_valid("xx_0123456789abcdef01234567"));
	assert_false(id_valid("cp_0123"));
	assert_false(id_valid(NULL));
	assert_int_equal(id_generate(a, 10), -EINVAL);
}

static void test_rfc3339(void **state)
{
	(void)state;
	char buf[40];
	assert_string_equal(fmt_rfc3339_ms(0, buf, sizeof(buf)), "1970-01-01T00:00:00.000Z");
	assert_string_equal(fmt_rfc3339_ms(1795000000123LL, buf, sizeof(buf)), "2026-11-18T11:06:40.123Z");
}

static void test_secure_streq(void **state)
{
	(void)state;
	assert_true(secure_streq("token", "token"));
	assert_false(secure_streq("token", "tokem"));
	assert_false(secure_streq("token", "token2"));
	assert_false(secure_streq("", "x"));
	assert_true(secure_streq("", ""));
}

static void test_errors(void **state)
{
	(void)state;
	ckpt_error err = { 0 };
	assert_int_equal(err_set(&err, ENOENT, "not_found", "no %s", "thing"), -ENOENT);
	assert_int_equal(err.errnum, ENOENT);
	assert_string_equal(err.code, "not_found");
	assert_int_equal(err_prefix(&err, "while %s", "reading"), -ENOENT);
	assert_string_equal(err.msg, "while reading: no thing");
	assert_int_equal(err_set(NULL, -EIO, NULL, "x"), -EIO);
	assert_int_equal(err_set(&err, 0, NULL, "zero"), -EIO);
}

static void test_atomic_write(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN];
	assert_int_equal(testlib_mkdir(dir, "util"), 0);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	char *buf = NULL;
	size_t len;
	assert_int_equal(write_file_atomic(dfd, "rec.json", "{\"a\":1}", 7, 0600), 0);
	assert_int_equal(write_file_atomic(dfd, "rec.json", "{\"a\":2}", 7, 0600), 0);
	assert_int_equal(read_file_at(dfd, "rec.json", 100, &buf, &len), 0);
	assert_string_equal(buf, "{\"a\":2}");
	free(buf);
	assert_int_equal(read_file_at(dfd, "rec.json", 3, &buf, &len), -EFBIG);
	assert_int_equal(read_file_at(dfd, "missing", 3, &buf, &len), -ENOENT);
	/* No temp file left behind. */
	DIR *d;
	int n = 0;
	assert_int_equal(walk_open(dfd, NULL, &d), 0);
	while (walk_next(d))
		n++;
	closedir(d);
	assert_int_equal(n, 1);
	assert_int_equal(mkdirat(dfd, "tree", 0700), 0);
	assert_int_equal(mkdirat(dfd, "tree/sub", 0700), 0);
	int sub = openat(dfd, "tree/sub", O_RDONLY | O_DIRECTORY);
	assert_int_equal(write_file_atomic(sub, "f", "x", 1, 0600), 0);
	close(sub);
	assert_int_equal(symlinkat("/etc", dfd, "tree/link"), 0);
	assert_int_equal(rm_rf_at(dfd, "tree"), 0);
	assert_int_equal(faccessat(dfd, "tree", F_OK, AT_SYMLINK_NOFOLLOW), -1);
	assert_int_equal(access("/etc/passwd", F_OK), 0);
	/* What a killed writer leaves is swept; look-alikes stay. */
	static const char *const temps[] = { ".rec.json.tmp.0123abcd", ".live.json.tmp.deadbeef" };
	static const char *const keep[] = { ".rec.json.tmp.0123abc", "rec.tmp.0123abcd", ".x.tmp.0123ABCD" };
	for (size_t i = 0; i < 2; i++)
		close(openat(dfd, temps[i], O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	for (size_t i = 0; i < 3; i++)
		close(openat(dfd, keep[i], O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	assert_int_equal(write_file_atomic_sweep(dfd), 2);
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(unlinkat(dfd, keep[i], 0), 0);
	assert_int_equal(rm_rf_at(dfd, "rec.json"), 0);
	close(dfd);
	assert_int_equal(rmdir(dir), 0);
}

/* write_file_atomic in two steps: staged, the temp file holds the data
 * under a name the sweep knows, and name is untouched; committed, name
 * holds it and no temp file is left. */
static void test_atomic_write_staged(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN], tmp[WRITE_FILE_TMP_MAX];
	assert_int_equal(testlib_mkdir(dir, "stage"), 0);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	char *buf = NULL;
	size_t len;
	assert_int_equal(write_file_atomic(dfd, "rec.json", "old", 3, 0600), 0);
	assert_int_equal(write_file_stage(dfd, "rec.json", "new", 3, 0600, tmp), 0);
	assert_int_equal(strncmp(tmp, ".rec.json.tmp.", 14), 0);
	assert_int_equal(read_file_at(dfd, tmp, 100, &buf, &len), 0);
	assert_string_equal(buf, "new");
	free(buf);
	assert_int_equal(read_file_at(dfd, "rec.json", 100, &buf, &len), 0);
	assert_string_equal(buf, "old");
	free(buf);
	assert_int_equal(write_file_commit(dfd, tmp, "rec.json"), 0);
	assert_int_equal(read_file_at(dfd, "rec.json", 100, &buf, &len), 0);
	assert_string_equal(buf, "new");
	free(buf);
	assert_int_equal(write_file_atomic_sweep(dfd), 0);
	/* a commit that cannot rename removes the temp file */
	assert_int_equal(write_file_stage(dfd, "rec.json", "x", 1, 0600, tmp), 0);
	assert_int_equal(mkdirat(dfd, "d", 0700), 0);
	assert_int_equal(write_file_commit(dfd, tmp, "d"), -EISDIR);
	assert_int_equal(write_file_atomic_sweep(dfd), 0);
	assert_int_equal(unlinkat(dfd, "d", AT_REMOVEDIR), 0);
	assert_int_equal(rm_rf_at(dfd, "rec.json"), 0);
	close(dfd);
	assert_int_equal(rmdir(dir), 0);
}

/* Past the walk's WALK_DEPTH_MAX levels, rm_rf_at goes on one open
 * directory at a time: a tree 5,000 levels deep, with files at every level
 * and a second branch near the bottom, goes whole. */
static void test_rm_rf_deeper_than_the_walk(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN];
	assert_int_equal(testlib_mkdir(dir, "rmdeep"), 0);
	int top = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(top >= 0);
	int fd = dup(top);
	for (int i = 0; i < 5000; i++) {
		assert_int_equal(mkdirat(fd, "d", 0700), 0);
		assert_int_equal(write_file_atomic(fd, "f", "x", 1, 0600), 0);
		if (i == 4990)
			assert_int_equal(mkdirat(fd, "branch", 0700), 0);
		int c = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		assert_true(c >= 0);
		close(fd);
		fd = c;
	}
	assert_int_equal(write_file_atomic(fd, "bottom", "x", 1, 0600), 0);
	close(fd);
	assert_int_equal(rm_rf_at(top, "d"), 0);
	assert_int_equal(faccessat(top, "d", F_OK, AT_SYMLINK_NOFOLLOW), -1);
	assert_int_equal(unlinkat(top, "f", 0), 0);
	close(top);
	assert_int_equal(rmdir(dir), 0);
}

/* A mount point below the tree is never entered: rm_rf_at says -EXDEV and
 * removes everything else, keeping only the directories that lead to it. */
static void test_rm_rf_mount(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN];
	assert_int_equal(testlib_mkdir(dir, "rm"), 0);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dfd >= 0);
	static const char *const dirs[] = { "t", "t/a", "t/a/m", "t/a/b", "t/a/b/c", "t/z" };
	for (size_t i = 0; i < sizeof(dirs) / sizeof(*dirs); i++)
		assert_int_equal(mkdirat(dfd, dirs[i], 0700), 0);
	close(openat(dfd, "t/a/b/c/f", O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	close(openat(dfd, "t/z/f", O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	char m[TESTLIB_DIR_LEN + 8];
	snprintf(m, sizeof(m), "%s/t/a/m", dir);
	assert_int_equal(mount("tmpfs", m, "tmpfs", 0, "size=1m"), 0);
	close(openat(dfd, "t/a/m/kept", O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	assert_int_equal(rm_rf_at(dfd, "t"), -EXDEV);
	assert_int_equal(faccessat(dfd, "t/a/m/kept", F_OK, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(faccessat(dfd, "t/a/b", F_OK, AT_SYMLINK_NOFOLLOW), -1);
	assert_int_equal(faccessat(dfd, "t/z", F_OK, AT_SYMLINK_NOFOLLOW), -1);
	assert_int_equal(rm_rf_at(dfd, "t/a/m"), -EXDEV); /* the mount point itself */
	assert_int_equal(umount(m), 0);
	assert_int_equal(rm_rf_at(dfd, "t"), 0);
	assert_int_equal(faccessat(dfd, "t", F_OK, AT_SYMLINK_NOFOLLOW), -1);
	close(dfd);
	testlib_rmdir(dir);
}

static void test_path_join(void **state)
{
	(void)state;
	char *p = path_join("/a/b/", "/c");
	assert_string_equal(p, "/a/b/c");
	free(p);
	p = path_join("/", "x");
	assert_string_equal(p, "/x");
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_name_valid),   cmocka_unit_test(test_utf8_valid),
		cmocka_unit_test(test_id),           cmocka_unit_test(test_rfc3339),
		cmocka_unit_test(test_secure_streq), cmocka_unit_test(test_errors),
		cmocka_unit_test(test_atomic_write), cmocka_unit_test(test_atomic_write_staged),
		cmocka_unit_test(test_rm_rf_mount),  cmocka_unit_test(test_rm_rf_deeper_than_the_walk),
		cmocka_unit_test(test_path_join),
	};
	return cmocka_run_group_tests_name("util", tests, NULL, NULL);
}
