/* api.c: decode requests, call the engine, encode answers. No policy here
 * beyond the shape of the JSON: the engine decides what is allowed. */
#include "http/api.h"

#include "config.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "http/api_fork.h"

bool api_decode_create(json_t *obj, struct create_req *cr, struct http_response *resp)
{
	static const char *const allowed[] = { "name", "ttl_secs", "labels", "async", NULL };
	json_t *v;

	if (!api_only_fields(obj, allowed, resp))
		return false;
	v = json_object_get(obj, "name");
	if (!json_is_string(v)) {
		http_fail(resp, ERR_INVALID, "invalid_field", "name is required and must be a string");
		return false;
	}
	cr->name = json_string_value(v);
	if ((v = json_object_get(obj, "ttl_secs")) && !json_is_null(v)) {
		if (!json_is_integer(v)) {
			http_fail(resp, ERR_INVALID, "invalid_field", "ttl_secs must be an integer number of seconds");
			return false;
		}
		cr->has_ttl = true;
		cr->ttl_secs = json_integer_value(v);
	}
	if ((v = json_object_get(obj, "labels")) && !json_is_null(v)) {
		if (!json_is_object(v)) {
			http_fail(resp, ERR_INVALID, "invalid_field", "labels must be an object of strings");
			return false;
		}
		cr->labels = v;
	}
	if ((v = json_object_get(obj, "async")) && !json_is_null(v)) {
		if (!json_is_boolean(v)) {
			http_fail(resp, ERR_INVALID, "invalid_field", "async must be true or false");
			return false;
		}
		cr->async = json_is_true(v);
	}
	return true;
}

/* Answer status with v's JSON. */
static void api_record_reply(struct http_response *resp, int status, const struct ckpt_view *v)
{
	json_t *o = api_record_json(v);
	if (o)
		http_json(resp, status, o);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory");
}

/* A replayed 202 (an async create) answers what became of the checkpoint:
 * 202 with its progress while it is created, 200 with the record once it is
 * done (or failed). A checkpoint gone since keeps the first answer. */
static void api_replay_current(void *app, struct http_response *resp)
{
	const char *id = json_string_value(json_object_get(resp->json, "checkpoint_id"));
	ckpt_error err = { 0 };
	struct ckpt_view cur;

	if (!id || engine_get(app, id, &cur, &err) < 0)
		return;
	api_record_reply(resp, cur.rec->status == CKPT_CREATING ? 202 : 200, &cur);
	ckpt_view_free(&cur);
}

/* Whether a key keeps this answer. A 5xx, a conflict with another request
 * or a busy answer says "not done, try again": a retry with the same key
 * must run again. */
static bool api_idem_keeps(int status)
{
	return status >= 200 && status < 500 && status != 408 && status != 409 && status != 429;
}

/* A key's answer written to <state>/idempotency/ after it was sent: its two
 * barriers (the file's fsync, its directory's) no longer delay the answer;
 * a repeat meanwhile gets it from memory (engine_idem_answer). A crash
 * before the write loses it, as a crash between the create's record and
 * that write did before; only the client may now hold the answer. */
struct api_idem_after {
	void *app;
	struct idem_ticket t;
	char *key;
	int status;
	char *body;
	bool problem;
};

static void api_idem_after(void *arg)
{
	struct api_idem_after *a = arg;
	engine_idem_finish(a->app, &a->t, a->key ? a->key : "", a->status, a->body, a->problem);
	free(a->key);
	free(a->body);
	free(a);
}

/* Run handler under the request's Idempotency-Key, if it has one: a repeat
 * of a request already answered gets that answer again (with
 * Idempotent-Replayed: true), a repeat while it runs a 409, another request
 * under the same key a 422. Any mutating POST route can go through this. */
