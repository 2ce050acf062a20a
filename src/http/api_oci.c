/* api_oci.c: POST /v1/checkpoints/{id}/push and POST /v1/checkpoints/pull
 * decode their bodies and call engine_oci.c. */
#include "http/api.h"

#include "engine/engine.h"
#include "engine/engine_oci.h"

static bool oci_fields(json_t *obj, const char *const *allowed, struct http_response *resp)
{
	if (!api_only_fields(obj, allowed, resp))
		return false;
	json_t *ref = json_object_get(obj, "ref");
	if (!json_is_string(ref)) {
		http_fail(resp, ERR_INVALID, "invalid_field", "ref is required: HOST[:PORT]/REPO[:TAG]");
		return false;
	}
	return true;
}

/* {checkpoint_id, ref, digest, layers, uploaded_bytes, reused_bytes} */
static json_t *api_push_json(const struct push_result *r)
{
	json_t *layers = json_array();
	for (size_t i = 0; layers && i < r->n_layers; i++) {
		const struct push_result_layer *l = &r->layers[i];
		json_array_append_new(layers,
				      json_pack("{s:s, s:s, s:I, s:b}", "digest", l->digest, "media_type",
						l->media_type, "size", (json_int_t)l->size, "uploaded", l->uploaded));
	}
	return json_pack("{s:s, s:s, s:s, s:o, s:I, s:I}", "checkpoint_id", r->checkpoint_id, "ref", r->ref, "digest",
			 r->digest, "layers", layers, "uploaded_bytes", (json_int_t)r->uploaded_bytes, "reused_bytes",
			 (json_int_t)r->reused_bytes);
}

void api_push(void *app, const struct http_request *req, struct http_response *resp)
{
	static const char *const allowed[] = { "ref", "base", "async", NULL };
	json_auto_t *obj = api_parse_object(req, true, resp);
	struct push_req pr = { .base = true };
	ckpt_error err = { 0 };
	json_t *v;

	if (!obj || !oci_fields(obj, allowed, resp))
		return;
	pr.ref = json_string_value(json_object_get(obj, "ref"));
	if ((v = json_object_get(obj, "base")) && !json_is_boolean(v)) {
		http_fail(resp, ERR_INVALID, "invalid_field", "base must be true or false");
		return;
	}
	pr.base = !v || json_is_true(v);
	if ((v = json_object_get(obj, "async")) && !json_is_boolean(v)) {
		http_fail(resp, ERR_INVALID, "invalid_field", "async must be true or false");
		return;
	}
	if (json_is_true(v)) {
		struct ckpt_view view;
		if (engine_push_async(app, req->params[0], &pr, &view, &err) < 0) {
			http_error(resp, &err);
			return;
		}
		http_json(resp, 202, api_record_json(&view));
		ckpt_view_free(&view);
		return;
	}
	struct push_result res;
	if (engine_push(app, req->params[0], &pr, &res, &err) < 0)
		http_error(resp, &err);
	else
		http_json(resp, 200, api_push_json(&res));
}

/* "roots" {"/image/root": "/local/root"} into ret (its strings borrowed
 * from v): -EINVAL when it is no such object. */
static int api_pull_roots(json_t *v, struct pull_root *ret, size_t *n)
{
	const char *k;
	json_t *t;
	if (!json_is_object(v))
		return -EINVAL;
	json_object_foreach (v, k, t) {
		if (!json_is_string(t) || k[0] != '/')
			return -EINVAL;
		ret[(*n)++] = (struct pull_root){ .image = k, .local = json_string_value(t) };
	}
	return 0;
}

void api_pull(void *app, const struct http_request *req, struct http_response *resp)
{
	static const char *const allowed[] = { "ref", "roots", NULL };
	json_auto_t *obj = api_parse_object(req, true, resp);
	struct pull_req pr = { 0 };
	ckpt_error err = { 0 };
	struct ckpt_view view;
	json_t *out, *v;

	if (!obj || !oci_fields(obj, allowed, resp))
		return;
	pr.ref = json_string_value(json_object_get(obj, "ref"));
	v = json_object_get(obj, "roots");
	_cleanup_free_ struct pull_root *roots = calloc(json_object_size(v) + 1, sizeof(*roots));
	if (!roots) {
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory");
		return;
	}
	if (v && !json_is_null(v) && api_pull_roots(v, roots, &pr.n_roots) < 0) {
		http_fail(resp, ERR_INVALID, "invalid_field",
			  "roots must map absolute paths in the image to this daemon's roots");
		return;
	}
	pr.roots = roots;
	if (engine_pull(app, &pr, &view, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	out = api_record_json(&view);
	ckpt_view_free(&view);
	if (out)
		http_json(resp, 201, out);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory");
}
