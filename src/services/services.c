/* services.c: which systemd units a restore stops and starts and a create
 * freezes (the plan), and what the report says about them. Executing a plan
 * is services_run.c; the system calls go through a services_ops table. */
#include "config.h"
#include "services/services_internal.h"

void svc_report_init(struct svc_report *r)
{
	*r = (struct svc_report){ 0 };
}

void svc_report_free(struct svc_report *r)
{
	services_strv_clear(&r->stopped);
	services_strv_clear(&r->started);
	services_strv_clear(&r->activating);
	services_strv_clear(&r->failed);
	services_strv_clear(&r->frozen);
	for (size_t i = 0; i < r->n_failures; i++) {
		free(r->failures[i].unit);
		free(r->failures[i].reason);
	}
	free(r->failures);
	*r = (struct svc_report){ 0 };
}

int svc_report_fail(struct svc_report *r, const char *unit, const char *reason)
{
	char *why = strdup(reason);
	size_t i = 0;
	while (i < r->n_failures && strcmp(r->failures[i].unit, unit))
		i++;
	if (why && i < r->n_failures) {
		free(r->failures[i].reason);
		r->failures[i].reason = why;
		return 0;
	}
	struct svc_failure *v = why ? realloc(r->failures, (r->n_failures + 1) * sizeof(*v)) : NULL;
	char *name = v ? strdup(unit) : NULL;
	if (v)
		r->failures = v;
	if (!name) {
		free(why);
		return -ENOMEM;
	}
	v[r->n_failures++] = (struct svc_failure){ .unit = name, .reason = why };
	return 0;
}

static void report_add(struct strv *l, const char *unit, bool yes)
{
	if (yes)
		services_strv_add(l, unit);
}

void services_report(const struct svc_plan *p, struct svc_report *r)
{
	for (size_t i = 0; i < p->n; i++) {
		const struct svc_unit *u = &p->units[i];
		report_add(&r->stopped, u->name, u->stopped);
		report_add(&r->started, u->name, u->started);
		report_add(&r->activating, u->name, u->activating);
		report_add(&r->failed, u->name, u->failed);
		report_add(&r->frozen, u->name, u->frozen);
		if (u->reason)
			svc_report_fail(r, u->name, u->reason);
	}
}

struct svc_unit *services_plan_add(struct svc_plan *p, const char *unit)
{
	for (size_t i = 0; i < p->n; i++)
		if (!strcmp(p->units[i].name, unit))
			return &p->units[i];
	struct svc_unit *v = realloc(p->units, (p->n + 1) * sizeof(*v));
	if (!v)
		return NULL;
	p->units = v;
	memset(&v[p->n], 0, sizeof(v[p->n]));
	if (!(v[p->n].name = strdup(unit)))
		return NULL;
	return &v[p->n++];
}

static bool plan_has(const struct svc_plan *p, const char *unit)
{
	for (size_t i = 0; p && i < p->n; i++)
		if (!strcmp(p->units[i].name, unit))
			return true;
	return false;
}

int services_plan_merge(struct svc_plan *p, const struct svc_plan *from, const struct svc_plan *skip, bool start)
{
	for (size_t i = 0; i < from->n; i++) {
		const char *name = from->units[i].name;
		if (plan_has(skip, name) || plan_has(p, name))
			continue;
		struct svc_unit *u = services_plan_add(p, name);
		if (!u)
			return -ENOMEM;
		u->start = start;
	}
	return 0;
}

void services_plan_free(struct svc_plan *p)
{
	for (size_t i = 0; p && i < p->n; i++) {
		free(p->units[i].name);
		free(p->units[i].reason);
	}
	if (p)
		free(p->units);
	if (p)
		memset(p, 0, sizeof(*p));
}

void services_unit_fail(struct svc_unit *u, const char *reason)
{
	free(u->reason);
	u->reason = strdup(reason ? reason : "out of memory");
	u->failed = true;
}

bool services_state_running(const char *st)
{
	return st && (!strcmp(st, "active") || !strcmp(st, "activating") || !strcmp(st, "reloading"));
}

static int open_config(struct services *s, const struct config *cfg)
{
	for (size_t i = 0; i < cfg->n_units; i++) {
		_cleanup_free_ char *u = services_scan_unit_name(cfg->units[i]);
		if (!u)
			return -ENOMEM;
		if (!services_scan_unit_allowed(u, s->self_unit))
			log_debug("services: not managing configured unit '%s' (ckptd itself, a scope or a session)",
				  u);
		else if (services_strv_add(&s->configured, u) < 0)
			return -ENOMEM;
	}
	/* The whole sandbox as a root: every process uses it. Only the
	 * configured units go down around the swap; the rest are restarted
	 * after it when they use a file it replaced (services_gone.c). */
	s->auto_discover = cfg->services_auto && !cfg->whole_root;
	s->timeout_ms = (int64_t)(cfg->service_timeout_secs > 0 ? cfg->service_timeout_secs : 30) * 1000;
	return 0;
}

