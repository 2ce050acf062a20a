/* services_scan.c: which processes use a managed root (lib/procscan.c reads
 * /proc), and which units may be managed at all. No sd-bus, so unit-testable. */
#include <sys/stat.h>
#include "lib/procscan.h"
#include "services/services_internal.h"

static bool has_prefix(const char *s, const char *p)
{
	return strncmp(s, p, strlen(p)) == 0;
}

static bool has_suffix(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Units that keep the machine reachable or running: stopping them because one
 * of their processes touched a managed root would do more harm than good. */
static const char *const protected_prefixes[] = {
	"user@",   "user-runtime-dir@", "getty@", "serial-getty@", "console-getty.", "container-getty@",
	"autovt@", "systemd-",          "dbus.",  "dbus-broker.",  "polkit.",        "session-",
	"init.",
};

bool services_scan_unit_allowed(const char *unit, const char *self_unit)
{
	if (!unit || !*unit || (self_unit && strcmp(unit, self_unit) == 0))
		return false;
	if (has_suffix(unit, ".scope") || has_suffix(unit, ".slice"))
		return false;
	return !has_prefix(unit, "session-") && !has_prefix(unit, "user@") && !has_prefix(unit, "getty@");
}

bool services_scan_unit_eligible(const char *unit, const char *self_unit)
{
	if (!services_scan_unit_allowed(unit, self_unit) || !has_suffix(unit, ".service"))
		return false;
	for (size_t i = 0; i < ARRAY_SIZE(protected_prefixes); i++)
		if (has_prefix(unit, protected_prefixes[i]))
			return false;
	return true;
}

char *services_scan_unit_name(const char *name)
{
	static const char *const types[] = { ".service",   ".socket", ".target", ".timer", ".path", ".mount",
					     ".automount", ".swap",   ".device", ".scope", ".slice" };
	for (size_t i = 0; i < ARRAY_SIZE(types); i++)
		if (has_suffix(name, types[i]))
			return strdup(name);
	char *r = NULL;
	return asprintf(&r, "%s.service", name) < 0 ? NULL : r;
}

int services_scan_pids(const char *proc, char *const *roots, size_t n_roots, pid_t skip_pid, pid_t **ret, size_t *ret_n)
{
	_cleanup_free_ struct procscan_target *t = NULL;
	_cleanup_free_ struct procscan_user *u = NULL;
	size_t n_t = 0, n = 0;
	int r = services_scan_targets(roots, n_roots, NULL, 0, &t, &n_t);
	if (r >= 0)
		r = procscan_users(proc, t, n_t, skip_pid, &u, &n);
	pid_t *pids = r >= 0 ? calloc(n ? n : 1, sizeof(*pids)) : NULL;
	if (r >= 0 && !pids)
		r = -ENOMEM;
	for (size_t i = 0; pids && i < n; i++)
		pids[i] = u[i].pid;
	*ret = pids;
	*ret_n = r >= 0 ? n : 0;
	return r;
}

int services_scan_targets(char *const *roots, size_t n_roots, const struct procscan_target *extra, size_t n_extra,
			  struct procscan_target **ret, size_t *ret_n)
{
	struct procscan_target *t = calloc(n_roots + n_extra + 1, sizeof(*t));
	size_t n = 0;
	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < n_roots; i++) {
		/* A root that cannot be stat'ed is matched by its path only. */
		struct stat st = { 0 };
		if (stat(roots[i], &st) < 0)
			st.st_dev = 0, st.st_ino = 0;
		t[n++] = (struct procscan_target){ .path = roots[i], .dev = st.st_dev, .ino = st.st_ino, .tag = 0 };
	}
	for (size_t i = 0; i < n_extra; i++)
		t[n++] = extra[i];
	*ret = t;
	*ret_n = n;
	return 0;
}