static void api_idempotent(void *app, const struct http_request *req, struct http_response *resp, http_handler handler)
{
	const char *key = http_header(req, "Idempotency-Key");
	struct idem_ticket t;
	struct idem_answer a;

	if (!key) {
		handler(app, req, resp);
		return;
	}
	if (!idem_key_valid(key)) {
		http_fail(resp, ERR_INVALID, "invalid_idempotency_key",
			  "Idempotency-Key must be 1 to %d printable ASCII characters", IDEM_KEY_MAX);
		return;
	}
	int r = engine_idem_begin(app, key, req->method, req->path, req->body_sha256, &t, &a);
	switch (r) {
	case IDEM_FRESH: {
		handler(app, req, resp);
		struct api_idem_after *a = calloc(1, sizeof(*a));
		if (a) {
			a->app = app;
			a->t = t;
			a->status = resp->status;
			a->problem = resp->content_type && strstr(resp->content_type, "problem");
			a->body = resp->json && api_idem_keeps(resp->status) ? json_dumps(resp->json, JSON_COMPACT)
									     : NULL;
			a->key = strdup(key);
		}
		if (a && a->key && !resp->after) { /* kept in memory now, on disk once the client has it */
			engine_idem_answer(app, &t, a->status, a->body, a->problem);
			resp->after = api_idem_after;
			resp->after_arg = a;
			return;
		}
		if (a)
			api_idem_after(a);
		else
			engine_idem_finish(app, &t, key, resp->status, NULL, false);
		return;
	}
	case IDEM_REPLAY:
		http_json(resp, a.status, json_loads(a.body, 0, NULL));
		if (a.status == 202)
			api_replay_current(app, resp);
		if (a.problem)
			resp->content_type = "application/problem+json";
		resp->extra_headers[0][0] = strdup("Idempotent-Replayed");
		resp->extra_headers[0][1] = strdup("true");
		free(a.body);
		if (!resp->json)
			http_fail(resp, ERR_INTERNAL, NULL, "cannot read the answer kept for this Idempotency-Key");
		return;
	case IDEM_RUNNING:
		http_problem(resp, 409, "idempotency_in_progress",
			     "a request with this Idempotency-Key is still running; retry later");
		return;
	case IDEM_MISMATCH:
		http_problem(resp, 422, "idempotency_key_reused",
			     "this Idempotency-Key was used for another request (method, path or body differ)");
		return;
	default:
		http_fail(resp, ERR_INTERNAL, NULL, "cannot look up the Idempotency-Key: %s", strerror(-r));
	}
}

