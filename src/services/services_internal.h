/* services_internal.h: the parts of the services module, shared by
 * services.c (policy: which units, what the report says), services_scan.c
 * (which processes use a root, pure /proc reading) and services_bus.c (sd-bus). */
#pragma once
#include <sys/types.h>
#include "services/services.h"

/* A small owned list of strings. */
struct strv {
	char **v;
	size_t n;
};
int services_strv_add(struct strv *s, const char *str); /* adds a copy, skips duplicates */
bool services_strv_contains(const struct strv *s, const char *str);
void services_strv_clear(struct strv *s);

/* --- services_scan.c --- */
/* A unit found by the /proc scan may be managed: a .service that is neither
 * ckptd's own unit nor a login, getty or systemd/dbus infrastructure unit. */
bool services_scan_unit_eligible(const char *unit, const char *self_unit);
/* A configured unit name made complete: "web" -> "web.service". NULL on ENOMEM. */
char *services_scan_unit_name(const char *name);
/* A configured unit that may be managed: not ckptd's own, not a scope or slice,
 * not a login session unit. */
bool services_scan_unit_allowed(const char *unit, const char *self_unit);
/* Pids (other than skip_pid) whose cwd, root, open fds or mappings are under
 * one of roots, reading the proc filesystem mounted at proc. */
int services_scan_pids(const char *proc, char *const *roots, size_t n_roots, pid_t skip_pid, pid_t **ret,
		       size_t *ret_n);
/* Each root as it is now (stat of its path, tag -1) followed by extra: the
 * targets a scan by identity looks for. *ret malloc'd. */
int services_scan_targets(char *const *roots, size_t n_roots, const struct procscan_target *extra, size_t n_extra,
			  struct procscan_target **ret, size_t *ret_n);

/* --- services_bus.c --- */
struct services_bus;
int services_bus_open(struct services_bus **ret, ckpt_error *err);
void services_bus_close(struct services_bus *b);
/* ActiveState of a unit ("active", "inactive", ...), malloc'd in *ret. */
int services_bus_active_state(struct services_bus *b, const char *unit, char **ret);

/* One job per unit, run in parallel: every job is queued before any is waited for. */
enum services_job_kind {
	SERVICES_JOB_STOP,
	SERVICES_JOB_START
};
struct services_job {
	const char *unit;
	char *path;       /* job object path, once queued */
	char *result;     /* JobRemoved result ("done", "failed", ...) */
	char *error;      /* why it could not be queued or finished (else NULL) */
	int64_t deadline; /* mono_ms */
	bool killed;      /* SIGKILL sent after the timeout */
	bool done;        /* result or error is final (error NULL only on ENOMEM) */
};
/* Queue kind for every job, wait for all with timeout_ms each; a stop job
 * past its deadline gets KillUnit SIGKILL and a grace period. */
int services_bus_run_jobs(struct services_bus *b, enum services_job_kind kind, struct services_job *jobs, size_t n,
			  int64_t timeout_ms);
void services_job_clear(struct services_job *j);
/* The service's Result property ("exit-code", ...), malloc'd, for reports. */
int services_bus_unit_result(struct services_bus *b, const char *unit, char **ret);
/* FreezeUnit / ThawUnit; on failure *reason (malloc'd) says why. */
int services_bus_freeze(struct services_bus *b, const char *unit, bool freeze, int64_t timeout_ms, char **reason);
