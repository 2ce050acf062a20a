/* http_internal.h: what the files of the HTTP server share, private to
 * src/http: the server, the per-connection tracker and the per-request
 * context. Calls go http.c (listeners, the request's life) -> http_body.c
 * (spooling) -> http_route.c (matching, checks, dispatch) -> http_conn.c
 * (slow clients), http_reply.c (sending responses, upgrades),
 * http_problem.c (statuses, problem+json), never back. */
#pragma once
#include "http/http.h"
#include "lib/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <nettle/sha2.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define MAX_SERVERS 8
/* A flood must not fill the accept queue: a dropped SYN is retried only
 * after a second. The kernel caps this at net.core.somaxconn. */
#define HTTP_BACKLOG 4096

/* One per open connection, to refuse slow clients (slowloris): a client gets
 * header_timeout_s to send a request's headers, counted from the connection
 * or from the end of its previous request, however it trickles bytes; and
 * past 3/4 of the connection limit, or past the limit of one client address,
 * the oldest connections still waiting for headers make room for new ones.
 * libmicrohttpd's own timeout restarts on every byte, and its limits refuse
 * newcomers instead: in a sandbox every client is 127.0.0.1, and a few
 * trickling connections would lock every request out. */
struct conn_track {
	struct conn_track *prev, *next;
	int fd;
	bool has_addr;       /* an IP client (unix socket clients are not counted) */
	uint8_t addr[16];    /* its address, IPv4 as IPv4-mapped IPv6 */
	int64_t since_ms;    /* start of the wait for headers */
	bool pending;        /* waiting for a request's headers */
	bool evicted;        /* shut down by us, libmicrohttpd closes it */
	bool upgraded;       /* a WebSocket now: never waiting for headers again */
	const char *bad_url; /* set by http_route_unescape: why the URL is refused */
};

struct http_server {
	struct http_server_opts opts;
	struct MHD_Daemon *mhd[MAX_SERVERS];
	char *unix_paths[MAX_SERVERS];
	size_t n;
	pthread_mutex_t lock; /* guards the list and the pending/since fields */
	struct conn_track *conns;
	unsigned n_conns, n_evicted;
	struct metrics_statuses statuses; /* every response sent, by status */
};

struct req_ctx {
	char *body;
	size_t len;
	bool too_large;
	struct http_server *srv;
	int spool_fd; /* HTTP_BODY_SPOOL routes: the body so far; else -1 */
	uint64_t spool_len;
	bool spool;
	struct sha256_ctx hash;   /* of the body as read, spooled or not */
	void (*after)(void *arg); /* http_response's, run by on_completed */
	void *after_arg;
};

/* http_conn.c */
struct conn_track *http_conn_of(struct MHD_Connection *conn);
void http_conn_set_pending(struct http_server *srv, struct MHD_Connection *conn, bool pending);
void http_conn_mark_upgraded(struct http_server *srv, struct MHD_Connection *conn);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback. */
void http_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
		      enum MHD_ConnectionNotificationCode code);

/* http_route.c */
bool http_route_match(const char *pattern, const char *path, struct http_request *req);
const char *http_route_peer(void *conn, char *buf, size_t len);
bool http_route_authorized(struct http_server *srv, const struct http_request *req);
void http_route_dispatch(struct http_server *srv, struct http_request *req, struct http_response *resp);
/* libmicrohttpd's MHD_OPTION_UNESCAPE_CALLBACK. */
size_t http_route_unescape(void *cls, struct MHD_Connection *conn, char *s);

/* http_body.c */
bool http_body_wants_spool(struct http_server *srv, struct MHD_Connection *conn, const char *url, const char *method);
int http_body_spool_open(const char *dir);
bool http_body_spool_write(struct req_ctx *ctx, const char *data, size_t n);

/* http_reply.c */
enum MHD_Result http_reply_now(struct MHD_Connection *conn, struct http_server *srv, struct http_response *resp);
void http_reply_upgrades_stopped(bool stopped);
