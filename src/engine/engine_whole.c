/* engine_whole.c: the services step of a whole-root restore, and what
 * health says of it (docs/whole-root.md). After the swap, as needrestart
 * does: daemon-reload when a unit file changed, then the running units
 * whose processes map or hold open a file the restore replaced or removed
 * are stopped and started (a unit whose file is gone stays stopped), and
 * the units whose enablement came back are started. ckptd itself is never
 * stopped: if it uses a replaced file, health says a restart is due. */
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

void engine_whole_services(struct engine *e, struct restore_report *rep)
{
	struct restore_details *d = &rep->details;
	size_t n = json_array_size(d->units_linked);
	const char *linked[n ? n : 1];
	_cleanup_free_ char *why = NULL;
	struct svc_plan plan;
	bool self = false;

	if (d->unit_files_changed && services_reload(e->services, &why) < 0)
		log_warn("whole-root restore: daemon-reload failed: %s", why ? why : "unknown error");
	for (size_t i = 0; i < n; i++)
		linked[i] = json_string_value(json_array_get(d->units_linked, i));
	int r = services_plan_gone(e->services, d->gone, linked, n, &plan, &self);
	if (r < 0)
		log_warn("whole-root restore: cannot find the units that use replaced files: %s", strerror(-r));
	if (self)
		engine_whole_self(e);
	if (services_restart(e->services, &plan) < 0)
		log_warn("whole-root restore: a unit did not come back after its restart (failed_services)");
	services_report(&plan, &rep->services);
	services_plan_free(&plan);
}

void engine_whole_health(struct engine *e, json_t *h)
{
	if (!e->cfg->whole_root)
		return;
	pthread_mutex_lock(&e->state_lock);
	bool due = e->restart_due;
	pthread_mutex_unlock(&e->state_lock);
	json_object_set_new(h, "restart_due", json_boolean(due));
	if (due)
		json_object_set_new(h, "restart_due_reason",
				    json_string("a restore replaced ckptd's own binary or a library it maps"));
}
