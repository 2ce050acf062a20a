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
	assert_int_equal(parse(&cfg, &err, "--create-roots", "--listen", "127.0.0.1:9", "--listen", "unix:/tmp/x.sock",
			       "--state-dir", tpath("state"), "--root", tpath("r1"), "--root", tpath("r2"), "--backend",
			       "tar", NULL),
			 0);
	assert_int_equal(cfg.n_listen, 2);
	assert_string_equal(cfg.listen[1], "unix:/tmp/x.sock");
	assert_int_equal(cfg.n_roots, 2);
	assert_int_equal(cfg.backend, BACKEND_TAR);
	assert_int_equal(cfg.max_checkpoints, 100);
	assert_int_equal(cfg.default_ttl_secs, 14 * 24 * 3600);
	assert_false(cfg.unmount_on_exit);
	struct stat st;
	assert_int_equal(stat(tpath("r2"), &st), 0); /* missing roots are created with --create-roots */
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
		 " \"create_roots\": true,"
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
	assert_true(parse(&cfg, &err, "--create-roots", "--state-dir", tpath("s"), "--root", tpath("r"), "--backend",
			  "zfs", NULL) < 0);
	assert_non_null(strstr(err.msg, "backend"));
	config_free(&cfg);
	/* A root inside the state dir would checkpoint the checkpoints. */
	assert_true(parse(&cfg, &err, "--create-roots", "--state-dir", tpath("s"), "--root", tpath("s/inner"), NULL) <
		    0);
	assert_non_null(strstr(err.msg, "overlap"));
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--create-roots", "--state-dir", tpath("s"), "--root", tpath("a"), "--root",
			  tpath("a/b"), NULL) < 0);
	config_free(&cfg);
	write_text(tpath("bad.json"), "{\"max_checkpoints\": \"many\"}");
	assert_true(parse(&cfg, &err, "--config", tpath("bad.json"), NULL) < 0);
	assert_non_null(strstr(err.msg, "max_checkpoints"));
	config_free(&cfg);
	write_text(tpath("broken.json"), "{\"listen\": ");
	assert_true(parse(&cfg, &err, "--config", tpath("broken.json"), NULL) < 0);
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--create-roots", "--state-dir", tpath("s"), "--root", tpath("r"), "--token-file",
			  tpath("nope"), NULL) < 0);
	config_free(&cfg);
}

static void test_token(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	write_text(tpath("tok"), "s3cret\n");
	assert_int_equal(parse(&cfg, &err, "--create-roots", "--state-dir", tpath("s"), "--root", tpath("r"),
			       "--token-file", tpath("tok"), NULL),
			 0);
	assert_string_equal(cfg.token, "s3cret");
	config_free(&cfg);
	write_text(tpath("empty"), "\n");
	assert_true(parse(&cfg, &err, "--create-roots", "--state-dir", tpath("s"), "--root", tpath("r"), "--token-file",
			  tpath("empty"), NULL) < 0);
	config_free(&cfg);
}

/* Parse a config file holding text; returns config_parse's result, err filled. */
static int parse_file(struct config *cfg, ckpt_error *err, const char *text)
{
	write_text(tpath("strict.json"), text);
	return parse(cfg, err, "--config", tpath("strict.json"), "--state-dir", tpath("s"), NULL);
}

