/* Unit tests of command line and config file parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/stat.h>

#include "config.h"
#include "testlib.h"

static char tmp[TESTLIB_DIR_LEN];

static int setup(void **state)
{
	(void)state;
	return testlib_mkdir(tmp, "cfg");
}

static int teardown(void **state)
{
	(void)state;
	testlib_rmdir(tmp);
	return 0;
}

static int parse(struct config *cfg, ckpt_error *err, ...)
{
	char *argv[32] = { "ckptd" };
	int argc = 1;
	va_list ap;
	va_start(ap, err);
	for (char *a; (a = va_arg(ap, char *)) && argc < 31;)
		argv[argc++] = a;
	va_end(ap);
	return config_parse(cfg, argc, argv, err);
}

static char *tpath(const char *name)
{
	static char buf[8][128];
	static int i;
	i = (i + 1) % 8;
	snprintf(buf[i], sizeof(buf[i]), "%s/%s", tmp, name);
	return buf[i];
}

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_flags(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	assert_int_equal(parse(&cfg, &err, "--listen", "127.0.0.1:9", "--listen", "unix:/tmp/x.sock", "--state-dir",
			       tpath("state"), "--root", tpath("r1"), "--root", tpath("r2"), "--backend", "tar", NULL),
			 0);
	assert_int_equal(cfg.n_listen, 2);
	assert_string_equal(cfg.listen[1], "unix:/tmp/x.sock");
	assert_int_equal(cfg.n_roots, 2);
	assert_int_equal(cfg.backend, BACKEND_TAR);
	assert_int_equal(cfg.max_checkpoints, 100);
	assert_int_equal(cfg.default_ttl_secs, 14 * 24 * 3600);
	assert_false(cfg.unmount_on_exit);
	struct stat st;
	assert_int_equal(stat(tpath("r2"), &st), 0); /* missing roots are created */
	config_free(&cfg);
}

static void test_file_and_flags_win(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	char text[512];
	snprintf(text, sizeof(text),
		 "{\"listen\": [\"127.0.0.1:1\"], \"state_dir\": \"%s\", \"roots\": [\"%s\"], \"backend\": \"overlay\","
		 " \"max_checkpoints\": 5, \"default_ttl_secs\": 0, \"unmount_on_exit\": true,"
		 " \"services\": [\"web.service\", \"auto\"]}",
		 tpath("state"), tpath("fileroot"));
	write_text(tpath("c.json"), text);
	assert_int_equal(
		parse(&cfg, &err, "--config", tpath("c.json"), "--listen", "127.0.0.1:2", "--backend", "tar", NULL), 0);
	assert_int_equal(cfg.n_listen, 1);
	assert_string_equal(cfg.listen[0], "127.0.0.1:2");
	assert_int_equal(cfg.backend, BACKEND_TAR);
	assert_int_equal(cfg.max_checkpoints, 5);
	assert_int_equal(cfg.default_ttl_secs, 0);
	assert_true(cfg.unmount_on_exit);
	assert_true(cfg.services_auto);
	assert_int_equal(cfg.n_units, 1);
	assert_string_equal(cfg.units[0], "web.service");
	assert_int_equal(cfg.n_roots, 1);
	config_free(&cfg);
}

static void test_errors(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	assert_true(parse(&cfg, &err, "--bogus", NULL) < 0);
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--state-dir", tpath("s"), NULL) < 0);
	assert_non_null(strstr(err.msg, "--root"));
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--state-dir", tpath("s"), "--root", tpath("r"), "--backend", "zfs", NULL) < 0);
	assert_non_null(strstr(err.msg, "backend"));
	config_free(&cfg);
	/* A root inside the state dir would checkpoint the checkpoints. */
	assert_true(parse(&cfg, &err, "--state-dir", tpath("s"), "--root", tpath("s/inner"), NULL) < 0);
	assert_non_null(strstr(err.msg, "overlap"));
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--state-dir", tpath("s"), "--root", tpath("a"), "--root", tpath("a/b"), NULL) <
		    0);
	config_free(&cfg);
	write_text(tpath("bad.json"), "{\"max_checkpoints\": \"many\"}");
	assert_true(parse(&cfg, &err, "--config", tpath("bad.json"), NULL) < 0);
	assert_non_null(strstr(err.msg, "max_checkpoints"));
	config_free(&cfg);
	write_text(tpath("broken.json"), "{\"listen\": ");
	assert_true(parse(&cfg, &err, "--config", tpath("broken.json"), NULL) < 0);
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--state-dir", tpath("s"), "--root", tpath("r"), "--token-file", tpath("nope"),
			  NULL) < 0);
	config_free(&cfg);
}

static void test_token(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	write_text(tpath("tok"), "s3cret\n");
	assert_int_equal(
		parse(&cfg, &err, "--state-dir", tpath("s"), "--root", tpath("r"), "--token-file", tpath("tok"), NULL),
		0);
	assert_string_equal(cfg.token, "s3cret");
	config_free(&cfg);
	write_text(tpath("empty"), "\n");
	assert_true(parse(&cfg, &err, "--state-dir", tpath("s"), "--root", tpath("r"), "--token-file", tpath("empty"),
			  NULL) < 0);
	config_free(&cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_flags),
		cmocka_unit_test(test_file_and_flags_win),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_token),
	};
	return cmocka_run_group_tests_name("config", tests, setup, teardown);
}
