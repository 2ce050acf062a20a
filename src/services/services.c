/* services.c: which systemd units a restore stops and starts and a create
 * freezes, and what the report says about them. The bus work is in
 * services_bus.c, the /proc scan in services_scan.c. */
#include <pthread.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-login.h>
#include "config.h"
#include "services/services_internal.h"

struct services {
	pthread_mutex_t lock; /* one operation at a time: they share to_start/frozen */
	bool available;
	char reason[sizeof(((ckpt_error *)0)->msg)];
	char *self_unit; /* ckptd's own unit, never managed */
	struct strv roots;
	struct strv configured; /* units named in the config */
	bool auto_discover;
	int64_t timeout_ms;
	struct strv to_start;          /* active before the last stop */
	struct strv frozen;            /* frozen by the last freeze */
	struct procscan_target *extra; /* hidden directories (path owned) */
	size_t n_extra;
};

int services_strv_add(struct strv *s, const char *str)
{
	if (services_strv_contains(s, str))
		return 0;
	char **v = realloc(s->v, (s->n + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	s->v = v;
	if (!(v[s->n] = strdup(str)))
		return -ENOMEM;
	s->n++;
	return 0;
}

bool services_strv_contains(const struct strv *s, const char *str)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], str) == 0)
			return true;
	return false;
}

void services_strv_clear(struct strv *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	s->v = NULL;
	s->n = 0;
}

void svc_report_init(struct svc_report *r)
{
	r->stopped = json_array();
	r->started = json_array();
	r->failed = json_array();
	r->frozen = json_array();
	r->failures = json_object();
}

void svc_report_free(struct svc_report *r)
{
	json_decref(r->stopped);
	json_decref(r->started);
	json_decref(r->failed);
	json_decref(r->frozen);
	json_decref(r->failures);
	memset(r, 0, sizeof(*r));
}

static void report_add(json_t *list, const char *unit)
{
	if (list)
		json_array_append_new(list, json_string(unit));
}

/* A unit failed: named in failed (unless only_reason) and failures {unit: reason}. */
static void report_fail(struct svc_report *rep, const char *unit, const char *reason, bool only_reason)
{
	if (!rep)
		return;
	if (!only_reason)
		report_add(rep->failed, unit);
	if (rep->failures)
		json_object_set_new(rep->failures, unit, json_string(reason ? reason : "out of memory"));
}

static int open_config(struct services *s, const struct config *cfg, char *const *roots, size_t n_roots)
{
	for (size_t i = 0; i < n_roots; i++)
		if (services_strv_add(&s->roots, roots[i]) < 0)
			return -ENOMEM;
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
	s->auto_discover = cfg->services_auto;
	s->timeout_ms = (int64_t)(cfg->service_timeout_secs > 0 ? cfg->service_timeout_secs : 30) * 1000;
	return 0;
}

static void open_probe(struct services *s)
{
	struct services_bus *b = NULL;
	ckpt_error e = { 0 };
	if (sd_booted() <= 0) {
		snprintf(s->reason, sizeof(s->reason), "systemd is not the init system (PID 1)");
		return;
	}
	if (services_bus_open(&b, &e) < 0) {
		snprintf(s->reason, sizeof(s->reason), "%s", e.msg);
		return;
	}
	services_bus_close(b);
	s->available = true;
}

