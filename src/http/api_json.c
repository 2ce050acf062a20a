/* api_json.c: the engine's structs written as the API's JSON. Every route
 * file renders through here, so one shape serves each of them (and none of
 * them calls another route file for it). */
#include "http/api.h"

#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/engine_oci.h"

json_t *api_record_json(const struct ckpt_view *v)
{
	json_t *o = record_json(v->rec, false);
	if (o && v->has_progress)
		json_object_set_new(o, "progress",
				    json_pack("{s:I, s:I, s:I, s:I}", "bytes_done", (json_int_t)v->bytes_done,
					      "bytes_total", (json_int_t)v->bytes_total, "files_done",
					      (json_int_t)v->files_done, "files_total", (json_int_t)v->files_total));
	if (o && v->push)
		json_object_set_new(o, "push", record_push_json(v->push));
	return o;
}

json_t *api_names_json(const struct strv *l)
{
	return services_strv_json(l);
}

json_t *api_failures_json(const struct svc_report *r)
{
	json_t *o = json_object();
	for (size_t i = 0; o && i < r->n_failures; i++)
		json_object_set_new(o, r->failures[i].unit, json_string(r->failures[i].reason));
	return o;
}

static json_t *api_strings_json(const char *const *v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < n; i++)
		json_array_append_new(a, json_string(v[i]));
	return a;
}

static json_t *api_overlay_json(const struct backend_health *b)
{
	return json_pack("{s:s, s:b, s:b}", "kind", b->overlay_kind, "redirect_dir", b->redirect_dir, "userxattr",
			 b->userxattr);
}

/* Root i, in one view: its backend and why, the overlay options (the same
 * for every root of one daemon), and how its changes are tracked and why. */
static json_t *api_root_json(const struct health_report *h, size_t i)
{
	const struct backend_health *b = &h->backend_health;
	json_t *d = json_pack("{s:s, s:s, s:s}", "path", h->roots[i], "backend", h->backend, "backend_reason",
			      h->backend_reason);
	if (d && b->has_overlay)
		json_object_set_new(d, "overlay", api_overlay_json(b));
	if (!d || i >= b->n_roots)
		return d;
	const struct backend_root_health *t = &b->roots[i];
	json_object_set_new(d, "tracking", json_string(t->tracking));
	json_object_set_new(d, "tracking_reason", json_string(t->tracking_reason));
	if (!t->detailed)
		return d;
	json_object_set_new(d, "tracked", json_integer((json_int_t)t->tracked));
	json_object_set_new(d, "walked", json_integer((json_int_t)t->walked));
	json_object_set_new(d, "ctime_blind", api_strings_json(t->ctime_blind, t->n_ctime_blind));
	json_object_set_new(d, "not_guaranteed", api_strings_json(t->not_guaranteed, t->n_not_guaranteed));
	return d;
}

/* {mounted, stopped_units, restarted_units, failures[, at][, state]} */
static json_t *api_adoption_json(const struct adoption_report *a)
{
	json_t *o = json_pack("{s:o, s:o, s:o, s:o}", "mounted", api_names_json(&a->mounted), "stopped_units",
			      api_names_json(&a->units.stopped), "restarted_units", api_names_json(&a->units.started),
			      "failures", api_failures_json(&a->units));
	if (o && a->at[0])
		json_object_set_new(o, "at", json_string(a->at));
	if (o && a->starting)
		json_object_set_new(o, "state", json_string("starting units"));
	return o;
}

/* [{pid, command[, unit], hidden}]: hidden, through the directory a mount
 * at start hid (the scan's tag 1). */
static json_t *api_users_json(const struct svc_users *u)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < u->n; i++) {
		json_t *p = json_pack("{s:I, s:s}", "pid", (json_int_t)u->v[i].pid, "command", u->v[i].command);
		if (p && u->v[i].unit)
			json_object_set_new(p, "unit", json_string(u->v[i].unit));
		if (p)
			json_object_set_new(p, "hidden", json_boolean(u->v[i].tag == 1));
		json_array_append_new(a, p);
	}
	return a;
}

