/* engine_records.c: finding records (resolve, get, list) and dropping one
 * with its data. Calls only the catalog, the backend and engine_life.c. */
#include "engine/engine_internal.h"
#include "lib/failpoint.h"

/* An id, or a name meaning the newest usable checkpoint with that name: an
 * active one when there is one, so a failed or still-running create does not
 * hide the last good checkpoint of that name. */
const struct ckpt_record *engine_resolve(struct engine *e, const char *id_or_name)
{
	const struct ckpt_record *r = id_valid(id_or_name) ? catalog_get(e->catalog, id_or_name) : NULL;
	return r ? r : catalog_find_name(e->catalog, id_or_name);
}

int engine_resolve_active(struct engine *e, const char *id_or_name, const struct ckpt_record **ret, ckpt_error *err)
{
	const struct ckpt_record *r = engine_resolve(e, id_or_name);
	if (!r)
		return err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint with id or name '%s'",
				    id_or_name);
	if (r->status != CKPT_ACTIVE) {
		record_unref(r);
		return err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict",
				    "checkpoint '%s' is not active (being created or deleted)", id_or_name);
	}
	*ret = r;
	return 0;
}

int engine_get(struct engine *e, const char *id_or_name, struct ckpt_view *ret, ckpt_error *err)
{
	const struct ckpt_record *r = engine_resolve(e, id_or_name);
	if (!r)
		return err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint with id or name '%s'",
				    id_or_name);
	engine_view(e, r, ret);
	record_unref(r);
	return 0;
}

void ckpt_view_list_free(struct ckpt_view_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		ckpt_view_free(&l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* Page tokens are "<created ms>.<id>" of the last record of a page: a
 * position in the newest-first order, valid even if that record is gone. */
static int list_token_parse(const char *token, int64_t *ret_ms, const char **ret_id, ckpt_error *err)
{
	char *end;
	errno = 0;
	long long ms = strtoll(token, &end, 10);
	if (errno || end == token || *end != '.' || !id_valid(end + 1))
		return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_field",
				    "page_token is not one this server gave");
	*ret_ms = ms;
	*ret_id = end + 1;
	return 0;
}

/* Whether r comes after the position (ms, id) in the newest-first order. */
static bool list_after(const struct ckpt_record *r, int64_t ms, const char *id)
{
	return r->created_ms < ms || (r->created_ms == ms && strcmp(r->id, id) < 0);
}

int engine_list_page(struct engine *e, const char *name, size_t limit, const char *page_token,
		     struct ckpt_view_list *ret, char **ret_next, ckpt_error *err)
{
	int64_t after_ms = 0;
	const char *after_id = NULL;
	const struct ckpt_record *last = NULL;
	struct catalog_list all;
	int r;

	*ret_next = NULL;
	if (page_token && (r = list_token_parse(page_token, &after_ms, &after_id, err)) < 0)
		return r;
	struct ckpt_view_list out = { 0 };
	if (catalog_list(e->catalog, name, &all) < 0)
		return err_set_kind(err, ERR_INTERNAL, ENOMEM, NULL, "out of memory listing checkpoints");
	size_t cap = all.n < limit ? all.n : limit;
	if (!(out.v = calloc(cap ? cap : 1, sizeof(*out.v)))) {
		catalog_list_free(&all);
		return err_set_kind(err, ERR_INTERNAL, ENOMEM, NULL, "out of memory listing checkpoints");
	}
	for (size_t i = 0; i < all.n; i++) {
		if (after_id && !list_after(all.v[i], after_ms, after_id))
			continue;
		if (out.n == limit) {
			if (asprintf(ret_next, "%lld.%s", (long long)last->created_ms, last->id) < 0)
				*ret_next = NULL;
			break;
		}
		engine_view(e, all.v[i], &out.v[out.n++]);
		last = all.v[i];
	}
	catalog_list_free(&all);
	*ret = out;
	return 0;
}

/* Remove a record's data and then the record; used by delete, the sweeper and
 * recovery. The record is marked "deleting" durably first, so a crash in the
 * middle is finished at the next start rather than leaving a broken checkpoint. */
int engine_drop(struct engine *e, const struct ckpt_record *rec, ckpt_error *err)
{
	struct ckpt_record *d = record_dup(rec);
	const char *id = rec->id;
	int r;

	if (!d)
		return -ENOMEM;
	d->status = CKPT_DELETING;
	r = FAILPOINT_AROUND("delete.record.mark", catalog_put(e->catalog, d, err));
	record_unref(d);
	if (r == -ENOSPC || r == -EDQUOT) {
		/* A full disk must not block the delete that frees it: drop the record
		 * first instead; the backend's recover() removes orphaned data. */
		if ((r = catalog_remove(e->catalog, id, err)) < 0)
			return r;
		if (e->backend->remove(e->bst, id, rec->backend_data, NULL) < 0)
			log_warn("data of \"%s\" is left until the next start", id);
		return 0;
	}
	if (r < 0)
		return r;
	if ((r = FAILPOINT_AROUND("delete.data.remove", e->backend->remove(e->bst, id, rec->backend_data, err))) < 0)
		return err_prefix(err, "cannot remove data of '%s'", id);
	return FAILPOINT_AROUND("delete.record.remove", catalog_remove(e->catalog, id, err));
}
