/* Unit tests of a tar checkpoint's meta.json (tar_meta.c): read into its
 * struct and written back with the same bytes, for files a daemon from
 * before the struct wrote, and what a compaction writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/tar/tar_internal.h"
#include "testlib.h"

static char dir[TESTLIB_DIR_LEN];
static int dfd = -1;

static int setup(void **state)
{
	(void)state;
	assert_int_equal(testlib_mkdir(dir, "tarmeta"), 0);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return dfd < 0;
}

static int teardown(void **state)
{
	(void)state;
	close(dfd);
	testlib_rmdir(dir);
	return 0;
}

static void put_meta(const char *text)
{
	assert_int_equal(write_file_atomic(dfd, META, text, strlen(text), 0600), 0);
}

/* As tar_meta_write and a compaction of a daemon from before wrote them. */
static const char *const old_metas[] = {
	"{\"version\":1,\"compression\":\"zstd\",\"roots\":[\"/a\",\"/b\"],\"depth\":2,\"refs\":["
	"\"cp_000000000001aaaaaaaaaaaa/r0.tar.zst\"],\"started_ns\":1700000000123456789,\"parent\":"
	"\"cp_000000000002aaaaaaaaaaaa\"}",
	"{\"version\":1,\"compression\":\"none\",\"roots\":[\"/w\"],\"depth\":0,\"refs\":[],\"started_ns\":5}",
	/* from before started_ns, with a member of a newer version */
	"{\"version\":1,\"compression\":\"none\",\"roots\":[\"/w\"],\"depth\":1,\"refs\":[],\"parent\":\"base\","
	"\"future\":{\"x\":[1]}}",
};

static void test_old_bytes(void **state)
{
	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(old_metas); i++) {
		struct tar_meta m;
		put_meta(old_metas[i]);
		assert_int_equal(tar_meta_load(dfd, &m), 0);
		_cleanup_free_ char *text = tar_meta_text(&m);
		assert_string_equal(text, old_metas[i]);
		tar_meta_free(&m);
	}
}

static void test_fields(void **state)
{
	(void)state;
	struct tar_meta m;
	put_meta(old_metas[0]);
	assert_int_equal(tar_meta_load(dfd, &m), 0);
	assert_int_equal(m.version, 1);
	assert_true(m.zstd);
	assert_int_equal(m.roots.n, 2);
	assert_string_equal(m.roots.v[1], "/b");
	assert_int_equal(m.depth, 2);
	assert_int_equal(m.refs.n, 1);
	assert_true(m.has_started_ns && m.started_ns == 1700000000123456789LL);
	assert_string_equal(m.parent, "cp_000000000002aaaaaaaaaaaa");
	assert_null(m.unknown);
	/* a compaction: whole, no parent, nothing older read */
	m.depth = 0;
	services_strv_clear(&m.refs);
	m.parent[0] = '\0';
	_cleanup_free_ char *text = tar_meta_text(&m);
	assert_string_equal(text,
			    "{\"version\":1,\"compression\":\"zstd\",\"roots\":[\"/a\",\"/b\"],\"depth\":0,"
			    "\"refs\":[],\"started_ns\":1700000000123456789}");
	tar_meta_free(&m);
}

/* No file, or no JSON object in it: an error, and nothing to free. */
static void test_unreadable(void **state)
{
	(void)state;
	struct tar_meta m;
	assert_int_equal(tar_meta_load(dfd, &m), -ENOENT);
	put_meta("[1]");
	assert_int_equal(tar_meta_load(dfd, &m), -EBADMSG);
	assert_int_equal(m.roots.n, 0);
	/* a member of another shape reads as absent, and is written as such */
	put_meta("{\"roots\":[\"/w\",7],\"depth\":\"deep\"}");
	assert_int_equal(tar_meta_load(dfd, &m), 0);
	assert_int_equal(m.roots.n, 0);
	_cleanup_free_ char *text = tar_meta_text(&m);
	assert_string_equal(text, "{\"compression\":\"none\",\"roots\":[],\"depth\":0,\"refs\":[]}");
	tar_meta_free(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_old_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fields, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unreadable, setup, teardown),
	};
	return cmocka_run_group_tests_name("tar_meta", tests, NULL, NULL);
}