static void test_strict_file(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	char text[512];

	mkdir(tpath("exists"), 0755);
	/* an unknown key names itself and the nearest known key */
	snprintf(text, sizeof(text), "{\"roots\": [\"%s\"], \"max_checkpoint\": 3}", tpath("exists"));
	assert_true(parse_file(&cfg, &err, text) < 0);
	assert_non_null(strstr(err.msg, "unknown key 'max_checkpoint'"));
	assert_non_null(strstr(err.msg, "'max_checkpoints'"));
	config_free(&cfg);
	/* "root" instead of "roots" says so */
	snprintf(text, sizeof(text), "{\"root\": [\"%s\"]}", tpath("exists"));
	assert_true(parse_file(&cfg, &err, text) < 0);
	assert_non_null(strstr(err.msg, "'root'"));
	assert_non_null(strstr(err.msg, "did you mean 'roots'"));
	config_free(&cfg);
	/* a string where a list is expected */
	snprintf(text, sizeof(text), "{\"roots\": \"%s\"}", tpath("exists"));
	assert_true(parse_file(&cfg, &err, text) < 0);
	assert_non_null(strstr(err.msg, "roots must be a list"));
	config_free(&cfg);
	assert_true(parse_file(&cfg, &err, "{\"listen\": \"127.0.0.1:1\", \"roots\": []}") < 0);
	assert_non_null(strstr(err.msg, "listen must be a list"));
	config_free(&cfg);
	/* a root that does not exist, unless create_roots */
	snprintf(text, sizeof(text), "{\"roots\": [\"%s\"]}", tpath("missing"));
	assert_true(parse_file(&cfg, &err, text) < 0);
	assert_non_null(strstr(err.msg, "does not exist"));
	assert_non_null(strstr(err.msg, "create_roots"));
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--state-dir", tpath("s"), "--root", tpath("missing"), NULL) < 0);
	assert_non_null(strstr(err.msg, "does not exist"));
	config_free(&cfg);
	snprintf(text, sizeof(text), "{\"roots\": [\"%s\"], \"create_roots\": true}", tpath("missing"));
	assert_int_equal(parse_file(&cfg, &err, text), 0);
	struct stat st;
	assert_int_equal(stat(tpath("missing"), &st), 0);
	config_free(&cfg);
	snprintf(text, sizeof(text), "{\"roots\": [\"%s\"], \"create_roots\": \"yes\"}", tpath("missing"));
	assert_true(parse_file(&cfg, &err, text) < 0);
	config_free(&cfg);
	/* a missing file says "cannot open", not "line -1" */
	assert_true(parse(&cfg, &err, "--config", tpath("nope.json"), NULL) < 0);
	assert_non_null(strstr(err.msg, "cannot open config file"));
	assert_null(strstr(err.msg, "line -1")); /* the temp path itself may hold "-1" */
	config_free(&cfg);
}

static void test_check_only_creates_nothing(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	struct stat st;
	char text[512];

	snprintf(text, sizeof(text), "{\"roots\": [\"%s\"], \"create_roots\": true, \"state_dir\": \"%s\"}",
		 tpath("later-root"), tpath("later-state"));
	write_text(tpath("check.json"), text);
	assert_int_equal(parse(&cfg, &err, "--config", tpath("check.json"), "--check-config", NULL), 0);
	assert_true(cfg.check_only);
	assert_true(stat(tpath("later-root"), &st) < 0 && stat(tpath("later-state"), &st) < 0);
	config_free(&cfg);
	/* known as check-only even when parsing fails early */
	assert_true(parse(&cfg, &err, "--config", tpath("nope.json"), "--check-config", NULL) < 0);
	assert_true(cfg.check_only);
	config_free(&cfg);
}

/* Change tracking: "auto" by default, the three words, anything else refused;
 * track_check a boolean, off by default. */
static void test_tracking_keys(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	char text[512];
	const char *words[] = { "auto", "always", "never" };

	mkdir(tpath("exists"), 0755);
	snprintf(text, sizeof(text), "{\"roots\": [\"%s\"]}", tpath("exists"));
	assert_int_equal(parse_file(&cfg, &err, text), 0);
	assert_int_equal(cfg.track_changes, TRACK_AUTO);
	assert_false(cfg.track_check);
	config_free(&cfg);
	for (int m = TRACK_AUTO; m <= TRACK_NEVER; m++) {
		snprintf(text, sizeof(text), "{\"roots\": [\"%s\"], \"track_changes\": \"%s\", \"track_check\": true}",
			 tpath("exists"), words[m]);
		assert_int_equal(parse_file(&cfg, &err, text), 0);
		assert_int_equal(cfg.track_changes, m);
		assert_string_equal(track_mode_name(cfg.track_changes), words[m]);
		assert_true(cfg.track_check);
		config_free(&cfg);
	}
	const char *bad[] = { "\"1\"", "\"yes\"", "true", "1" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		snprintf(text, sizeof(text), "{\"roots\": [\"%s\"], \"track_changes\": %s}", tpath("exists"), bad[i]);
		assert_true(parse_file(&cfg, &err, text) < 0);
		assert_non_null(strstr(err.msg, "track_changes must be"));
		config_free(&cfg);
	}
	snprintf(text, sizeof(text), "{\"roots\": [\"%s\"], \"track_check\": \"1\"}", tpath("exists"));
	assert_true(parse_file(&cfg, &err, text) < 0);
	assert_non_null(strstr(err.msg, "track_check must be true or false"));
	config_free(&cfg);
}

