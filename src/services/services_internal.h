/* services_internal.h: the parts of the services module, shared by
 * services.c (open, plan, report), services_run.c (stop, start, freeze,
 * thaw of a plan), services_scan.c (which processes use a root, pure /proc
 * reading) and services_bus.c (the real services_ops: sd-bus, sd-login). */
#pragma once
#include <sys/types.h>
#include "lib/procscan.h"
#include "services/services.h"
#include "services/services_ops.h"

struct services {
	const struct services_ops *ops;
	bool available;
	char reason[sizeof(((ckpt_error *)0)->msg)];
	char *self_unit;        /* ckptd's own unit, never managed */
	struct strv configured; /* units named in the config */
	bool auto_discover;
	int64_t timeout_ms;
};

/* --- services.c --- */
/* Adds a unit to the plan (unless there); NULL on ENOMEM. */
struct svc_unit *services_plan_add(struct svc_plan *p, const char *unit);
/* Marks u failed with a copy of reason (NULL: out of memory). */
void services_unit_fail(struct svc_unit *u, const char *reason);
/* ActiveState says the unit runs (active, activating, reloading). */
bool services_state_running(const char *state);

/* --- services_scan.c --- */
/* A unit found by the /proc scan may be managed: a .service that is neither
 * ckptd's own unit nor a login, getty or systemd/dbus infrastructure unit. */
bool services_scan_unit_eligible(const char *unit, const char *self_unit);
/* A configured unit name made complete: "web" -> "web.service". NULL on ENOMEM. */
char *services_scan_unit_name(const char *name);
/* A configured unit that may be managed: not ckptd's own, not a scope or slice,
 * not a login session unit. */
bool services_scan_unit_allowed(const char *unit, const char *self_unit);
/* Pids (other than skip_pid) whose cwd, root, open fds or mappings are on
 * one of roots, found by device and inode (lib/procscan.h), reading the proc
 * filesystem mounted at proc. */
int services_scan_pids(const char *proc, char *const *roots, size_t n_roots, pid_t skip_pid, pid_t **ret,
		       size_t *ret_n);
/* Each root as it is now (stat of its path, tag 0; dev and ino 0 when it
 * cannot be stat'ed) followed by extra: the targets a scan by identity looks
 * for. *ret malloc'd. */
int services_scan_targets(char *const *roots, size_t n_roots, const struct procscan_target *extra, size_t n_extra,
			  struct procscan_target **ret, size_t *ret_n);