static void api_create_run(void *app, const struct http_request *req, struct http_response *resp)
{
	struct create_req cr = { 0 };
	ckpt_error err = { 0 };
	struct ckpt_view v;
	struct ckpt_idem k;
	json_auto_t *obj = api_parse_object(req, true, resp);

	if (!obj || !api_decode_create(obj, &cr, resp))
		return;
	/* its key in the record too: durable with it (engine_idem_from_records) */
	if (api_idem_of(req, cr.async ? 202 : 201, &k))
		cr.idem = &k;
	if (engine_create(app, &cr, &v, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	api_record_reply(resp, cr.async ? 202 : 201, &v);
	ckpt_view_free(&v);
}

#define API_LIST_DEFAULT 100
#define API_LIST_MAX 1000

static bool api_list_limit(const struct http_request *req, size_t *ret, struct http_response *resp)
{
	const char *v = http_query(req, "limit");
	char *end;
	*ret = API_LIST_DEFAULT;
	if (!v)
		return true;
	errno = 0;
	unsigned long n = strtoul(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-' || n < 1 || n > API_LIST_MAX) {
		http_problem(resp, 400, "invalid_field", "limit must be an integer from 1 to %d", API_LIST_MAX);
		return false;
	}
	*ret = n;
	return true;
}

static void api_list(void *app, const struct http_request *req, struct http_response *resp)
{
	const char *name = http_query(req, "name");
	_cleanup_free_ char *next = NULL;
	ckpt_error err = { 0 };
	struct ckpt_view_list l;
	size_t limit;

	if (name && !name_valid(name)) {
		http_fail(resp, ERR_INVALID, "invalid_field", "name must be 1 to 128 printable characters");
		return;
	}
	if (!api_list_limit(req, &limit, resp))
		return;
	if (engine_list_page(app, name, limit, http_query(req, "page_token"), &l, &next, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	json_t *list = json_array();
	for (size_t i = 0; list && i < l.n; i++)
		json_array_append_new(list, api_record_json(&l.v[i]));
	ckpt_view_list_free(&l);
	json_t *body = list ? json_pack("{s:o}", "checkpoints", list) : NULL;
	if (body && next)
		json_object_set_new(body, "next_page_token", json_string(next));
	if (body)
		http_json(resp, 200, body);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory listing checkpoints");
}

static void api_get(void *app, const struct http_request *req, struct http_response *resp)
{
	ckpt_error err = { 0 };
	struct ckpt_view v;
	if (engine_get(app, req->params[0], &v, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	api_record_reply(resp, 200, &v);
	ckpt_view_free(&v);
}

static void api_delete(void *app, const struct http_request *req, struct http_response *resp)
{
	ckpt_error err = { 0 };
	if (engine_delete(app, req->params[0], &err) < 0)
		http_error(resp, &err);
	else
		resp->status = 204;
}

bool api_decode_restore(json_t *obj, struct restore_req *rr, struct http_response *resp)
{
	static const char *const allowed[] = { "force", "if_expired", "verify", NULL };
	static const char *const flags[] = { "force", "verify" };
	bool *dst[] = { &rr->force, &rr->verify };
	json_t *v;

	if (!api_only_fields(obj, allowed, resp))
		return false;
	for (size_t i = 0; i < ARRAY_SIZE(flags); i++) {
		if (!(v = json_object_get(obj, flags[i])) || json_is_null(v))
			continue;
		if (!json_is_boolean(v)) {
			http_fail(resp, ERR_INVALID, "invalid_field", "%s must be true or false", flags[i]);
			return false;
		}
		*dst[i] = json_is_true(v);
	}
	if ((v = json_object_get(obj, "if_expired")) && !json_is_null(v)) {
		const char *s = json_string_value(v);
		if (!s || (strcmp(s, "fail") && strcmp(s, "fresh"))) {
			http_fail(resp, ERR_INVALID, "invalid_field", "if_expired must be \"fail\" or \"fresh\"");
			return false;
		}
		rr->if_expired = s;
	}
	return true;
}

static json_t *api_restore_details(const struct restore_details *d, json_t *out)
{
	if (d->n_busy) {
		json_t *busy = json_array();
		for (size_t i = 0; i < d->n_busy; i++)
			json_array_append_new(busy,
					      json_pack("{s:I, s:s}", "pid", (json_int_t)d->busy[i].pid, "command",
							d->busy[i].command));
		json_object_set_new(out, "busy_processes", busy);
	}
	if (d->counts_key)
		json_object_set_new(out, d->counts_key,
				    json_pack("{s:I, s:I, s:I, s:I}", "rewritten", (json_int_t)d->rewritten, "removed",
					      (json_int_t)d->removed, "kept", (json_int_t)d->kept, "bytes",
					      (json_int_t)d->bytes));
	return out;
}

/* verified, verify_ms, verify_differences [{path, reason}][, verify_error],
 * and "ok": false over the report's own when the roots differ. */
static void api_verify_json(const struct verify_report *v, json_t *out)
{
	json_t *diffs = json_array();
	for (size_t i = 0; diffs && i < v->differences.n; i++)
		json_array_append_new(diffs,
				      json_pack("{s:s, s:s}", "path", v->differences.v[i].path, "reason",
						v->differences.v[i].reason));
	json_object_set_new(out, "verified", json_boolean(v->verified));
	json_object_set_new(out, "verify_ms", json_integer(v->verify_ms));
	json_object_set_new(out, "verify_differences", diffs);
	if (v->error)
		json_object_set_new(out, "verify_error", json_string(v->error));
	if (!v->verified)
		json_object_set_new(out, "ok", json_false());
}

json_t *api_restore_json(const struct restore_report *rep)
{
	const struct svc_report *s = &rep->services;
	json_t *out = json_pack(
		"{s:b, s:b, s:s, s:I, s:o, s:o, s:o, s:o, s:{s:I, s:I, s:I, s:I}, s:s, s:b, s:b}", "ok",
		rep->swapped && s->failed.n == 0, "swapped", rep->swapped, "checkpoint_id", rep->checkpoint_id,
		"restore_duration_ms", (json_int_t)rep->duration_ms, "started_services", api_names_json(&s->started),
		"stopped_services", api_names_json(&s->stopped), "failed_services", api_names_json(&s->failed),
		"failures", api_failures_json(s), "phases", "queue_ms", (json_int_t)rep->queue_ms, "stop_ms",
		(json_int_t)rep->stop_ms, "swap_ms", (json_int_t)rep->swap_ms, "start_ms", (json_int_t)rep->start_ms,
		"services", rep->services_available ? "ok" : "unavailable", "restored_from_checkpoint",
		rep->restored_from_checkpoint, "ttl_expired", rep->ttl_expired);
	if (out && s->activating.n)
		json_object_set_new(out, "activating_services", api_names_json(&s->activating));
	if (out && !rep->services_available && rep->services_reason)
		json_object_set_new(out, "services_reason", json_string(rep->services_reason));
	if (out && rep->verify.ran)
		api_verify_json(&rep->verify, out);
	return out ? api_restore_details(&rep->details, out) : NULL;
}

static void api_restore_run(void *app, const struct http_request *req, struct http_response *resp)
{
	struct restore_req rr = { 0 };
	struct restore_report rep;
	ckpt_error err = { 0 };
	json_auto_t *obj = api_parse_object(req, false, resp);

	if (!obj || !api_decode_restore(obj, &rr, resp))
		return;
	if (engine_restore(app, req->params[0], &rr, &rep, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	json_t *out = api_restore_json(&rep);
	restore_report_free(&rep);
	if (out)
		http_json(resp, 200, out);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory writing the restore report");
}

static void api_create(void *app, const struct http_request *req, struct http_response *resp)
{
	api_idempotent(app, req, resp, api_create_run);
}

static void api_restore(void *app, const struct http_request *req, struct http_response *resp)
{
	api_idempotent(app, req, resp, api_restore_run);
}

static void api_health(void *app, const struct http_request *req, struct http_response *resp)
{
	(void)req;
	struct health_report h;
	engine_health(app, &h);
	json_t *out = api_health_json(&h);
	health_report_free(&h);
	if (out)
		http_json(resp, 200, out);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory");
}

static void api_metrics(void *app, const struct http_request *req, struct http_response *resp)
{
	_cleanup_free_ char *engine = engine_metrics(app), *http = http_metrics(req);
	resp->status = 200;
	if (engine && http && asprintf(&resp->text, "%s%s", engine, http) < 0)
		resp->text = NULL;
	resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
	if (!resp->text)
		http_fail(resp, ERR_INTERNAL, NULL, "cannot render metrics");
}

static void api_fork(void *app, const struct http_request *req, struct http_response *resp)
{
	api_idempotent(app, req, resp, api_fork_create);
}

static void api_import_idem(void *app, const struct http_request *req, struct http_response *resp)
{
	api_idempotent(app, req, resp, api_import);
}

static void api_push_idem(void *app, const struct http_request *req, struct http_response *resp)
{
	api_idempotent(app, req, resp, api_push);
}

static void api_pull_idem(void *app, const struct http_request *req, struct http_response *resp)
{
	api_idempotent(app, req, resp, api_pull);
}

static const struct http_route routes[] = {
	{ "POST", "/v1/checkpoints", api_create, false, false },
	{ "GET", "/v1/checkpoints", api_list, false, false },
	{ "GET", "/v1/checkpoints/{id}", api_get, false, false },
	{ "DELETE", "/v1/checkpoints/{id}", api_delete, false, false },
	{ "POST", "/v1/checkpoints/{id}/restore", api_restore, false, false },
	{ "POST", "/v1/checkpoints/{id}/fork", api_fork, false, false },
	{ "GET", "/v1/checkpoints/{id}/diff", api_diff, false, false },
	{ "GET", "/v1/forks", api_fork_list, false, false },
	{ "DELETE", "/v1/forks/{id}", api_fork_delete, false, false },
	{ .method = "GET", .pattern = "/v1/checkpoints/{id}/export", .handler = api_export },
	{ .method = "POST",
	  .pattern = "/v1/checkpoints/import",
	  .handler = api_import_idem,
	  .raw_body = HTTP_BODY_SPOOL },
	{ "POST", "/v1/checkpoints/{id}/push", api_push_idem, false, false },
	{ "POST", "/v1/checkpoints/pull", api_pull_idem, false, false },
	{ "POST", "/v1/roots/release", api_release, false, false },
	{ "GET", "/v1/health", api_health, true, false },
	{ "GET", "/metrics", api_metrics, false, false },
};

void api_server_opts(struct engine *e, const char *token, bool metrics_token_free, struct http_server_opts *ret)
{
	static struct http_route out[ARRAY_SIZE(routes)];
	memcpy(out, routes, sizeof(routes));
	for (size_t i = 0; i < ARRAY_SIZE(out); i++)
		if (!strcmp(out[i].pattern, "/metrics"))
			out[i].public_ = metrics_token_free;
	*ret = (struct http_server_opts){ .routes = out, .n_routes = ARRAY_SIZE(out), .app = e, .token = token };
}
