/* services_run.c: a plan executed. Stop, start, freeze and thaw each open a
 * fresh connection to the manager (a restarted dbus or systemd never leaves
 * a dead one behind), run their jobs in parallel, and write into the plan
 * what systemd says happened: the job's result and the unit's ActiveState.
 * Every unit's freeze, stop and start is logged with its duration. */
#include "services/services_internal.h"

static bool state_down(const char *st)
{
	return st && (!strcmp(st, "inactive") || !strcmp(st, "failed"));
}

static char *fmt(const char *f, ...) _printf_(1, 2);
static char *fmt(const char *f, ...)
{
	char *s = NULL;
	va_list ap;
	va_start(ap, f);
	if (vasprintf(&s, f, ap) < 0)
		s = NULL;
	va_end(ap);
	return s;
}

static long long job_ms(const struct services_job *j)
{
	return (long long)(j->ended_ms - j->queued_ms);
}

/* Down and to be started again: stopped cleanly, or a failed stop that left
 * an empty cgroup (not a unit that may still run). */
static bool to_start(const struct svc_unit *u)
{
	return !u->unit_gone && ((u->stopped && !u->failed) || u->stop_failed || (u->start && !u->failed));
}

/* Jobs for the plan's units: a stop for each running one, a start for each
 * one down (and not one that may still run: its processes may be around). */
static int jobs_for(const struct svc_plan *p, enum services_job_kind kind, struct services_jobs *jobs)
{
	for (size_t i = 0; i < p->n; i++) {
		const struct svc_unit *u = &p->units[i];
		bool want = kind == SERVICES_JOB_STOP ? !u->failed && !u->stopped && !u->start : to_start(u);
		if (want && !services_jobs_add(jobs, u->name))
			return -ENOMEM;
	}
	return 0;
}

static void judge_stop(struct services *s, void *conn, struct services_job *j, struct svc_plan *p)
{
	_cleanup_free_ char *st = NULL, *why = NULL;
	if (s->ops->active_state(conn, j->unit, &st) < 0)
		st = NULL;
	if (j->side_effect && !state_down(st)) {
		/* Not managed, so not using a root: it does not hold up the swap. */
		log_event(LOG_WARN_, &(struct log_fields){ "stop", NULL, j->unit, job_ms(j) },
			  "services: systemd was to stop \"%s\" with a managed unit, but it is %s", j->unit,
			  st ? st : "in an unknown state");
		return;
	}
	struct svc_unit *u = services_plan_add(p, j->unit);
	if (!u)
		return;
	if (j->side_effect)
		u->side_effect = true;
	bool clean = !j->error && j->result && !strcmp(j->result, "done") && strcmp(st ? st : "", "failed");
	if (state_down(st) && clean) {
		u->stopped = true;
		log_event(LOG_INFO_, &(struct log_fields){ "stop", NULL, j->unit, job_ms(j) },
			  "services: stopped \"%s\"%s in %lld ms (job %s, unit %s)", j->unit,
			  j->side_effect ? " (with a managed unit)" : "", job_ms(j), j->result, st);
		return;
	}
	if (state_down(st) && j->killed && !j->error && s->ops->cgroup_empty(conn, j->unit) > 0) {
		/* ckptd's own SIGKILL after service_timeout_secs is how a unit
		 * that ignores SIGTERM is meant to stop: systemd records it as
		 * failed (result: signal), but it is down and its cgroup empty. */
		u->stopped = u->killed = true;
		log_event(LOG_WARN_, &(struct log_fields){ "stop", NULL, j->unit, job_ms(j) },
			  "services: stopped \"%s\" with SIGKILL after service_timeout_secs, in %lld ms (unit %s)",
			  j->unit, job_ms(j), st);
		return;
	}
	if (state_down(st)) {
		/* Down, but not cleanly (a failed ExecStop=, a kill by someone
		 * else): systemd's account is a
		 * failure. The swap may go on only once its cgroup is empty; it
		 * is started again after, still reported failed. */
		_cleanup_free_ char *res = NULL;
		if (s->ops->unit_result(conn, j->unit, &res) < 0)
			res = NULL;
		int empty = s->ops->cgroup_empty(conn, j->unit);
		why = fmt("stop failed%s: job %s, unit %s (result: %s)%s",
			  j->killed ? " (SIGKILL after service_timeout_secs)" : "",
			  j->error            ? j->error
				  : j->result ? j->result
					      : "?",
			  st, res ? res : "unknown",
			  empty > 0           ? ""
				  : empty < 0 ? "; cannot tell whether its cgroup is empty"
					      : "; processes are left in its cgroup");
		services_unit_fail(u, why);
		u->stop_failed = empty > 0;
		log_event(LOG_WARN_, &(struct log_fields){ "stop", NULL, j->unit, job_ms(j) },
			  "services: \"%s\"%s went down uncleanly in %lld ms: %s", j->unit,
			  j->side_effect ? " (with a managed unit)" : "", job_ms(j), u->reason ? u->reason : "");
		return;
	}
	if (j->error)
		why = fmt("%s; unit is %s", j->error, st ? st : "in an unknown state");
	else
		why = fmt("stop job ended '%s', unit is %s", j->result ? j->result : "?",
			  st ? st : "in an unknown state");
	services_unit_fail(u, why);
	log_event(LOG_WARN_, &(struct log_fields){ "stop", NULL, j->unit, job_ms(j) },
		  "services: \"%s\" still runs after %lld ms: %s", j->unit, job_ms(j), u->reason);
}

