/* engine_whole.c: the services step of a whole-root restore, and what
 * health says of it (docs/whole-root.md). Planned before the swap, once
 * the backend knows what it will change: the running units whose own files
 * change are stopped then (and started after the swap); the units whose
 * processes map or hold open a file that goes are restarted after it, as
 * needrestart does; daemon-reload runs when a unit file changed; the units
 * whose enablement came back are started. The plan is in services.json
 * until done: a start that finishes an interrupted restore runs it. ckptd
 * itself is never stopped: if it uses a replaced file, health says a
 * restart is due. */
#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"

static void engine_whole_self(struct engine *e)
{
	pthread_mutex_lock(&e->state_lock);
	e->restart_due = true;
	pthread_mutex_unlock(&e->state_lock);
	log_warn("whole-root restore: ckptd runs a binary or library the restore replaced; restart ckptd");
}

/* What the services step owes once the swap is done, for services.json. */
static void whole_owed(const struct whole_run *w, const struct restore_details *planned, struct whole_owed *ret)
{
	*ret = (struct whole_owed){ .reload = planned->unit_files_changed };
	for (size_t i = 0; i < w->restart->n; i++)
		services_strv_add(&ret->restart, w->restart->units[i].name);
	for (size_t i = 0; i < planned->units_linked.n; i++)
		services_strv_add(&ret->linked, planned->units_linked.v[i]);
}

int engine_whole_before(void *ctx, const char *const *paths, size_t n, const struct restore_details *planned)
{
	struct whole_run *w = ctx;
	struct svc_plan users;
	size_t before = w->units->n;
	int r = services_plan_own(w->e->services, paths, n, w->units);
	if (r < 0)
		log_warn("whole-root restore: cannot tell which units own the files it changes: %s", strerror(-r));
	r = services_plan_gone(w->e->services, planned->gone, NULL, 0, &users, &w->self);
	if (r < 0)
		log_warn("whole-root restore: cannot find the units that use replaced files: %s", strerror(-r));
	if (services_plan_merge(w->restart, &users, w->units, false) < 0)
		log_warn("whole-root restore: out of memory planning the restarts");
	services_plan_free(&users);
	_cleanup_(engine_svc_journal_whole_free) struct whole_owed owed;
	whole_owed(w, planned, &owed);
	/* a crash now: done at the next start (with systemd to reach: else
	 * there is nothing to owe, and the write would cost two fsyncs) */
	if (services_available(w->e->services))
		engine_svc_journal_save_whole(w->e, w->id, w->units, &owed);
	if (w->units->n == before)
		return 0;
	r = services_stop(w->e->services, w->units);
	engine_svc_journal_save_whole(w->e, w->id, w->units, &owed); /* with the units systemd stopped too */
	return r < 0 ? -EBUSY : 0;
}

void engine_whole_reload(struct whole_run *w, const struct restore_details *d)
{
	_cleanup_free_ char *why = NULL;
	if (d->unit_files_changed && services_reload(w->e->services, &why) < 0)
		log_warn("whole-root restore: daemon-reload failed: %s", why ? why : "unknown error");
	services_plan_mark_gone(w->e->services, w->units);
}

/* The units of linked (.service names whose unit file or enablement link
 * came back) that are enabled and do not run, added to p to be started. */
static void whole_linked(struct engine *e, const struct strv *linked, struct svc_plan *p, const struct svc_plan *skip)
{
	struct svc_plan lp;
	bool self = false;
	int r = services_plan_gone(e->services, NULL, (const char *const *)linked->v, linked->n, &lp, &self);
	if (r < 0 || services_plan_merge(p, &lp, skip, true) < 0)
		log_warn("whole-root restore: cannot find the units whose enablement came back: %s",
			 strerror(r < 0 ? -r : ENOMEM));
	services_plan_free(&lp);
}

void engine_whole_services(struct whole_run *w, struct restore_report *rep)
{
	whole_linked(w->e, &rep->details.units_linked, w->restart, w->units);
	if (w->self)
		engine_whole_self(w->e);
	if (services_restart(w->e->services, w->restart) < 0)
		log_warn("whole-root restore: a unit did not come back after its restart (failed_services)");
	services_report(w->restart, &rep->services);
}

void engine_whole_owed_reload(struct engine *e)
{
	_cleanup_free_ char *why = NULL;
	if (!e->whole_owed)
		return;
	if (e->whole_owed->reload && services_reload(e->services, &why) < 0)
		log_warn("whole-root restore: daemon-reload failed: %s", why ? why : "unknown error");
	for (size_t i = 0; i < e->n_plans; i++)
		services_plan_mark_gone(e->services, &e->plans[i]);
}

void engine_whole_owed_restart(struct engine *e, struct svc_report *rep)
{
	struct whole_owed *owed = e->whole_owed;
	struct svc_plan p;
	if (!owed)
		return;
	if (services_plan_running(e->services, (const char *const *)owed->restart.v, owed->restart.n, &p) < 0)
		log_warn("whole-root restore: cannot list the units the interrupted restore owed a restart");
	whole_linked(e, &owed->linked, &p, NULL);
	if (services_restart(e->services, &p) < 0)
		log_warn("whole-root restore: a unit did not come back after its restart");
	services_report(&p, rep);
	services_plan_free(&p);
	engine_svc_journal_whole_free(owed);
	free(owed);
	e->whole_owed = NULL;
}

void engine_whole_health(struct engine *e, struct health_report *h)
{
	if (!e->cfg->whole_root)
		return;
	h->whole_root = true;
	pthread_mutex_lock(&e->state_lock);
	h->restart_due = e->restart_due;
	pthread_mutex_unlock(&e->state_lock);
	if (h->restart_due)
		h->restart_due_reason = "a restore replaced ckptd's own binary or a library it maps";
}
