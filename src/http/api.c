/* api.c: decode requests, call the engine, encode answers. No policy here
 * beyond the shape of the JSON: the engine decides what is allowed. */
#include "http/api.h"

#include "config.h"
#include "engine/engine.h"

json_t *api_parse_object(const struct http_request *req, bool required, struct http_response *resp)
{
	json_error_t jerr;
	if (!req->body || req->body_len == 0) {
		if (required)
			http_problem(resp, 400, "bad_request", "a JSON object body is required");
		return required ? NULL : json_object();
	}
	json_t *obj = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!obj) {
		http_problem(resp, 400, "bad_request", "malformed JSON at line %d column %d: %s", jerr.line,
			     jerr.column, jerr.text);
		return NULL;
	}
	if (!json_is_object(obj)) {
		json_decref(obj);
		http_problem(resp, 400, "bad_request", "the body must be a JSON object");
		return NULL;
	}
	return obj;
}

/* Unknown members are refused so that a typo never passes silently. */
static bool api_only_fields(json_t *obj, const char *const *allowed, struct http_response *resp)
{
	const char *k;
	json_t *v;
	json_object_foreach(obj, k, v)
	{
		bool ok = false;
		for (const char *const *a = allowed; *a; a++)
			ok |= !strcmp(k, *a);
		if (!ok) {
			http_problem(resp, 400, "invalid_field", "unknown field '%s'", k);
			return false;
		}
	}
	return true;
}

bool api_decode_create(json_t *obj, struct create_req *cr, struct http_response *resp)
{
	static const char *const allowed[] = { "name", "ttl_secs", "labels", "async", NULL };
	json_t *v;

	if (!api_only_fields(obj, allowed, resp))
		return false;
	v = json_object_get(obj, "name");
	if (!json_is_string(v)) {
		http_problem(resp, 400, "invalid_field", "name is required and must be a string");
		return false;
	}
	cr->name = json_string_value(v);
	if ((v = json_object_get(obj, "ttl_secs")) && !json_is_null(v)) {
		if (!json_is_integer(v)) {
			http_problem(resp, 400, "invalid_field", "ttl_secs must be an integer number of seconds");
			return false;
		}
		cr->has_ttl = true;
		cr->ttl_secs = json_integer_value(v);
	}
	if ((v = json_object_get(obj, "labels")) && !json_is_null(v)) {
		if (!json_is_object(v)) {
			http_problem(resp, 400, "invalid_field", "labels must be an object of strings");
			return false;
		}
		cr->labels = v;
	}
	if ((v = json_object_get(obj, "async")) && !json_is_null(v)) {
		if (!json_is_boolean(v)) {
			http_problem(resp, 400, "invalid_field", "async must be true or false");
			return false;
		}
		cr->async = json_is_true(v);
	}
	return true;
}

static void api_create(void *app, const struct http_request *req, struct http_response *resp)
{
	struct create_req cr = { 0 };
	ckpt_error err = { 0 };
	json_t *rec = NULL;
	json_t *obj = api_parse_object(req, true, resp);

	if (!obj)
		return;
	if (api_decode_create(obj, &cr, resp)) {
		if (engine_create(app, &cr, &rec, &err) < 0)
			http_error(resp, &err);
		else
			http_json(resp, cr.async ? 202 : 201, rec);
	}
	json_decref(obj);
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
	json_t *list;
	size_t limit;

	if (name && !name_valid(name)) {
		http_problem(resp, 400, "invalid_field", "name must be 1 to 128 printable characters");
		return;
	}
	if (!api_list_limit(req, &limit, resp))
		return;
	if (engine_list_page(app, name, limit, http_query(req, "page_token"), &list, &next, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	json_t *body = json_pack("{s:o}", "checkpoints", list);
	if (next)
		json_object_set_new(body, "next_page_token", json_string(next));
	http_json(resp, 200, body);
}

static void api_get(void *app, const struct http_request *req, struct http_response *resp)
{
	ckpt_error err = { 0 };
	json_t *rec;
	if (engine_get(app, req->params[0], &rec, &err) < 0)
		http_error(resp, &err);
	else
		http_json(resp, 200, rec);
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
	static const char *const allowed[] = { "force", "if_expired", NULL };
	json_t *v;

	if (!api_only_fields(obj, allowed, resp))
		return false;
	if ((v = json_object_get(obj, "force")) && !json_is_null(v)) {
		if (!json_is_boolean(v)) {
			http_problem(resp, 400, "invalid_field", "force must be true or false");
			return false;
		}
		rr->force = json_is_true(v);
	}
	if ((v = json_object_get(obj, "if_expired")) && !json_is_null(v)) {
		const char *s = json_string_value(v);
		if (!s || (strcmp(s, "fail") && strcmp(s, "fresh"))) {
			http_problem(resp, 400, "invalid_field", "if_expired must be \"fail\" or \"fresh\"");
			return false;
		}
		rr->if_expired = s;
	}
	return true;
}

static void api_restore(void *app, const struct http_request *req, struct http_response *resp)
{
	struct restore_req rr = { 0 };
	ckpt_error err = { 0 };
	json_t *report = NULL;
	json_t *obj = api_parse_object(req, false, resp);

	if (!obj)
		return;
	if (api_decode_restore(obj, &rr, resp)) {
		if (engine_restore(app, req->params[0], &rr, &report, &err) < 0)
			http_error(resp, &err);
		else
			http_json(resp, 200, report);
	}
	json_decref(obj);
}

static void api_health(void *app, const struct http_request *req, struct http_response *resp)
{
	(void)req;
	http_json(resp, 200, engine_health(app));
}

static void api_metrics(void *app, const struct http_request *req, struct http_response *resp)
{
	(void)req;
	resp->status = 200;
	resp->text = engine_metrics(app);
	resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
	if (!resp->text)
		http_problem(resp, 500, NULL, "cannot render metrics");
}

static const struct http_route routes[] = {
	{ "POST", "/v1/checkpoints", api_create, false, false },
	{ "GET", "/v1/checkpoints", api_list, false, false },
	{ "GET", "/v1/checkpoints/{id}", api_get, false, false },
	{ "DELETE", "/v1/checkpoints/{id}", api_delete, false, false },
	{ "POST", "/v1/checkpoints/{id}/restore", api_restore, false, false },
	{ "GET", "/v1/health", api_health, true, false },
	{ "GET", "/metrics", api_metrics, false, false },
};

const struct http_route *api_routes(bool metrics_token_free, size_t *ret_n)
{
	static struct http_route out[ARRAY_SIZE(routes)];
	memcpy(out, routes, sizeof(routes));
	for (size_t i = 0; i < ARRAY_SIZE(out); i++)
		if (!strcmp(out[i].pattern, "/metrics"))
			out[i].public_ = metrics_token_free;
	*ret_n = ARRAY_SIZE(out);
	return out;
}
