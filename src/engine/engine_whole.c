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
static json_t *whole_owed(const struct whole_run *w, const struct restore_details *planned)
{
	json_t *restart = json_array();
	for (size_t i = 0; restart && i < w->restart->n; i++)
		json_array_append_new(restart, json_string(w->restart->units[i].name));
	return json_pack("{s:b,s:o,s:o}", "reload", planned->unit_files_changed, "restart",
			 restart ? restart : json_array(), "linked",
			 planned->units_linked ? json_incref(planned->units_linked) : json_array());
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
	json_auto_t *owed = whole_owed(w, planned);
	/* a crash now: done at the next start (with systemd to reach: else
	 * there is nothing to owe, and the write would cost two fsyncs) */
	if (services_available(w->e->services))
		engine_svc_journal_save_whole(w->e, w->id, w->units, owed);
	if (w->units->n == before)
		return 0;
	r = services_stop(w->e->services, w->units);
	engine_svc_journal_save_whole(w->e, w->id, w->units, owed); /* with the units systemd stopped too */
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
static void whole_linked(struct engine *e, json_t *linked, struct svc_plan *p, const struct svc_plan *skip)
{
	size_t n = json_array_size(linked);
	const char *names[n ? n : 1];
	struct svc_plan lp;
	bool self = false;
	for (size_t i = 0; i < n; i++)
		names[i] = json_string_value(json_array_get(linked, i));
	int r = services_plan_gone(e->services, NULL, names, n, &lp, &self);
	if (r < 0 || services_plan_merge(p, &lp, skip, true) < 0)
		log_warn("whole-root restore: cannot find the units whose enablement came back: %s",
			 strerror(r < 0 ? -r : ENOMEM));
	services_plan_free(&lp);
}

void engine_whole_services(struct whole_run *w, struct restore_report *rep)
{
	whole_linked(w->e, rep->details.units_linked, w->restart, w->units);
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
	if (json_is_true(json_object_get(e->whole_owed, "reload")) && services_reload(e->services, &why) < 0)
		log_warn("whole-root restore: daemon-reload failed: %s", why ? why : "unknown error");
	for (size_t i = 0; i < e->n_plans; i++)
		services_plan_mark_gone(e->services, &e->plans[i]);
}

void engine_whole_owed_restart(struct engine *e, struct svc_report *rep)
{
	json_t *names = json_object_get(e->whole_owed, "restart");
	size_t n = json_array_size(names);
	const char *v[n ? n : 1];
	struct svc_plan p;
	if (!e->whole_owed)
		return;
	for (size_t i = 0; i < n; i++)
		v[i] = json_string_value(json_array_get(names, i));
	if (services_plan_running(e->services, v, n, &p) < 0)
		log_warn("whole-root restore: cannot list the units the interrupted restore owed a restart");
	whole_linked(e, json_object_get(e->whole_owed, "linked"), &p, NULL);
	if (services_restart(e->services, &p) < 0)
		log_warn("whole-root restore: a unit did not come back after its restart");
	services_report(&p, rep);
	services_plan_free(&p);
	json_decref(e->whole_owed);
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
