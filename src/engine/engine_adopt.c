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
	e->adoption.present = true;
	services_strv_add(&e->adoption.mounted, path);
	for (size_t k = 0; k < p->n; k++)
		if (p->units[k].stopped) {
			services_strv_add(&e->adoption.units.stopped, p->units[k].name);
			log_notice("adoption: stopped %s before mounting over %s", p->units[k].name, path);
		}
	e->adoption_pending = true;
	pthread_mutex_unlock(&e->state_lock);
}

static void rescan_unmanaged(struct engine *e)
{
	struct svc_users u;
	services_unmanaged_users(e->services, e->cfg->roots, e->cfg->n_roots, e->hidden, e->n_hidden, &u);
	pthread_mutex_lock(&e->state_lock);
	svc_users_free(&e->unmanaged);
	e->unmanaged = u;
	e->unmanaged_scanned = true;
	e->unmanaged_ms = mono_ms();
	pthread_mutex_unlock(&e->state_lock);
}

/* A copy of from, which state_lock guards; -ENOMEM. */
static int users_copy(const struct svc_users *from, struct svc_users *to)
{
	*to = (struct svc_users){ .v = from->n ? calloc(from->n, sizeof(*to->v)) : NULL };
	if (from->n && !to->v)
		return -ENOMEM;
	for (size_t i = 0; i < from->n; i++) {
		to->v[to->n] = from->v[i];
		to->v[to->n].unit = NULL;
		if (from->v[i].unit && !(to->v[to->n].unit = strdup(from->v[i].unit)))
			return -ENOMEM;
		to->n++;
	}
	return 0;
}

static int names_copy(const struct strv *from, struct strv *to)
{
	for (size_t i = 0; i < from->n; i++)
		if (services_strv_add(to, from->v[i]) < 0)
			return -ENOMEM;
	return 0;
}

/* A copy of from (state_lock's); -ENOMEM. */
static int adoption_copy(const struct adoption_report *from, struct adoption_report *to)
{
	*to = (struct adoption_report){ .present = from->present };
	snprintf(to->at, sizeof(to->at), "%s", from->at);
	int r = names_copy(&from->mounted, &to->mounted);
	if (r == 0)
		r = names_copy(&from->units.stopped, &to->units.stopped);
	if (r == 0)
		r = names_copy(&from->units.started, &to->units.started);
	for (size_t i = 0; r == 0 && i < from->units.n_failures; i++)
		r = svc_report_fail(&to->units, from->units.failures[i].unit, from->units.failures[i].reason);
	return r;
}

void adoption_report_free(struct adoption_report *a)
{
	services_strv_clear(&a->mounted);
	svc_report_free(&a->units);
	*a = (struct adoption_report){ 0 };
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
			services_strv_add(&e->adoption.units.started, rep.started.v[i]);
		for (size_t i = 0; i < rep.n_failures; i++)
			svc_report_fail(&e->adoption.units, rep.failures[i].unit, rep.failures[i].reason);
		snprintf(e->adoption.at, sizeof(e->adoption.at), "%s", at);
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
	struct svc_users users;
	pthread_mutex_lock(&e->state_lock);
	users_copy(&e->unmanaged, &users);
	pthread_mutex_unlock(&e->state_lock);
	for (size_t i = 0; i < users.n; i++)
		log_warn("process %lld (%s) uses a managed root%s and belongs to no managed unit: nothing stops it "
			 "around a restore",
			 (long long)users.v[i].pid, users.v[i].command,
			 users.v[i].tag == 1 ? " through the directory hidden under the mount" : "");
	svc_users_free(&users);
}

void engine_adoption_health(struct engine *e, struct health_report *h)
{
	pthread_mutex_lock(&e->state_lock);
	bool stale = !e->unmanaged_scanned || mono_ms() - e->unmanaged_ms > UNMANAGED_TTL_MS;
	pthread_mutex_unlock(&e->state_lock);
	if (stale && !e->adoption_pending)
		rescan_unmanaged(e);
	pthread_mutex_lock(&e->state_lock);
	if (e->adoption.present && adoption_copy(&e->adoption, &h->adoption) < 0)
		log_warn("health: out of memory copying the adoption");
	h->adoption.starting = e->adoption.present && e->adoption_pending;
	if (users_copy(&e->unmanaged, &h->unmanaged) < 0)
		log_warn("health: out of memory copying the unmanaged users");
	pthread_mutex_unlock(&e->state_lock);
}

void engine_adoption_free(struct engine *e)
{
	for (size_t i = 0; i < e->n_plans; i++)
		services_plan_free(&e->plans[i]);
	free(e->plans);
	engine_svc_journal_whole_free(e->whole_owed);
	free(e->whole_owed);
	e->whole_owed = NULL;
	free(e->hidden);
	e->plans = NULL;
	e->hidden = NULL;
	e->n_plans = e->n_hidden = 0;
	adoption_report_free(&e->adoption);
	svc_users_free(&e->unmanaged);
	e->unmanaged_scanned = false;
}
