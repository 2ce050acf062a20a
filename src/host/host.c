/* host.c: placeholder until host mode lands. */
#include "host.h"
#include "config.h"

struct host { int unused; };

int host_open(const struct config *cfg, struct host **ret, ckpt_error *err)
{
	(void)cfg; (void)ret;
	return err_set(err, ENOTSUP, NULL, "host mode is not built yet");
}
const struct http_route *host_routes(size_t *ret_n) { *ret_n = 0; return NULL; }
json_t *host_health(struct host *h) { (void)h; return json_object(); }
void host_close(struct host *h) { (void)h; }
