/* Unit tests of engine_err.c: a failure from below the engine gets its kind
 * once, from its errno, its reason code and what the engine asked for; the
 * HTTP table then answers with the status that kind stands for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/engine_err.h"
#include "http/http.h"

/* Classify a backend's error (kind unset) in ctx; return the HTTP status and
 * the code the client would see. */
static int answer(int errnum, const char *code, enum engine_err_ctx ctx, const char **ret_code, int *ret_r)
{
	ckpt_error err = { 0 };
	int r = err_set(&err, errnum, code, "backend says no");
	*ret_r = engine_err_classify(&err, ctx, r);
	assert_string_equal(err.msg, "backend says no"); /* the message goes up untouched */
	return http_status_of(&err, ret_code);
}

static void test_no_space_in_every_context(void **state)
{
	(void)state;
	const char *code;
	int r;
	for (int ctx = 0; ctx < ENGINE_CTX_COUNT_; ctx++) {
		assert_int_equal(answer(ENOSPC, NULL, ctx, &code, &r), 507);
		assert_string_equal(code, "insufficient_storage");
		assert_int_equal(r, -ENOSPC);
		/* a quota is out of room too, and reported as ENOSPC */
		assert_int_equal(answer(EDQUOT, NULL, ctx, &code, &r), 507);
		assert_string_equal(code, "insufficient_storage");
		assert_int_equal(r, -ENOSPC);
	}
}

static void test_backend_not_found_is_404(void **state)
{
	(void)state;
	const char *code;
	int r;
	/* the overlay restore's "no layers recorded": was 500 internal */
	assert_int_equal(answer(ENOENT, "not_found", ENGINE_CTX_RESTORE, &code, &r), 404);
	assert_string_equal(code, "not_found");
	assert_int_equal(r, -ENOENT);
	assert_int_equal(answer(ENOENT, "not_found", ENGINE_CTX_READ, &code, &r), 404);
	/* a bare ENOENT from deep in a backend is not the client's checkpoint */
	assert_int_equal(answer(ENOENT, NULL, ENGINE_CTX_RESTORE, &code, &r), 500);
	assert_string_equal(code, "internal");
}

static void test_release_reasons(void **state)
{
	(void)state;
	const char *code;
	int r;
	assert_int_equal(answer(EBUSY, "forks_exist", ENGINE_CTX_RELEASE, &code, &r), 409);
	assert_string_equal(code, "forks_exist");
	assert_int_equal(answer(EBUSY, "root_busy", ENGINE_CTX_RELEASE, &code, &r), 409);
	assert_string_equal(code, "root_busy");
	/* umount's EBUSY names no reason: the engine knows it is the root */
	assert_int_equal(answer(EBUSY, NULL, ENGINE_CTX_RELEASE, &code, &r), 409);
	assert_string_equal(code, "root_busy");
	/* the same EBUSY elsewhere is nothing the client did */
	assert_int_equal(answer(EBUSY, NULL, ENGINE_CTX_DELETE, &code, &r), 500);
	assert_string_equal(code, "internal");
	/* released, but unfinished: the reason wins over a full disk's errno */
	assert_int_equal(answer(ENOSPC, "release_incomplete", ENGINE_CTX_RELEASE, &code, &r), 500);
	assert_string_equal(code, "release_incomplete");
	assert_int_equal(r, -ENOSPC);
}

static void test_unknown_stays_internal(void **state)
{
	(void)state;
	const char *code;
	int r;
	/* a code no rule knows is not passed to the client */
	assert_int_equal(answer(EBADMSG, "unsafe_path", ENGINE_CTX_RESTORE, &code, &r), 500);
	assert_string_equal(code, "internal");
	assert_int_equal(answer(EACCES, NULL, ENGINE_CTX_CREATE, &code, &r), 500);
	assert_int_equal(r, -EACCES);
}

/* A walk's ENAMETOOLONG or ELOOP, wherever it comes from, is one answer:
 * 409 path_too_long, the limit first, then the walk's own message (which a
 * 4,000-byte path would have cut short before its reason). */
static void test_too_deep_is_one_answer(void **state)
{
	(void)state;
	static const enum engine_err_ctx ctxs[] = { ENGINE_CTX_CREATE, ENGINE_CTX_RESTORE, ENGINE_CTX_READ };
	static const int errnums[] = { ENAMETOOLONG, ELOOP };
	for (size_t i = 0; i < ARRAY_SIZE(ctxs); i++) {
		for (size_t k = 0; k < ARRAY_SIZE(errnums); k++) {
			ckpt_error err = { 0 };
			const char *code;
			int r = err_set(&err, errnums[k], NULL, "path 'd/d/d': %s", strerror(errnums[k]));
			assert_int_equal(engine_err_classify(&err, ctxs[i], r), -errnums[k]);
			assert_int_equal(http_status_of(&err, &code), 409);
			assert_string_equal(code, "path_too_long");
			assert_non_null(strstr(err.msg,
					       "a path below a root is 4096 bytes or longer, or more than "
					       "4096 directories deep: path 'd/d/d'"));
			assert_ptr_equal(strstr(err.msg, "a path below"), err.msg);
		}
	}
	/* deleting or releasing reads no tree: nothing the client can change */
	const char *code;
	int r;
	assert_int_equal(answer(ENAMETOOLONG, NULL, ENGINE_CTX_DELETE, &code, &r), 500);
	assert_int_equal(answer(ELOOP, NULL, ENGINE_CTX_RELEASE, &code, &r), 500);
}

static void test_engine_kind_is_kept(void **state)
{
	(void)state;
	ckpt_error err = { 0 };
	/* max_checkpoints answers 403 with its EDQUOT, never 507 */
	int r = err_set_kind(&err, ERR_LIMIT, EDQUOT, "checkpoint_limit", "limit");
	assert_int_equal(engine_err_classify(&err, ENGINE_CTX_CREATE, r), -EDQUOT);
	assert_int_equal(err.kind, ERR_LIMIT);
	assert_string_equal(err.code, "checkpoint_limit");
	assert_int_equal(err.errnum, EDQUOT);
	/* success and a missing err pass through */
	assert_int_equal(engine_err_classify(&err, ENGINE_CTX_CREATE, 0), 0);
	assert_int_equal(engine_err_classify(NULL, ENGINE_CTX_CREATE, -ENOSPC), -ENOSPC);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_space_in_every_context), cmocka_unit_test(test_backend_not_found_is_404),
		cmocka_unit_test(test_release_reasons),           cmocka_unit_test(test_unknown_stays_internal),
		cmocka_unit_test(test_engine_kind_is_kept),       cmocka_unit_test(test_too_deep_is_one_answer),
	};
	return cmocka_run_group_tests_name("engine_err", tests, NULL, NULL);
}
