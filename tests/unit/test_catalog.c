/* Unit tests of the checkpoint catalog: durability, ordering, torn files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/catalog.h"
#include "testlib.h"

static json_t *rec(const char *id, const char *name, int64_t created)
{
	return json_pack("{s:s, s:s, s:s, s:I, s:{s:i}}", "checkpoint_id", id, "name", name, "status", "active",
			 "_created_ms", (json_int_t)created, "_backend", "x", 1);
}

static void test_catalog(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN];
	ckpt_error err = { 0 };
	struct catalog *c;
	assert_int_equal(testlib_mkdir(dir, "cat"), 0);
	int sfd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_int_equal(catalog_open(sfd, &c, &err), 0);

	const char *a = "cp_000000000001aaaaaaaaaaaa", *b = "cp_000000000002bbbbbbbbbbbb",
		   *v = "cp_000000000003cccccccccccc";
	json_t *r;
	assert_int_equal(catalog_put(c, r = rec(a, "one", 1), &err), 0), json_decref(r);
	assert_int_equal(catalog_put(c, r = rec(b, "one", 2), &err), 0), json_decref(r);
	assert_int_equal(catalog_put_volatile(c, r = rec(v, "two", 3)), 0), json_decref(r);
	assert_int_equal(catalog_count(c), 3);

	json_t *list = catalog_list(c, NULL);
	assert_int_equal(json_array_size(list), 3);
	assert_string_equal(record_id(json_array_get(list, 0)), v); /* newest first */
	assert_string_equal(record_id(json_array_get(list, 2)), a);
	json_decref(list);
	json_t *byname = catalog_list(c, "one");
	assert_int_equal(json_array_size(byname), 2);
	assert_string_equal(record_id(json_array_get(byname, 0)), b);
	json_decref(byname);

	json_t *pub = record_public(r = catalog_get(c, a));
	assert_null(json_object_get(pub, "_backend"));
	assert_non_null(json_object_get(pub, "name"));
	json_decref(pub), json_decref(r);

	/* A torn temp file and a foreign file are ignored at load; volatile records vanish. */
	int cfd = openat(sfd, "catalog", O_RDONLY | O_DIRECTORY);
	assert_int_equal(write_file_atomic(cfd, ".x.json.tmp.1234", "{", 1, 0600), 0);
	assert_int_equal(write_file_atomic(cfd, "cp_000000000009dddddddddddd.json",
					   "{\"checkpoint_id\":\"cp_000000000009eeeeeeeeeeee\",\"name\":\"x\"}", 57,
					   0600),
			 0);
	assert_int_equal(write_file_atomic(cfd, "cp_00000000000affffffffffff.json", "{\"checkpoint_id\":", 17, 0600),
			 0);
	catalog_close(c);
	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	assert_int_equal(catalog_count(c), 2);
	assert_null(catalog_get(c, v));
	assert_int_equal(faccessat(cfd, ".x.json.tmp.1234", F_OK, 0), -1);

	assert_int_equal(catalog_remove(c, a, &err), 0);
	assert_null(catalog_get(c, a));
	assert_int_equal(catalog_remove(c, "../evil", &err), -EINVAL);
	catalog_close(c);
	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	assert_int_equal(catalog_count(c), 1);
	catalog_close(c);
	close(cfd);
	close(sfd);
	testlib_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = { cmocka_unit_test(test_catalog) };
	return cmocka_run_group_tests_name("catalog", tests, NULL, NULL);
}
