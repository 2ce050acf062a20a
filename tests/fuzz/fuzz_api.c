/* fuzz_api.c: a request body through the API's decoders, as a POST would. */
#include "engine/engine.h"
#include "http/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void decode(const uint8_t *data, size_t size, bool restore)
{
	_cleanup_free_ char *body = malloc(size + 1);
	struct http_request req = { .method = "POST", .path = "/v1/checkpoints" };
	struct http_response resp = { 0 };
	struct create_req cr = { 0 };
	struct restore_req rr = { 0 };

	if (!body)
		return;
	memcpy(body, data, size);
	body[size] = '\0';
	req.body = body, req.body_len = size;
	json_t *obj = api_parse_object(&req, !restore, &resp);
	bool ok = obj && (restore ? api_decode_restore(obj, &rr, &resp) : api_decode_create(obj, &cr, &resp));
	/* A refusal is a 400 problem with a code; an acceptance leaves resp alone. */
	if (ok != (resp.json == NULL) || (!ok && (resp.status != 400 || !json_object_get(resp.json, "code"))))
		abort();
	if (ok && !restore && (!cr.name || (cr.labels && !json_is_object(cr.labels))))
		abort();
	json_decref(obj);
	json_decref(resp.json);
	free(resp.text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	decode(data, size, false);
	decode(data, size, true);
	return 0;
}
