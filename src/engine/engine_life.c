/* engine_life.c: progress of running operations, the client's view of a
 * record, health, metrics, and the status line. Of the
 * engine it calls only the catalog. */
#include "config.h"
#include "backend/change_track.h"
#include "engine/engine_internal.h"
#include "engine/engine_push_note.h"
#include "services/services.h"

bool record_expired(const struct ckpt_record *rec, int64_t now)
{
	return rec->expires_ms > 0 && now >= rec->expires_ms;
}

struct engine_op *engine_op_begin(struct engine *e, const char *id)
{
	struct engine_op *op = calloc(1, sizeof(*op));
	if (!op)
		return NULL;
	snprintf(op->id, sizeof(op->id), "%s", id);
	pthread_mutex_lock(&e->state_lock);
	op->next = e->ops;
	e->ops = op;
	pthread_mutex_unlock(&e->state_lock);
	return op;
}

void engine_op_end(struct engine *e, struct engine_op *op)
{
	if (!op)
		return;
	pthread_mutex_lock(&e->state_lock);
	for (struct engine_op **p = &e->ops; *p; p = &(*p)->next)
		if (*p == op) {
			*p = op->next;
			break;
		}
	pthread_mutex_unlock(&e->state_lock);
	free(op);
}

void engine_view(struct engine *e, const struct ckpt_record *rec, struct ckpt_view *ret)
{
	*ret = (struct ckpt_view){ .rec = record_ref(rec) };
	pthread_mutex_lock(&e->state_lock);
	for (struct engine_op *op = e->ops; op; op = op->next)
		if (!strcmp(op->id, rec->id)) {
			struct progress *p = &op->progress;
			ret->has_progress = true;
			ret->bytes_done = atomic_load(&p->bytes_done);
			ret->bytes_total = atomic_load(&p->bytes_total);
			ret->files_done = atomic_load(&p->files_done);
			ret->files_total = atomic_load(&p->files_total);
		}
	pthread_mutex_unlock(&e->state_lock);
	ret->push = engine_push_of(e, rec->id);
}

void ckpt_view_free(struct ckpt_view *v)
{
	if (v->rec)
		record_unref(v->rec);
	v->rec = NULL;
	free(TAKE_PTR(v->push));
}

void engine_set_status(struct engine *e, const char *op, const char *what)
{
	pthread_mutex_lock(&e->state_lock);
	if (op)
		snprintf(e->status, sizeof(e->status), "%s %s", op, what ? what : "");
	else
		e->status[0] = '\0';
	pthread_mutex_unlock(&e->state_lock);
}

void engine_status_line(struct engine *e, char *buf, size_t len)
{
	pthread_mutex_lock(&e->state_lock);
	if (e->status[0])
		snprintf(buf, len, "%s", e->status);
	else
		snprintf(buf, len, "idle, %zu checkpoints, %s backend", catalog_count(e->catalog), e->backend->name);
	pthread_mutex_unlock(&e->state_lock);
}

void health_report_free(struct health_report *h)
{
	backend_health_free(&h->backend_health);
	adoption_report_free(&h->adoption);
	svc_users_free(&h->unmanaged);
}

void engine_health(struct engine *e, struct health_report *ret)
{
	*ret = (struct health_report){ .version = CKPTD_VERSION,
				       .mode = "sandbox",
				       .backend = e->backend->name,
				       .roots = e->cfg->roots,
				       .n_roots = e->cfg->n_roots,
				       .backend_reason = e->backend_reason,
				       .checkpoints = catalog_count(e->catalog),
				       .uptime_secs = (mono_ms() - e->started_ms) / 1000,
				       .services_available = services_available(e->services) };
	if (!ret->services_available)
		ret->services_reason = services_unavailable_reason(e->services);
	e->backend->health(e->bst, &ret->backend_health);
	engine_adoption_health(e, ret);
	engine_whole_health(e, ret);
	pthread_mutex_lock(&e->state_lock); /* engine_release.c fills it */
	for (size_t i = 0; i < e->n_released; i++)
		ret->released[ret->n_released++] = e->released[i];
	pthread_mutex_unlock(&e->state_lock);
}

char *engine_metrics(struct engine *e)
{
	struct metrics_gauges g = { .version = CKPTD_VERSION, .backend = e->backend->name };
	struct catalog_stats st;

	catalog_stats(e->catalog, &st);
	g.creating = st.count[CKPT_CREATING];
	g.active = st.count[CKPT_ACTIVE];
	g.deleting = st.count[CKPT_DELETING];
	g.failed = st.count[CKPT_FAILED];
	/* a failed create's data is gone already */
	g.checkpoint_bytes = st.bytes[CKPT_CREATING] + st.bytes[CKPT_ACTIVE] + st.bytes[CKPT_DELETING];
	g.tracking_fallbacks = chg_track_fallbacks_total();
	g.tracking_events = chg_track_events_total();
	return metrics_render(&e->metrics, &g);
}
