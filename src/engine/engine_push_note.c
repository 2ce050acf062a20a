/* engine_push_note.c: how the last async push of each checkpoint went.
 * In memory (e->pushes) from the 202 on, and on the record file itself
 * (its "push" member) once the worker runs: a restart still shows how the
 * last push ended, and one it cut short as failed. */
#include "engine/engine_push_note.h"

#include <pthread.h>

#include "engine/catalog.h"
#include "engine/engine_internal.h"

struct push_note {
	char id[32];
	struct push_outcome o;
	struct push_note *next;
};

struct push_outcome engine_push_outcome_of(const char *ref, const struct push_result *res, const ckpt_error *err)
{
	struct push_outcome o = { .state = res ? PUSH_DONE : err ? PUSH_FAILED : PUSH_PUSHING };
	snprintf(o.ref, sizeof(o.ref), "%s", res ? res->ref : ref);
	if (res) {
		snprintf(o.digest, sizeof(o.digest), "%s", res->digest);
		o.uploaded_bytes = res->uploaded_bytes;
		o.reused_bytes = res->reused_bytes;
	} else if (err) {
		snprintf(o.code, sizeof(o.code), "%s", err->code ? err->code : "internal");
		snprintf(o.detail, sizeof(o.detail), "%s", err->msg);
	}
	return o;
}

/* Durably (catalog_put: temp, fsync, rename); under the operation lock, as
 * every change of a record is. */
void engine_push_persist(struct engine *e, const char *id, const struct push_outcome *o)
{
	ckpt_error err = { 0 };
	pthread_mutex_lock(&e->op_lock);
	const struct ckpt_record *cur = catalog_get(e->catalog, id);
	struct ckpt_record *r = cur && cur->status == CKPT_ACTIVE ? record_dup(cur) : NULL;
	if (r && (r->extra.push || (r->extra.push = malloc(sizeof(*o))))) {
		*r->extra.push = *o;
		if (catalog_put(e->catalog, r, &err) < 0)
			log_warn("push: cannot record the outcome on %s: %s", id, err.msg);
	}
	if (r)
		record_unref(r);
	if (cur)
		record_unref(cur);
	pthread_mutex_unlock(&e->op_lock);
}

static struct push_note *push_find(struct engine *e, const char *id)
{
	for (struct push_note *n = e->pushes; n; n = n->next)
		if (!strcmp(n->id, id))
			return n;
	return NULL;
}

void engine_push_note(struct engine *e, const char *id, const struct push_outcome *o, bool durable)
{
	if (durable)
		engine_push_persist(e, id, o);
	pthread_mutex_lock(&e->state_lock);
	struct push_note *n = push_find(e, id);
	if (!n && (n = calloc(1, sizeof(*n)))) {
		snprintf(n->id, sizeof(n->id), "%s", id);
		n->next = e->pushes;
		e->pushes = n;
	}
	if (n)
		n->o = *o;
	pthread_mutex_unlock(&e->state_lock);
}

bool engine_push_running_locked(struct engine *e, const char *id)
{
	struct push_note *n = push_find(e, id);
	return n && n->o.state == PUSH_PUSHING;
}

struct push_outcome *engine_push_of(struct engine *e, const char *id)
{
	pthread_mutex_lock(&e->state_lock);
	struct push_note *n = push_find(e, id);
	struct push_outcome *o = n ? malloc(sizeof(*o)) : NULL;
	if (o)
		*o = n->o;
	pthread_mutex_unlock(&e->state_lock);
	return o;
}

void engine_pushes_free(struct engine *e)
{
	while (e->pushes) {
		struct push_note *n = e->pushes;
		e->pushes = n->next;
		free(n);
	}
}

void engine_push_recover(struct engine *e)
{
	struct catalog_list all = { 0 };
	ckpt_error cut = { .code = "interrupted" };
	snprintf(cut.msg, sizeof(cut.msg), "ckptd stopped before the push ended: push again");
	if (catalog_list(e->catalog, NULL, &all) < 0)
		return;
	for (size_t i = 0; i < all.n; i++) {
		const struct push_outcome *push = all.v[i]->extra.push;
		if (!push || push->state != PUSH_PUSHING)
			continue;
		struct push_outcome o = engine_push_outcome_of(push->ref, NULL, &cut);
		engine_push_persist(e, all.v[i]->id, &o);
	}
	catalog_list_free(&all);
}
