/* engine.h: create / restore / delete orchestration. Knows no HTTP.
 * Mutating operations are serialized by one lock; reads never wait for it. */
#pragma once
#include <jansson.h>
#include "backend/backend.h"
#include "config.h"
#include "lib/util.h"
#include "services/services.h"

struct config;
struct engine;
struct backend_ops;
struct services;

struct engine_deps {                       /* injected OS adapters; tests pass fakes */
	const struct backend_ops *backend; /* NULL: choose by config */
	struct services *services;         /* NULL: open the real one */
};

int engine_open(const struct config *cfg, const struct engine_deps *deps, struct engine **ret, ckpt_error *err);
void engine_close(struct engine *e);

struct ckpt_idem;
struct create_req {
	const char *name;
	bool has_ttl;
	int64_t ttl_secs;
	/* object or NULL (borrowed). The client's own data, kept and answered
	 * as sent, so it stays JSON. */
	json_t *labels;
	bool async;
	/* the request's Idempotency-Key, kept in the record
	 * (engine_idem_of_request); NULL: none */
	const struct ckpt_idem *idem;
};
/* On success fills ret (the new checkpoint; the caller frees it). With
 * async, returns at once in state creating, with its progress. */
struct ckpt_view;
int engine_create(struct engine *e, const struct create_req *req, struct ckpt_view *ret, ckpt_error *err);

struct restore_req {
	bool force;
	const char *if_expired; /* NULL, "fail", "fresh" */
	bool verify;            /* compare the roots with the checkpoint after the swap */
};
#define VERIFY_MAX_DIFFS 20
/* What "verify" found after the swap: ran is false when it was not asked
 * for or the roots were not swapped. */
struct verify_report {
	bool ran;
	bool verified; /* it ran to its end and found no difference */
	int64_t verify_ms;
	struct verify_diffs differences; /* the first VERIFY_MAX_DIFFS */
	char *error;                     /* why it could not run to its end (owned), or NULL */
};
/* What a restore did, as data; the API layer writes the JSON. */
struct restore_report {
	char checkpoint_id[32];
	int64_t duration_ms, queue_ms, stop_ms, swap_ms, start_ms; /* duration includes the wait for the lock */
	bool restored_from_checkpoint;                             /* false: reset to the base (if_expired fresh) */
	bool ttl_expired;
	bool services_available;
	bool swapped;                   /* false: a unit using the roots could not be stopped, nothing was swapped */
	const char *services_reason;    /* why not available; lives as long as the engine */
	struct svc_report services;     /* units stopped, started, failed (owned) */
	struct restore_details details; /* the backend's own account (owned) */
	struct verify_report verify;    /* when the request asked for it (owned) */
};
void restore_report_free(struct restore_report *r);
/* On success fills ret_report, which the caller frees. */
int engine_restore(struct engine *e, const char *id_or_name, const struct restore_req *req,
		   struct restore_report *ret_report, ckpt_error *err);
int engine_delete(struct engine *e, const char *id_or_name, ckpt_error *err);
/* A checkpoint as a client sees it, as data; the API layer writes the JSON
 * (the record's public members and, while an operation runs on it, its
 * progress). */
struct ckpt_record;
struct push_outcome;
struct ckpt_view {
	const struct ckpt_record *rec; /* a reference; ckpt_view_free drops it */
	bool has_progress;
	uint64_t bytes_done, bytes_total, files_done, files_total;
	struct push_outcome *push; /* the last async push (engine_oci.h), owned, or NULL */
};
void ckpt_view_free(struct ckpt_view *v);
/* On success fills ret, which the caller frees. */
int engine_get(struct engine *e, const char *id_or_name, struct ckpt_view *ret, ckpt_error *err);
struct ckpt_view_list {
	struct ckpt_view *v;
	size_t n;
};
void ckpt_view_list_free(struct ckpt_view_list *l);
/* At most limit checkpoints (SIZE_MAX: all) named name (NULL: any), newest
 * first, after page_token (NULL: from the newest); *ret_next is the token
 * of the next page (caller frees), NULL on the last page. */
