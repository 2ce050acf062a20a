/* engine_internal.h: what the engine's files share. Not for other modules. */
#pragma once
#include <pthread.h>

#include "backend/backend.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "lib/metrics.h"

struct services;

/* An operation in flight whose progress GET can show. */
struct engine_op {
	char id[32];
	struct progress progress;
	struct engine_op *next;
};

struct engine {
	const struct config *cfg;
	int state_fd, lock_fd;
	int64_t started_ms;

	const struct backend_ops *backend;
	void *bst;
	struct backend_ctx bctx;
	char backend_reason[512];

	struct catalog *catalog;
	struct services *services;
	bool services_borrowed;
	struct metrics metrics;

	pthread_mutex_t op_lock;    /* serializes create, restore, delete, sweep */
	pthread_mutex_t state_lock; /* guards ops, status, pending, sweeper flags */
	struct engine_op *ops;
	unsigned pending_async;
	char status[160];

	json_t *forks; /* fork id -> record (engine_fork.c); guarded by state_lock */

	pthread_t sweeper;
	bool sweeper_running, stopping, maintenance_due;
	pthread_cond_t sweep_cond;
};

json_t *engine_resolve(struct engine *e, const char *id_or_name);
json_t *engine_public(struct engine *e, json_t *rec);
int engine_drop(struct engine *e, json_t *rec, ckpt_error *err);
void engine_set_status(struct engine *e, const char *op, const char *what);
int engine_sweeper_start(struct engine *e, ckpt_error *err);
void engine_sweeper_stop(struct engine *e);
void engine_kick_maintenance(struct engine *e);
struct engine_op *engine_op_begin(struct engine *e, const char *id);
void engine_op_end(struct engine *e, struct engine_op *op);
bool record_expired(json_t *rec, int64_t now);
int engine_storage_err(ckpt_error *err, int r);
int engine_forks_open(struct engine *e, ckpt_error *err);
bool engine_fork_uses(struct engine *e, const char *id);
/* Compare the roots with checkpoint id (NULL: the base) and add verified,
 * verify_ms, verify_differences (and ok: false) to extra. Returns its ms. */
int64_t engine_verify(struct engine *e, const char *id, json_t *data, json_t *extra);
