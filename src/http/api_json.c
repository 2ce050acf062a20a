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
		json_object_set_new(o, "push", engine_push_outcome_json(v->push));
	return o;
}

json_t *api_names_json(const struct strv *l)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < l->n; i++)
		json_array_append_new(a, json_string(l->v[i]));
	return a;
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
	if (b->extra)
		json_object_update(out, b->extra);
	if (b->has_overlay)
		json_object_set_new(out, "overlay", api_overlay_json(b));
	if (h->adoption.present)
		json_object_set_new(out, "adoption", api_adoption_json(&h->adoption));
	json_object_set_new(out, "unmanaged_users", api_users_json(&h->unmanaged));
	if (h->sections)
		json_object_update(out, h->sections);
	json_object_set_new(out, "released_roots", api_strings_json(h->released, h->n_released));
	json_t *details = json_array();
	for (size_t i = 0; details && i < h->n_roots; i++)
		json_array_append_new(details, api_root_json(h, i));
	json_object_set_new(out, "root_details", details);
	return out;
}
