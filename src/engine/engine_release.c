/* engine_release.c: stop managing a root and leave it a plain directory
 * holding what it showed (POST /v1/roots/release). The units using the roots
 * are stopped around the backend's release and started after, on the plain
 * directory. Until ckptd restarts (and adopts the root again), creates,
 * restores, forks and imports answer 409 root_released. */
#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"

void release_report_free(struct release_report *r)
{
	free(r->dropped);
	if (r->units_ran)
		svc_report_free(&r->services);
	memset(r, 0, sizeof(*r));
}

static bool is_released(struct engine *e, const char *root)
{
	for (size_t i = 0; i < e->n_released; i++)
		if (!strcmp(e->released[i], root))
			return true;
	return false;
}

/* Drop every checkpoint (asked: drop_checkpoints). */
static int release_drop_all(struct engine *e, struct release_report *out, ckpt_error *err)
{
	struct catalog_list l = { 0 };
	int r = catalog_list(e->catalog, NULL, &l);
	if (r == 0 && l.n && !(out->dropped = calloc(l.n, sizeof(*out->dropped))))
		r = err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t k = 0; r == 0 && k < l.n; k++) {
		if (l.v[k]->status == CKPT_CREATING)
			r = err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "checkpoint '%s' is still being created",
					 l.v[k]->id);
		else if ((r = engine_err_classify(err, ENGINE_CTX_DELETE, engine_drop(e, l.v[k], err))) == 0)
			snprintf(out->dropped[out->n_dropped++], sizeof(*out->dropped), "%s", l.v[k]->id);
	}
	catalog_list_free(&l);
	return r;
}

static int release_roots(struct engine *e, const char *root, size_t *idx, size_t *n, ckpt_error *err)
{
	*n = 0;
	for (size_t i = 0; i < e->cfg->n_roots; i++) {
		const char *p = e->cfg->roots[i];
		if (root && strcmp(root, p))
			continue;
		if (is_released(e, p)) {
			if (root)
				return err_set_kind(err, ERR_CONFLICT, EALREADY, "root_released",
						    "'%s' is released already; ckptd adopts it again when it restarts",
						    p);
			continue;
		}
		idx[(*n)++] = i;
	}
	if (root && !*n)
		return err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "'%s' is not a managed root", root);
	return 0;
}

/* A backend that unmounts (overlay) cannot let a process outside the units
 * go on writing to the mount: refuse before anything is dropped. */
static int release_check_users(struct engine *e, const size_t *idx, size_t n, ckpt_error *err)
{
	char *roots[n];
	for (size_t k = 0; k < n; k++)
		roots[k] = e->cfg->roots[idx[k]];
	struct svc_users u;
	services_unmanaged_users(e->services, roots, n, NULL, 0, &u);
	int r = u.n == 0 ? 0
			 : err_set_kind(err, ERR_CONFLICT, EBUSY, "root_busy",
					"process %lld (%s) uses a root and belongs to no managed unit: stop it first, "
					"nothing released",
					(long long)u.v[0].pid, u.v[0].command);
	svc_users_free(&u);
	return r;
}

/* Stop the units, release, start them: like a restore's swap. */
static int release_run(struct engine *e, const size_t *idx, size_t n, struct release_report *out, ckpt_error *err)
{
	struct svc_plan units;
	char *roots[n ? n : 1];
	for (size_t k = 0; k < n; k++)
		roots[k] = e->cfg->roots[idx[k]];
	int r = services_plan(e->services, roots, n, &units);
	if (r < 0) {
		services_plan_free(&units);
		return err_set(err, -r, NULL, "cannot list the services that use the roots: %s", strerror(-r));
	}
	svc_report_init(&out->services);
	out->units_ran = true;
	if (services_stop(e->services, &units) < 0)
		r = err_set_kind(err, ERR_CONFLICT, EBUSY, "services_busy",
				 "a unit that uses the roots could not be stopped: nothing released");
	for (size_t k = 0; r == 0 && k < n; k++) {
		r = engine_err_classify(err, ENGINE_CTX_RELEASE, e->backend->release->release(e->bst, idx[k], err));
		/* "released, but" (the next start finishes it): released all the same */
		if (r < 0 && !(err->code && !strcmp(err->code, "release_incomplete")))
			break;
		pthread_mutex_lock(&e->state_lock);
		e->released[e->n_released++] = roots[k];
		pthread_mutex_unlock(&e->state_lock);
		out->released[out->n_released++] = roots[k];
		log_notice("released '%s': a plain directory now, not managed until ckptd restarts", roots[k]);
	}
	services_start(e->services, &units);
	services_report(&units, &out->services);
	services_plan_free(&units);
	return r;
}

int engine_release(struct engine *e, const char *root, bool drop, struct release_report *ret_report, ckpt_error *err)
{
	size_t idx[e->cfg->n_roots ? e->cfg->n_roots : 1], n = 0;
	int64_t t0 = mono_ms();
	if (!e->backend->release)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "not_supported", "the %s backend cannot release",
				    e->backend->name);
	struct release_report out = { 0 };
	pthread_mutex_lock(&e->op_lock);
	engine_set_status(e, "releasing", root ? root : "the roots");
	int r = release_roots(e, root, idx, &n, err);
	if (r == 0 && n && e->forks && e->backend->release->unmounts)
		r = err_set_kind(err, ERR_CONFLICT, EBUSY, "forks_exist",
				 "forks use the checkpoints' layers: delete them first (GET /v1/forks)");
	if (r == 0 && n && e->backend->release->unmounts)
		r = release_check_users(e, idx, n, err);
	if (r == 0 && n && drop)
		r = release_drop_all(e, &out, err);
	if (r == 0 && n)
		r = release_run(e, idx, n, &out, err);
	out.checkpoints_kept = !drop && catalog_count(e->catalog) > 0;
	out.duration_ms = mono_ms() - t0;
	engine_set_status(e, NULL, NULL);
	pthread_mutex_unlock(&e->op_lock);
	engine_kick_maintenance(e);
	if (r < 0) {
		release_report_free(&out);
		return r;
	}
	*ret_report = out;
	return 0;
}
