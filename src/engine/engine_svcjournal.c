/* engine_svcjournal.c: the units a restore stopped or a create froze, kept
 * durable while they are down or frozen. A kill in that window used to leave
 * them stopped or frozen for good: nothing remembered them. The next start
 * reads <state>/services.json, logs and counts the interrupted operation,
 * thaws the frozen units at once and starts the stopped ones after READY
 * (with the units adoption stopped: a unit ordered After=ckptd.service would
 * wait on ckptd's own start job otherwise). */
#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"

#define SVC_JOURNAL "services.json"

void engine_svc_journal_whole_free(struct whole_owed *w)
{
	if (!w)
		return;
	services_strv_clear(&w->restart);
	services_strv_clear(&w->linked);
	w->reload = false;
}

/* A whole-root restore that owes nothing but what p says. */
static bool svc_journal_owes(const struct whole_owed *w)
{
	return w && (w->reload || w->restart.n || w->linked.n);
}

static json_t *svc_journal_names_of(const struct svc_plan *p)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < p->n; i++)
		json_array_append_new(a, json_string(p->units[i].name));
	return a;
}

/* {reload, restart: [unit], linked: [unit]}, in that order */
json_t *engine_svc_journal_whole_json(const struct whole_owed *w)
{
	return json_pack("{s:b,s:o,s:o}", "reload", w->reload, "restart", services_strv_json(&w->restart), "linked",
			 services_strv_json(&w->linked));
}

/* The same read back; NULL when whole is no object. */
struct whole_owed *engine_svc_journal_whole_read(json_t *whole)
{
	struct whole_owed *w = json_is_object(whole) ? calloc(1, sizeof(*w)) : NULL;
	if (!w)
		return NULL;
	w->reload = json_is_true(json_object_get(whole, "reload"));
	/* what is not a unit name is no unit to start */
	services_strv_from_json(&w->restart, json_object_get(whole, "restart"));
	services_strv_from_json(&w->linked, json_object_get(whole, "linked"));
	return w;
}

static int svc_journal_write(struct engine *e, const char *op, const char *id, const struct svc_plan *p,
			     const struct whole_owed *whole)
{
	if (p->n == 0 && !svc_journal_owes(whole))
		return 0;
	json_auto_t *units = svc_journal_names_of(p);
	json_auto_t *j =
		units ? json_pack("{s:s,s:s,s:O}", "op", op, "checkpoint_id", id ? id : "", "units", units) : NULL;
	if (j && svc_journal_owes(whole))
		json_object_set_new(j, "whole", engine_svc_journal_whole_json(whole));
	_cleanup_free_ char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	int r = s ? write_file_atomic(e->state_fd, SVC_JOURNAL, s, strlen(s), 0600) : -ENOMEM;
	if (r < 0)
		log_warn("services: cannot record the units of this %s (a crash now would leave them %s): %s", op,
			 strcmp(op, "create") ? "stopped" : "frozen", strerror(-r));
	return r;
}

/* Before the units of p are stopped (op "restore") or frozen ("create"). No
 * unit, no file: a sandbox without systemd pays nothing. */
int engine_svc_journal_save(struct engine *e, const char *op, const char *id, const struct svc_plan *p)
{
	return svc_journal_write(e, op, id, p, NULL);
}

int engine_svc_journal_save_whole(struct engine *e, const char *id, const struct svc_plan *p,
				  const struct whole_owed *whole)
{
	return svc_journal_write(e, "restore", id, p, whole);
}

/* The units are back (or were never touched). */
void engine_svc_journal_clear(struct engine *e)
{
	if (unlinkat(e->state_fd, SVC_JOURNAL, 0) == 0)
		fsync_dirfd(e->state_fd);
}

/* A plan whose units are all marked stopped (to start) or frozen (to thaw). */
static int svc_journal_plan(json_t *units, bool frozen, struct svc_plan *p)
{
	*p = (struct svc_plan){ 0 };
	p->units = calloc(json_array_size(units) + 1, sizeof(*p->units));
	if (!p->units)
		return -ENOMEM;
	for (size_t i = 0; i < json_array_size(units); i++) {
		const char *n = json_string_value(json_array_get(units, i));
		if (!n || !(p->units[p->n].name = strdup(n)))
			continue;
		*(frozen ? &p->units[p->n].frozen : &p->units[p->n].stopped) = true;
		p->n++;
	}
	return 0;
}

/* Hand the stopped units to the start after READY (engine_adoption_finish). */
static void svc_journal_defer_start(struct engine *e, struct svc_plan *p)
{
	struct svc_plan *plans = realloc(e->plans, (e->n_plans + 1) * sizeof(*plans));
	if (!plans) {
		log_warn("services: out of memory: the units of the interrupted restore are not started");
		services_plan_free(p);
		return;
	}
	e->plans = plans;
	e->plans[e->n_plans++] = *p;
	pthread_mutex_lock(&e->state_lock);
	e->adoption_pending = true;
	e->svc_journal_pending = true;
	pthread_mutex_unlock(&e->state_lock);
}

void engine_svc_journal_recover(struct engine *e)
{
	_cleanup_free_ char *s = NULL;
	if (read_file_at(e->state_fd, SVC_JOURNAL, 1 << 20, &s, NULL) < 0)
		return;
	json_auto_t *j = json_loads(s, 0, NULL);
	const char *op = json_string_value(json_object_get(j, "op"));
	const char *id = json_string_value(json_object_get(j, "checkpoint_id"));
	json_t *units = json_object_get(j, "units");
	if (!op || !json_is_array(units)) {
		log_warn("services: ignoring a damaged %s", SVC_JOURNAL);
		engine_svc_journal_clear(e);
		return;
	}
	bool create = !strcmp(op, "create");
	_cleanup_free_ char *names = json_dumps(units, JSON_COMPACT);
	log_event(LOG_WARN_, &(struct log_fields){ create ? "create" : "restore", id && *id ? id : NULL, NULL, -1 },
		  "%s of \"%s\" was interrupted by a crash with units %s: %s them again", op, id ? id : "",
		  names ? names : "?", create ? "thawing" : "starting");
	metrics_interrupted(&e->metrics, create ? OP_CREATE : OP_RESTORE);
	struct svc_plan p;
	if (svc_journal_plan(units, create, &p) < 0)
		return;
	if (create) {
		services_thaw(e->services, &p);
		services_plan_free(&p);
		engine_svc_journal_clear(e);
		return;
	}
	/* run by engine_adoption_finish: engine_whole.c */
	e->whole_owed = engine_svc_journal_whole_read(json_object_get(j, "whole"));
	svc_journal_defer_start(e, &p);
}