int services_open(const struct config *cfg, char *const *roots, size_t n_roots, struct services **ret, ckpt_error *err)
{
	struct services *s = calloc(1, sizeof(*s));
	if (!s)
		return err_set(err, ENOMEM, NULL, "out of memory");
	pthread_mutex_init(&s->lock, NULL);
	if (sd_pid_get_unit(getpid(), &s->self_unit) < 0)
		s->self_unit = NULL;
	if (open_config(s, cfg, roots, n_roots) < 0) {
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
	if (s->frozen.n)
		services_thaw(s, NULL);
	services_strv_clear(&s->roots);
	services_strv_clear(&s->configured);
	services_strv_clear(&s->to_start);
	services_strv_clear(&s->frozen);
	for (size_t i = 0; i < s->n_extra; i++)
		free((char *)s->extra[i].path);
	free(s->extra);
	free(s->self_unit);
	pthread_mutex_destroy(&s->lock);
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

int services_add_target(struct services *s, const char *path, dev_t dev, ino_t ino)
{
	char *p = s ? strdup(path) : NULL;
	if (!p)
		return -ENOMEM;
	pthread_mutex_lock(&s->lock);
	struct procscan_target *t = realloc(s->extra, (s->n_extra + 1) * sizeof(*t));
	if (t) {
		s->extra = t;
		t[s->n_extra++] = (struct procscan_target){ .path = p, .dev = dev, .ino = ino, .tag = 1 };
	}
	pthread_mutex_unlock(&s->lock);
	if (!t)
		free(p);
	return t ? 0 : -ENOMEM;
}

/* Processes using t (NULL: the roots as they are now plus the hidden
 * directories), by identity. */
static int users_of(struct services *s, const struct procscan_target *t, size_t n, struct procscan_user **ret,
		    size_t *ret_n)
{
	_cleanup_free_ struct procscan_target *all = NULL;
	if (!t) {
		int r = services_scan_targets(s->roots.v, s->roots.n, s->extra, s->n_extra, &all, &n);
		if (r < 0)
			return r;
		t = all;
	}
	return procscan_users("/proc", t, n, getpid(), ret, ret_n);
}

/* The unit pid belongs to when ckptd may manage it (malloc'd), else NULL. */
static char *unit_of(struct services *s, pid_t pid, char **any)
{
	char *unit = NULL;
	*any = NULL;
	if (sd_pid_get_unit(pid, &unit) < 0)
		return NULL;
	if (services_strv_contains(&s->configured, unit) ||
	    (s->auto_discover && services_scan_unit_eligible(unit, s->self_unit)))
		return unit;
	*any = unit;
	return NULL;
}

/* Configured units plus the eligible units of processes using t (NULL: the
 * roots), found by device and inode. */
static int managed_units(struct services *s, const struct procscan_target *t, size_t n_t, struct strv *ret)
{
	for (size_t i = 0; i < s->configured.n; i++)
		if (services_strv_add(ret, s->configured.v[i]) < 0)
			return -ENOMEM;
	if (!s->auto_discover)
		return 0;
	_cleanup_free_ struct procscan_user *users = NULL;
	size_t n = 0;
	int r = users_of(s, t, n_t, &users, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		_cleanup_free_ char *other = NULL;
		_cleanup_free_ char *unit = unit_of(s, users[i].pid, &other);
		if (unit && services_strv_add(ret, unit) < 0)
			return -ENOMEM;
	}
	return 0;
}

json_t *services_unmanaged_users(struct services *s, const struct procscan_target *t, size_t n_t)
{
	json_t *out = json_array();
	_cleanup_free_ struct procscan_user *users = NULL;
	size_t n = 0;
	if (!s || users_of(s, t, n_t, &users, &n) < 0)
		return out;
	for (size_t i = 0; i < n; i++) {
		_cleanup_free_ char *other = NULL;
		_cleanup_free_ char *unit = s->available ? unit_of(s, users[i].pid, &other) : NULL;
		char comm[64];
		if (unit)
			continue;
		procscan_comm("/proc", users[i].pid, comm, sizeof(comm));
		json_t *u = json_pack("{s:I,s:s,s:i}", "pid", (json_int_t)users[i].pid, "command", comm, "tag",
				      users[i].tag);
		if (u && other)
			json_object_set_new(u, "unit", json_string(other));
		json_array_append_new(out, u);
	}
	return out;
}

static bool state_running(const char *st)
{
	return st && (!strcmp(st, "active") || !strcmp(st, "activating") || !strcmp(st, "reloading"));
}

/* The managed units that are running now. */
static int active_units(struct services *s, struct services_bus *b, const struct procscan_target *t, size_t n_t,
			struct strv *ret)
{
	struct strv all = { 0 };
	int r = managed_units(s, t, n_t, &all);
	for (size_t i = 0; r >= 0 && i < all.n; i++) {
		_cleanup_free_ char *st = NULL;
		if (services_bus_active_state(b, all.v[i], &st) < 0)
			log_debug("services: no ActiveState for '%s'", all.v[i]);
		else if (state_running(st))
			r = services_strv_add(ret, all.v[i]);
	}
	services_strv_clear(&all);
	return r;
}

static struct services_job *jobs_new(const struct strv *units)
{
	struct services_job *jobs = calloc(units->n ? units->n : 1, sizeof(*jobs));
	for (size_t i = 0; jobs && i < units->n; i++)
		jobs[i].unit = units->v[i];
	return jobs;
}

static void jobs_free(struct services_job *jobs, size_t n)
{
	for (size_t i = 0; jobs && i < n; i++)
		services_job_clear(&jobs[i]);
	free(jobs);
}

/* A stop job that did not end "done" still stopped the unit if it is down now. */
static void stop_judge(struct services_bus *b, struct services_job *j, struct svc_report *rep)
{
	_cleanup_free_ char *st = NULL, *why = NULL;
	if (j->done && !j->error && j->result && !strcmp(j->result, "done")) {
		report_add(rep ? rep->stopped : NULL, j->unit);
		return;
	}
	if (!j->error && services_bus_active_state(b, j->unit, &st) >= 0 &&
	    (!strcmp(st, "inactive") || !strcmp(st, "failed"))) {
		report_add(rep ? rep->stopped : NULL, j->unit);
		return;
	}
	if (j->error ||
	    asprintf(&why, "stop job ended '%s', unit is %s", j->result ? j->result : "?",
		     st ? st : "in an unknown state") < 0)
		why = NULL;
	report_fail(rep, j->unit, j->error ? j->error : why, false);
}

/* Without the bus nothing can be stopped: the units found are named as
 * failed, so the restore does not report ok with its services still running. */
static int stop_unreachable(struct services *s, struct svc_report *rep)
{
	struct strv all = { 0 };
	int r = managed_units(s, NULL, 0, &all);
	for (size_t i = 0; i < all.n; i++)
		report_fail(rep, all.v[i], "cannot reach systemd on the system bus", false);
	services_strv_clear(&all);
	return r < 0 ? r : -ENOTCONN;
}

/* Stop the active managed units using t (NULL: the roots); they join to_start. */
static int stop_units(struct services *s, struct services_bus *b, const struct procscan_target *t, size_t n_t,
		      struct svc_report *rep)
{
	struct strv units = { 0 };
	if (!b)
		return stop_unreachable(s, rep);
	int r = active_units(s, b, t, n_t, &units);
	struct services_job *jobs = r >= 0 && units.n ? jobs_new(&units) : NULL;
	if (r >= 0 && units.n && !jobs)
		r = -ENOMEM;
	if (jobs) {
		r = services_bus_run_jobs(b, SERVICES_JOB_STOP, jobs, units.n, s->timeout_ms);
		for (size_t i = 0; i < units.n; i++)
			stop_judge(b, &jobs[i], rep);
		jobs_free(jobs, units.n);
	}
	for (size_t i = 0; i < units.n; i++)
		if (services_strv_add(&s->to_start, units.v[i]) < 0)
			r = -ENOMEM;
	services_strv_clear(&units);
	return r;
}

static int stop_locked(struct services *s, struct services_bus *b, struct svc_report *rep)
{
	services_strv_clear(&s->to_start);
	return stop_units(s, b, NULL, 0, rep);
}

typedef int (*locked_op)(struct services *s, struct services_bus *b, struct svc_report *rep);

/* Run op under the lock on a fresh bus connection (fresh, so a restarted
 * dbus or systemd never leaves a dead connection behind); op gets NULL when
 * the bus cannot be reached. When work is empty there is nothing to do. */
static int with_bus(struct services *s, const struct strv *work, locked_op op, struct svc_report *rep, const char *what)
{
	struct services_bus *b = NULL;
	int r = 0;
	if (!services_available(s))
		return 0;
	pthread_mutex_lock(&s->lock);
	if (!work || work->n) {
		if (services_bus_open(&b, NULL) < 0)
			b = NULL;
		r = op(s, b, rep);
	}
	services_bus_close(b);
	pthread_mutex_unlock(&s->lock);
	if (r < 0)
		log_debug("services: %s: %s", what, strerror(-r));
	return r;
}

int services_stop(struct services *s, struct svc_report *rep)
{
	return with_bus(s, NULL, stop_locked, rep, "stop");
}

int services_stop_users(struct services *s, const struct procscan_target *t, size_t n, struct svc_report *rep)
{
	struct services_bus *b = NULL;
	if (!services_available(s))
		return 0;
	pthread_mutex_lock(&s->lock);
	if (services_bus_open(&b, NULL) < 0)
		b = NULL;
	int r = stop_units(s, b, t, n, rep);
	services_bus_close(b);
	pthread_mutex_unlock(&s->lock);
	return r;
}

static void start_judge(struct services_bus *b, struct services_job *j, struct svc_report *rep)
{
	_cleanup_free_ char *res = NULL, *why = NULL;
	if (!j->error && j->result && !strcmp(j->result, "done")) {
		report_add(rep ? rep->started : NULL, j->unit);
		return;
	}
	if (!j->error && services_bus_unit_result(b, j->unit, &res) < 0)
		res = NULL;
	if (j->error ||
	    asprintf(&why, "start job ended '%s'%s%s%s", j->result ? j->result : "?", res ? " (unit result: " : "",
		     res ? res : "", res ? ")" : "") < 0)
		why = NULL;
	report_fail(rep, j->unit, j->error ? j->error : why, false);
}

/* b is NULL when the bus could not be reached: every unit then failed to start. */
static int start_locked(struct services *s, struct services_bus *b, struct svc_report *rep)
{
	int r = b ? 0 : -ENOTCONN;
	struct services_job *jobs = b ? jobs_new(&s->to_start) : NULL;
	if (b && !jobs)
		r = -ENOMEM;
	if (jobs) {
		r = services_bus_run_jobs(b, SERVICES_JOB_START, jobs, s->to_start.n, s->timeout_ms);
		for (size_t i = 0; i < s->to_start.n; i++)
			start_judge(b, &jobs[i], rep);
		jobs_free(jobs, s->to_start.n);
	}
	for (size_t i = 0; r < 0 && !jobs && i < s->to_start.n; i++)
		report_fail(rep, s->to_start.v[i], strerror(-r), false);
	services_strv_clear(&s->to_start);
	return r;
}

int services_start(struct services *s, struct svc_report *rep)
{
	return s ? with_bus(s, &s->to_start, start_locked, rep, "start") : 0;
}

static int freeze_locked(struct services *s, struct services_bus *b, struct svc_report *rep)
{
	struct strv units = { 0 };
	if (!b)
		return -ENOTCONN;
	if (active_units(s, b, NULL, 0, &units) < 0)
		log_debug("services: freeze: cannot list the managed units");
	for (size_t i = 0; i < units.n; i++) {
		_cleanup_free_ char *reason = NULL, *why = NULL;
		if (services_bus_freeze(b, units.v[i], true, s->timeout_ms, &reason) >= 0) {
			if (services_strv_add(&s->frozen, units.v[i]) < 0) {
				/* Not remembered means never thawed: undo at once. */
				services_bus_freeze(b, units.v[i], false, s->timeout_ms, &reason);
				continue;
			}
			report_add(rep ? rep->frozen : NULL, units.v[i]);
		} else if (asprintf(&why, "not frozen: %s", reason ? reason : "unknown error") >= 0) {
			report_fail(rep, units.v[i], why, true);
		}
	}
	services_strv_clear(&units);
	return 0;
}

/* Freezing is best effort: a unit that cannot be frozen (cgroup v1) is named in
 * failures and the create goes on, consistent only as far as syncfs makes it. */
int services_freeze(struct services *s, struct svc_report *rep)
{
	return with_bus(s, NULL, freeze_locked, rep, "freeze");
}

static int thaw_locked(struct services *s, struct services_bus *b, struct svc_report *rep)
{
	int r = b ? 0 : -ENOTCONN;
	for (size_t i = 0; b && i < s->frozen.n; i++) {
		_cleanup_free_ char *reason = NULL, *why = NULL;
		int k = services_bus_freeze(b, s->frozen.v[i], false, s->timeout_ms, &reason);
		if (k < 0 && asprintf(&why, "not thawed: %s", reason ? reason : "unknown error") >= 0)
			report_fail(rep, s->frozen.v[i], why, true);
		if (k < 0 && r >= 0)
			r = k;
	}
	/* Without a bus the units stay remembered, so a later thaw retries. */
	if (b)
		services_strv_clear(&s->frozen);
	return r;
}

int services_thaw(struct services *s, struct svc_report *rep)
{
	return s ? with_bus(s, &s->frozen, thaw_locked, rep, "thaw") : 0;
}
