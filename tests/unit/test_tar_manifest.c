/* test_tar_manifest.c: loading corrupt and valid tar manifests. Run under
 * valgrind --leak-check=full: every rejected manifest must free what its
 * parse allocated. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/tar/tar_manifest.h"

#define ROOT "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\n"

static char dir[PATH_MAX];
static int dirfd_;

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/ckptd-manifest-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	dirfd_ = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return dirfd_ < 0 ? -1 : 0;
}

static int teardown(void **state)
{
	(void)state;
	unlinkat(dirfd_, "m", 0);
	close(dirfd_);
	rmdir(dir);
	return 0;
}

/* Lines in the version 1 format (no content hash) unless magic says. */
static int load_magic(const char *magic, const char *body, struct tar_manifest *m, ckpt_error *err)
{
	char text[4096];
	int n = snprintf(text, sizeof(text), "%s\n%s", magic, body);
	assert_int_equal(write_file_atomic(dirfd_, "m", text, (size_t)n, 0600), 0);
	return tar_manifest_load(dirfd_, "m", m, err);
}

static int load(const char *body, struct tar_manifest *m, ckpt_error *err)
{
	return load_magic(TAR_MANIFEST_MAGIC_V1, body, m, err);
}

static void expect_rejected(const char *body, const char *msg)
{
	struct tar_manifest m;
	ckpt_error err = { 0 };
	assert_int_equal(load(body, &m, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, msg));
	assert_int_equal(m.n, 0); /* freed and cleared */
}

/* The first entry must be the root directory; a hardlink there used to leak
 * its link target (issue 13 item 6). */
static void test_first_entry_hardlink(void **state)
{
	(void)state;
	expect_rejected("h\t644\t0\t0\t0\t1.0\t1.0\t3\t2\tnone\t.\ttarget\n", "does not start with its root");
	expect_rejected("h\t644\t0\t0\t0\t1.0\t1.0\t3\t2\tnone\tfile\ttarget\n", "does not start with its root");
}

static void test_bad_lines(void **state)
{
	(void)state;
	expect_rejected(ROOT "h\t644\t0\t0\t0\t1.0\t1.0\t3\t2\tnone\tx\t../out\n", "unsafe path");
	expect_rejected(ROOT "h\t644\t0\t0\t0\t1.0\t1.0\t3\t2\tnone\tx\tmissing\n", "has no target");
	expect_rejected(ROOT "f\t644\t0\t0\tNaN\t1.0\t1.0\t3\t1\tnone\tx\t-\n", "bad manifest line 2");
	expect_rejected(ROOT "f\t644\t0\t0\t0\t1.0\t1.0\t3\t1\tnone\tx\tstray\n", "bad manifest line 2");
	expect_rejected(ROOT "x\tuser.a\t0\n", "bad root xattr");
	expect_rejected(ROOT "f\t644\t0\t0\t0\t1.0\t1.0\t3\t1\tnone\tx\t-\n"
			     "f\t644\t0\t0\t0\t1.0\t1.0\t4\t1\tnone\tx\t-\n",
			"twice");
}

static void test_valid_manifest(void **state)
{
	struct tar_manifest m;
	ckpt_error err = { 0 };
	(void)state;
	assert_int_equal(load(ROOT "x\tuser.a\t6869\n"
				   "d\t755\t0\t0\t0\t1.0\t1.0\t5\t2\tnone\tsub\t-\n"
				   "f\t644\t0\t0\t3\t1.0\t1.0\t6\t2\tnone\tsub/a%20b\t-\n"
				   "h\t644\t0\t0\t3\t1.0\t1.0\t6\t2\tnone\tsub/c\tsub/a%20b\n",
			      &m, &err),
			 0);
	assert_int_equal(m.n, 3);
	assert_int_equal(m.n_root_xattrs, 1);
	struct tar_mentry *h = tar_manifest_find(&m, "sub/c");
	assert_non_null(h);
	assert_string_equal(h->link, "sub/a b");
	assert_ptr_equal(&m.v[h->group], tar_manifest_find(&m, "sub/a b"));
	assert_false(m.v[1].has_sha256);
	tar_manifest_free(&m);
}

#define SHA "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

