/* Unit tests of request decoding: JSON bodies to engine requests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "http/api.h"
#include "engine/engine.h"

static int decode_create(const char *body, struct create_req *cr, json_t **keep, int *status, const char **code)
{
	struct http_request req = {
		.method = "POST", .path = "/v1/checkpoints", .body = body, .body_len = body ? strlen(body) : 0
	};
	struct http_response resp = { 0 };
	json_t *obj = api_parse_object(&req, true, &resp);
	bool ok = obj && api_decode_create(obj, cr, &resp);
	*status = resp.status;
	*code = resp.json ? json_string_value(json_object_get(resp.json, "code")) : NULL;
	static char codebuf[64];
	if (*code) {
		snprintf(codebuf, sizeof(codebuf), "%s", *code);
		*code = codebuf;
	}
	json_decref(resp.json);
	*keep = obj;
	return ok ? 0 : -1;
}

static void expect_reject(const char *body, const char *want_code)
{
	struct create_req cr = { 0 };
	json_t *obj;
	int status;
	const char *code;
	assert_int_equal(decode_create(body, &cr, &obj, &status, &code), -1);
	assert_int_equal(status, 400);
	assert_string_equal(code, want_code);
	json_decref(obj);
}

static void test_create_ok(void **state)
{
	(void)state;
	struct create_req cr = { 0 };
	json_t *obj;
	int status;
	const char *code;
	assert_int_equal(decode_create("{\"name\":\"a\",\"ttl_secs\":60,\"labels\":{\"k\":\"v\"},\"async\":true}", &cr,
				       &obj, &status, &code),
			 0);
	assert_string_equal(cr.name, "a");
	assert_true(cr.has_ttl);
	assert_int_equal(cr.ttl_secs, 60);
	assert_true(cr.async);
	assert_string_equal(json_string_value(json_object_get(cr.labels, "k")), "v");
	json_decref(obj);
	memset(&cr, 0, sizeof(cr));
	assert_int_equal(decode_create("{\"name\":\"b\",\"ttl_secs\":null}", &cr, &obj, &status, &code), 0);
	assert_false(cr.has_ttl);
	assert_false(cr.async);
	assert_null(cr.labels);
	json_decref(obj);
}

static void test_create_rejects(void **state)
{
	(void)state;
	expect_reject(NULL, "bad_request");
	expect_reject("", "bad_request");
	expect_reject("{", "bad_request");
	expect_reject("[]", "bad_request");
	expect_reject("\"name\"", "bad_request");
	expect_reject("{\"name\":\"a\",\"name\":\"b\"}", "bad_request");
	expect_reject("{}", "invalid_field");
	expect_reject("{\"name\":1}", "invalid_field");
	expect_reject("{\"name\":\"a\",\"ttl_secs\":1.5}", "invalid_field");
	expect_reject("{\"name\":\"a\",\"ttl_secs\":\"1\"}", "invalid_field");
	expect_reject("{\"name\":\"a\",\"labels\":[]}", "invalid_field");
	expect_reject("{\"name\":\"a\",\"async\":\"yes\"}", "invalid_field");
	expect_reject("{\"name\":\"a\",\"nmae\":\"typo\"}", "invalid_field");
}

static int decode_restore(const char *body, struct restore_req *rr)
{
	struct http_request req = { .method = "POST", .body = body, .body_len = body ? strlen(body) : 0 };
	struct http_response resp = { 0 };
	json_t *obj = api_parse_object(&req, false, &resp);
	bool ok = obj && api_decode_restore(obj, rr, &resp);
	int status = ok ? 0 : resp.status;
	json_decref(resp.json);
	json_decref(obj);
	return status;
}

static void test_restore(void **state)
{
	(void)state;
	struct restore_req rr = { 0 };
	assert_int_equal(decode_restore(NULL, &rr), 0); /* no body is fine */
	assert_false(rr.force);
	assert_int_equal(decode_restore("{}", &rr), 0);
	assert_int_equal(decode_restore("{\"force\":true}", &rr), 0);
	assert_true(rr.force);
	assert_int_equal(decode_restore("{\"force\":1}", &rr), 400);
	assert_int_equal(decode_restore("{\"if_expired\":\"later\"}", &rr), 400);
	assert_int_equal(decode_restore("{\"if_expired\":7}", &rr), 400);
	assert_int_equal(decode_restore("{\"bogus\":true}", &rr), 400);
	assert_int_equal(decode_restore("[true]", &rr), 400);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_ok),
		cmocka_unit_test(test_create_rejects),
		cmocka_unit_test(test_restore),
	};
	return cmocka_run_group_tests_name("api", tests, NULL, NULL);
}
