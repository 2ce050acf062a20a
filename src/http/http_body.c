/* http_body.c: request bodies that a route streams to a temp file instead
 * of memory (HTTP_BODY_SPOOL), hashed as they are read. */
#include "http/http_internal.h"

/* Does (method, url) go to a route that spools its body? Unauthorized
 * requests never spool: their body is dropped and http_route_dispatch answers 401. */
bool http_body_wants_spool(struct http_server *srv, struct MHD_Connection *conn, const char *url, const char *method)
{
	struct http_request req = { .method = method, .path = url, .conn = conn, .server = srv };
	for (size_t i = 0; i < srv->opts.n_routes; i++) {
		const struct http_route *r = &srv->opts.routes[i];
		if (r->raw_body == HTTP_BODY_SPOOL && !strcmp(r->method, method) &&
		    http_route_match(r->pattern, url, &req))
			return r->public_ || http_route_authorized(srv, &req);
	}
	return false;
}

int http_body_spool_open(const char *dir)
{
	int fd = open(dir ? dir : "/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0) { /* a filesystem without O_TMPFILE */
		_cleanup_free_ char *t = NULL;
		if (asprintf(&t, "%s/.spool-XXXXXX", dir ? dir : "/tmp") < 0)
			return -1;
		fd = mkostemp(t, O_CLOEXEC);
		if (fd >= 0)
			unlink(t);
	}
	return fd;
}

bool http_body_spool_write(struct req_ctx *ctx, const char *data, size_t n)
{
	while (n > 0) {
		ssize_t k = write(ctx->spool_fd, data, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return false;
		data += k, n -= (size_t)k;
		ctx->spool_len += (uint64_t)k;
	}
	return true;
}
