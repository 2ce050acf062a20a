/* services_scan.c: which processes use a managed root, and which units may be
 * managed at all. Pure /proc reading, no sd-bus, so it is unit-testable. */
#include <ctype.h>
#include <limits.h>
#include "services/services_internal.h"

bool services_scan_path_under(const char *path, const char *root)
{
	size_t n = strlen(root);
	while (n > 1 && root[n - 1] == '/')
		n--;
	if (n == 1 && root[0] == '/')
		return path[0] == '/';
	return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

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

static bool link_under(int dirfd, const char *name, char *const *roots, size_t n_roots)
{
	char buf[PATH_MAX];
	ssize_t n = readlinkat(dirfd, name, buf, sizeof(buf) - 1);
	if (n <= 0 || buf[0] != '/')
		return false;
	buf[n] = '\0';
	for (size_t i = 0; i < n_roots; i++)
		if (services_scan_path_under(buf, roots[i]))
			return true;
	return false;
}

static bool fds_under(int piddirfd, char *const *roots, size_t n_roots)
{
	int fd = openat(piddirfd, "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return false;
	_cleanup_closedir_ DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return false;
	}
	struct dirent *de;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' && link_under(dirfd(d), de->d_name, roots, n_roots))
			return true;
	return false;
}

/* A maps line: "addr perms offset dev inode   /path"; the path starts at the
 * first '/' after the inode field (names may hold spaces). */
static bool maps_under(int piddirfd, char *const *roots, size_t n_roots)
{
	int fd = openat(piddirfd, "maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	_cleanup_fclose_ FILE *f = fdopen(fd, "re");
	if (!f) {
		close(fd);
		return false;
	}
	_cleanup_free_ char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	while ((len = getline(&line, &cap, f)) > 0) {
		if (line[len - 1] == '\n')
			line[len - 1] = '\0';
		char *p = strchr(line, '/');
		if (!p)
			continue;
		char *del = strstr(p, " (deleted)");
		if (del && del[10] == '\0')
			*del = '\0';
		for (size_t i = 0; i < n_roots; i++)
			if (services_scan_path_under(p, roots[i]))
				return true;
	}
	return false;
}

static bool pid_uses_roots(int procfd, const char *pid, char *const *roots, size_t n_roots)
{
	_cleanup_close_ int dfd = openat(procfd, pid, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return false;
	return link_under(dfd, "cwd", roots, n_roots) || link_under(dfd, "root", roots, n_roots) ||
		fds_under(dfd, roots, n_roots) || maps_under(dfd, roots, n_roots);
}

static int pids_push(pid_t **v, size_t *n, size_t *cap, pid_t pid)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 16;
		pid_t *nv = realloc(*v, c * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		*v = nv;
		*cap = c;
	}
	(*v)[(*n)++] = pid;
	return 0;
}

static bool is_pid_name(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isdigit((unsigned char)*s))
			return false;
	return true;
}

int services_scan_pids(const char *proc, char *const *roots, size_t n_roots, pid_t skip_pid, pid_t **ret, size_t *ret_n)
{
	_cleanup_closedir_ DIR *d = opendir(proc);
	if (!d)
		return -errno;
	_cleanup_free_ pid_t *v = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!is_pid_name(de->d_name))
			continue;
		long pid = strtol(de->d_name, NULL, 10);
		if (pid <= 0 || pid > INT_MAX || pid == skip_pid)
			continue;
		if (pid_uses_roots(dirfd(d), de->d_name, roots, n_roots) && pids_push(&v, &n, &cap, (pid_t)pid) < 0)
			return -ENOMEM;
	}
	*ret = TAKE_PTR(v);
	*ret_n = n;
	return 0;
}
