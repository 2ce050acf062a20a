/* catalog.h: checkpoint records, one JSON file each under <state>/catalog/.
 * A record on disk is the acknowledgement of a checkpoint: it is written
 * crash-safely, and nothing is reported to a client before it is durable.
 *
 * In memory a record is a typed struct ckpt_record; only catalog.c converts it
 * to and from JSON. Records held by the catalog are shared and read-only: the
 * catalog hands out references (record_unref them), and a caller that wants to
 * change one changes a record_dup() and puts that back. */
#pragma once
#include <sys/types.h>
#include <jansson.h>
#include <pthread.h>
#include "engine/engine_oci.h"
#include "lib/util.h"
#include "services/services.h"

struct catalog;

enum ckpt_status {
	CKPT_CREATING, /* in memory only, until the data is captured */
	CKPT_ACTIVE,
	CKPT_DELETING, /* durable mark: a restart finishes the delete */
	CKPT_FAILED,   /* an async create that failed, kept in memory until it expires */
	CKPT_STATUS_N
};
const char *ckpt_status_name(enum ckpt_status s);

/* Why an async create failed: "error" {code, detail}; code NULL: absent. */
struct ckpt_rec_error {
	char *code, *detail;
};

/* Where a pulled checkpoint came from: "pull_of" {ref, digest, roots:
 * {"/image/root": "/local/root"}}; the strings are its own. */
struct ckpt_pull_of {
	char *ref, *digest;
	struct pull_root *roots;
	size_t n_roots;
};

/* The Idempotency-Key of the create that made the checkpoint ("_idempotency",
 * kept on disk only): the record is durable before the key's own file is
 * written, so a daemon stopped in between writes that file at its next start
 * (engine_idem_from_records) and a repeat is answered, not run again. */
struct ckpt_idem {
	char key[256];        /* 1 to 255 characters (as idem_key_valid took it) */
	char file[72];        /* its file's name: sha256 of the key, hex, ".json" */
	char fingerprint[65]; /* of the request: method, path, body */
	int status;           /* the answer's: 201, or 202 for an async create */
};

/* The members a create, a push, a pull or an import add to a record, each
 * absent until set, and the ones this version does not know. */
struct ckpt_extra {
	bool has_freeze_ms, has_queue_ms;
	int64_t freeze_ms, queue_ms; /* how long the create froze the units, waited its turn */
	struct push_outcome *push;   /* the last async push, or NULL */
	struct ckpt_pull_of *pull_of;
	bool has_import_of;
	char import_of[32]; /* the exported checkpoint's id; "": null (it had none valid) */
	struct ckpt_idem *idem;
	json_t *unknown; /* members of a newer version, kept as read; NULL: none */
};
void ckpt_extra_free(struct ckpt_extra *x);

struct ckpt_record {
	char id[32];
	char *name;
	enum ckpt_status status;
	char *backend;                                         /* name of the backend that made it */
	char created_at[40], expires_at[40], last_used_at[40]; /* RFC 3339; "" answers null */
	int64_t size_bytes, duration_ms, ttl_secs;
	int64_t created_ms, expires_ms;      /* expires_ms 0: never */
	json_t *labels, *roots;              /* object, array */
	struct strv frozen_services;         /* the units the create froze */
	struct svc_failure *freeze_failures; /* {unit: reason}; none: absent */
	size_t n_freeze_failures;
	struct ckpt_rec_error error; /* a failed async create's */
	json_t *backend_data;        /* the backend's own (opaque); NULL when absent */
	struct ckpt_extra extra;
	int refs;
};

/* A new record (one reference) with empty labels, roots and frozen_services. */
struct ckpt_record *record_new(const char *id, const char *name, enum ckpt_status status);
/* A deep copy the caller may change. */
struct ckpt_record *record_dup(const struct ckpt_record *r);
const struct ckpt_record *record_ref(const struct ckpt_record *r);
void record_unref(const struct ckpt_record *r);
void record_set_name(struct ckpt_record *r, const char *name);
void record_set_backend(struct ckpt_record *r, const char *backend);
/* The client's view (no internal members), or everything as stored on disk. */
json_t *record_json(const struct ckpt_record *r, bool internal);
/* The record's "push": {ref, status[, digest, uploaded_bytes,
 * reused_bytes][, error: {code, detail}]}. The one writer of that shape, for
 * the record file and for the API. */
json_t *record_push_json(const struct push_outcome *o);
/* A record from its JSON; NULL with *why set when it is not a valid record. */
struct ckpt_record *record_from_json(json_t *j, const char **why);

int catalog_open(int state_fd, struct catalog **ret, ckpt_error *err);
void catalog_close(struct catalog *c);

/* Write (create or replace) a copy of the record durably, then update memory. */
int catalog_put(struct catalog *c, const struct ckpt_record *r, ckpt_error *err);
/* catalog_put's write alone, for a caller that puts the record in memory
 * itself next (catalog_put_volatile). by_syncfs: one syncfs of the catalog's
 * file system, between the temp file's write and its rename, stands for
 * the temp file's fsync; it also makes durable what the caller left
 * unsynced on that file system (a create's new layers, when catalog_dev
 * says they share it). */
int catalog_write(struct catalog *c, const struct ckpt_record *r, bool by_syncfs, ckpt_error *err);
/* The catalog directory's st_dev (0 if fstat fails: nothing shares it). */
dev_t catalog_dev(struct catalog *c);
/* Update memory only (transient states such as "creating"). */
int catalog_put_volatile(struct catalog *c, const struct ckpt_record *r);
int catalog_remove(struct catalog *c, const char *id, ckpt_error *err);

/* A reference (record_unref it), or NULL when absent: O(log n). */
const struct ckpt_record *catalog_get(struct catalog *c, const char *id);
/* The newest record with that name that is active, else the newest with that
 * name in any state; NULL when none: O(log n) plus the newer failed or
 * in-flight records of that name. */
const struct ckpt_record *catalog_find_name(struct catalog *c, const char *name);

/* References, newest first; name may be NULL. No record is copied. */
struct catalog_list {
	const struct ckpt_record **v;
	size_t n;
};
int catalog_list(struct catalog *c, const char *name, struct catalog_list *ret);
void catalog_list_free(struct catalog_list *l);

/* Counts and size_bytes sums per status, kept up to date on every change. */
struct catalog_stats {
	size_t count[CKPT_STATUS_N];
	uint64_t bytes[CKPT_STATUS_N];
};
void catalog_stats(struct catalog *c, struct catalog_stats *ret);
size_t catalog_count(struct catalog *c);
/* Ids of record files left out at load (no valid status, ...): their data is
 * kept. Fixed after catalog_open. */
size_t catalog_left_out_ids(struct catalog *c, const char (**ret)[32]);
