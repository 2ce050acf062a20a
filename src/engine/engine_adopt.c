/* engine_adopt.c: a mount at start hides the directory that services may be
 * using already. Before the backend mounts over a root, the units using it
 * (found by device and inode) are stopped; after READY they are started
 * again, on the mounted root. Processes no unit covers are named in health. */
#include <sys/stat.h>
#include <time.h>

#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"

#define UNMANAGED_TTL_MS 5000

/* What the mount over root is about to hide, remembered by identity: its
 * users' paths will read like the mount's. */
static int remember_hidden(struct engine *e, const char *root, const struct stat *st)
{
	struct procscan_target *t = realloc(e->hidden, (e->n_hidden + 1) * sizeof(*t));
	if (!t)
		return -ENOMEM;
	e->hidden = t;
	t[e->n_hidden++] = (struct procscan_target){ .path = root, .dev = st->st_dev, .ino = st->st_ino, .tag = 1 };
	return 0;
}

void engine_adopt_before_mount(void *engine, const char *path)
{
	struct engine *e = engine;
	struct stat st;
	size_t i = 0;
	while (i < e->cfg->n_roots && strcmp(e->cfg->roots[i], path))
		i++;
	if (i == e->cfg->n_roots || stat(path, &st) < 0)
		return;
	struct svc_plan *plans = realloc(e->plans, (e->n_plans + 1) * sizeof(*plans));
	if (!plans || remember_hidden(e, e->cfg->roots[i], &st) < 0) {
		e->plans = plans ? plans : e->plans;
		log_warn("adoption: out of memory: the units using '%s' are not restarted", path);
		return;
	}
	e->plans = plans;
	struct svc_plan *p = &plans[e->n_plans++];
	/* Whatever is at the root now is what the units use: stop them. */
	if (services_plan(e->services, &e->cfg->roots[i], 1, p) < 0)
		log_warn("adoption: cannot list the units using '%s'", path);
	services_stop(e->services, p);
	pthread_mutex_lock(&e->state_lock);
	if (!e->adoption)
		e->adoption =
			json_pack("{s:[],s:[],s:[],s:{}}", "mounted", "stopped_units", "restarted_units", "failures");
	json_array_append_new(json_object_get(e->adoption, "mounted"), json_string(path));
	for (size_t k = 0; k < p->n; k++)
		if (p->units[k].stopped) {
			json_array_append_new(json_object_get(e->adoption, "stopped_units"),
					      json_string(p->units[k].name));
			log_notice("adoption: stopped %s before mounting over %s", p->units[k].name, path);
		}
	e->adoption_pending = true;
	pthread_mutex_unlock(&e->state_lock);
}

static void rescan_unmanaged(struct engine *e)
{
	json_t *u = services_unmanaged_users(e->services, e->cfg->roots, e->cfg->n_roots, e->hidden, e->n_hidden);
	for (size_t i = 0; i < json_array_size(u); i++) {
		json_t *p = json_array_get(u, i);
		json_object_set_new(p, "hidden", json_boolean(json_integer_value(json_object_get(p, "tag")) == 1));
		json_object_del(p, "tag");
	}
	pthread_mutex_lock(&e->state_lock);
	json_decref(e->unmanaged);
	e->unmanaged = u;
	e->unmanaged_ms = mono_ms();
	pthread_mutex_unlock(&e->state_lock);
}

void engine_adoption_finish(struct engine *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->state_lock);
	bool pending = e->adoption_pending;
	e->adoption_pending = false;
	pthread_mutex_unlock(&e->state_lock);
	if (pending) {
		/* a restore or create waits: it would stop or freeze units being started */
		pthread_mutex_lock(&e->op_lock);
		struct svc_report rep;
		char at[32];
		time_t now = time(NULL);
		svc_report_init(&rep);
		engine_whole_owed_reload(e); /* an interrupted whole-root restore's */
		for (size_t i = 0; i < e->n_plans; i++) {
			services_start(e->services, &e->plans[i]);
			services_report(&e->plans[i], &rep);
			services_plan_free(&e->plans[i]);
		}
		e->n_plans = 0;
		engine_whole_owed_restart(e, &rep);
		strftime(at, sizeof(at), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
		pthread_mutex_lock(&e->state_lock);
		for (size_t i = 0; i < rep.started.n; i++)
			json_array_append_new(json_object_get(e->adoption, "restarted_units"),
					      json_string(rep.started.v[i]));
		for (size_t i = 0; i < rep.n_failures; i++)
			json_object_set_new(json_object_get(e->adoption, "failures"), rep.failures[i].unit,
					    json_string(rep.failures[i].reason));
		json_object_set_new(e->adoption, "at", json_string(at));
		pthread_mutex_unlock(&e->state_lock);
		for (size_t i = 0; i < rep.started.n; i++)
			log_notice("adoption: started %s on the mounted root", rep.started.v[i]);
		svc_report_free(&rep);
		if (e->svc_journal_pending) /* an interrupted restore's units are started */
			engine_svc_journal_clear(e);
		e->svc_journal_pending = false;
		pthread_mutex_unlock(&e->op_lock);
	}
	rescan_unmanaged(e);
	pthread_mutex_lock(&e->state_lock);
	json_t *users = json_deep_copy(e->unmanaged);
	pthread_mutex_unlock(&e->state_lock);
	for (size_t i = 0; i < json_array_size(users); i++) {
		json_t *p = json_array_get(users, i);
		log_warn("process %lld (%s) uses a managed root%s and belongs to no managed unit: nothing stops it "
			 "around a restore",
			 (long long)json_integer_value(json_object_get(p, "pid")),
			 json_string_value(json_object_get(p, "command")),
			 json_is_true(json_object_get(p, "hidden")) ? " through the directory hidden under the mount"
								    : "");
	}
	json_decref(users);
}

void engine_adoption_health(struct engine *e, json_t *h)
{
	pthread_mutex_lock(&e->state_lock);
	bool stale = !e->unmanaged || mono_ms() - e->unmanaged_ms > UNMANAGED_TTL_MS;
	pthread_mutex_unlock(&e->state_lock);
	if (stale && !e->adoption_pending)
		rescan_unmanaged(e);
	pthread_mutex_lock(&e->state_lock);
	if (e->adoption) {
		json_t *a = json_deep_copy(e->adoption);
		if (e->adoption_pending)
			json_object_set_new(a, "state", json_string("starting units"));
		json_object_set_new(h, "adoption", a);
	}
	json_object_set_new(h, "unmanaged_users", e->unmanaged ? json_deep_copy(e->unmanaged) : json_array());
	pthread_mutex_unlock(&e->state_lock);
}

void engine_adoption_free(struct engine *e)
{
	for (size_t i = 0; i < e->n_plans; i++)
		services_plan_free(&e->plans[i]);
	free(e->plans);
	json_decref(e->whole_owed);
	e->whole_owed = NULL;
	free(e->hidden);
	e->plans = NULL;
	e->hidden = NULL;
	e->n_plans = e->n_hidden = 0;
	json_decref(e->adoption);
	json_decref(e->unmanaged);
	e->adoption = e->unmanaged = NULL;
}
