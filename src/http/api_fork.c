/* api_fork.c: POST /v1/checkpoints/{id}/fork, GET /v1/forks,
 * DELETE /v1/forks/{id}, GET /v1/checkpoints/{id}/diff and
 * POST /v1/roots/release. */
#include "http/api_fork.h"

#include "backend/backend_diff.h"
#include "engine/engine.h"
#include "http/api.h"

/* {fork_id, checkpoint_id, path, paths, created_at, mounted[, error][, fork_ms]} */
static json_t *api_fork_json(const struct fork_info *f)
{
	json_t *paths = json_array();
	for (size_t i = 0; paths && i < f->n_paths; i++)
		json_array_append_new(paths, json_string(f->paths[i]));
	json_t *o = json_pack("{s:s, s:s}", "fork_id", f->fork_id, "checkpoint_id", f->checkpoint_id);
	if (!o || !paths) {
		json_decref(o);
		json_decref(paths);
		return NULL;
	}
	if (f->path)
		json_object_set_new(o, "path", json_string(f->path));
	json_object_set_new(o, "paths", paths);
	json_object_set_new(o, "created_at", json_string(f->created_at));
	json_object_set_new(o, "mounted", json_boolean(f->mounted));
	if (f->error)
		json_object_set_new(o, "error", json_string(f->error));
	if (f->fork_ms >= 0)
		json_object_set_new(o, "fork_ms", json_integer(f->fork_ms));
	return o;
}

