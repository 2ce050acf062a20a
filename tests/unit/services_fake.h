/* services_fake.h: a fake systemd behind the services ops table, for the
 * engine tests (included by test_engine.c after engine_fake.h). Units have an
 * ActiveState and knobs that make their stop, start or freeze fail; a unit
 * bound to another goes down with it, as BindsTo= does. Every job is written
 * to svc.log, with "swap" where the fake backend restored in between, so a
 * test can check the order of the bracket. */
#pragma once
#include "services/services.h"
#include "services/services_ops.h"

struct svc_fake_unit {
	const char *name;
	char state[16];       /* ActiveState */
	bool uses_root;       /* found by the /proc scan while it runs */
	bool survives_stop;   /* still deactivating after SIGKILL */
	bool leftover;        /* stops, but a process keeps using the root */
	bool stop_fails;      /* ExecStop= fails: job "done", unit "failed" (exit-code) */
	bool cgroup_kept;     /* and a process is left in its cgroup */
	bool reset;           /* ResetFailedUnit was called */
	bool start_fails;     /* start job "failed", unit "failed" */
	bool start_slow;      /* start job not done in time, unit "activating" */
	bool freeze_fails;    /* FreezeUnit refused (cgroup v1) */
	const char *bound_to; /* stopped by systemd when this unit stops */
};

static struct svc_fake {
	struct svc_fake_unit units[8];
	size_t n;
	bool unreachable; /* connect fails */
	char log[1024];
	int swaps_logged;
} svc;

static void svc_fake_reset(void)
{
	memset(&svc, 0, sizeof(svc));
}

static struct svc_fake_unit *svc_unit(const char *name)
{
	for (size_t i = 0; i < svc.n; i++)
		if (!strcmp(svc.units[i].name, name))
			return &svc.units[i];
	return NULL;
}

static void svc_add(const char *name, const char *state, bool uses_root)
{
	struct svc_fake_unit *u = &svc.units[svc.n++];
	memset(u, 0, sizeof(*u));
	u->name = name;
	snprintf(u->state, sizeof(u->state), "%s", state);
	u->uses_root = uses_root;
}

static void svc_event(const char *what, const char *unit)
{
	size_t len = strlen(svc.log);
	int swaps = fake.n_restore + fake.n_reset;
	if (swaps != svc.swaps_logged) {
		snprintf(svc.log + len, sizeof(svc.log) - len, "%sswap", len ? " " : "");
		svc.swaps_logged = swaps;
		len = strlen(svc.log);
	}
	snprintf(svc.log + len, sizeof(svc.log) - len, "%s%s:%s", len ? " " : "", what, unit);
}

static bool svc_fake_booted(void)
{
	return true;
}

static int svc_fake_pid_unit(pid_t pid, char **ret)
{
	(void)pid, (void)ret;
	return -ENODATA;
}

static int svc_fake_units_using(char *const *roots, size_t n_roots, struct strv *ret)
{
	(void)roots, (void)n_roots;
	for (size_t i = 0; i < svc.n; i++) {
		struct svc_fake_unit *u = &svc.units[i];
		bool runs = strcmp(u->state, "inactive") && strcmp(u->state, "failed");
		if (u->uses_root && (runs || u->leftover) && services_strv_add(ret, u->name) < 0)
			return -ENOMEM;
	}
	return 0;
}

static int svc_fake_connect(void **ret, ckpt_error *err)
{
	if (svc.unreachable)
		return err_set(err, ECONNREFUSED, NULL, "fake: no bus");
	*ret = &svc;
	return 0;
}

static void svc_fake_disconnect(void *conn)
{
	assert_ptr_equal(conn, &svc);
}

static int svc_fake_active_state(void *conn, const char *unit, char **ret)
{
	(void)conn;
	struct svc_fake_unit *u = svc_unit(unit);
	if (!u)
		return -ENOENT;
	*ret = strdup(u->state);
	return 0;
}