/* [{path, layers, upper, released, deltas}] */
static json_t *api_overlay_roots_json(const struct backend_health *b)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < b->n_overlay_roots; i++) {
		const struct backend_overlay_root *r = &b->overlay_roots[i];
		json_array_append_new(a,
				      json_pack("{s:s,s:I,s:s,s:b,s:I}", "path", r->path, "layers",
						(json_int_t)r->layers, "upper", r->upper, "released", r->released,
						"deltas", (json_int_t)r->deltas));
	}
	return a;
}

/* [{path, reason}] of what the roots leave out, each item below another
 * left out with it and not shown. */
static json_t *api_excluded_json(const struct rootexcl *x)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < x->n; i++)
		if (!x->v[i].nested)
			json_array_append_new(a, json_pack("{s:s, s:s}", "path", x->v[i].path, "reason", x->v[i].why));
	return a;
}

/* tar_compression, tar_base, excluded (or excluded_error), tar_base_error,
 * tar_last_restore, tar_unfinished_restore, in that order. */
static void api_tar_json(json_t *out, const struct backend_tar_health *t)
{
	json_object_set_new(out, "tar_compression", json_string(t->zstd ? "zstd" : "none"));
	json_object_set_new(out, "tar_base", json_boolean(t->base));
	if (t->excluded_error[0])
		json_object_set_new(out, "excluded_error", json_string(t->excluded_error));
	else
		json_object_set_new(out, "excluded", api_excluded_json(&t->excluded));
	if (t->base_failed)
		json_object_set_new(out, "tar_base_error", json_string(t->base_error));
	json_object_set_new(out, "tar_last_restore",
			    json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "rewritten", (json_int_t)t->rewritten,
				      "removed", (json_int_t)t->removed, "kept", (json_int_t)t->kept, "bytes",
				      (json_int_t)t->bytes, "archives", (json_int_t)t->archives, "entered",
				      (json_int_t)t->entered));
	if (t->pending[0])
		json_object_set_new(out, "tar_unfinished_restore",
				    json_pack("{s:s, s:s}", "id", t->pending, "error", t->pending_msg));
}

/* The engine's members, then the backend's own, the overlay options, what
 * the adoption and the whole root add, released_roots, and one entry per
 * root (root_details). */
json_t *api_health_json(const struct health_report *h)
{
	const struct backend_health *b = &h->backend_health;
	json_t *roots = api_strings_json((const char *const *)h->roots, h->n_roots);
	json_t *out =
		json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:I, s:I, s:s}", "status", b->preparing ? "preparing" : "ok",
			  "version", h->version, "mode", h->mode, "backend", h->backend, "roots", roots,
			  "backend_reason", h->backend_reason, "checkpoints", (json_int_t)h->checkpoints, "uptime_secs",
			  (json_int_t)h->uptime_secs, "services", h->services_available ? "available" : "unavailable");
	if (!out)
		return NULL;
	if (h->services_reason)
		json_object_set_new(out, "services_reason", json_string(h->services_reason));
	if (b->has_overlay_roots)
		json_object_set_new(out, "overlay_roots", api_overlay_roots_json(b));
	if (b->has_tar)
		api_tar_json(out, &b->tar);
	if (b->has_overlay)
		json_object_set_new(out, "overlay", api_overlay_json(b));
	if (h->adoption.present)
		json_object_set_new(out, "adoption", api_adoption_json(&h->adoption));
	json_object_set_new(out, "unmanaged_users", api_users_json(&h->unmanaged));
	if (h->whole_root)
		json_object_set_new(out, "restart_due", json_boolean(h->restart_due));
	if (h->restart_due_reason)
		json_object_set_new(out, "restart_due_reason", json_string(h->restart_due_reason));
	json_object_set_new(out, "released_roots", api_strings_json(h->released, h->n_released));
	json_t *details = json_array();
	for (size_t i = 0; details && i < h->n_roots; i++)
		json_array_append_new(details, api_root_json(h, i));
	json_object_set_new(out, "root_details", details);
	return out;
}

/* What the record a request makes keeps of its Idempotency-Key (the
 * answer's status), when it has one. */
bool api_idem_of(const struct http_request *req, int status, struct ckpt_idem *ret)
{
	const char *key = http_header(req, "Idempotency-Key");
	if (key)
		engine_idem_of_request(key, req->method, req->path, req->body_sha256, status, ret);
	return key != NULL;
}
