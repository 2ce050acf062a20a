/* services_ops.h: what the services module asks of the system, as a table of
 * functions. services_bus.c (sd-bus, sd-login, /proc) fills the real one;
 * tests pass a fake to services_open to drive stops, starts and freezes that
 * fail at will. */
#pragma once
#include <jansson.h>
#include "lib/util.h"

/* A small owned list of strings. */
struct strv {
	char **v;
	size_t n;
};
int services_strv_add(struct strv *s, const char *str); /* adds a copy, skips duplicates */
bool services_strv_contains(const struct strv *s, const char *str);
void services_strv_clear(struct strv *s);
/* The list as a JSON array of strings, or NULL. */
json_t *services_strv_json(const struct strv *s);
/* Adds the strings of array a: -EINVAL when a is no array or holds
 * something else (the strings are added still), -ENOMEM. */
int services_strv_from_json(struct strv *s, json_t *a);

enum services_job_kind {
	SERVICES_JOB_STOP,
	SERVICES_JOB_START
};

/* One StopUnit/StartUnit job and what systemd said of it. */
struct services_job {
	char *unit;        /* owned */
	char *path;        /* job object path, once queued */
	char *result;      /* JobRemoved result ("done", "failed", "timeout", ...) */
	char *error;       /* why it could not be queued or finished (else NULL) */
	int64_t queued_ms; /* mono_ms when queued */
	int64_t ended_ms;  /* mono_ms when it ended or was given up */
	int64_t deadline;  /* mono_ms */
	bool killed;       /* SIGKILL sent after the timeout */
	bool timed_out;    /* given up at the deadline; systemd may still run it */
	bool done;         /* result or error is final (error NULL only on ENOMEM) */
	bool side_effect;  /* queued by systemd for another job, not by ckptd */
};

/* A growable list of jobs. */
struct services_jobs {
	struct services_job *v;
	size_t n, cap;
};
/* Adds a job for unit (copied); NULL on ENOMEM. */
struct services_job *services_jobs_add(struct services_jobs *jobs, const char *unit);
void services_jobs_clear(struct services_jobs *jobs);

struct services_ops {
	/* systemd is PID 1 (sd_booted). */
	bool (*booted)(void);
	/* The unit of a pid (sd_pid_get_unit), malloc'd. */
	int (*pid_unit)(pid_t pid, char **ret);
	/* Units whose processes (other than ours) use one of roots. */
	int (*units_using)(char *const *roots, size_t n_roots, struct strv *ret);
	/* A connection to the manager; every operation opens its own. */
	int (*connect)(void **ret_conn, ckpt_error *err);
	void (*disconnect)(void *conn);
	/* ActiveState ("active", "inactive", ...) and the service's Result, malloc'd. */
	int (*active_state)(void *conn, const char *unit, char **ret);
	int (*unit_result)(void *conn, const char *unit, char **ret);
	/* Queue one job per entry of jobs, then wait for all, timeout_ms each; a
	 * stop job past its deadline gets SIGKILL and a grace period. For stops,
	 * the jobs systemd queues meanwhile for other units (Requires=, BindsTo=,
	 * PartOf=) are appended with side_effect set, and waited for too. */
	int (*run_jobs)(void *conn, enum services_job_kind kind, struct services_jobs *jobs, int64_t timeout_ms);
	/* 1 when the unit's cgroup holds no process (or it has none), 0 when it does. */
	int (*cgroup_empty)(void *conn, const char *unit);
	/* ResetFailedUnit: a unit whose stop failed starts afresh. */
	int (*reset_failed)(void *conn, const char *unit);
	/* FreezeUnit / ThawUnit; on failure *reason (malloc'd) says why. */
	int (*freeze)(void *conn, const char *unit, bool freeze, int64_t timeout_ms, char **reason);
	/* Whole-root restores (may be NULL: not done). Reload: daemon-reload,
	 * waited for. LoadState: "loaded", "not-found", "masked"..., malloc'd. */
	int (*reload)(void *conn, char **reason);
	int (*load_state)(void *conn, const char *unit, char **ret);
	/* UnitFileState: "enabled", "disabled", "static"..., malloc'd. */
	int (*file_state)(void *conn, const char *unit, char **ret);
	/* The .service units that run now (may be NULL, as may unit_files);
	 * a unit's files as systemd names them: FragmentPath first (or ""),
	 * then DropInPaths and the path of each ExecStart. */
	int (*running_units)(void *conn, struct strv *ret);
	int (*unit_files)(void *conn, const char *unit, struct strv *ret);
};

/* The real table: sd-bus on the system bus, sd-login and /proc. */
extern const struct services_ops services_bus_ops;
