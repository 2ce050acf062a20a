/* services_own.c: the units a whole-root restore stops before its swap and
 * starts after it, because their own files change (docs/whole-root.md). A
 * unit's own files: its unit file and drop-ins, the executables of its
 * ExecStart, and the files of the Debian package that ships its unit file
 * (/var/lib/dpkg/info/<package>.list, which lists the conffiles too), with
 * the directories under /etc that only that package lists, whole: an edit
 * under /etc/nginx is nginx's. A unit that read its config at start and
 * closed it is found so; a scan of /proc would not see it. */
#include <limits.h>
#include <sys/stat.h>

#include "lib/walk.h"
#include "services/services_internal.h"

#define DPKG_INFO "/var/lib/dpkg/info"

/* The paths the restore changes, absolute and sorted; a directory removed
 * whole ends in "/". */
struct own_set {
	char **v;
	size_t n;
	bool merged[6]; /* /bin ... are links into /usr (merged /usr) */
};

static const char *const own_top[] = { "bin", "sbin", "lib", "lib32", "lib64", "libx32" };

struct own_unit {
	const char *name;
	char *fragment; /* normalized */
	int pkg;        /* index of its package's .list in the pass, or -1 */
	bool hit;
};

struct own_etc {
	char *path;
	int pkg;
};

static int own_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int own_etc_cmp(const void *a, const void *b)
{
	return strcmp(((const struct own_etc *)a)->path, ((const struct own_etc *)b)->path);
}

static void own_set_free(struct own_set *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
}

static int own_set_make(struct own_set *s, const char *const *paths, size_t n)
{
	if (!(s->v = calloc(n + 1, sizeof(*s->v))))
		return -ENOMEM;
	for (; s->n < n; s->n++)
		if (asprintf(&s->v[s->n], "/%s", paths[s->n]) < 0)
			return -ENOMEM;
	qsort(s->v, s->n, sizeof(*s->v), own_cmp);
	for (size_t i = 0; i < ARRAY_SIZE(own_top); i++) {
		char link[PATH_MAX], top[16], want[24];
		snprintf(top, sizeof(top), "/%s", own_top[i]);
		snprintf(want, sizeof(want), "usr/%s", own_top[i]);
		ssize_t len = readlink(top, link, sizeof(link) - 1);
		link[len > 0 ? len : 0] = '\0';
		s->merged[i] = !strcmp(link, want) || (link[0] == '/' && !strcmp(link + 1, want));
	}
	return 0;
}

/* A path as the walk sees it: through merged /usr links. */
static const char *own_norm(const struct own_set *s, const char *path, char *buf, size_t len)
{
	for (size_t i = 0; i < ARRAY_SIZE(own_top); i++) {
		size_t k = strlen(own_top[i]);
		if (s->merged[i] && path[0] == '/' && !strncmp(path + 1, own_top[i], k) && path[k + 1] == '/') {
			snprintf(buf, len, "/usr%s", path);
			return buf;
		}
	}
	return path;
}