static void test_version2_content_hash(void **state)
{
	struct tar_manifest m;
	ckpt_error err = { 0 };
	(void)state;
	assert_int_equal(load_magic(TAR_MANIFEST_MAGIC_V2,
				    "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t-\n"
				    "f\t644\t0\t0\t4\t1.0\t1.0\t6\t1\tnone\ta\t-\t" SHA "\n",
				    &m, &err),
			 0);
	assert_true(m.v[0].has_sha256);
	assert_int_equal(m.v[0].sha256[0], 0x9f);
	assert_int_equal(m.v[0].sha256[31], 0x08);
	tar_manifest_free(&m);
	/* a hash on a directory, a short hash, or a v1 line in a v2 file */
	assert_int_equal(
		load_magic(TAR_MANIFEST_MAGIC_V2, "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t" SHA "\n", &m, &err),
		-EBADMSG);
	assert_int_equal(load_magic(TAR_MANIFEST_MAGIC_V2,
				    "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t-\n"
				    "f\t644\t0\t0\t4\t1.0\t1.0\t6\t1\tnone\ta\t-\t9f86\n",
				    &m, &err),
			 -EBADMSG);
	assert_int_equal(load_magic(TAR_MANIFEST_MAGIC_V2, ROOT, &m, &err), -EBADMSG);
}

/* Version 3: a regular file's data may be in an older checkpoint's archive. */
static void test_version3_data_source(void **state)
{
	struct tar_manifest m;
	ckpt_error err = { 0 };
	(void)state;
	assert_int_equal(load_magic(TAR_MANIFEST_MAGIC_V3,
				    "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t-\t-\n"
				    "f\t644\t0\t0\t4\t1.0\t1.0\t6\t1\tnone\ta\t-\t" SHA "\tbase\n"
				    "f\t644\t0\t0\t4\t1.0\t1.0\t7\t1\tnone\tb\t-\t" SHA
				    "\tcp_0123456789abcdef01234567\n"
				    "f\t644\t0\t0\t4\t1.0\t1.0\t8\t1\tnone\tc\t-\t" SHA "\t-\n",
				    &m, &err),
			 0);
	assert_string_equal(m.v[0].src, "base");
	assert_string_equal(m.v[1].src, "cp_0123456789abcdef01234567");
	assert_null(m.v[2].src);
	tar_manifest_free(&m);
	/* a source that is no checkpoint name (it becomes a path), or on a dir */
	assert_int_equal(load_magic(TAR_MANIFEST_MAGIC_V3,
				    "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t-\t-\n"
				    "f\t644\t0\t0\t4\t1.0\t1.0\t6\t1\tnone\ta\t-\t" SHA "\t../x\n",
				    &m, &err),
			 -EBADMSG);
	assert_int_equal(load_magic(TAR_MANIFEST_MAGIC_V3,
				    "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t-\t-\n"
				    "d\t755\t0\t0\t0\t1.0\t1.0\t6\t1\tnone\td\t-\t-\tbase\n",
				    &m, &err),
			 -EBADMSG);
}

/* Version 4: each entry's offset in the archive holding its data ("-" when
 * not known); anything else is refused. */
static void test_version4_offsets(void **state)
{
	struct tar_manifest m;
	ckpt_error err = { 0 };
	(void)state;
	assert_int_equal(load_magic(TAR_MANIFEST_MAGIC,
				    "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t-\t-\t-\n"
				    "f\t644\t0\t0\t4\t1.0\t1.0\t6\t1\tnone\ta\t-\t" SHA "\tbase\t1536\n"
				    "f\t644\t0\t0\t4\t1.0\t1.0\t8\t1\tnone\tc\t-\t" SHA "\t-\t-\n",
				    &m, &err),
			 0);
	assert_int_equal(m.v[0].off, 1536);
	assert_int_equal(m.v[1].off, -1);
	assert_int_equal(m.root.off, -1);
	tar_manifest_free(&m);
	const char *bad[] = { "-1", "12x", "", "99999999999999999999" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		char text[512];
		snprintf(text, sizeof(text),
			 "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t-\t-\t-\n"
			 "f\t644\t0\t0\t4\t1.0\t1.0\t6\t1\tnone\ta\t-\t" SHA "\t-\t%s\n",
			 bad[i]);
		assert_int_equal(load_magic(TAR_MANIFEST_MAGIC, text, &m, &err), -EBADMSG);
	}
	/* a version 3 line (no offset) is short for version 4 */
	assert_int_equal(
		load_magic(TAR_MANIFEST_MAGIC, "d\t755\t0\t0\t0\t1.0\t1.0\t2\t2\tnone\t.\t-\t-\t-\n", &m, &err),
		-EBADMSG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_first_entry_hardlink), cmocka_unit_test(test_bad_lines),
		cmocka_unit_test(test_valid_manifest),       cmocka_unit_test(test_version2_content_hash),
		cmocka_unit_test(test_version3_data_source), cmocka_unit_test(test_version4_offsets),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
