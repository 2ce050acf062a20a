/* http.h: the HTTP transport on libmicrohttpd. It reads bodies into a capped
 * buffer, checks auth and content type, routes, and writes JSON or
 * problem+json. Only the server (http*.c, through http_internal.h) includes
 * microhttpd.h. */
#pragma once
#include <jansson.h>
#include "lib/util.h"

#define HTTP_MAX_BODY (1024 * 1024)

struct http_request {
	const char *method;
	const char *path; /* without the query */
	const char *body; /* NUL-terminated, may be NULL */
	size_t body_len;
	void *conn;                 /* opaque, for http_query / http_header */
	struct http_server *server; /* the server that answers, for http_metrics */
	const char *params[4];      /* {id}-style path parameters, in order */
	size_t n_params;
	int body_fd; /* HTTP_BODY_SPOOL routes: the body in an unlinked file at offset 0 (body_len bytes); else -1 */
	/* sha256 of the body in hex, taken as it was read whether kept in memory
	 * or spooled ("" when the request was not read by the server) */
	char body_sha256[65];
};

struct http_response {
	int status;
	json_t *json;             /* body, owned; or */
	char *text;               /* body, owned */
	const char *content_type; /* default application/json */
	/* WebSocket and other upgrades: called after 101 with the raw socket, on
	 * the connection's thread; it should hand the work to a thread of its own
	 * and return. extra holds bytes already read past the headers. When done
	 * with fd, call http_upgrade_close(handle) exactly once (it closes fd). */
	void (*upgrade)(void *arg, int fd, const char *extra, size_t extra_len, void *handle);
	void *upgrade_arg;
	const char *upgrade_protocol; /* value of Upgrade: header, e.g. "websocket" */
	char *extra_headers[4][2];    /* name, value (owned) */
	/* A body streamed as it is produced (chunked): stream_read gives > 0
	 * bytes, 0 at the end, < 0 to cut the stream (the client sees it
	 * incomplete); stream_free is called once when the response is done. */
	ssize_t (*stream_read)(void *arg, char *buf, size_t max);
	void (*stream_free)(void *arg);
	void *stream_arg;
	/* Work the client need not wait for: called once, on the connection's
	 * thread, after the answer is sent or the connection ended (the server
	 * stops before the engine closes). */
	void (*after)(void *arg);
	void *after_arg;
};

typedef void (*http_handler)(void *app, const struct http_request *req, struct http_response *resp);

struct http_route {
	const char *method;  /* "GET", "POST", ... */
	const char *pattern; /* "/v1/checkpoints/{id}/restore" */
	http_handler handler;
	bool public_; /* no token needed */
	/* false: a JSON body; true: any content type; HTTP_BODY_SPOOL: any
	 * content type, into an unlinked file below opts.spool_dir of at most
	 * opts.max_spool_bytes (req->body_fd). */
	unsigned char raw_body;
};
#define HTTP_BODY_SPOOL 2

struct http_server;
struct http_server_opts {
	const struct http_route *routes;
	size_t n_routes;
	void *app;
	const char *token;         /* NULL: no auth */
	unsigned conn_limit;       /* per listener, default 1024 */
	unsigned per_client_limit; /* per client address, default 64 */
	unsigned conn_timeout_s;   /* idle, default 60 */
	unsigned header_timeout_s; /* to send a request's headers, default 10 */
	const char *spool_dir;     /* where spooled bodies go (unlinked files) */
	uint64_t max_spool_bytes;  /* larger spooled bodies answer 413 */
};

/* listen: "HOST:PORT", "unix:PATH", or "fd:N" (socket activation). */
int http_start(const struct http_server_opts *opts, char *const *listen, size_t n_listen, struct http_server **ret,
	       ckpt_error *err);
void http_stop(struct http_server *s);

void http_upgrade_close(void *handle);

const char *http_query(const struct http_request *req, const char *key);
/* The responses req's server sent, by status, in Prometheus text
 * (ckptd_http_requests_total); caller frees, NULL when out of memory. */
char *http_metrics(const struct http_request *req);
const char *http_header(const struct http_request *req, const char *key);

/* Fill resp with application/problem+json {type,title,status,detail,code}. */
void http_problem(struct http_response *resp, int status, const char *code, const char *fmt, ...) _printf_(4, 5);
/* An error as a problem response: its kind gives the status and default code
 * (the one table in http_problem.c); an unset kind is a 500 with code "internal". */
void http_error(struct http_response *resp, const ckpt_error *err);
/* The same for an error the caller classifies on the spot. */
void http_fail(struct http_response *resp, enum ckpt_err_kind kind, const char *code, const char *fmt, ...)
	_printf_(4, 5);
/* Status and code (with ret_code) that http_error answers for err. */
int http_status_of(const ckpt_error *err, const char **ret_code);
void http_json(struct http_response *resp, int status, json_t *body);

/* %XX-decode a URL path, query name or value in place, as libmicrohttpd
 * asks: *ret_len is the new length. Returns why the URL must be refused
 * (400), or NULL: "a control character" when one (a NUL too) is decoded,
 * the escape then left as it was so that nothing is cut; else "bytes that
 * are not UTF-8" when the result is not strict UTF-8. */
const char *http_url_decode(char *s, size_t *ret_len);