/* Leftover processes (KillMode=process or none) of a unit systemd calls
 * stopped still use the roots: the unit counts as still running. */
static int check_leftovers(struct services *s, struct svc_plan *p)
{
	struct strv using = { 0 };
	int r = s->ops->units_using(p->roots, p->n_roots, &using);
	for (size_t i = 0; r >= 0 && i < p->n; i++) {
		struct svc_unit *u = &p->units[i];
		if (to_start(u) && services_strv_contains(&using, u->name)) {
			u->stop_failed = false;
			services_unit_fail(u, "stopped, but processes of the unit still use a root");
			log_event(LOG_WARN_, &(struct log_fields){ "stop", NULL, u->name, -1 }, "services: \"%s\": %s",
				  u->name, u->reason);
		}
	}
	services_strv_clear(&using);
	return r;
}

static bool any_failed(const struct svc_plan *p)
{
	for (size_t i = 0; i < p->n; i++)
		if (p->units[i].failed)
			return true;
	return false;
}

/* A unit that may still run: the roots must not be swapped. */
static bool any_may_run(const struct svc_plan *p)
{
	for (size_t i = 0; i < p->n; i++)
		if (p->units[i].failed && !p->units[i].stop_failed)
			return true;
	return false;
}

static void *connect_or_fail(struct services *s, struct svc_plan *p, enum services_job_kind kind)
{
	void *conn = NULL;
	ckpt_error e = { 0 };
	if (s->ops->connect(&conn, &e) >= 0)
		return conn;
	for (size_t i = 0; i < p->n; i++)
		if (kind == SERVICES_JOB_STOP ? !p->units[i].failed : to_start(&p->units[i])) {
			p->units[i].stop_failed = false; /* not started: it stays down */
			services_unit_fail(&p->units[i], "cannot reach systemd on the system bus");
		}
	return NULL;
}

typedef void (*judge_fn)(struct services *s, void *conn, struct services_job *j, struct svc_plan *p);

/* Queue the plan's jobs of kind, wait, and let judge write each outcome into p. */
static int run_jobs(struct services *s, struct svc_plan *p, enum services_job_kind kind, judge_fn judge)
{
	struct services_jobs jobs = { 0 };
	void *conn = NULL;
	int r = jobs_for(p, kind, &jobs);
	if (r >= 0 && jobs.n && !(conn = connect_or_fail(s, p, kind)))
		r = -ENOTCONN;
	if (conn && (r = s->ops->run_jobs(conn, kind, &jobs, s->timeout_ms)) < 0)
		log_warn("services: waiting for the %s jobs: %s", kind == SERVICES_JOB_STOP ? "stop" : "start",
			 strerror(-r));
	for (size_t i = 0; conn && i < jobs.n; i++)
		judge(s, conn, &jobs.v[i], p);
	if (conn)
		s->ops->disconnect(conn);
	services_jobs_clear(&jobs);
	return r;
}

int services_stop(struct services *s, struct svc_plan *p)
{
	if (!services_available(s) || p->n == 0)
		return 0;
	if (any_failed(p)) /* the plan could not reach the manager */
		return -ENOTCONN;
	int r = run_jobs(s, p, SERVICES_JOB_STOP, judge_stop);
	if (r >= 0 && check_leftovers(s, p) < 0)
		log_warn("services: cannot scan for processes left over by the stopped units");
	return r < 0 ? r : any_may_run(p) ? -EBUSY : 0;
}

