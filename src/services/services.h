/* services.h: systemd units around a restore (stop, start) and a create
 * (freeze, thaw), planned then executed. services_plan says which units run
 * now and use the roots; stop, start, freeze and thaw take that plan and write
 * into it what systemd said happened to each unit. The module keeps no state
 * between calls: the plan is the caller's. */
#pragma once
#include <jansson.h>
#include "lib/devino.h"
#include "lib/procscan.h"
#include "lib/util.h"
#include "services/services_ops.h"

struct config;
struct services;
struct services_ops;

/* One unit of a plan and what happened to it. */
struct svc_unit {
	char *name;
	bool side_effect; /* not managed: systemd stopped it because a managed unit stopped */
	bool stopped;     /* went down in services_stop */
	bool started;     /* active again after services_start */
	bool activating;  /* still activating within its own start timeout */
	bool frozen;      /* frozen by services_freeze */
	bool thawed;      /* and thawed again by services_thaw */
	bool failed;      /* its stop or start failed: reason says why */
	bool stop_failed; /* down, cgroup empty, but systemd says the stop failed (e.g. ExecStop=
			   * exited non-zero): not "stopped"; failed, yet reset and started again */
	bool killed;      /* stopped by ckptd's SIGKILL after service_timeout_secs: a stop
			   * the issue asks for, so "stopped", but reset before its start */
	char *reason;     /* failure, or a freeze/thaw problem (frozen units only) */
	/* Whole-root restores (docs/whole-root.md): */
	bool start;     /* not stopped here, only started (its enablement came back) */
	bool unit_gone; /* stopped, and not started: its unit file went with the restore */
};

struct svc_plan {
	struct svc_unit *units;
	size_t n;
	char *const *roots; /* borrowed from the caller of services_plan */
	size_t n_roots;
};
void services_plan_free(struct svc_plan *p);
/* Adds the units of from to p, but those in skip (may be NULL) or in p
 * already; start: they are only started (their enablement came back). */
int services_plan_merge(struct svc_plan *p, const struct svc_plan *from, const struct svc_plan *skip, bool start);

/* A unit and why it failed, or what its freeze or thaw met (owned). */
struct svc_failure {
	char *unit, *reason;
};
/* What the plan says, as data: the units in each state, and the reasons
 * (one per unit). The API layer writes the JSON. */
struct svc_report {
	struct strv stopped, started, activating, failed, frozen; /* unit names */
	struct svc_failure *failures;
	size_t n_failures;
};
void svc_report_init(struct svc_report *r);
void svc_report_free(struct svc_report *r);
/* Adds the plan's units to the lists of r. */
void services_report(const struct svc_plan *p, struct svc_report *r);
/* Set unit's reason in r (a second reason replaces the first); -ENOMEM. */
int svc_report_fail(struct svc_report *r, const char *unit, const char *reason);

/* ops NULL: the real systemd. Never fails for lack of systemd:
 * services_available() then says false. */
int services_open(const struct config *cfg, const struct services_ops *ops, struct services **ret, ckpt_error *err);
void services_close(struct services *s);
bool services_available(struct services *s);
/* Why not available (or NULL). */
const char *services_unavailable_reason(struct services *s);

/* The managed units (configured, plus with auto those with a process using a
 * root) that are running now. Without systemd the plan is empty. When the
 * manager cannot be reached, every managed unit is in the plan, failed. */
int services_plan(struct services *s, char *const *roots, size_t n_roots, struct svc_plan *ret);
/* Stop the plan's units, and follow the units systemd stops with them (added
 * to the plan as side effects). Returns < 0 when a unit still runs afterwards
 * (even after SIGKILL): the roots must not be swapped then. */
int services_stop(struct services *s, struct svc_plan *p);
/* Start every unit that services_stop stopped. < 0 when one did not come back. */
int services_start(struct services *s, struct svc_plan *p);
/* Freeze / thaw the plan's units for a consistent create. Best effort: a unit
 * that cannot be frozen (cgroup v1) gets a reason and the create goes on. */
int services_freeze(struct services *s, struct svc_plan *p);
int services_thaw(struct services *s, struct svc_plan *p);

/* After a whole-root restore (docs/whole-root.md), as needrestart does:
 * the running units whose processes map or hold open a file the restore
 * replaced or removed (gone, by device and inode), to be stopped and
 * started again; and the units of linked (.service names whose unit file
 * or enablement link the restore wrote) that are enabled and do not run,
 * to be started. *ret_self: ckptd
 * itself maps or holds one (never stopped; it says a restart is due). */
int services_plan_gone(struct services *s, const struct devino_map *gone, const char *const *linked, size_t n_linked,
		       struct svc_plan *ret, bool *ret_self);
/* Before a whole-root restore's swap (docs/whole-root.md): adds to plan the
 * running units whose own files are among paths (below "/", no leading
 * slash; one ending in "/" a directory removed whole): the unit file and
 * drop-ins, ExecStart's executables, and the files of the Debian package
 * that ships the unit file. ckptd and systemd's own units never. */
int services_plan_own(struct services *s, const char *const *paths, size_t n, struct svc_plan *plan);
/* Of names, the units that run now and may be restarted. */
int services_plan_running(struct services *s, const char *const *names, size_t n, struct svc_plan *ret);
/* Marks unit_gone the units of p whose unit file is gone now (after a
 * daemon-reload): they are not started. */
void services_plan_mark_gone(struct services *s, struct svc_plan *p);
/* daemon-reload, waited for. < 0 with *reason (malloc'd) on failure. */
int services_reload(struct services *s, char **reason);
/* Stop the plan's units, then start them, except those whose unit file is
 * gone now (they stay stopped: unit_gone). */
int services_restart(struct services *s, struct svc_plan *p);

/* A process that uses a root and belongs to no unit ckptd manages. */
struct svc_user {
	int64_t pid;
	char command[64];
	char *unit; /* its unit, or NULL (owned) */
	int tag;    /* the target's: 0 a root, else the extra one's */
};
struct svc_users {
	struct svc_user *v;
	size_t n;
};
void svc_users_free(struct svc_users *u);
/* Processes using one of roots (tag 0) or of extra (e.g. the directories
 * mounts hid), by device and inode, that belong to no unit ckptd manages, so
 * nothing stops them around a mount or a restore. Fills ret (empty when the
 * scan fails), which the caller frees. */
void services_unmanaged_users(struct services *s, char *const *roots, size_t n_roots,
			      const struct procscan_target *extra, size_t n_extra, struct svc_users *ret);