static int svc_fake_unit_result(void *conn, const char *unit, char **ret)
{
	(void)conn;
	struct svc_fake_unit *u = svc_unit(unit);
	*ret = strdup(u && !strcmp(u->state, "failed") ? "exit-code" : "success");
	return 0;
}

static void svc_job_end(struct services_job *j, const char *state, const char *result)
{
	snprintf(svc_unit(j->unit)->state, sizeof(svc.units[0].state), "%s", state);
	j->result = strdup(result);
	j->done = true;
}

static void svc_fake_stop(struct services_jobs *jobs, size_t i)
{
	struct svc_fake_unit *u = svc_unit(jobs->v[i].unit);
	svc_event("stop", u->name);
	if (u->survives_stop) {
		snprintf(u->state, sizeof(u->state), "deactivating");
		jobs->v[i].error = strdup("stop job timed out after 1s and SIGKILL");
		jobs->v[i].done = jobs->v[i].timed_out = jobs->v[i].killed = true;
		return;
	}
	svc_job_end(&jobs->v[i], u->stop_fails ? "failed" : "inactive", "done");
	for (size_t k = 0; k < svc.n; k++) {
		struct svc_fake_unit *b = &svc.units[k];
		if (b->bound_to && !strcmp(b->bound_to, u->name) && !strcmp(b->state, "active")) {
			struct services_job *j = services_jobs_add(jobs, b->name);
			j->side_effect = true;
			if (b->survives_stop)
				svc_job_end(j, "deactivating", "timeout");
			else
				svc_job_end(j, "inactive", "done");
		}
	}
}

static void svc_fake_start(struct services_job *j)
{
	struct svc_fake_unit *u = svc_unit(j->unit);
	svc_event("start", u->name);
	if (u->start_fails) {
		svc_job_end(j, "failed", "failed");
	} else if (u->start_slow) {
		snprintf(u->state, sizeof(u->state), "activating");
		j->error = strdup("start job timed out after 1s");
		j->done = j->timed_out = true;
	} else {
		svc_job_end(j, "active", "done");
	}
}

static int svc_fake_run_jobs(void *conn, enum services_job_kind kind, struct services_jobs *jobs, int64_t timeout_ms)
{
	(void)conn, (void)timeout_ms;
	for (size_t i = 0, n = jobs->n; i < n; i++)
		if (kind == SERVICES_JOB_STOP)
			svc_fake_stop(jobs, i);
		else
			svc_fake_start(&jobs->v[i]);
	return 0;
}

static int svc_fake_cgroup_empty(void *conn, const char *unit)
{
	(void)conn;
	return !svc_unit(unit)->cgroup_kept;
}

static int svc_fake_reset_failed(void *conn, const char *unit)
{
	(void)conn;
	struct svc_fake_unit *u = svc_unit(unit);
	svc_event("reset", unit);
	u->reset = true;
	if (!strcmp(u->state, "failed"))
		snprintf(u->state, sizeof(u->state), "inactive");
	return 0;
}

static int svc_fake_freeze(void *conn, const char *unit, bool freeze, int64_t timeout_ms, char **reason)
{
	(void)conn, (void)timeout_ms;
	struct svc_fake_unit *u = svc_unit(unit);
	svc_event(freeze ? "freeze" : "thaw", unit);
	if (freeze && u->freeze_fails) {
		*reason = strdup("fake: cgroup v1 has no freezer");
		return -EOPNOTSUPP;
	}
	return 0;
}

static const struct services_ops svc_fake_ops = {
	.booted = svc_fake_booted,
	.pid_unit = svc_fake_pid_unit,
	.units_using = svc_fake_units_using,
	.connect = svc_fake_connect,
	.disconnect = svc_fake_disconnect,
	.active_state = svc_fake_active_state,
	.unit_result = svc_fake_unit_result,
	.run_jobs = svc_fake_run_jobs,
	.cgroup_empty = svc_fake_cgroup_empty,
	.reset_failed = svc_fake_reset_failed,
	.freeze = svc_fake_freeze,
};
