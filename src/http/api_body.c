/* api_body.c: the JSON object body of a request, shared by api.c and
 * api_fork.c (so that neither calls the other back). */
#include "http/api.h"

json_t *api_parse_object(const struct http_request *req, bool required, struct http_response *resp)
{
	json_error_t jerr;
	if (!req->body || req->body_len == 0) {
		if (required)
			http_fail(resp, ERR_INVALID, "bad_request", "a JSON object body is required");
		return required ? NULL : json_object();
	}
	json_auto_t *obj = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!obj) {
		http_fail(resp, ERR_INVALID, "bad_request", "malformed JSON at line %d column %d: %s", jerr.line,
			  jerr.column, jerr.text);
		return NULL;
	}
	if (!json_is_object(obj)) {
		http_fail(resp, ERR_INVALID, "bad_request", "the body must be a JSON object");
		return NULL;
	}
	return TAKE_PTR(obj);
}

/* Unknown members are refused so that a typo never passes silently. */
bool api_only_fields(json_t *obj, const char *const *allowed, struct http_response *resp)
{
	const char *k;
	json_t *v;
	json_object_foreach (obj, k, v) {
		bool ok = false;
		for (const char *const *a = allowed; *a; a++)
			ok |= !strcmp(k, *a);
		if (!ok) {
			http_fail(resp, ERR_INVALID, "invalid_field", "unknown field '%s'", k);
			return false;
		}
	}
	return true;
}
