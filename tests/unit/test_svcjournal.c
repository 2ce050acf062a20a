/* Unit tests of services.json's "whole" member (engine_svcjournal.c): what
 * an interrupted whole-root restore owes, written from its struct and read
 * back, and read as a daemon from before the struct wrote it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/engine_internal.h"

static void whole_drop(struct whole_owed *w)
{
	engine_svc_journal_whole_free(w);
	free(w);
}

/* The bytes a daemon from before wrote (compact, in this order) are read
 * into the struct, and the struct writes the same bytes. */
static void test_whole_same_bytes(void **state)
{
	(void)state;
	const char *old = "{\"reload\":true,\"restart\":[\"a.service\",\"b.service\"],\"linked\":[\"c.service\"]}";
	json_auto_t *in = json_loads(old, 0, NULL);
	struct whole_owed *w = engine_svc_journal_whole_read(in);
	assert_non_null(w);
	assert_true(w->reload);
	assert_int_equal(w->restart.n, 2);
	assert_string_equal(w->restart.v[1], "b.service");
	assert_int_equal(w->linked.n, 1);
	assert_string_equal(w->linked.v[0], "c.service");
	json_auto_t *out = engine_svc_journal_whole_json(w);
	_cleanup_free_ char *text = json_dumps(out, JSON_COMPACT);
	assert_string_equal(text, old);
	whole_drop(w);
}

/* Members missing or of another type owe nothing; no object, no struct. */
static void test_whole_damaged(void **state)
{
	(void)state;
	json_auto_t *in = json_loads("{\"reload\":1,\"restart\":\"a.service\",\"linked\":[2,\"d.service\"]}", 0, NULL);
	struct whole_owed *w = engine_svc_journal_whole_read(in);
	assert_non_null(w);
	assert_false(w->reload);
	assert_int_equal(w->restart.n, 0);
	assert_int_equal(w->linked.n, 1);
	assert_string_equal(w->linked.v[0], "d.service");
	whole_drop(w);
	json_auto_t *list = json_array();
	assert_null(engine_svc_journal_whole_read(list));
	assert_null(engine_svc_journal_whole_read(NULL));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_whole_same_bytes),
		cmocka_unit_test(test_whole_damaged),
	};
	return cmocka_run_group_tests_name("svcjournal", tests, NULL, NULL);
}
