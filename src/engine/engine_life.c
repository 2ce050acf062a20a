/* engine_life.c: the sweeper (TTL expiry, maintenance), progress of running
 * operations, health, metrics and the status line. */
#include <time.h>

#include "config.h"
#include "engine/engine_internal.h"
#include "services/services.h"

bool record_expired(json_t *rec, int64_t now)
{
	int64_t exp = record_int(rec, "_expires_ms");
	return exp > 0 && now >= exp;
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

static json_t *progress_json(struct progress *p)
{
	return json_pack("{s:I, s:I, s:I, s:I}", "bytes_done", (json_int_t)atomic_load(&p->bytes_done), "bytes_total",
			 (json_int_t)atomic_load(&p->bytes_total), "files_done",
			 (json_int_t)atomic_load(&p->files_done), "files_total",
			 (json_int_t)atomic_load(&p->files_total));
}

/* The client's view of a record, with live progress while an operation runs. */
json_t *engine_public(struct engine *e, json_t *rec)
{
	json_t *pub = record_public(rec);
	const char *id = record_id(rec);

	pthread_mutex_lock(&e->state_lock);
	for (struct engine_op *op = e->ops; op; op = op->next)
		if (!strcmp(op->id, id))
			json_object_set_new(pub, "progress", progress_json(&op->progress));
	pthread_mutex_unlock(&e->state_lock);
	return pub;
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

int engine_sweep(struct engine *e)
{
	json_t *all = catalog_list(e->catalog, NULL), *rec;
	int64_t now = now_ms();
	size_t i;
	int n = 0;

	json_array_foreach(all, i, rec)
	{
		const char *status = json_string_value(json_object_get(rec, "status"));
		/* failed async creates are kept for their clients to see, until they expire */
		if (!record_expired(rec, now) || (strcmp(status, "active") && strcmp(status, "failed")))
			continue;
		ckpt_error err = { 0 };
		pthread_mutex_lock(&e->op_lock);
		json_t *cur = catalog_get(e->catalog, record_id(rec)); /* may have gone meanwhile */
		int r = cur && record_expired(cur, now) && !engine_fork_uses(e, record_id(cur))
			? engine_drop(e, cur, &err)
			: 1; /* a forked one waits */
		pthread_mutex_unlock(&e->op_lock);
		json_decref(cur);
		if (r == 0) {
			log_event(LOG_INFO_, &(struct log_fields){ "expire", record_id(rec), NULL, -1 },
				  "expired checkpoint \"%s\" removed", record_id(rec));
			n++;
		} else if (r < 0) {
			log_warn("cannot remove expired checkpoint \"%s\": %s", record_id(rec), err.msg);
		}
		metrics_op(&e->metrics, OP_SWEEP, r >= 0, 0);
	}
	json_decref(all);
	return n;
}

static void *engine_sweeper_main(void *arg)
{
	struct engine *e = arg;
	int64_t next_sweep = mono_ms() + e->cfg->cleanup_interval_secs * 1000;

	pthread_mutex_lock(&e->state_lock);
	while (!e->stopping) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		int64_t wait = next_sweep - mono_ms();
		if (wait > 0 && !e->maintenance_due) {
			ts.tv_sec += wait / 1000;
			ts.tv_nsec += (wait % 1000) * 1000000;
			if (ts.tv_nsec >= 1000000000)
				ts.tv_sec++, ts.tv_nsec -= 1000000000;
			pthread_cond_timedwait(&e->sweep_cond, &e->state_lock, &ts);
			continue;
		}
		bool maintain = e->maintenance_due;
		e->maintenance_due = false;
		pthread_mutex_unlock(&e->state_lock);
		if (mono_ms() >= next_sweep) {
			engine_sweep(e);
			next_sweep = mono_ms() + e->cfg->cleanup_interval_secs * 1000;
			maintain = true;
		}
		if (maintain && e->backend->maintain) {
			pthread_mutex_lock(&e->op_lock);
			e->backend->maintain(e->bst);
			pthread_mutex_unlock(&e->op_lock);
		}
		pthread_mutex_lock(&e->state_lock);
	}
	pthread_mutex_unlock(&e->state_lock);
	return NULL;
}

int engine_sweeper_start(struct engine *e, ckpt_error *err)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_destroy(&e->sweep_cond);
	pthread_cond_init(&e->sweep_cond, &ca);
	pthread_condattr_destroy(&ca);
	int r = pthread_create(&e->sweeper, NULL, engine_sweeper_main, e);
	if (r != 0)
		return err_set(err, r, NULL, "cannot start the sweeper thread");
	e->sweeper_running = true;
	return 0;
}

void engine_sweeper_stop(struct engine *e)
{
	if (!e->sweeper_running)
		return;
	pthread_mutex_lock(&e->state_lock);
	e->stopping = true;
	pthread_cond_broadcast(&e->sweep_cond);
	pthread_mutex_unlock(&e->state_lock);
	pthread_join(e->sweeper, NULL);
	e->sweeper_running = false;
}

/* Ask the sweeper to run backend maintenance (GC of old uppers, flattening)
 * soon, off the request path. */
void engine_kick_maintenance(struct engine *e)
{
	pthread_mutex_lock(&e->state_lock);
	e->maintenance_due = true;
	pthread_cond_broadcast(&e->sweep_cond);
	pthread_mutex_unlock(&e->state_lock);
}

json_t *engine_health(struct engine *e)
{
	json_t *roots = json_array();
	for (size_t i = 0; i < e->cfg->n_roots; i++)
		json_array_append_new(roots, json_string(e->cfg->roots[i]));
	json_t *h = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:I, s:I}", "status", "ok", "version", CKPTD_VERSION,
			      "mode", "sandbox", "backend", e->backend->name, "roots", roots, "backend_reason",
			      e->backend_reason, "checkpoints", (json_int_t)catalog_count(e->catalog), "uptime_secs",
			      (json_int_t)((mono_ms() - e->started_ms) / 1000));
	bool avail = services_available(e->services);
	json_object_set_new(h, "services", json_string(avail ? "available" : "unavailable"));
	if (!avail && services_unavailable_reason(e->services))
		json_object_set_new(h, "services_reason", json_string(services_unavailable_reason(e->services)));
	if (e->backend->health)
		e->backend->health(e->bst, h);
	json_object_set_new(h, "backend_reason", json_string(e->backend_reason));
	return h;
}

char *engine_metrics(struct engine *e)
{
	json_t *all = catalog_list(e->catalog, NULL), *rec;
	struct metrics_gauges g = { .version = CKPTD_VERSION, .backend = e->backend->name };
	size_t i;

	json_array_foreach(all, i, rec)
	{
		const char *s = json_string_value(json_object_get(rec, "status"));
		if (!strcmp(s, "creating"))
			g.creating++;
		else if (!strcmp(s, "deleting"))
			g.deleting++;
		else if (!strcmp(s, "failed"))
			g.failed++;
		else
			g.active++;
		if (strcmp(s, "failed")) /* a failed create's data is gone already */
			g.checkpoint_bytes += (uint64_t)record_int(rec, "size_bytes");
	}
	json_decref(all);
	return metrics_render(&e->metrics, &g);
}