int engine_list_page(struct engine *e, const char *name, size_t limit, const char *page_token,
		     struct ckpt_view_list *ret, char **ret_next, ckpt_error *err);
/* What the mounts at start did to the units using the roots (the
 * adoption), as data. */
struct adoption_report {
	bool present;            /* a mount at start hid a root */
	bool starting;           /* its units are not started again yet */
	struct strv mounted;     /* the roots mounted over */
	struct svc_report units; /* stopped before the mounts; started after READY; failures */
	char at[32];             /* when they were started, "" until then */
};
void adoption_report_free(struct adoption_report *a);
/* Health, as data; the API layer writes the JSON. */
struct health_report {
	const char *version, *mode, *backend;
	char *const *roots; /* the config's */
	size_t n_roots;
	const char *backend_reason; /* the engine's; lives as long as it */
	size_t checkpoints;
	int64_t uptime_secs;
	bool services_available;
	const char *services_reason;          /* NULL, or lives as long as the engine */
	struct backend_health backend_health; /* the backend's account (owned) */
	struct adoption_report adoption;      /* owned */
	struct svc_users unmanaged;           /* processes no managed unit covers (owned) */
	/* The whole root (engine_whole.c): a restore replaced ckptd's own
	 * files, so a restart is due; the reason is static, NULL unless due. */
	bool whole_root, restart_due;
	const char *restart_due_reason;
	const char *released[MAX_ROOTS]; /* roots released (the config's) */
	size_t n_released;
};
void health_report_free(struct health_report *h);
/* Fills ret, which the caller frees. */
void engine_health(struct engine *e, struct health_report *ret);

/* Forks (engine_fork.c): a writable copy-on-write view of a checkpoint
 * mounted at path (an existing empty dir outside the roots and state dir). */
/* A fork, as data; the API layer writes the JSON. */
struct fork_info {
	char fork_id[32];
	char checkpoint_id[32];
	char *path;   /* resolved; NULL if its record lacked it */
	char **paths; /* where each root's view is (owned) */
	size_t n_paths;
	char created_at[40];
	bool mounted;
	char *error;     /* why it could not be mounted again at start, or NULL */
	int64_t fork_ms; /* how long the fork took; -1: mounted again at start */
};
void fork_info_free(struct fork_info *f);
struct fork_list {
	struct fork_info *v;
	size_t n;
};
void fork_list_free(struct fork_list *l);
/* On success fills ret (the caller frees it). */
int engine_fork(struct engine *e, const char *id_or_name, const char *path, struct fork_info *ret, ckpt_error *err);
/* A copy of every fork, in the order made (or found at start). */
int engine_fork_list(struct engine *e, struct fork_list *ret, ckpt_error *err);
int engine_fork_delete(struct engine *e, const char *fork_id, ckpt_error *err);
/* Diffs (engine_diff.c): what changed from checkpoint id_or_name to against
 * (NULL: the live roots). */
struct diff_req {
	const char *against;
	size_t limit;           /* 0: default */
	const char *page_token; /* NULL: first page */
};
/* A page of a diff, as data; the API layer writes the JSON. */
struct diff_report {
	char checkpoint_id[32];
	char against[32];             /* a checkpoint id, or "live" */
	struct bdiff_change *changes; /* this page (backend_diff.h); owned, with the paths */
	size_t n_changes;
	size_t total; /* changes on every page */
	int64_t diff_ms;
	char *next_page_token; /* NULL on the last page (owned) */
	/* Against the live roots: the units a restore would stop and start. */
	bool live;
	char **services; /* owned */
	size_t n_services;
	bool services_available;
};
void diff_report_free(struct diff_report *r);
/* On success fills ret, which the caller frees. */
int engine_diff(struct engine *e, const char *id_or_name, const struct diff_req *req, struct diff_report *ret,
		ckpt_error *err);