/* "/" is the whole sandbox: the only root, on tar, the state dir inside. */
static void test_whole_root(void **state)
{
	(void)state;
	struct config cfg;
	ckpt_error err = { 0 };
	char text[512];

	assert_int_equal(parse(&cfg, &err, "--state-dir", tpath("s"), "--root", "/", NULL), 0);
	assert_true(cfg.whole_root);
	assert_string_equal(cfg.roots[0], "/");
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--create-roots", "--state-dir", tpath("s"), "--root", "/", "--root", tpath("r"),
			  NULL) < 0);
	assert_non_null(strstr(err.msg, "only root"));
	config_free(&cfg);
	assert_true(parse(&cfg, &err, "--state-dir", tpath("s"), "--root", "/", "--backend", "overlay", NULL) < 0);
	assert_non_null(strstr(err.msg, "tar backend"));
	config_free(&cfg);
	/* the state dir may still not be / */
	assert_true(parse(&cfg, &err, "--state-dir", "/", "--create-roots", "--root", tpath("r"), NULL) < 0);
	assert_non_null(strstr(err.msg, "may not be /"));
	config_free(&cfg);
	snprintf(text, sizeof(text),
		 "{\"state_dir\": \"%s\", \"roots\": [\"/\"], \"exclude\": [\"/opt/cache\", \"/home\"]}", tpath("s"));
	write_text(tpath("x.json"), text);
	assert_int_equal(parse(&cfg, &err, "--config", tpath("x.json"), NULL), 0);
	assert_int_equal(cfg.n_excludes, 2);
	assert_string_equal(cfg.excludes[1], "/home");
	config_free(&cfg);
	static const char *const bad[] = { "relative", "/opt/", "/opt//x", "/opt/../etc", "/opt/.", "/" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(text, sizeof(text), "{\"state_dir\": \"%s\", \"roots\": [\"/\"], \"exclude\": [\"%s\"]}",
			 tpath("s"), bad[i]);
		write_text(tpath("x.json"), text);
		assert_true(parse(&cfg, &err, "--config", tpath("x.json"), NULL) < 0);
		assert_non_null(strstr(err.msg, "exclude"));
		config_free(&cfg);
	}
	/* outside every root */
	snprintf(text, sizeof(text), "{\"state_dir\": \"%s\", \"roots\": [\"%s\"], \"exclude\": [\"/opt\"]}",
		 tpath("s"), tpath("r"));
	write_text(tpath("x.json"), text);
	assert_true(parse(&cfg, &err, "--create-roots", "--config", tpath("x.json"), NULL) < 0);
	assert_non_null(strstr(err.msg, "inside no root"));
	config_free(&cfg);
	write_text(tpath("x.json"), "{\"exclude\": \"/opt\"}");
	assert_true(parse(&cfg, &err, "--config", tpath("x.json"), NULL) < 0);
	assert_non_null(strstr(err.msg, "list of strings"));
	config_free(&cfg);
}

static void test_nearest_key(void **state)
{
	(void)state;
	assert_string_equal(config_nearest_key("root"), "roots");
	assert_string_equal(config_nearest_key("stat_dir"), "state_dir");
	assert_string_equal(config_nearest_key("listens"), "listen");
	assert_string_equal(config_nearest_key("metrics_token_fre"), "metrics_token_free");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_flags),         cmocka_unit_test(test_file_and_flags_win),
		cmocka_unit_test(test_errors),        cmocka_unit_test(test_token),
		cmocka_unit_test(test_strict_file),   cmocka_unit_test(test_check_only_creates_nothing),
		cmocka_unit_test(test_nearest_key),   cmocka_unit_test(test_whole_root),
		cmocka_unit_test(test_tracking_keys),
	};
	return cmocka_run_group_tests_name("config", tests, setup, teardown);
}
