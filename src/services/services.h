/* services.h: systemd units around a restore (stop, start) and a create
 * (freeze, thaw). Only services.c talks to sd-bus. */
#pragma once
#include <jansson.h>
#include "lib/procscan.h"
#include "lib/util.h"

struct config;
struct services;

/* What happened to units; arrays of unit names, failures {unit: reason}. */
struct svc_report {
	json_t *stopped, *started, *failed, *frozen; /* arrays */
	json_t *failures;                            /* object */
};
void svc_report_init(struct svc_report *r);
void svc_report_free(struct svc_report *r);

/* Never fails for lack of systemd: services_available() then says false. */
int services_open(const struct config *cfg, char *const *roots, size_t n_roots, struct services **ret, ckpt_error *err);
void services_close(struct services *s);
bool services_available(struct services *s);
/* Why not available (or NULL). */
const char *services_unavailable_reason(struct services *s);

/* Stop every managed unit that is active; remembers them for services_start. */
int services_stop(struct services *s, struct svc_report *rep);
/* Start the units stopped by the last services_stop. */
int services_start(struct services *s, struct svc_report *rep);
/* Freeze / thaw managed units for a consistent create. */
int services_freeze(struct services *s, struct svc_report *rep);
int services_thaw(struct services *s, struct svc_report *rep);

/* Also look for users of this directory (by identity) when finding the units
 * of a root: the directory a mount hid, which old processes may still use. */
int services_add_target(struct services *s, const char *path, dev_t dev, ino_t ino);
/* Stop the running units whose processes use one of t (by identity), and the
 * configured units; added to what services_start starts. For a mount over a
 * root at start: stop, mount, start. */
int services_stop_users(struct services *s, const struct procscan_target *t, size_t n, struct svc_report *rep);
/* Processes using one of t that belong to no unit ckptd manages (nothing
 * stops them around a mount or a restore): [{pid, command, unit?, tag}]. */
json_t *services_unmanaged_users(struct services *s, const struct procscan_target *t, size_t n);
