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

/* The one table: http_error answers with the status and code of err's kind;
 * errno never decides the status. */
static int answer(const ckpt_error *err, char *code, size_t len)
{
	struct http_response resp = { 0 };
	http_error(&resp, err);
	json_t *j = resp.json;
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "status")), resp.status);
	assert_string_equal(resp.content_type, "application/problem+json");
	snprintf(code, len, "%s", json_string_value(json_object_get(j, "code")));
	json_decref(j);
	return resp.status;
}

static void test_error_table(void **state)
{
	(void)state;
	static const struct {
		enum ckpt_err_kind kind;
		int status;
		const char *code;
	} want[] = {
		{ ERR_UNSET, 500, "internal" },
		{ ERR_INVALID, 400, "bad_request" },
		{ ERR_NOT_FOUND, 404, "not_found" },
		{ ERR_CONFLICT, 409, "conflict" },
		{ ERR_EXPIRED, 410, "gone" },
		{ ERR_LIMIT, 403, "forbidden" },
		{ ERR_NO_SPACE, 507, "insufficient_storage" },
		{ ERR_UNAVAILABLE, 503, "unavailable" },
		{ ERR_INTERNAL, 500, "internal" },
	};
	ckpt_error err = { 0 };
	char code[64];

	for (size_t i = 0; i < ARRAY_SIZE(want); i++) {
		err_set_kind(&err, want[i].kind, EIO, NULL, "kind %zu", i);
		assert_int_equal(answer(&err, code, sizeof(code)), want[i].status);
		assert_string_equal(code, want[i].code);
	}
	/* a kind's specific code is kept */
	err_set_kind(&err, ERR_EXPIRED, EKEYEXPIRED, "checkpoint_expired", "expired");
	assert_int_equal(answer(&err, code, sizeof(code)), 410);
	assert_string_equal(code, "checkpoint_expired");
	/* errnos that once picked a status are 500 without a kind, whatever code a
	 * lower layer left: a filesystem EACCES is no 401, EINVAL no 400 */
	int errnos[] = { EACCES, EINVAL, ENOENT, EBUSY, ENOSPC, EDQUOT, EKEYEXPIRED, EMSGSIZE };
	for (size_t i = 0; i < ARRAY_SIZE(errnos); i++) {
		err_set(&err, errnos[i], "not_found", "a lower layer failed: %s", strerror(errnos[i]));
		assert_int_equal(answer(&err, code, sizeof(code)), 500);
		assert_string_equal(code, "internal");
	}
	/* marking keeps errno and message */
	err_set(&err, EDQUOT, NULL, "write: %s", strerror(EDQUOT));
	assert_int_equal(err_mark(&err, ERR_NO_SPACE, "insufficient_storage", -EDQUOT), -EDQUOT);
	assert_int_equal(err.errnum, EDQUOT);
	assert_int_equal(answer(&err, code, sizeof(code)), 507);
	assert_string_equal(code, "insufficient_storage");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_ok),
		cmocka_unit_test(test_create_rejects),
		cmocka_unit_test(test_restore),
		cmocka_unit_test(test_error_table),
	};
	return cmocka_run_group_tests_name("api", tests, NULL, NULL);
}
