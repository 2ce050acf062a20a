/* engine_push_note.h: the outcome of the last async push of each
 * checkpoint, in memory and on its record (engine_push_note.c). Private to
 * src/engine; engine_oci.h has the struct and its JSON. */
#pragma once
#include "engine/engine_oci.h"

/* The outcome of a push of ref: pushing (res and err NULL), done (res), or
 * failed (err). */
struct push_outcome engine_push_outcome_of(const char *ref, const struct push_result *res, const ckpt_error *err);
/* o as the record's "push", durably. */
void engine_push_persist(struct engine *e, const char *id, const struct push_outcome *o);
/* o as checkpoint id's last push, in memory (and on the record: durable). */
void engine_push_note(struct engine *e, const char *id, const struct push_outcome *o, bool durable);
/* A copy of the last async push of checkpoint id (caller frees), or NULL. */
struct push_outcome *engine_push_of(struct engine *e, const char *id);
/* Forget them all, at close. */
void engine_pushes_free(struct engine *e);
/* Does a push of id still run? Under state_lock. */
bool engine_push_running_locked(struct engine *e, const char *id);