void api_fork_create(void *app, const struct http_request *req, struct http_response *resp)
{
	ckpt_error err = { 0 };
	struct fork_info f;
	json_auto_t *obj = api_parse_object(req, true, resp);
	if (!obj)
		return;
	const char *k;
	json_t *v;
	json_object_foreach (obj, k, v)
		if (strcmp(k, "path")) {
			http_fail(resp, ERR_INVALID, "invalid_field", "unknown field '%s'", k);
			return;
		}
	const char *path = json_string_value(json_object_get(obj, "path"));
	if (!path || !*path) {
		http_fail(resp, ERR_INVALID, "invalid_field", "path is required: an existing empty directory");
		return;
	}
	if (engine_fork(app, req->params[0], path, &f, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	json_t *out = api_fork_json(&f);
	fork_info_free(&f);
	if (out)
		http_json(resp, 201, out);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory");
}

void api_fork_list(void *app, const struct http_request *req, struct http_response *resp)
{
	(void)req;
	ckpt_error err = { 0 };
	struct fork_list l;
	if (engine_fork_list(app, &l, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	json_t *forks = json_array();
	for (size_t i = 0; forks && i < l.n; i++)
		json_array_append_new(forks, api_fork_json(&l.v[i]));
	fork_list_free(&l);
	json_t *out = forks ? json_pack("{s:o}", "forks", forks) : NULL;
	if (out)
		http_json(resp, 200, out);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory listing forks");
}

void api_fork_delete(void *app, const struct http_request *req, struct http_response *resp)
{
	ckpt_error err = { 0 };
	if (engine_fork_delete(app, req->params[0], &err) < 0)
		http_error(resp, &err);
	else
		resp->status = 204;
}

/* {path, type, size, change, mode} when added or deleted; when modified
 * {path, type, size[, old_type][, old_size][, old_mode, mode][, old_uid,
 * uid, old_gid, gid], change, changes: [what changed]}. */
static json_t *api_change_json(const struct bdiff_change *c)
{
	static const char *const kinds[] = { "added", "deleted", "modified" };
	static const char *const what[] = { "type", "content", "mode", "owner" };
	json_t *o = json_pack("{s:s, s:s, s:I}", "path", c->path, "type", c->type, "size", (json_int_t)c->size);
	if (o && c->kind != BDIFF_MODIFIED) {
		json_object_set_new(o, "change", json_string(kinds[c->kind]));
		json_object_set_new(o, "mode", json_sprintf("%04o", c->mode));
		return o;
	}
	if (!o)
		return NULL;
	if (c->what & BDIFF_TYPE)
		json_object_set_new(o, "old_type", json_string(c->old_type));
	if (c->has_old_size)
		json_object_set_new(o, "old_size", json_integer((json_int_t)c->old_size));
	if (c->what & BDIFF_MODE) {
		json_object_set_new(o, "old_mode", json_sprintf("%04o", c->old_mode));
		json_object_set_new(o, "mode", json_sprintf("%04o", c->mode));
	}
	if (c->what & BDIFF_OWNER) {
		json_object_set_new(o, "old_uid", json_integer(c->old_uid));
		json_object_set_new(o, "uid", json_integer(c->uid));
		json_object_set_new(o, "old_gid", json_integer(c->old_gid));
		json_object_set_new(o, "gid", json_integer(c->gid));
	}
	json_t *a = json_array();
	for (size_t i = 0; a && i < 4; i++)
		if (c->what & (1u << i))
			json_array_append_new(a, json_string(what[i]));
	json_object_set_new(o, "change", json_string(kinds[c->kind]));
	json_object_set_new(o, "changes", a);
	return o;
}

/* {checkpoint_id, against, changes, total, diff_ms[, next_page_token]
 * [, services, services_available]}: the units only against the live roots. */
static json_t *api_diff_json(const struct diff_report *rep)
{
	json_t *changes = json_array();
	for (size_t i = 0; changes && i < rep->n_changes; i++)
		json_array_append_new(changes, api_change_json(&rep->changes[i]));
	json_t *out =
		json_pack("{s:s, s:s, s:o, s:I, s:I}", "checkpoint_id", rep->checkpoint_id, "against", rep->against,
			  "changes", changes, "total", (json_int_t)rep->total, "diff_ms", (json_int_t)rep->diff_ms);
	if (out && rep->next_page_token)
		json_object_set_new(out, "next_page_token", json_string(rep->next_page_token));
	if (out && rep->live) {
		json_t *names = json_array();
		for (size_t i = 0; names && i < rep->n_services; i++)
			json_array_append_new(names, json_string(rep->services[i]));
		json_object_set_new(out, "services", names);
		json_object_set_new(out, "services_available", json_boolean(rep->services_available));
	}
	return out;
}

void api_diff(void *app, const struct http_request *req, struct http_response *resp)
{
	ckpt_error err = { 0 };
	struct diff_req dr = { .against = http_query(req, "against"), .page_token = http_query(req, "page_token") };
	const char *limit = http_query(req, "limit");
	struct diff_report rep;
	if (limit) {
		char *end;
		long n = strtol(limit, &end, 10);
		if (*end || n < 1) {
			http_fail(resp, ERR_INVALID, "invalid_field", "limit must be a positive integer");
			return;
		}
		dr.limit = (size_t)n;
	}
	if (dr.against && !*dr.against)
		dr.against = NULL;
	if (engine_diff(app, req->params[0], &dr, &rep, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	json_t *out = api_diff_json(&rep);
	diff_report_free(&rep);
	if (out)
		http_json(resp, 200, out);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory");
}

/* root: a string, drop_checkpoints: a boolean, nothing else. */
static bool release_body_ok(json_t *obj, struct http_response *resp)
{
	const char *k;
	json_t *v;
	json_object_foreach (obj, k, v) {
		if (!strcmp(k, "root") ? json_is_string(v) : !strcmp(k, "drop_checkpoints") && json_is_boolean(v))
			continue;
		http_fail(resp, ERR_INVALID, "invalid_field",
			  "unknown or mistyped field '%s' (root: a string, drop_checkpoints: a boolean)", k);
		return false;
	}
	return true;
}

/* {released, dropped_checkpoints, checkpoints_kept[, stopped_units,
 * started_units], duration_ms}: the units only when they were stopped. */
static json_t *api_release_json(const struct release_report *rep)
{
	json_t *released = json_array(), *dropped = json_array();
	for (size_t i = 0; i < rep->n_released; i++)
		json_array_append_new(released, json_string(rep->released[i]));
	for (size_t i = 0; i < rep->n_dropped; i++)
		json_array_append_new(dropped, json_string(rep->dropped[i]));
	json_t *out = json_pack("{s:o,s:o,s:b}", "released", released, "dropped_checkpoints", dropped,
				"checkpoints_kept", rep->checkpoints_kept);
	if (out && rep->units_ran) {
		json_object_set_new(out, "stopped_units", api_names_json(&rep->services.stopped));
		json_object_set_new(out, "started_units", api_names_json(&rep->services.started));
	}
	if (out)
		json_object_set_new(out, "duration_ms", json_integer(rep->duration_ms));
	return out;
}

void api_release(void *app, const struct http_request *req, struct http_response *resp)
{
	json_auto_t *obj = api_parse_object(req, false, resp);
	if (!obj || !release_body_ok(obj, resp)) /* an empty body: every root */
		return;
	ckpt_error err = { 0 };
	struct release_report rep;
	const char *root = json_string_value(json_object_get(obj, "root"));
	if (engine_release(app, root && *root ? root : NULL, json_is_true(json_object_get(obj, "drop_checkpoints")),
			   &rep, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	json_t *out = api_release_json(&rep);
	release_report_free(&rep);
	if (out)
		http_json(resp, 200, out);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory");
}
