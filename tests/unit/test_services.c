/* test_services.c: the pure parts of the services module (which units, which
 * processes use a root, from a fake /proc) and its behaviour without systemd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/stat.h>

#include "config.h"
#include "services/services_internal.h"
#include "testlib.h"

static char dir[TESTLIB_DIR_LEN];

static void put_link(const char *rel, const char *target)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	assert_int_equal(symlink(target, p), 0);
}

static void put_dir(const char *rel)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	assert_int_equal(mkdir(p, 0755), 0);
}

static void put_file(const char *rel, const char *text)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int setup(void **state)
{
	(void)state;
	return testlib_mkdir(dir, "services");
}

static int teardown(void **state)
{
	(void)state;
	testlib_rmdir(dir);
	return 0;
}

static void test_unit_names(void **state)
{
	(void)state;
}

static void test_unit_eligible(void **state)
{
	(void)state;
	assert_true(services_scan_unit_eligible("web.service", "ckptd.service"));
	assert_true(services_scan_unit_eligible("app@1.service", NULL));
	assert_false(services_scan_unit_eligible("ckptd.service", "ckptd.service"));
	assert_false(services_scan_unit_eligible("session-3.scope", NULL));
	assert_false(services_scan_unit_eligible("run-u4.scope", NULL));
	assert_false(services_scan_unit_eligible("user@0.service", NULL));
	assert_false(services_scan_unit_eligible("user-runtime-dir@0.service", NULL));
	assert_false(services_scan_unit_eligible("getty@tty1.service", NULL));
	assert_false(services_scan_unit_eligible("console-getty.service", NULL));
	assert_false(services_scan_unit_eligible("systemd-journald.service", NULL));
	assert_false(services_scan_unit_eligible("dbus.service", NULL));
	assert_false(services_scan_unit_eligible("user.slice", NULL));
	assert_false(services_scan_unit_eligible("web.socket", NULL));
	assert_false(services_scan_unit_eligible("", NULL));
	assert_false(services_scan_unit_eligible(NULL, NULL));
}

static void test_unit_allowed_and_named(void **state)
{
	(void)state;
	/* Configured units may be other types, but never scopes, slices, sessions or ckptd. */
	assert_true(services_scan_unit_allowed("web.service", "ckptd.service"));
	assert_true(services_scan_unit_allowed("app.target", NULL));
	assert_false(services_scan_unit_allowed("ckptd.service", "ckptd.service"));
	assert_false(services_scan_unit_allowed("session-1.scope", NULL));
	assert_false(services_scan_unit_allowed("user-0.slice", NULL));
	assert_false(services_scan_unit_allowed("user@0.service", NULL));
	char *n = services_scan_unit_name("web");
	assert_string_equal(n, "web.service");
	free(n);
	n = services_scan_unit_name("app.target");
	assert_string_equal(n, "app.target");
	free(n);
}

static bool has_pid(const pid_t *v, size_t n, pid_t pid)
{
	for (size_t i = 0; i < n; i++)
		if (v[i] == pid)
			return true;
	return false;
}