/* The first entry not below key (binary search). */
static size_t own_lower(const struct own_set *s, const char *key)
{
	size_t lo = 0, hi = s->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(s->v[mid], key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static bool own_exact(const struct own_set *s, const char *key)
{
	size_t i = own_lower(s, key);
	return i < s->n && !strcmp(s->v[i], key);
}

/* path changes: it is in the set, or below a directory removed whole. */
static bool own_changes(const struct own_set *s, const char *path)
{
	char buf[PATH_MAX];
	path = own_norm(s, path, buf, sizeof(buf));
	if (own_exact(s, path))
		return true;
	for (const char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
		char dir[PATH_MAX];
		snprintf(dir, sizeof(dir), "%.*s", (int)(p - path + 1), path);
		if (own_exact(s, dir))
			return true;
	}
	return false;
}

/* Anything below dir changes. */
static bool own_below(const struct own_set *s, const char *dir)
{
	char key[PATH_MAX];
	snprintf(key, sizeof(key), "%s/", dir);
	size_t i = own_lower(s, key);
	return i < s->n && !strncmp(s->v[i], key, strlen(key));
}

/* What systemd names as the unit's files: one of them changes (hit), or
 * the fragment is kept for the package pass. */
static int own_unit_files(struct services *s, void *conn, const struct own_set *set, struct own_unit *u)
{
	struct strv files = { 0 };
	char buf[PATH_MAX];
	int r = s->ops->unit_files(conn, u->name, &files);
	for (size_t i = 0; r >= 0 && i < files.n && !u->hit; i++) {
		u->hit = own_changes(set, files.v[i]);
		if (u->hit)
			log_info("services: \"%s\" is stopped around the swap: the restore changes its file '%s'",
				 u->name, files.v[i]);
	}
	if (r >= 0 && files.n && files.v[0][0] == '/' &&
	    !(u->fragment = strdup(own_norm(set, files.v[0], buf, sizeof(buf)))))
		r = -ENOMEM;
	services_strv_clear(&files);
	return r < 0 && r != -ENOMEM ? 0 : r; /* a unit gone meanwhile: not ours to stop */
}

struct own_pass {
	const struct own_set *set;
	struct own_unit *units;
	size_t n_units;
	int n_pkgs;
	bool *pkg_hit;   /* by package index */
	bool *pkg_units; /* the package ships a unit's file */
	struct own_etc *etc;
	size_t n_etc, cap_etc;
};

static int own_etc_add(struct own_pass *p, const char *line, int pkg)
{
	if (p->n_etc == p->cap_etc) {
		size_t cap = p->cap_etc ? p->cap_etc * 2 : 256;
		struct own_etc *v = realloc(p->etc, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		p->etc = v, p->cap_etc = cap;
	}
	if (!(p->etc[p->n_etc].path = strdup(line)))
		return -ENOMEM;
	p->etc[p->n_etc++].pkg = pkg;
	return 0;
}

/* One line of package pkg's .list. */
static int own_line(struct own_pass *p, const char *line, int pkg)
{
	char buf[PATH_MAX];
	const char *n = own_norm(p->set, line, buf, sizeof(buf));
	if (!p->pkg_hit[pkg] && own_exact(p->set, n))
		p->pkg_hit[pkg] = true;
	for (size_t i = 0; i < p->n_units; i++)
		if (p->units[i].fragment && p->units[i].pkg < 0 && !strcmp(p->units[i].fragment, n)) {
			p->units[i].pkg = pkg;
			p->pkg_units[pkg] = true;
		}
	return !strncmp(line, "/etc/", 5) ? own_etc_add(p, line, pkg) : 0;
}

static int own_list(struct own_pass *p, int dfd, const char *name)
{
	_cleanup_free_ char *text = NULL;
	int r = read_file_at(dfd, name, 64 << 20, &text, NULL);
	if (r < 0)
		return r == -ENOMEM ? r : 0;
	bool *hit = realloc(p->pkg_hit, (size_t)(p->n_pkgs + 1) * sizeof(*hit));
	bool *units = hit ? realloc(p->pkg_units, (size_t)(p->n_pkgs + 1) * sizeof(*units)) : NULL;
	p->pkg_hit = hit ? hit : p->pkg_hit;
	if (!hit || !units)
		return -ENOMEM;
	p->pkg_units = units;
	int pkg = p->n_pkgs++;
	hit[pkg] = units[pkg] = false;
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); r >= 0 && line; line = strtok_r(NULL, "\n", &save))
		r = own_line(p, line, pkg);
	return r;
}

/* A directory under /etc that one package alone lists is that package's,
 * with all below it (/etc/nginx); one that several list (/etc/default) is
 * not. */
static void own_etc_dirs(struct own_pass *p)
{
	qsort(p->etc, p->n_etc, sizeof(*p->etc), own_etc_cmp);
	for (size_t i = 0; i < p->n_etc; i++) {
		struct stat st;
		bool shared = (i > 0 && !strcmp(p->etc[i].path, p->etc[i - 1].path)) ||
			(i + 1 < p->n_etc && !strcmp(p->etc[i].path, p->etc[i + 1].path));
		int pkg = p->etc[i].pkg;
		if (shared || !p->pkg_units[pkg] || p->pkg_hit[pkg] || lstat(p->etc[i].path, &st) < 0 ||
		    !S_ISDIR(st.st_mode))
			continue;
		p->pkg_hit[pkg] = own_below(p->set, p->etc[i].path);
	}
}

static void own_pass_free(struct own_pass *p)
{
	for (size_t i = 0; i < p->n_etc; i++)
		free(p->etc[i].path);
	free(p->etc);
	free(p->pkg_hit);
	free(p->pkg_units);
}

/* Every package's .list, read once: which ships each unit's file, and
 * whether one of its files (or its own /etc directories) changes. */
static int own_packages(struct own_pass *p)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	int r = walk_open(AT_FDCWD, DPKG_INFO, &d);
	if (r < 0)
		return r == -ENOENT ? 0 : r; /* not a Debian system */
	while (r >= 0 && (de = walk_next(d))) {
		size_t len = strlen(de->d_name);
		if (len > 5 && !strcmp(de->d_name + len - 5, ".list"))
			r = own_list(p, dirfd(d), de->d_name);
	}
	if (r < 0)
		return r;
	own_etc_dirs(p);
	for (size_t i = 0; i < p->n_units; i++) {
		struct own_unit *u = &p->units[i];
		if (u->hit || u->pkg < 0 || !p->pkg_hit[u->pkg])
			continue;
		u->hit = true;
		log_info("services: \"%s\" is stopped around the swap: the restore changes files of the package "
			 "that ships '%s'",
			 u->name, u->fragment);
	}
	return 0;
}

