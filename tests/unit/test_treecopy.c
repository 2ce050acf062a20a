/* test_treecopy.c: every file type, metadata, hardlinks, holes, whiteouts,
 * opaque dirs, hard links from the previous layer, and merge rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include "backend/overlay/treecopy.h"
#include "testlib.h"

static char dir[TESTLIB_DIR_LEN];
static int src, dst, dst2;

static int opendir_at(const char *name)
{
	char p[128];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	mkdir(p, 0755);
	return open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static int setup(void **state)
{
	(void)state;
	assert_int_equal(testlib_mkdir(dir, "treecopy"), 0);
	src = opendir_at("src");
	dst = opendir_at("dst");
	dst2 = opendir_at("dst2");
	return src < 0 || dst < 0 || dst2 < 0;
}

static int teardown(void **state)
{
	(void)state;
	close(src);
	close(dst);
	close(dst2);
	testlib_rmdir(dir);
	return 0;
}

static void write_at(int dfd, const char *name, const char *data, mode_t mode)
{
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, strlen(data)), (ssize_t)strlen(data));
	close(fd);
}

static void read_at(int dfd, const char *name, char *buf, size_t n)
{
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	ssize_t r = read(fd, buf, n - 1);
	assert_true(r >= 0);
	buf[r] = 0;
	close(fd);
}

static void xattr_at(int dfd, const char *name, const char *k, char *v, size_t n)
{
	char p[256];
	snprintf(p, sizeof(p), "/proc/self/fd/%d/%s", dfd, name);
	ssize_t r = lgetxattr(p, k, v, n - 1);
	v[r < 0 ? 0 : r] = 0;
}

static void make_source(void)
{
	struct timespec ts[2] = { { 1000, 1 }, { 2000, 2 } };
	write_at(src, "file", "hello", 0640);
	assert_int_equal(fchownat(src, "file", 1234, 4321, 0), 0);
	assert_int_equal(utimensat(src, "file", ts, 0), 0);
	assert_int_equal(linkat(src, "file", src, "hard", 0), 0);
	assert_int_equal(symlinkat("file", src, "link"), 0);
	assert_int_equal(mkfifoat(src, "fifo", 0600), 0);
	assert_int_equal(mknodat(src, "gone", S_IFCHR | 0, makedev(0, 0)), 0);
	assert_int_equal(mkdirat(src, "d", 0750), 0);
	assert_int_equal(mkdirat(src, "d/opaque", 0700), 0);
	char p[256];
	snprintf(p, sizeof(p), "%s/src/d/opaque", dir);
	assert_int_equal(setxattr(p, "trusted.overlay.opaque", "y", 1, 0), 0);
	snprintf(p, sizeof(p), "%s/src/file", dir);
	assert_int_equal(setxattr(p, "user.color", "blue", 4, 0), 0);
	int fd = openat(src, "sparse", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	assert_int_equal(pwrite(fd, "x", 1, 8 << 20), 1);
	close(fd);
	assert_int_equal(utimensat(src, "d", ts, 0), 0);
}

static void test_copy_everything(void **state)
{
	(void)state;
	struct stat a, b;
	char buf[64];
	make_source();
	struct treecopy_stats st = { 0 };
	struct treecopy_opts o = { .mode = TREECOPY_NEW, .prev_fd = -1 };
	ckpt_error err = { 0 };
	assert_int_equal(treecopy_copy(src, dst, &o, &st, &err), 0);
	read_at(dst, "file", buf, sizeof(buf));
	assert_string_equal(buf, "hello");
	assert_int_equal(fstatat(dst, "file", &a, 0), 0);
	assert_int_equal(a.st_uid, 1234);
	assert_int_equal(a.st_gid, 4321);
	assert_int_equal(a.st_mode & 07777, 0640);
	assert_int_equal(a.st_mtim.tv_sec, 2000);
	assert_int_equal(a.st_mtim.tv_nsec, 2);
	assert_int_equal(fstatat(dst, "hard", &b, 0), 0);
	assert_int_equal(a.st_ino, b.st_ino);
	assert_int_equal(readlinkat(dst, "link", buf, sizeof(buf)), 4);
	assert_int_equal(fstatat(dst, "fifo", &a, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISFIFO(a.st_mode));
	assert_int_equal(fstatat(dst, "gone", &a, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(treecopy_is_whiteout(&a));
	xattr_at(dst, "d/opaque", "trusted.overlay.opaque", buf, sizeof(buf));
	assert_string_equal(buf, "y");
	xattr_at(dst, "file", "user.color", buf, sizeof(buf));
	assert_string_equal(buf, "blue");
	assert_int_equal(fstatat(dst, "sparse", &a, 0), 0);
	assert_int_equal(a.st_size, (8 << 20) + 1);
	assert_true(a.st_blocks * 512 < 1 << 20); /* the hole stayed a hole */
	assert_int_equal(fstatat(dst, "d", &a, 0), 0);
	assert_int_equal(a.st_mtim.tv_sec, 2000); /* dir times after children */
	assert_int_equal(a.st_mode & 07777, 0750);
	assert_true(st.bytes_copied < 4096);
}

