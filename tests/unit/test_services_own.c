/* test_services_own.c: which running units a whole-root restore stops
 * around its swap because their own files change (services_own.c,
 * docs/whole-root.md). systemd is a fake ops table; the Debian package
 * pass reads this machine's real dpkg database (/var/lib/dpkg/info), read
 * only, through dpkg's own package, which ships a unit file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <sys/stat.h>

#include "config.h"
#include "services/services_internal.h"
#include "services/services_ops.h"

#define DPKG_LIST "/var/lib/dpkg/info/dpkg.list"
#define DPKG_UNIT "/lib/systemd/system/dpkg-db-backup.service"

/* A running unit and the files systemd names for it: FragmentPath first,
 * then drop-ins and ExecStart paths. gone: the unit went meanwhile. */
struct own_fake_unit {
	const char *name;
	const char *files[4];
	bool gone;
};

static const struct own_fake_unit own_units[] = {
	{ "web.service",
	  { "/etc/systemd/system/web.service", "/etc/systemd/system/web.service.d/limits.conf", "/opt/web/bin/web" },
	  false },
	{ "dpkg-db-backup.service", { DPKG_UNIT }, false },
	/* ckptd itself and systemd's own: never stopped, whatever changes */
	{ "ckptd.service", { "/etc/systemd/system/ckptd.service", "/usr/local/sbin/ckptd" }, false },
	{ "systemd-journald.service", { "/lib/systemd/system/systemd-journald.service" }, false },
	{ "gone.service", { "/etc/systemd/system/gone.service" }, true },
};

static struct {
	bool unreachable; /* connect fails (after services_open found the bus) */
	int connects, disconnects;
} own_bus;

static bool own_fake_booted(void)
{
	return true;
}

static int own_fake_pid_unit(pid_t pid, char **ret)
{
	(void)pid;
	*ret = strdup("ckptd.service");
	return *ret ? 0 : -ENOMEM;
}

static int own_fake_connect(void **ret, ckpt_error *err)
{
	if (own_bus.unreachable)
		return err_set(err, ECONNREFUSED, NULL, "fake: no bus");
	own_bus.connects++;
	*ret = &own_bus;
	return 0;
}

static void own_fake_disconnect(void *conn)
{
	assert_ptr_equal(conn, &own_bus);
	own_bus.disconnects++;
}

static int own_fake_running(void *conn, struct strv *ret)
{
	(void)conn;
	for (size_t i = 0; i < ARRAY_SIZE(own_units); i++)
		if (services_strv_add(ret, own_units[i].name) < 0)
			return -ENOMEM;
	return 0;
}

static int own_fake_unit_files(void *conn, const char *unit, struct strv *ret)
{
	(void)conn;
	for (size_t i = 0; i < ARRAY_SIZE(own_units); i++) {
		const struct own_fake_unit *u = &own_units[i];
		if (strcmp(u->name, unit))
			continue;
		if (u->gone)
			return -ENOENT;
		for (size_t k = 0; k < ARRAY_SIZE(u->files) && u->files[k]; k++)
			if (services_strv_add(ret, u->files[k]) < 0)
				return -ENOMEM;
		return 0;
	}
	return -ENOENT;
}

static const struct services_ops own_fake_ops = {
	.booted = own_fake_booted,
	.pid_unit = own_fake_pid_unit,
	.connect = own_fake_connect,
	.disconnect = own_fake_disconnect,
	.running_units = own_fake_running,
	.unit_files = own_fake_unit_files,
};

struct own_fixture {
	struct config cfg;
	struct services *s;
	struct svc_plan plan;
};

static int setup(void **state)
{
	struct own_fixture *f = calloc(1, sizeof(*f));
	ckpt_error err = { 0 };
	if (!f)
		return -1;
	memset(&own_bus, 0, sizeof(own_bus));
	config_defaults(&f->cfg);
	if (services_open(&f->cfg, &own_fake_ops, &f->s, &err) < 0 || !services_available(f->s))
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct own_fixture *f = *state;
	services_plan_free(&f->plan);
	services_close(f->s);
	config_free(&f->cfg);
	free(f);
	return 0;
}

/* The plan for these changed paths (relative to "/", as the restore gives
 * them), as one sorted string "a.service b.service". */
static const char *own_plan(struct own_fixture *f, const char *const *paths, size_t n)
{
	static char out[256];
	services_plan_free(&f->plan);
	memset(&f->plan, 0, sizeof(f->plan));
	assert_int_equal(services_plan_own(f->s, paths, n, &f->plan), 0);
	out[0] = '\0';
	for (size_t i = 0; i < f->plan.n; i++) {
		size_t len = strlen(out);
		snprintf(out + len, sizeof(out) - len, "%s%s", len ? " " : "", f->plan.units[i].name);
	}
	assert_int_equal(own_bus.connects, own_bus.disconnects);
	return out;
}

static void test_unit_file_dropin_exec(void **state)
{
	struct own_fixture *f = *state;
	const char *const fragment[] = { "etc/systemd/system/web.service" };
	const char *const dropin[] = { "etc/systemd/system/web.service.d/limits.conf" };
	const char *const exec[] = { "srv/other", "opt/web/bin/web" };
	assert_string_equal(own_plan(f, fragment, 1), "web.service");
	assert_string_equal(own_plan(f, dropin, 1), "web.service");
	assert_string_equal(own_plan(f, exec, 2), "web.service");
}