/* A fake /proc: one process per way of using a root, and some that do not. */
static void test_scan_pids(void **state)
{
	(void)state;
	const char *names[] = { "10", "11", "12", "13", "14", "15", "16", "self" };
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		put_dir(names[i]);
	put_link("10/cwd", "/srv/app/sub"); /* cwd under root */
	put_link("11/cwd", "/");
	put_dir("11/fd");
	put_link("11/fd/0", "/dev/null");
	put_link("11/fd/7", "/srv/app/data.log"); /* open file */
	put_link("12/cwd", "/srv");
	put_file("12/maps",
		 "7f00-7f01 r-xp 00000000 08:01 42   /usr/lib/libc.so.6\n"
		 "7f02-7f03 r--p 00000000 08:01 43   /srv/app/lib/my lib.so (deleted)\n");
	put_link("13/root", "/srv/app");  /* chrooted into it */
	put_link("14/cwd", "/srv/apple"); /* a sibling, not under */
	put_dir("14/fd");
	put_link("14/fd/1", "socket:[1234]");
	put_link("15/cwd", "/other/root/x"); /* second root */
	put_link("16/cwd", "/srv/app");      /* skipped: ckptd itself */
	put_link("self/cwd", "/srv/app");
	char *roots[] = { "/srv/app", "/other/root" };
	pid_t *pids = NULL;
	size_t n = 0;
	assert_int_equal(services_scan_pids(dir, roots, 2, 16, &pids, &n), 0);
	assert_int_equal(n, 5);
	assert_true(has_pid(pids, n, 10));
	assert_true(has_pid(pids, n, 11));
	assert_true(has_pid(pids, n, 12));
	assert_true(has_pid(pids, n, 13));
	assert_true(has_pid(pids, n, 15));
	free(pids);
	assert_int_equal(services_scan_pids("/nonexistent-proc", roots, 2, 0, &pids, &n), -ENOENT);
}

/* The real /proc: this test process holds a file open under a temp root. */
static void test_scan_real_proc(void **state)
{
	(void)state;
	put_file("held", "x");
	char p[128];
	snprintf(p, sizeof(p), "%s/held", dir);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	char *roots[] = { dir };
	pid_t *pids = NULL;
	size_t n = 0;
	assert_int_equal(services_scan_pids("/proc", roots, 1, 0, &pids, &n), 0);
	assert_true(has_pid(pids, n, getpid()));
	free(pids);
	assert_int_equal(services_scan_pids("/proc", roots, 1, getpid(), &pids, &n), 0);
	assert_false(has_pid(pids, n, getpid()));
	free(pids);
	close(fd);
}

static void test_strv(void **state)
{
	(void)state;
	struct strv s = { 0 };
	assert_int_equal(services_strv_add(&s, "a.service"), 0);
	assert_int_equal(services_strv_add(&s, "b.service"), 0);
	assert_int_equal(services_strv_add(&s, "a.service"), 0);
	assert_int_equal(s.n, 2);
	assert_true(services_strv_contains(&s, "b.service"));
	assert_false(services_strv_contains(&s, "c.service"));
	services_strv_clear(&s);
	assert_int_equal(s.n, 0);
}

/* This machine's PID 1 is not systemd: every step is skipped and says why. */
static void test_unavailable_without_systemd(void **state)
{
	(void)state;
	struct config cfg;
	config_defaults(&cfg);
	char *roots[] = { dir };
	struct services *s = NULL;
	ckpt_error err = { 0 };
	assert_int_equal(services_open(&cfg, NULL, &s, &err), 0);
	assert_non_null(s);
	assert_false(services_available(s));
	assert_non_null(strstr(services_unavailable_reason(s), "PID 1"));
	struct svc_plan plan;
	assert_int_equal(services_plan(s, roots, 1, &plan), 0);
	assert_int_equal(plan.n, 0);
	assert_int_equal(services_freeze(s, &plan), 0);
	assert_int_equal(services_thaw(s, &plan), 0);
	assert_int_equal(services_stop(s, &plan), 0);
	assert_int_equal(services_start(s, &plan), 0);
	struct svc_report rep;
	svc_report_init(&rep);
	services_report(&plan, &rep);
	assert_int_equal(rep.stopped.n + rep.started.n + rep.failed.n + rep.frozen.n + rep.n_failures, 0);
	svc_report_free(&rep);
	services_plan_free(&plan);
	services_close(s);
	config_free(&cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unit_names),
		cmocka_unit_test(test_unit_eligible),
		cmocka_unit_test(test_unit_allowed_and_named),
		cmocka_unit_test_setup_teardown(test_scan_pids, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scan_real_proc, setup, teardown),
		cmocka_unit_test(test_strv),
		cmocka_unit_test_setup_teardown(test_unavailable_without_systemd, setup, teardown),
	};
	return cmocka_run_group_tests_name("services", tests, NULL, NULL);
}