/* After READY: start the units stopped for a mount at start (units ordered
 * After=ckptd.service could not start before), and look for processes that
 * no unit covers. Health says what happened. */
void engine_adoption_finish(struct engine *e);
/* What a release did, as data; the API layer writes the JSON. */
struct release_report {
	const char *released[MAX_ROOTS]; /* roots released by this call (borrowed from the config) */
	size_t n_released;
	char (*dropped)[32]; /* ids of the checkpoints dropped (owned) */
	size_t n_dropped;
	bool checkpoints_kept;      /* checkpoints remain, to restore once the roots are adopted again */
	bool units_ran;             /* the units were stopped and started: services holds them */
	struct svc_report services; /* stopped and started (owned when units_ran) */
	int64_t duration_ms;
};
void release_report_free(struct release_report *r);
/* Stop managing root (NULL: every root) and leave a plain directory holding
 * what it showed (engine_release.c). drop: drop the checkpoints (required
 * when the backend cannot keep them). On success fills ret_report, which
 * the caller frees. */
int engine_release(struct engine *e, const char *root, bool drop, struct release_report *ret_report, ckpt_error *err);
/* Prometheus text exposition; caller frees. */
char *engine_metrics(struct engine *e);
/* Delete expired checkpoints (the sweeper calls this). Returns how many. */
int engine_sweep(struct engine *e);
/* A short phrase naming the running operation (for sd_notify STATUS=). */
void engine_status_line(struct engine *e, char *buf, size_t len);
const char *engine_backend_name(struct engine *e);

/* Idempotency keys (idempotency.c): the first answer to a mutating request
 * sent with an Idempotency-Key header, kept IDEM_TTL_SECS and across restarts. */
#define IDEM_KEY_MAX 255
#define IDEM_TTL_SECS (24 * 3600)
enum {
	IDEM_FRESH,
	IDEM_REPLAY,
	IDEM_RUNNING,
	IDEM_MISMATCH
};
struct idem_running;
struct idem_ticket {
	char name[72];
	char fingerprint[65];
	bool active;
	struct idem_running *run; /* the key's entry while it runs (active) */
};
struct idem_answer {
	int status;
	char *body; /* owned */
	bool problem;
};
/* 1 to 255 printable ASCII characters. */
bool idem_key_valid(const char *key);
/* What a record keeps of key for this request, whose answer will have
 * this status (struct ckpt_idem); not looked up. */
void engine_idem_of_request(const char *key, const char *method, const char *path, const char *body_sha256, int status,
			    struct ckpt_idem *ret);
/* Look key up for this request (its fingerprint: method, path and the
 * sha256 of the body, hex, as the HTTP layer took it while reading). IDEM_FRESH: run it, then call
 * engine_idem_finish with the ticket. IDEM_REPLAY: ret holds the first
 * answer. IDEM_RUNNING: the first request with key still runs. IDEM_MISMATCH:
 * key was used for another request. Negative errno on failure. */
int engine_idem_begin(struct engine *e, const char *key, const char *method, const char *path, const char *body_sha256,
		      struct idem_ticket *t, struct idem_answer *ret);
/* The answer, kept in memory while engine_idem_finish writes it: a repeat
 * in between gets it (IDEM_REPLAY), not a 409. body NULL: none to keep. */
void engine_idem_answer(struct engine *e, struct idem_ticket *t, int status, const char *body, bool problem);
/* Remember the answer (body NULL: nothing to remember; which answers are
 * worth keeping is the HTTP layer's call) and release the key. */
void engine_idem_finish(struct engine *e, struct idem_ticket *t, const char *key, int status, const char *body,
			bool problem);
/* Write the answer of each key kept in a record (a create's) whose own
 * file is missing: the daemon stopped between the two. At start. */
void engine_idem_from_records(struct engine *e);
/* Forget keys older than IDEM_TTL_SECS; returns how many. */
int engine_idem_sweep(struct engine *e);
