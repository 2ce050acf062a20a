/* engine_internal.h: what the engine's files share. Not for other modules. */
#pragma once
#include <pthread.h>

#include "backend/backend.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/engine_err.h"
#include "lib/metrics.h"
#include "lib/procscan.h"
#include "services/services.h"

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

	struct engine_fork *forks; /* engine_fork.c, in the order made; guarded by state_lock */
	struct push_note *pushes;  /* the last async push of each checkpoint (engine_push_note.c); state_lock */

	/* <state>/oci (oci_trim.c): pushes and pulls hold oci_lock shared, a
	 * trim alone; oci_bytes is what it holds, counted with the checkpoints. */
	pthread_rwlock_t oci_lock;
	_Atomic uint64_t oci_bytes;

	/* Adoption (engine_adopt.c): units stopped before a mount at start,
	 * started again by engine_adoption_finish; guarded by state_lock. */
	struct adoption_report adoption; /* its starting unused: adoption_pending says */
	struct svc_plan *plans;          /* one per root mounted over, until started */
	size_t n_plans;
	struct procscan_target *hidden; /* what those mounts hide (path borrowed from cfg) */
	size_t n_hidden;
	struct svc_users unmanaged; /* from the last scan (tag 1: through a hidden directory) */
	bool unmanaged_scanned;
	int64_t unmanaged_ms;     /* mono_ms of that scan */
	bool adoption_pending;    /* units stopped, not started yet */
	bool svc_journal_pending; /* plans holds an interrupted restore's units (engine_svcjournal.c) */

	/* Roots released (engine_release.c), borrowed from the config; guarded
	 * by state_lock. */
	const char *released[MAX_ROOTS];
	size_t n_released;

	/* The base identity (engine_base_id.c), computed on first use, "" until
	 * then; guarded by state_lock. */
	char base_id[80];
	bool restart_due;              /* a whole-root restore replaced ckptd's own files; state_lock */
	struct whole_owed *whole_owed; /* an interrupted whole-root restore's services step, until done */

	pthread_t sweeper;
	bool sweeper_running, stopping, maintenance_due;
	pthread_cond_t sweep_cond;

	int idem_fd; /* <state>/idempotency */
	pthread_mutex_t idem_lock;
	struct idem_running *idem_running;
};

/* engine_whole.c: the services step of a whole-root restore, planned
 * before its swap (engine_whole_before, restore_details' before_change),
 * executed after: units is the restore's plan (stopped around the swap),
 * restart the units to restart after it. */
struct whole_run {
	struct engine *e;
	const char *id;
	struct svc_plan *units, *restart;
	bool self; /* ckptd maps or holds a file that goes */
};
int engine_whole_before(void *ctx, const char *const *paths, size_t n, const struct restore_details *planned);
/* After the swap, before units start again: daemon-reload when a unit file
 * changed; a unit whose file went stays stopped. */
void engine_whole_reload(struct whole_run *w, const struct restore_details *d);
void engine_whole_services(struct whole_run *w, struct restore_report *rep);
void engine_whole_health(struct engine *e, struct health_report *h);
/* At start, what an interrupted whole-root restore owed (services.json's
 * "whole"): the reload before the units it stopped start, the restarts
 * after. */
void engine_whole_owed_reload(struct engine *e);
void engine_whole_owed_restart(struct engine *e, struct svc_report *rep);

/* engine_records.c */
const struct ckpt_record *engine_resolve(struct engine *e, const char *id_or_name);
/* engine_resolve, for a call that reads the checkpoint's data: not_found
 * (404), or conflict (409) while it is created or deleted. On success *ret
 * holds a reference the caller drops. */
int engine_resolve_active(struct engine *e, const char *id_or_name, const struct ckpt_record **ret, ckpt_error *err);
int engine_drop(struct engine *e, const struct ckpt_record *rec, ckpt_error *err);
/* engine_life.c */
/* The client's view of a record, with live progress while an operation
 * runs and its last push: takes a reference to rec. */
void engine_view(struct engine *e, const struct ckpt_record *rec, struct ckpt_view *ret);
void engine_set_status(struct engine *e, const char *op, const char *what);
struct engine_op *engine_op_begin(struct engine *e, const char *id);
void engine_op_end(struct engine *e, struct engine_op *op);
bool record_expired(const struct ckpt_record *rec, int64_t now);
/* engine_sweep.c */
int engine_sweeper_start(struct engine *e, ckpt_error *err);
void engine_sweeper_stop(struct engine *e);
void engine_kick_maintenance(struct engine *e);
/* engine_svcjournal.c: the units a restore stopped or a create froze, durable
 * until they are back, so that a start after a crash brings them back */
struct svc_plan;
int engine_svc_journal_save(struct engine *e, const char *op, const char *id, const struct svc_plan *p);
/* What a whole-root restore's services step owes once the swap is done:
 * services.json's "whole" {reload, restart, linked}. */
struct whole_owed {
	bool reload;         /* a unit file changed: daemon-reload */
	struct strv restart; /* the units that use a file that went */
	struct strv linked;  /* .service names whose unit file or enablement link came back */
};
void engine_svc_journal_whole_free(struct whole_owed *w);
/* The one writer and reader of services.json's "whole"; read gives NULL
 * when it is no object (caller frees with the above, then free()). */
json_t *engine_svc_journal_whole_json(const struct whole_owed *w);
struct whole_owed *engine_svc_journal_whole_read(json_t *whole);
/* A whole-root restore's: with what its services step owes (whole, not NULL). */
int engine_svc_journal_save_whole(struct engine *e, const char *id, const struct svc_plan *p,
				  const struct whole_owed *whole);
void engine_svc_journal_clear(struct engine *e);
void engine_svc_journal_recover(struct engine *e);
/* A record reference dropped when the variable goes out of scope. */
static inline void record_unrefp(const struct ckpt_record **r)
{
	if (*r)
		record_unref(*r);
}
#define _cleanup_record_ __attribute__((cleanup(record_unrefp)))
/* engine_check.c: 0, or 409 root_released when a root was released; 0, or
 * 409 conflict when checkpoint id_or_name (may be NULL) is being created;
 * whether a fork uses checkpoint id. */
int engine_check_managed(struct engine *e, ckpt_error *err);
int engine_check_not_creating(struct engine *e, const char *id_or_name, ckpt_error *err);
bool engine_check_forked(struct engine *e, const char *id);
/* engine_fork.c */
struct engine_fork {
	struct fork_info info;
	json_t *backend; /* the backend's own record of it (opaque) */
	struct engine_fork *next;
};
int engine_forks_open(struct engine *e, ckpt_error *err);
void engine_forks_free(struct engine *e);
/* engine_verify.c: compare the roots with checkpoint id (NULL: the base);
 * fills ret, which the restore report owns. */
void engine_verify(struct engine *e, const char *id, json_t *data, struct verify_report *ret);
int engine_idem_open(struct engine *e, ckpt_error *err);
void engine_idem_close(struct engine *e);

/* engine_adopt.c */
void engine_adopt_before_mount(void *engine, const char *root); /* backend_ctx.before_mount */
void engine_adoption_health(struct engine *e, struct health_report *h);
void engine_adoption_free(struct engine *e);
/* A new record in state "creating" (engine_create.c). */
struct ckpt_record *create_record(struct engine *e, const struct create_req *req, const char *id);
/* Check max_checkpoints and max_state_bytes and publish rec (volatile). */
int create_admit(struct engine *e, const struct ckpt_record *rec, ckpt_error *err);