static void test_links_from_previous_layer(void **state)
{
	(void)state;
	struct stat a, b;
	write_at(src, "same", "unchanged", 0644);
	write_at(src, "edit", "v1", 0644);
	struct pathindex *ix1 = pathindex_new(), *ix2 = pathindex_new();
	struct treecopy_opts o = { .mode = TREECOPY_NEW, .prev_fd = -1, .new_ix = ix1 };
	ckpt_error err = { 0 };
	assert_int_equal(treecopy_copy(src, dst, &o, NULL, &err), 0);
	write_at(src, "edit", "v2", 0644);
	struct treecopy_stats st = { 0 };
	struct treecopy_opts o2 = { .mode = TREECOPY_NEW, .prev_fd = dst, .prev_ix = ix1, .new_ix = ix2 };
	assert_int_equal(treecopy_copy(src, dst2, &o2, &st, &err), 0);
	assert_int_equal(st.linked, 1);
	assert_int_equal(fstatat(dst, "same", &a, 0), 0);
	assert_int_equal(fstatat(dst2, "same", &b, 0), 0);
	assert_int_equal(a.st_ino, b.st_ino);
	assert_int_equal(fstatat(dst, "edit", &a, 0), 0);
	assert_int_equal(fstatat(dst2, "edit", &b, 0), 0);
	assert_int_not_equal(a.st_ino, b.st_ino);
	/* the index survives a save/load round trip */
	char *tag = NULL;
	struct pathindex *ix3 = NULL;
	assert_int_equal(pathindex_save(ix2, "up:layer", dst, "ix"), 0);
	assert_int_equal(pathindex_load(dst, "ix", &ix3, &tag), 0);
	assert_string_equal(tag, "up:layer");
	assert_int_equal(pathindex_count(ix3), 2);
	assert_int_equal(fstatat(src, "same", &a, 0), 0);
	assert_true(pathindex_match(ix3, "same", &a));
	free(tag);
	pathindex_free(ix1);
	pathindex_free(ix2);
	pathindex_free(ix3);
}

/* dst holds a lower layer; src (upper) deletes, replaces and makes opaque. */
static void test_merge_rules(void **state)
{
	(void)state;
	struct stat a;
	char buf[64];
	write_at(dst, "keep", "k", 0644);
	write_at(dst, "del", "d", 0644);
	mkdirat(dst, "dir", 0755);
	write_at(dst, "dir/old", "o", 0644);
	mkdirat(dst, "op", 0755);
	write_at(dst, "op/old", "o", 0644);
	write_at(dst, "f2d", "x", 0644);
	mknodat(src, "del", S_IFCHR, makedev(0, 0));
	mkdirat(src, "dir", 0700);
	write_at(src, "dir/new", "n", 0644);
	mkdirat(src, "op", 0755);
	char p[256];
	snprintf(p, sizeof(p), "%s/src/op", dir);
	assert_int_equal(setxattr(p, "trusted.overlay.opaque", "y", 1, 0), 0);
	mkdirat(src, "f2d", 0755);
	struct treecopy_opts o = { .mode = TREECOPY_MERGE, .prev_fd = -1, .link_sources = true };
	ckpt_error err = { 0 };
	assert_int_equal(treecopy_copy(src, dst, &o, NULL, &err), 0);
	read_at(dst, "keep", buf, sizeof(buf));
	assert_string_equal(buf, "k");
	assert_int_equal(fstatat(dst, "del", &a, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(treecopy_is_whiteout(&a));               /* still hides the base */
	assert_int_equal(fstatat(dst, "dir/old", &a, 0), 0); /* merged */
	assert_int_equal(fstatat(dst, "dir/new", &a, 0), 0);
	assert_int_equal(fstatat(dst, "dir", &a, 0), 0);
	assert_int_equal(a.st_mode & 07777, 0700);
	assert_int_not_equal(fstatat(dst, "op/old", &a, 0), 0); /* opaque replaced */
	xattr_at(dst, "f2d", "trusted.overlay.opaque", buf, sizeof(buf));
	assert_string_equal(buf, "y"); /* a dir over a file hides what is below */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_copy_everything, setup, teardown),
		cmocka_unit_test_setup_teardown(test_links_from_previous_layer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_merge_rules, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