static void judge_start(struct services *s, void *conn, struct services_job *j, struct svc_plan *p)
{
	_cleanup_free_ char *st = NULL, *res = NULL, *why = NULL;
	struct svc_unit *u = services_plan_add(p, j->unit);
	if (!u)
		return;
	if (s->ops->active_state(conn, j->unit, &st) < 0)
		st = NULL;
	bool job_ok = !j->error && j->result && !strcmp(j->result, "done");
	if (u->stop_failed) /* started again, but its failed stop stays in failures */
		u->stop_failed = false;
	if ((job_ok || j->timed_out) && st && (!strcmp(st, "active") || !strcmp(st, "reloading"))) {
		u->started = true;
		log_event(LOG_INFO_, &(struct log_fields){ "start", NULL, j->unit, job_ms(j) },
			  "services: started \"%s\" in %lld ms", j->unit, job_ms(j));
		return;
	}
	if ((job_ok || j->timed_out) && st && !strcmp(st, "activating")) {
		u->activating = true;
		log_event(LOG_INFO_, &(struct log_fields){ "start", NULL, j->unit, job_ms(j) },
			  "services: \"%s\" still activating after %lld ms, within its start timeout", j->unit,
			  job_ms(j));
		return;
	}
	if (s->ops->unit_result(conn, j->unit, &res) < 0)
		res = NULL;
	why = fmt("%s%s%s%s%s, unit is %s%s%s%s", u->failed && u->reason ? u->reason : "",
		  u->failed && u->reason ? "; then " : "", j->error ? j->error : "start job ended '",
		  j->error ? "" : (j->result ? j->result : "?"), j->error ? "" : "'", st ? st : "in an unknown state",
		  res ? " (result: " : "", res ? res : "", res ? ")" : "");
	services_unit_fail(u, why);
	log_event(LOG_WARN_, &(struct log_fields){ "start", NULL, j->unit, job_ms(j) },
		  "services: \"%s\" did not start (%lld ms): %s", j->unit, job_ms(j), u->reason);
}

/* A unit whose stop failed, or that ckptd killed, is in systemd's "failed" state: reset it (and its
 * start rate limit) so the start is a fresh one. */
static void reset_stop_failed(struct services *s, struct svc_plan *p)
{
	ckpt_error e = { 0 };
	void *conn = NULL;
	for (size_t i = 0; i < p->n; i++) {
		if (!(p->units[i].stop_failed || p->units[i].killed) || (!conn && s->ops->connect(&conn, &e) < 0))
			continue;
		int r = s->ops->reset_failed(conn, p->units[i].name);
		if (r < 0)
			log_warn("services: cannot reset the failed state of \"%s\": %s", p->units[i].name,
				 strerror(-r));
	}
	if (conn)
		s->ops->disconnect(conn);
}

int services_start(struct services *s, struct svc_plan *p)
{
	if (!services_available(s))
		return 0;
	size_t n = p->n; /* starts add no unit; the bound is for safety */
	bool again[n ? n : 1];
	for (size_t i = 0; i < n; i++)
		again[i] = to_start(&p->units[i]);
	reset_stop_failed(s, p);
	int r = run_jobs(s, p, SERVICES_JOB_START, judge_start);
	for (size_t i = 0; r >= 0 && i < n && i < p->n; i++)
		if (again[i] && !p->units[i].started && !p->units[i].activating)
			r = -EBUSY;
	return r;
}

static void freeze_one(struct services *s, void *conn, struct svc_unit *u, bool freeze)
{
	_cleanup_free_ char *reason = NULL;
	int64_t t0 = mono_ms();
	int r = s->ops->freeze(conn, u->name, freeze, s->timeout_ms, &reason);
	long long ms = (long long)(mono_ms() - t0);
	struct log_fields f = { freeze ? "freeze" : "thaw", NULL, u->name, ms };
	if (r >= 0) {
		*(freeze ? &u->frozen : &u->thawed) = true;
		log_event(LOG_INFO_, &f, "services: %s \"%s\" in %lld ms", freeze ? "froze" : "thawed", u->name, ms);
		return;
	}
	free(u->reason);
	u->reason = fmt("not %s: %s", freeze ? "frozen" : "thawed", reason ? reason : "unknown error");
	log_event(LOG_WARN_, &f, "services: \"%s\" %s (%lld ms)", u->name, u->reason ? u->reason : "", ms);
}

/* Freeze every running unit of the plan, or thaw every one frozen. */
static int freeze_all(struct services *s, struct svc_plan *p, bool freeze)
{
	ckpt_error e = { 0 };
	void *conn = NULL;
	int r = 0;
	if (!services_available(s) || p->n == 0)
		return 0;
	if (s->ops->connect(&conn, &e) < 0)
		return -ENOTCONN; /* a thaw that cannot run can be retried with the same plan */
	for (size_t i = 0; i < p->n; i++) {
		struct svc_unit *u = &p->units[i];
		bool todo = freeze ? !u->failed && !u->frozen : u->frozen && !u->thawed;
		if (todo)
			freeze_one(s, conn, u, freeze);
		if (todo && !(freeze ? u->frozen : u->thawed) && r == 0)
			r = -EBUSY;
	}
	s->ops->disconnect(conn);
	return r;
}

int services_freeze(struct services *s, struct svc_plan *p)
{
	return freeze_all(s, p, true);
}

int services_thaw(struct services *s, struct svc_plan *p)
{
	return freeze_all(s, p, false);
}
