/* services_gone.c: the units a whole-root restore restarts, as needrestart
 * finds them (docs/whole-root.md). A process that maps or holds open a file
 * the restore replaced or removed still runs the old one: its unit is
 * stopped and started, so it runs on what the checkpoint holds. */
#include <string.h>
#include <sys/stat.h>

#include "lib/procscan.h"
#include "services/services_internal.h"

struct gone_scan {
	const struct devino_map *gone;
	struct devino_map by_ino; /* (0, ino) -> path: a match where devices disagree */
	pid_t self;
	bool self_uses;
	pid_t *pids;
	size_t n, cap;
};

/* On an overlay of several filesystems, a mapping shows the device of the
 * layer that holds the file, stat the overlay's: the inode and the path
 * still tell it. */
static bool gone_match(const struct gone_scan *g, const struct procscan_ref *ref)
{
	if (devino_get(g->gone, ref->dev, ref->ino))
		return true;
	const char *p = devino_get(&g->by_ino, 0, ref->ino);
	return p && !strcmp(p, ref->path);
}

static int gone_pid_add(struct gone_scan *g, pid_t pid)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 16;
		pid_t *v = realloc(g->pids, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		g->pids = v;
		g->cap = cap;
	}
	g->pids[g->n++] = pid;
	return 0;
}

static int gone_visit(void *ctx, const struct procscan_ref *ref)
{
	struct gone_scan *g = ctx;
	if ((ref->kind != PROCSCAN_FD && ref->kind != PROCSCAN_MAP) || !ref->has_id || !gone_match(g, ref))
		return PROCSCAN_CONTINUE;
	log_debug("services: pid %ld uses \"%s\", which the restore replaced", (long)ref->pid, ref->path);
	if (ref->pid == g->self) {
		g->self_uses = true;
		return PROCSCAN_NEXT_PID;
	}
	int r = gone_pid_add(g, ref->pid);
	return r < 0 ? r : PROCSCAN_NEXT_PID;
}

static int gone_index(struct gone_scan *g)
{
	for (size_t i = 0; i < g->gone->cap; i++) {
		const struct devino_entry *e = &g->gone->v[i];
		if (e->path && devino_put(&g->by_ino, 0, e->ino, e->path) < 0)
			return -ENOMEM;
	}
	return 0;
}

/* A unit of a pid found: running, eligible, and added once. */
static int gone_add_unit(struct services *s, void *conn, struct svc_plan *ret, const char *unit)
{
	_cleanup_free_ char *st = NULL;
	if (!services_scan_unit_eligible(unit, s->self_unit))
		return 0; /* ckptd, logins, systemd's own: never restarted */
	if (s->ops->active_state(conn, unit, &st) < 0 || !services_state_running(st))
		return 0;
	return services_plan_add(ret, unit) ? 0 : -ENOMEM;
}

/* A unit whose file or enablement link the restore wrote, enabled now and
 * not running: started, as its package's install script would. */
static int gone_add_linked(struct services *s, void *conn, struct svc_plan *ret, const char *name)
{
	_cleanup_free_ char *unit = services_scan_unit_name(name), *st = NULL, *fs = NULL;
	if (!unit)
		return -ENOMEM;
	if (!services_scan_unit_eligible(unit, s->self_unit) || !s->ops->file_state ||
	    s->ops->file_state(conn, unit, &fs) < 0 || strcmp(fs, "enabled") ||
	    (s->ops->active_state(conn, unit, &st) >= 0 && services_state_running(st)))
		return 0;
	for (size_t i = 0; i < ret->n; i++)
		if (!strcmp(ret->units[i].name, unit))
			return 0;
	struct svc_unit *u = services_plan_add(ret, unit);
	if (!u)
		return -ENOMEM;
	u->start = true;
	return 0;
}

int services_plan_gone(struct services *s, const struct devino_map *gone, const char *const *linked, size_t n_linked,
		       struct svc_plan *ret, bool *ret_self)
{
	struct gone_scan g = { .gone = gone, .self = getpid() };
	ckpt_error e = { 0 };
	void *conn = NULL;
	int r = 0;

	memset(ret, 0, sizeof(*ret));
	*ret_self = false;
	if (gone && gone->n > 0 && (r = gone_index(&g)) >= 0)
		r = procscan_each("/proc", 0, PROCSCAN_STAT, gone_visit, &g);
	*ret_self = g.self_uses;
	if (r >= 0 && services_available(s) && (g.n || n_linked) && s->ops->connect(&conn, &e) < 0)
		r = -ENOTCONN;
	for (size_t i = 0; r >= 0 && conn && i < g.n; i++) {
		_cleanup_free_ char *unit = NULL;
		if (s->ops->pid_unit(g.pids[i], &unit) >= 0)
			r = gone_add_unit(s, conn, ret, unit);
	}
	for (size_t i = 0; r >= 0 && conn && i < n_linked; i++)
		r = gone_add_linked(s, conn, ret, linked[i]);
	if (conn)
		s->ops->disconnect(conn);
	devino_free(&g.by_ino);
	free(g.pids);
	return r;
}

int services_reload(struct services *s, char **reason)
{
	ckpt_error e = { 0 };
	void *conn = NULL;
	*reason = NULL;
	if (!services_available(s) || !s->ops->reload)
		return 0;
	if (s->ops->connect(&conn, &e) < 0) {
		*reason = strdup(e.msg);
		return -ENOTCONN;
	}
	int64_t t0 = mono_ms();
	int r = s->ops->reload(conn, reason);
	s->ops->disconnect(conn);
	if (r >= 0)
		log_info("services: daemon-reload in %lld ms: a unit file changed with the restore",
			 (long long)(mono_ms() - t0));
	return r;
}

int services_plan_running(struct services *s, const char *const *names, size_t n, struct svc_plan *ret)
{
	ckpt_error e = { 0 };
	void *conn = NULL;
	int r = 0;
	memset(ret, 0, sizeof(*ret));
	if (!services_available(s) || n == 0)
		return 0;
	if (s->ops->connect(&conn, &e) < 0)
		return -ENOTCONN;
	for (size_t i = 0; r >= 0 && i < n; i++)
		r = gone_add_unit(s, conn, ret, names[i]);
	s->ops->disconnect(conn);
	return r;
}

void services_plan_mark_gone(struct services *s, struct svc_plan *p)
{
	ckpt_error e = { 0 };
	void *conn = NULL;
	if (!services_available(s) || !p->n || !s->ops->load_state || s->ops->connect(&conn, &e) < 0)
		return;
	for (size_t i = 0; i < p->n; i++) {
		_cleanup_free_ char *ls = NULL;
		if (s->ops->load_state(conn, p->units[i].name, &ls) >= 0 && strcmp(ls, "loaded")) {
			p->units[i].unit_gone = true;
			log_info("services: \"%s\" is %s now: stopped, not started", p->units[i].name, ls);
		}
	}
	s->ops->disconnect(conn);
}

int services_restart(struct services *s, struct svc_plan *p)
{
	if (!services_available(s) || p->n == 0)
		return 0;
	int r = services_stop(s, p);
	services_plan_mark_gone(s, p);
	int q = services_start(s, p);
	return r < 0 ? r : q;
}
