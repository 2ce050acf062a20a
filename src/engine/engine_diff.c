/* engine_diff.c: what differs between a checkpoint and another one or the
 * live roots (the backend's diff), a page at a time, with the services a
 * restore would stop and start again. */
#include "backend/backend_diff.h"
#include "config.h"
#include "engine/engine_internal.h"

#define DIFF_LIMIT_DEFAULT 1000
#define DIFF_LIMIT_MAX 10000

/* Page tokens are the hex of the last path returned: pages stay right when
 * the tree changes between calls (entries are sorted by path). */
static char *diff_token(const char *path)
{
	size_t n = strlen(path);
	char *t = malloc(2 * n + 1);
	for (size_t i = 0; t && i < n; i++)
		sprintf(t + 2 * i, "%02x", (unsigned char)path[i]);
	if (t)
		t[2 * n] = 0;
	return t;
}

static char *diff_untoken(const char *t)
{
	size_t n = strlen(t);
	if (n % 2)
		return NULL;
	char *p = malloc(n / 2 + 1);
	for (size_t i = 0; p && i < n / 2; i++) {
		unsigned v;
		if (sscanf(t + 2 * i, "%2x", &v) != 1 || !v) {
			free(p);
			return NULL;
		}
		p[i] = (char)v;
	}
	if (p)
		p[n / 2] = 0;
	return p;
}

/* A diff against the live roots shows what a restore would undo; with it go
 * the units that restore would stop and start again: the services plan, as
 * the restore makes it, computed and not executed. A manager that cannot be
 * reached puts every managed unit in the plan, failed: listed too. */
static int diff_services(struct engine *e, struct diff_report *out, ckpt_error *err)
{
	struct svc_plan units;
	int r = services_plan(e->services, e->cfg->roots, e->cfg->n_roots, &units);
	if (r == 0 && !(out->services = calloc(units.n + 1, sizeof(*out->services))))
		r = -ENOMEM;
	for (size_t i = 0; r == 0 && i < units.n; i++)
		if (!(out->services[out->n_services++] = strdup(units.units[i].name)))
			r = -ENOMEM;
	services_plan_free(&units);
	if (r < 0)
		return err_set(err, -r, NULL, "cannot list the services that use the roots: %s", strerror(-r));
	out->live = true;
	out->services_available = services_available(e->services);
	return 0;
}

/* Move up to limit changes after the path after (NULL: from the first)
 * from all (sorted by path) into out; *more: changes follow the page. */
static int diff_page(struct bdiff_list *all, const char *after, size_t limit, struct diff_report *out, bool *more)
{
	size_t from = 0;
	while (after && from < all->n && strcmp(all->v[from].path, after) <= 0)
		from++;
	size_t n = all->n - from < limit ? all->n - from : limit;
	*more = from + n < all->n;
	if (n == 0)
		return 0;
	if (!(out->changes = malloc(n * sizeof(*out->changes))))
		return -ENOMEM;
	memcpy(out->changes, all->v + from, n * sizeof(*out->changes));
	for (size_t i = from; i < from + n; i++)
		all->v[i].path = NULL; /* moved */
	out->n_changes = n;
	return 0;
}

void diff_report_free(struct diff_report *r)
{
	bdiff_list_free(&(struct bdiff_list){ .v = r->changes, .n = r->n_changes });
	free(r->next_page_token);
	for (size_t i = 0; i < r->n_services; i++)
		free(r->services[i]);
	free(r->services);
	memset(r, 0, sizeof(*r));
}

int engine_diff(struct engine *e, const char *id_or_name, const struct diff_req *req, struct diff_report *ret,
		ckpt_error *err)
{
	int r = 0;
	size_t limit = req->limit ? req->limit : DIFF_LIMIT_DEFAULT;
	_cleanup_free_ char *after = NULL;
	if (limit > DIFF_LIMIT_MAX)
		return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_field", "limit must be 1 to %d", DIFF_LIMIT_MAX);
	if (req->page_token && !(after = diff_untoken(req->page_token)))
		return err_set_kind(err, ERR_INVALID, EINVAL, "invalid_field",
				    "page_token is not one this server gave");
	if (!e->backend->compare)
		return err_set_kind(err, ERR_INVALID, ENOTSUP, "not_supported", "the %s backend cannot diff",
				    e->backend->name);
	if (engine_check_not_creating(e, id_or_name, err) < 0 || engine_check_not_creating(e, req->against, err) < 0)
		return -EBUSY;
	pthread_mutex_lock(&e->op_lock);
	int64_t t0 = mono_ms();
	_cleanup_record_ const struct ckpt_record *a = engine_resolve(e, id_or_name);
	_cleanup_record_ const struct ckpt_record *b = req->against ? engine_resolve(e, req->against) : NULL;
	struct bdiff_list all = { 0 };
	if (!a || (req->against && !b))
		r = err_set_kind(err, ERR_NOT_FOUND, ENOENT, "not_found", "no checkpoint with id or name '%s'",
				 !a ? id_or_name : req->against);
	else if (a->status != CKPT_ACTIVE || (b && b->status != CKPT_ACTIVE))
		r = err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "both checkpoints must be active");
	else
		r = e->backend->compare->diff(e->bst, a->id, a->backend_data, b ? b->id : NULL,
					      b ? b->backend_data : NULL, &all, err);
	pthread_mutex_unlock(&e->op_lock);
	if ((r = engine_err_classify(err, ENGINE_CTX_READ, r)) < 0) {
		bdiff_list_free(&all);
		return r;
	}
	struct diff_report out = { .total = all.n, .diff_ms = mono_ms() - t0 };
	bool more = false;
	if (diff_page(&all, after, limit, &out, &more) < 0)
		r = err_set(err, ENOMEM, NULL, "out of memory");
	bdiff_list_free(&all);
	snprintf(out.checkpoint_id, sizeof(out.checkpoint_id), "%s", a->id);
	snprintf(out.against, sizeof(out.against), "%s", b ? b->id : "live");
	if (r == 0 && more && !(out.next_page_token = diff_token(out.changes[out.n_changes - 1].path)))
		r = err_set(err, ENOMEM, NULL, "out of memory");
	if (r == 0 && !b)
		r = diff_services(e, &out, err);
	if (r < 0) {
		diff_report_free(&out);
		return r;
	}
	*ret = out;
	return 0;
}
