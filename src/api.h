/* api.h: the v1 routes: HTTP requests translated to engine calls and back. */
#pragma once
#include "http.h"

/* Routes of sandbox mode; `app` is the struct engine. */
const struct http_route *api_routes(size_t *ret_n);
/* GET /v1/health for host mode; `app` is the struct host. */
extern const struct http_route api_host_health_route;