static void open_probe(struct services *s)
{
	void *conn = NULL;
	ckpt_error e = { 0 };
	if (!s->ops->booted()) {
		snprintf(s->reason, sizeof(s->reason), "systemd is not the init system (PID 1)");
		return;
	}
	if (s->ops->connect(&conn, &e) < 0) {
		snprintf(s->reason, sizeof(s->reason), "%s", e.msg);
		return;
	}
	s->ops->disconnect(conn);
	s->available = true;
}

int services_open(const struct config *cfg, const struct services_ops *ops, struct services **ret, ckpt_error *err)
{
	struct services *s = calloc(1, sizeof(*s));
	if (!s)
		return err_set(err, ENOMEM, NULL, "out of memory");
	s->ops = ops ? ops : &services_bus_ops;
	if (s->ops->pid_unit(getpid(), &s->self_unit) < 0)
		s->self_unit = NULL;
	if (open_config(s, cfg) < 0) {
		services_close(s);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	open_probe(s);
	*ret = s;
	return 0;
}

void services_close(struct services *s)
{
	if (!s)
		return;
	services_strv_clear(&s->configured);
	free(s->self_unit);
	free(s);
}

bool services_available(struct services *s)
{
	return s && s->available;
}

const char *services_unavailable_reason(struct services *s)
{
	if (!s)
		return "services module not opened";
	return s->available ? NULL : s->reason;
}

/* Configured units plus the eligible units of processes using the roots. */
static int managed_units(struct services *s, char *const *roots, size_t n_roots, struct strv *ret)
{
	struct strv using = { 0 };
	int r = 0;
	for (size_t i = 0; r >= 0 && i < s->configured.n; i++)
		r = services_strv_add(ret, s->configured.v[i]);
	if (r >= 0 && s->auto_discover)
		r = s->ops->units_using(roots, n_roots, &using);
	for (size_t i = 0; r >= 0 && i < using.n; i++)
		if (services_scan_unit_eligible(using.v[i], s->self_unit))
			r = services_strv_add(ret, using.v[i]);
	services_strv_clear(&using);
	return r;
}

/* Without the manager nothing can be stopped: every managed unit is in the
 * plan as failed, so the restore does not swap under running services. */
static int plan_unreachable(struct svc_plan *p, const struct strv *all, const char *why)
{
	for (size_t i = 0; i < all->n; i++) {
		struct svc_unit *u = services_plan_add(p, all->v[i]);
		if (!u)
			return -ENOMEM;
		services_unit_fail(u, why);
	}
	return 0;
}

int services_plan(struct services *s, char *const *roots, size_t n_roots, struct svc_plan *ret)
{
	struct strv all = { 0 };
	void *conn = NULL;
	ckpt_error e = { 0 };
	memset(ret, 0, sizeof(*ret));
	ret->roots = roots, ret->n_roots = n_roots;
	if (!services_available(s))
		return 0;
	int r = managed_units(s, roots, n_roots, &all);
	if (r >= 0 && s->ops->connect(&conn, &e) < 0)
		r = plan_unreachable(ret, &all, "cannot reach systemd on the system bus");
	for (size_t i = 0; r >= 0 && conn && i < all.n; i++) {
		_cleanup_free_ char *st = NULL;
		if (s->ops->active_state(conn, all.v[i], &st) < 0)
			log_debug("services: no ActiveState for '%s'", all.v[i]);
		else if (services_state_running(st) && !services_plan_add(ret, all.v[i]))
			r = -ENOMEM;
	}
	if (conn)
		s->ops->disconnect(conn);
	services_strv_clear(&all);
	return r;
}

void svc_users_free(struct svc_users *u)
{
	for (size_t i = 0; i < u->n; i++)
		free(u->v[i].unit);
	free(u->v);
	*u = (struct svc_users){ 0 };
}

void services_unmanaged_users(struct services *s, char *const *roots, size_t n_roots,
			      const struct procscan_target *extra, size_t n_extra, struct svc_users *ret)
{
	_cleanup_free_ struct procscan_target *t = NULL;
	_cleanup_free_ struct procscan_user *users = NULL;
	size_t n_t = 0, n = 0;
	*ret = (struct svc_users){ 0 };
	if (!s || services_scan_targets(roots, n_roots, extra, n_extra, &t, &n_t) < 0 ||
	    procscan_users("/proc", t, n_t, getpid(), &users, &n) < 0 || !n || !(ret->v = calloc(n, sizeof(*ret->v))))
		return;
	for (size_t i = 0; i < n; i++) {
		char *unit = NULL;
		if (s->available && s->ops->pid_unit(users[i].pid, &unit) < 0)
			unit = NULL;
		if (unit &&
		    (services_strv_contains(&s->configured, unit) ||
		     (s->auto_discover && services_scan_unit_eligible(unit, s->self_unit)))) {
			free(unit);
			continue;
		}
		struct svc_user *u = &ret->v[ret->n++];
		*u = (struct svc_user){ .pid = users[i].pid, .unit = unit, .tag = users[i].tag };
		procscan_comm("/proc", users[i].pid, u->command, sizeof(u->command));
	}
}
