/* Unit tests of backend/rootexcl.c: mountinfo lines, the items a root
 * leaves out, and matching entries by identity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <sys/stat.h>

#include "backend/rootexcl.h"
#include "testlib.h"

static char tmp[TESTLIB_DIR_LEN];

static int setup(void **state)
{
	(void)state;
	return testlib_mkdir(tmp, "rootexcl");
}

static int teardown(void **state)
{
	(void)state;
	testlib_rmdir(tmp);
	return 0;
}

static void test_parse_mountinfo(void **state)
{
	(void)state;
	char path[256], type[32];
	assert_int_equal(rootexcl_parse_mountinfo("36 35 98:0 /mnt1 /mnt/my\\040disk rw,noatime master:1 - ext3 "
						  "/dev/root rw,errors=continue\n",
						  path, sizeof(path), type, sizeof(type)),
			 0);
	assert_string_equal(path, "/mnt/my disk");
	assert_string_equal(type, "ext3");
	assert_int_equal(rootexcl_parse_mountinfo("22 1 0:21 / /proc rw,nosuid - proc proc rw\n", path, sizeof(path),
						  type, sizeof(type)),
			 0);
	assert_string_equal(path, "/proc");
	assert_string_equal(type, "proc");
	/* no separator, too few fields, a relative mount point */
	assert_true(rootexcl_parse_mountinfo("22 1 0:21 / /proc rw\n", path, sizeof(path), type, sizeof(type)) < 0);
	assert_true(rootexcl_parse_mountinfo("22 1 - x\n", path, sizeof(path), type, sizeof(type)) < 0);
	assert_true(rootexcl_parse_mountinfo("22 1 0:21 / proc rw - proc proc rw\n", path, sizeof(path), type,
					     sizeof(type)) < 0);
}

static void test_build_and_match(void **state)
{
	(void)state;
	char mi[300], state_dir[300], ex[300], mnt[300], below[300], text[1200];
	struct rootexcl x;
	struct stat st;

	snprintf(mi, sizeof(mi), "%s/mountinfo", tmp);
	snprintf(state_dir, sizeof(state_dir), "%s/state", tmp);
	snprintf(ex, sizeof(ex), "%s/excluded", tmp);
	snprintf(mnt, sizeof(mnt), "%s/mnt", tmp);
	snprintf(below, sizeof(below), "%s/mnt/sub", tmp);
	assert_int_equal(mkdir(state_dir, 0700), 0);
	assert_int_equal(mkdir(ex, 0700), 0);
	assert_int_equal(mkdir(mnt, 0700), 0);
	assert_int_equal(mkdir(below, 0700), 0);
	snprintf(text, sizeof(text),
		 "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:5 / %s rw - tmpfs tmpfs rw\n"
		 "3 2 0:6 / %s rw - tmpfs tmpfs rw\n",
		 mnt, below);
	FILE *f = fopen(mi, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);

	char *excl[] = { ex, "/does/not/exist" };
	assert_int_equal(rootexcl_build(&x, true, state_dir, excl, 2, mi), 0);
	assert_true(x.one_fs);
	/* state dir, 2 excludes, /tmp, 2 mounts (/ itself is not one) */
	assert_int_equal(x.n, 6);
	assert_string_equal(x.v[0].why, "state dir");
	assert_string_equal(x.v[1].why, "config exclude");
	assert_false(x.v[2].present);
	assert_string_equal(x.v[3].path, "/tmp");
	assert_string_equal(x.v[4].why, "mount point (tmpfs)");
	assert_true(x.v[5].nested);  /* below another item: health leaves it out */
	assert_false(x.v[3].nested); /* /tmp: health lists it */
	assert_int_equal(stat(state_dir, &st), 0);
	assert_true(rootexcl_has(&x, &st));
	assert_int_equal(stat(ex, &st), 0);
	assert_true(rootexcl_has(&x, &st));
	assert_int_equal(stat(mnt, &st), 0);
	assert_true(rootexcl_has(&x, &st));
	assert_int_equal(stat(tmp, &st), 0);
	assert_false(rootexcl_has(&x, &st));
	assert_false(rootexcl_has(NULL, &st));
	/* another filesystem's directory is a mount point, whatever mountinfo says */
	struct stat other = st;
	other.st_dev = st.st_dev + 1;
	assert_true(rootexcl_has(&x, &other));
	other.st_mode = S_IFREG | 0644; /* a file may show its layer's device */
	assert_false(rootexcl_has(&x, &other));
	rootexcl_free(&x);

	/* not the whole root: only the config's excludes */
	assert_int_equal(rootexcl_build(&x, false, NULL, excl, 2, mi), 0);
	assert_false(x.one_fs);
	assert_int_equal(x.n, 2);
	assert_int_equal(stat(mnt, &st), 0);
	assert_false(rootexcl_has(&x, &st));
	rootexcl_free(&x);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_mountinfo),
		cmocka_unit_test(test_build_and_match),
	};
	return cmocka_run_group_tests_name("rootexcl", tests, setup, teardown);
}
