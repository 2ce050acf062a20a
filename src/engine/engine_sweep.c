/* engine_sweep.c: the sweeper thread: TTL expiry, and backend maintenance
 * (GC of old uppers, flattening) off the request path. Calls down only:
 * engine_records.c to drop a record, engine_life.c for expiry. */
#include <time.h>

#include "config.h"
#include "engine/engine_internal.h"
#include "engine/oci_cache.h"
#include "lib/failpoint.h"

int engine_sweep(struct engine *e)
{
	struct catalog_list all;
	int64_t now = now_ms();
	int n = 0;

	if (catalog_list(e->catalog, NULL, &all) < 0)
		return 0;
	for (size_t i = 0; i < all.n; i++) {
		const struct ckpt_record *rec = all.v[i];
		/* failed async creates are kept for their clients to see, until they expire */
		if (!record_expired(rec, now) || (rec->status != CKPT_ACTIVE && rec->status != CKPT_FAILED))
			continue;
		ckpt_error err = { 0 };
		pthread_mutex_lock(&e->op_lock);
		const struct ckpt_record *cur = catalog_get(e->catalog, rec->id); /* may have gone meanwhile */
		int r = cur && record_expired(cur, now) && !engine_check_forked(e, cur->id)
			? FAILPOINT_AROUND("sweep.expire.drop", engine_drop(e, cur, &err))
			: 1; /* a forked one waits */
		pthread_mutex_unlock(&e->op_lock);
		record_unref(cur);
		if (r == 0) {
			log_event(LOG_INFO_, &(struct log_fields){ "expire", rec->id, NULL, -1 },
				  "expired checkpoint \"%s\" removed", rec->id);
			n++;
		} else if (r < 0) {
			log_warn("cannot remove expired checkpoint \"%s\": %s", rec->id, err.msg);
		}
		metrics_op(&e->metrics, OP_SWEEP, r >= 0, 0);
	}
	catalog_list_free(&all);
	return n;
}

static void *engine_sweeper_main(void *arg)
{
	struct engine *e = arg;
	int64_t next_sweep = mono_ms() + e->cfg->cleanup_interval_secs * 1000, next_cleanup = 0;

	pthread_mutex_lock(&e->state_lock);
	while (!e->stopping) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		int64_t wait = (next_cleanup && next_cleanup < next_sweep ? next_cleanup : next_sweep) - mono_ms();
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
			engine_idem_sweep(e); /* Idempotency-Key answers older than a day */
			next_sweep = mono_ms() + e->cfg->cleanup_interval_secs * 1000;
			maintain = true;
		}
		if (maintain)
			oci_trim(e);
		if (maintain) {
			pthread_mutex_lock(&e->op_lock);
			e->backend->maintain(e->bst);
			pthread_mutex_unlock(&e->op_lock);
		}
		if (maintain || (next_cleanup && mono_ms() >= next_cleanup))
			/* slow deletions: the requests go on meanwhile */
			next_cleanup = e->backend->cleanup(e->bst) > 0 ? mono_ms() + 1000 : 0;
		if (maintain) /* what a test waits for, rather than sleeping */
			log_debug("sweeper: maintenance done");
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
