/* services.h: systemd units around a restore (stop, start) and a create
 * (freeze, thaw). Only services.c talks to sd-bus. */
#pragma once
#include <jansson.h>
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
