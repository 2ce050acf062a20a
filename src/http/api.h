/* api.h: the v1 routes: HTTP requests translated to engine calls and back. */
#pragma once
#include "http/http.h"

struct create_req;
struct restore_req;

/* Request decoding, exposed for unit tests. On failure they fill resp with a
 * 400 problem and return NULL / false. */
json_t *api_parse_object(const struct http_request *req, bool required, struct http_response *resp);
bool api_decode_create(json_t *obj, struct create_req *cr, struct http_response *resp);
bool api_decode_restore(json_t *obj, struct restore_req *rr, struct http_response *resp);

/* Routes of sandbox mode; `app` is the struct engine. With
 * metrics_token_free, GET /metrics needs no token (for Prometheus). */
const struct http_route *api_routes(bool metrics_token_free, size_t *ret_n);
/* GET /v1/health for host mode; `app` is the struct host. */