/* A directory the restore removes whole ends in "/": what is below it changes. */
static void test_directory_removed_whole(void **state)
{
	struct own_fixture *f = *state;
	const char *const whole[] = { "opt/web/" };
	const char *const beside[] = { "opt/webx/" };
	assert_string_equal(own_plan(f, whole, 1), "web.service");
	assert_string_equal(own_plan(f, beside, 1), "");
}

/* Files of no unit (a config outside any package, data): nobody stops. */
static void test_unrelated_paths(void **state)
{
	struct own_fixture *f = *state;
	const char *const paths[] = { "srv/www/index.html", "etc/web.conf", "etc/systemd/system/web.service.bak" };
	assert_string_equal(own_plan(f, paths, 3), "");
	assert_string_equal(own_plan(f, NULL, 0), "");
}

/* ckptd's own unit, systemd's own units and a unit gone meanwhile are
 * never in the plan, even when every file of theirs changes. */
static void test_never_self_or_systemd(void **state)
{
	struct own_fixture *f = *state;
	const char *const paths[] = { "etc/systemd/system/ckptd.service", "usr/local/sbin/ckptd",
				      "usr/lib/systemd/system/systemd-journald.service",
				      "etc/systemd/system/gone.service" };
	assert_string_equal(own_plan(f, paths, 4), "");
}

/* Merged /usr: systemd names /lib/..., the restore writes usr/lib/... */
static void test_merged_usr(void **state)
{
	struct own_fixture *f = *state;
	char link[64] = { 0 };
	if (readlink("/lib", link, sizeof(link) - 1) < 0 || (strcmp(link, "usr/lib") && strcmp(link, "/usr/lib"))) {
		print_message("skipped: /lib is not a link into /usr on this machine\n");
		skip();
	}
	const char *const paths[] = { "usr" DPKG_UNIT };
	assert_string_equal(own_plan(f, paths, 1), "dpkg-db-backup.service");
}

static bool own_listed(const char *line)
{
	_cleanup_free_ char *text = NULL;
	char want[256];
	if (read_file_at(AT_FDCWD, DPKG_LIST, 64 << 20, &text, NULL) < 0)
		return false;
	snprintf(want, sizeof(want), "\n%s\n", line);
	return strstr(text, want) != NULL;
}

/* A file of the package that ships the unit file: dpkg's own package ships
 * dpkg-db-backup.service and /usr/bin/dpkg, on this Debian machine. */
static void test_package_files(void **state)
{
	struct own_fixture *f = *state;
	if (!own_listed(DPKG_UNIT) || !own_listed("/usr/bin/dpkg")) {
		print_message("skipped: %s does not list %s and /usr/bin/dpkg\n", DPKG_LIST, DPKG_UNIT);
		skip();
	}
	const char *const pkg[] = { "usr/bin/dpkg" };
	const char *const both[] = { "usr/bin/dpkg", "opt/web/bin/web" };
	assert_string_equal(own_plan(f, pkg, 1), "dpkg-db-backup.service");
	assert_string_equal(own_plan(f, both, 2), "web.service dpkg-db-backup.service");
}

/* How many packages' lists name line. */
static int own_listers(const char *line)
{
	_cleanup_closedir_ DIR *d = opendir("/var/lib/dpkg/info");
	struct dirent *de;
	int n = 0;
	while (d && (de = readdir(d))) {
		size_t len = strlen(de->d_name);
		_cleanup_free_ char *text = NULL;
		char want[256];
		if (len < 6 || strcmp(de->d_name + len - 5, ".list") ||
		    read_file_at(dirfd(d), de->d_name, 64 << 20, &text, NULL) < 0)
			continue;
		snprintf(want, sizeof(want), "\n%s\n", line);
		n += strstr(text, want) != NULL;
	}
	return n;
}

/* A config file of no package, below a directory under /etc that only the
 * unit's package lists, is the unit's (docs/whole-root.md): dpkg alone
 * lists /etc/alternatives here. One directly in /etc is nobody's. */
static void test_config_outside_packages(void **state)
{
	struct own_fixture *f = *state;
	if (!own_listed(DPKG_UNIT) || !own_listed("/etc/alternatives") || own_listers("/etc/alternatives") != 1) {
		print_message("skipped: dpkg does not ship %s and /etc/alternatives alone here\n", DPKG_UNIT);
		skip();
	}
	const char *const below[] = { "etc/alternatives/ckptd-test-of-no-package" };
	const char *const top[] = { "etc/ckptd-test-of-no-package.conf" };
	assert_int_equal(own_listers("/etc/alternatives/ckptd-test-of-no-package"), 0);
	assert_string_equal(own_plan(f, below, 1), "dpkg-db-backup.service");
	assert_string_equal(own_plan(f, top, 1), "");
}

/* No bus: an error, not a silent empty plan (the restore then warns). */
static void test_unreachable(void **state)
{
	struct own_fixture *f = *state;
	const char *const paths[] = { "opt/web/bin/web" };
	own_bus.unreachable = true;
	assert_int_equal(services_plan_own(f->s, paths, 1, &f->plan), -ENOTCONN);
	assert_int_equal(f->plan.n, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_unit_file_dropin_exec, setup, teardown),
		cmocka_unit_test_setup_teardown(test_directory_removed_whole, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unrelated_paths, setup, teardown),
		cmocka_unit_test_setup_teardown(test_never_self_or_systemd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_merged_usr, setup, teardown),
		cmocka_unit_test_setup_teardown(test_package_files, setup, teardown),
		cmocka_unit_test_setup_teardown(test_config_outside_packages, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unreachable, setup, teardown),
	};
	return cmocka_run_group_tests_name("services_own", tests, NULL, NULL);
}
