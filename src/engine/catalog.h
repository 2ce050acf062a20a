/* catalog.h: checkpoint records, one JSON file each under <state>/catalog/.
 * A record on disk is the acknowledgement of a checkpoint: it is written
 * crash-safely, and nothing is reported to a client before it is durable.
 * Members whose name starts with '_' are internal and never sent to clients. */
#pragma once
#include <jansson.h>
#include <pthread.h>
#include "lib/util.h"

struct catalog;

int catalog_open(int state_fd, struct catalog **ret, ckpt_error *err);
void catalog_close(struct catalog *c);

/* Write (create or replace) a record durably, then update memory. */
int catalog_put(struct catalog *c, json_t *record, ckpt_error *err);
/* Update memory only (transient states such as "creating"). */
int catalog_put_volatile(struct catalog *c, json_t *record);
int catalog_remove(struct catalog *c, const char *id, ckpt_error *err);

/* Deep copies (caller owns); NULL when absent. */
json_t *catalog_get(struct catalog *c, const char *id);
/* Array of deep copies, newest first; name may be NULL. */
json_t *catalog_list(struct catalog *c, const char *name);
size_t catalog_count(struct catalog *c);

/* Record field helpers. */
const char *record_id(json_t *r);
int64_t record_int(json_t *r, const char *key);
/* Copy without internal ('_') members. */
json_t *record_public(json_t *r);