static int own_find(struct services *s, void *conn, const struct own_set *set, struct svc_plan *plan)
{
	struct strv running = { 0 };
	int r = s->ops->running_units(conn, &running);
	_cleanup_free_ struct own_unit *units = calloc(running.n + 1, sizeof(*units));
	struct own_pass pass = { .set = set, .units = units };
	bool left = false;
	if (r >= 0 && !units)
		r = -ENOMEM;
	for (size_t i = 0; r >= 0 && i < running.n; i++) {
		if (!services_scan_unit_eligible(running.v[i], s->self_unit))
			continue; /* ckptd, logins, systemd's own: never stopped */
		struct own_unit *u = &units[pass.n_units++];
		*u = (struct own_unit){ .name = running.v[i], .pkg = -1 };
		r = own_unit_files(s, conn, set, u);
		left |= !u->hit && u->fragment;
	}
	if (r >= 0 && left)
		r = own_packages(&pass);
	for (size_t i = 0; r >= 0 && i < pass.n_units; i++)
		if (units[i].hit && !services_plan_add(plan, units[i].name))
			r = -ENOMEM;
	for (size_t i = 0; i < pass.n_units; i++)
		free(units[i].fragment);
	own_pass_free(&pass);
	services_strv_clear(&running);
	return r;
}

int services_plan_own(struct services *s, const char *const *paths, size_t n, struct svc_plan *plan)
{
	struct own_set set = { 0 };
	ckpt_error e = { 0 };
	void *conn = NULL;
	if (!services_available(s) || !s->ops->running_units || !s->ops->unit_files || n == 0)
		return 0;
	int r = own_set_make(&set, paths, n);
	if (r >= 0 && s->ops->connect(&conn, &e) < 0)
		r = -ENOTCONN;
	if (r >= 0)
		r = own_find(s, conn, &set, plan);
	if (conn)
		s->ops->disconnect(conn);
	own_set_free(&set);
	return r;
}
