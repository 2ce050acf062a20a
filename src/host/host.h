/* host.h: host mode, the runsc handoff path. ckptd.c starts it when
 * --mode host is given; it serves its routes through the shared HTTP layer. */
#pragma once
#include "http/http.h"

struct config;
struct host;

int host_open(const struct config *cfg, struct host **ret, ckpt_error *err);
/* Routes (WS /create, WS /attach/{id}, ...); `app` for them is the host. */
const struct http_route *host_routes(size_t *ret_n);
json_t *host_health(struct host *h);
void host_close(struct host *h);

struct sandbox;
/* A volume is configured and a safe lock method was found on it. */
bool host_checkpointing(const struct host *h);
/* Log a failed step with its message and the path of runsc's log file. */
void host_log_failure(struct host *h, const struct sandbox *sb, const char *what, const ckpt_error *err);
