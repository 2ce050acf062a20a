/* http.c: libmicrohttpd transport. One thread per connection, so a long create
 * or restore never holds up other requests; bodies are read into a capped
 * buffer and the handler runs on the final call. */
#include "http/http.h"

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
 * past 3/4 of the connection limit the oldest connections still waiting for
 * headers make room for new ones. libmicrohttpd's own timeout restarts on
 * every byte, and its limit refuses newcomers instead. */
struct conn_track {
	struct conn_track *prev, *next;
	int fd;
	int64_t since_ms;    /* start of the wait for headers */
	bool pending;        /* waiting for a request's headers */
	bool evicted;        /* shut down by us, libmicrohttpd closes it */
	bool upgraded;       /* a WebSocket now: never waiting for headers again */
	const char *bad_url; /* set by url_unescape: why the URL is refused */
};

struct http_server {
	struct http_server_opts opts;
	struct MHD_Daemon *mhd[MAX_SERVERS];
	char *unix_paths[MAX_SERVERS];
	size_t n;
	pthread_mutex_t lock; /* guards the list and the pending/since fields */
	struct conn_track *conns;
	unsigned n_conns, n_evicted;
};

struct req_ctx {
	char *body;
	size_t len;
	bool too_large;
	struct http_server *srv;
	int spool_fd; /* HTTP_BODY_SPOOL routes: the body so far; else -1 */
	uint64_t spool_len;
	bool spool;
	struct sha256_ctx hash; /* of the body as read, spooled or not */
};

/* The one table of statuses: title, default code, and the error kind that
 * answers with it (OpenBSD httpd's server_abort_http keeps one such table). */
static const struct http_status_row {
	int status;
	const char *title, *code;
	enum ckpt_err_kind kind;
} statuses[] = {
	{ 400, "Bad Request", "bad_request", ERR_INVALID },
	{ 401, "Unauthorized", "unauthorized", ERR_UNSET },
	{ 403, "Forbidden", "forbidden", ERR_LIMIT },
	{ 404, "Not Found", "not_found", ERR_NOT_FOUND },
	{ 405, "Method Not Allowed", "method_not_allowed", ERR_UNSET },
	{ 409, "Conflict", "conflict", ERR_CONFLICT },
	{ 410, "Gone", "gone", ERR_EXPIRED },
	{ 413, "Content Too Large", "body_too_large", ERR_UNSET },
	{ 415, "Unsupported Media Type", "unsupported_media_type", ERR_UNSET },
	{ 422, "Unprocessable Content", "unprocessable", ERR_UNSET },
	{ 500, "Internal Server Error", "internal", ERR_INTERNAL },
	{ 503, "Service Unavailable", "unavailable", ERR_UNAVAILABLE },
	{ 507, "Insufficient Storage", "insufficient_storage", ERR_NO_SPACE },
};
/* A status missing from the table answers as 500, as does an unset kind: a
 * failure nobody classified. */
static const struct http_status_row *status_row(int status)
{
	const struct http_status_row *internal = NULL;
	for (size_t i = 0; i < ARRAY_SIZE(statuses); i++) {
		if (statuses[i].status == status)
			return &statuses[i];
		if (statuses[i].kind == ERR_INTERNAL)
			internal = &statuses[i];
	}
	return internal;
}

static const struct http_status_row *kind_row(enum ckpt_err_kind kind)
{
	for (size_t i = 0; kind != ERR_UNSET && i < ARRAY_SIZE(statuses); i++)
		if (statuses[i].kind == kind)
			return &statuses[i];
	return status_row(500);
}

int http_status_of(const ckpt_error *err, const char **ret_code)
{
	const struct http_status_row *row = kind_row(err->kind);
	if (ret_code)
		*ret_code = err->kind != ERR_UNSET && err->code ? err->code : row->code;
	return row->status;
}

void http_json(struct http_response *resp, int status, json_t *body)
{
	json_decref(resp->json);
	resp->status = status;
	resp->json = body;
	resp->content_type = "application/json";
}

/* A detail may quote what the client sent; JSON strings must be UTF-8, or
 * jansson gives no body at all. */
static void utf8_scrub(char *s)
{
	if (utf8_valid(s, strlen(s)))
		return;
	for (; *s; s++)
		if ((unsigned char)*s >= 0x80)
			*s = '?';
}

void http_problem(struct http_response *resp, int status, const char *code, const char *fmt, ...)
{
	char detail[1024];
	va_list ap;
	const struct http_status_row *row = status_row(status);

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	utf8_scrub(detail);
	json_t *p = json_pack("{s:s, s:s, s:i, s:s, s:s}", "type", "about:blank", "title", row->title, "status", status,
			      "detail", detail, "code", code ? code : row->code);
	http_json(resp, status, p);
	resp->content_type = "application/problem+json";
}

void http_error(struct http_response *resp, const ckpt_error *err)
{
	const char *code;
	int status = http_status_of(err, &code);
	const char *detail = err->msg[0] ? err->msg : strerror(err->errnum ? err->errnum : EIO);

	/* the client sees the message; the log keeps the errno too */
	if (status >= 500 && err->errnum)
		log_warn("answering %d: %s (%s)", status, detail, strerror(err->errnum));
	else if (status >= 500)
		log_warn("answering %d: %s", status, detail);
	http_problem(resp, status, code, "%s", detail);
}

void http_fail(struct http_response *resp, enum ckpt_err_kind kind, const char *code, const char *fmt, ...)
{
	ckpt_error err = { .kind = kind, .code = code }; /* no errno: the caller decided */
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err.msg, sizeof(err.msg), fmt, ap);
	va_end(ap);
	http_error(resp, &err);
}

const char *http_query(const struct http_request *req, const char *key)
{
	return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *http_header(const struct http_request *req, const char *key)
{
	return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, key);
}

/* A WebSocket session may end after http_stop freed its handle (host mode
 * stops the server before the sessions end): a close that starts after the
 * stop is skipped, and the stop waits for one already under way. */
static pthread_rwlock_t upgrade_lock = PTHREAD_RWLOCK_INITIALIZER;
static bool upgrades_stopped;

void http_upgrade_close(void *handle)
{
	pthread_rwlock_rdlock(&upgrade_lock);
	if (!upgrades_stopped)
		MHD_upgrade_action(handle, MHD_UPGRADE_ACTION_CLOSE);
	pthread_rwlock_unlock(&upgrade_lock);
}

/* "/v1/checkpoints/{id}" against "/v1/checkpoints/cp_1": segment by segment. */
static bool route_match(const char *pattern, const char *path, struct http_request *req)
{
	req->n_params = 0;
	for (;;) {
		if (*pattern != '/' || *path != '/')
			return *pattern == *path;
		pattern++, path++;
		const char *pe = strchrnul(pattern, '/'), *se = strchrnul(path, '/');
		if (*pattern == '{') {
			if (se == path || req->n_params >= ARRAY_SIZE(req->params))
				return false;
			req->params[req->n_params++] = path; /* terminated below */
		} else if (pe - pattern != se - path || strncmp(pattern, path, (size_t)(pe - pattern))) {
			return false;
		}
		pattern = pe, path = se;
		if (!*pattern && !*path)
			return true;
	}
}

static void on_upgrade(void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra, size_t extra_len,
		       MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
	struct http_response *resp = cls;
	(void)conn, (void)con_cls;
	resp->upgrade(resp->upgrade_arg, sock, extra, extra_len, urh);
	free(resp);
}

/* "203.0.113.7", "[2001:db8::1]" or "unix" for the logs. */
static const char *peer_address(void *conn, char *buf, size_t len)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;
	char ip[INET6_ADDRSTRLEN] = "";
	if (sa && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof(ip));
	else if (sa && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof(ip));
	if (!*ip)
		snprintf(buf, len, "unix");
	else
		snprintf(buf, len, sa->sa_family == AF_INET6 ? "[%s]" : "%s", ip);
	return buf;
}

static bool authorized(struct http_server *srv, const struct http_request *req)
{
	const char *h = http_header(req, "Authorization");
	if (!srv->opts.token)
		return true;
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return false;
	return secure_streq(h + 7, srv->opts.token);
}

/* "application/json", optionally with "; charset=utf-8": JSON is UTF-8 only
 * (RFC 8259), so any other charset is refused rather than misread. */
static bool content_type_json(const struct http_request *req)
{
	const char *ct = http_header(req, "Content-Type");
	size_t n = strlen("application/json");
	if (!ct || strncasecmp(ct, "application/json", n) || (ct[n] && ct[n] != ';' && ct[n] != ' '))
		return false;
	for (const char *p = ct + n; (p = strchr(p, ';'));) {
		p += strspn(p, "; \t");
		if (strncasecmp(p, "charset=", 8))
			continue;
		p += 8;
		bool quoted = *p == '"';
		p += quoted;
		size_t len = strcspn(p, quoted ? "\"" : "; \t");
		if (!((len == 5 && !strncasecmp(p, "utf-8", 5)) || (len == 4 && !strncasecmp(p, "utf8", 4))))
			return false;
	}
	return true;
}

/* Split parameters out of a copy of the path so each is NUL-terminated. */
static void terminate_params(struct http_request *req, char *path_copy, const char *path)
{
	for (size_t i = 0; i < req->n_params; i++) {
		char *p = path_copy + (req->params[i] - path);
		char *e = strchrnul(p, '/');
		*e = '\0';
		req->params[i] = p;
	}
}

/* HEAD is GET without the body: libmicrohttpd leaves the body out itself. */
static bool method_matches(const char *route, const char *method)
{
	return !strcmp(route, method) || (!strcmp(method, "HEAD") && !strcmp(route, "GET"));
}

static void allow_add(char *allow, size_t size, const char *method)
{
	size_t len = strlen(allow);
	if (len + strlen(method) + 3 < size)
		snprintf(allow + len, size - len, "%s%s", len ? ", " : "", method);
}

static void dispatch(struct http_server *srv, struct http_request *req, struct http_response *resp)
{
	const struct http_route *match = NULL;
	bool path_known = false;
	char allow[64] = "";
	bool literal = false; /* "/v1/checkpoints/import" is not checkpoint "import" */

	for (size_t i = 0; i < srv->opts.n_routes; i++)
		literal |= !strchr(srv->opts.routes[i].pattern, '{') &&
			route_match(srv->opts.routes[i].pattern, req->path, req);
	for (size_t i = 0; i < srv->opts.n_routes; i++) {
		const struct http_route *r = &srv->opts.routes[i];
		if ((literal && strchr(r->pattern, '{')) || !route_match(r->pattern, req->path, req))
			continue;
		path_known = true;
		allow_add(allow, sizeof(allow), r->method);
		if (!strcmp(r->method, "GET"))
			allow_add(allow, sizeof(allow), "HEAD");
		if (method_matches(r->method, req->method)) {
			match = r;
			break;
		}
	}
	if (!match) {
		if (path_known) {
			http_problem(resp, 405, NULL, "method %s not allowed on %s (allowed: %s)", req->method,
				     req->path, allow);
			resp->extra_headers[0][0] = strdup("Allow");
			resp->extra_headers[0][1] = strdup(allow);
		} else {
			http_problem(resp, 404, NULL, "no such endpoint: %s", req->path);
		}
		return;
	}
	if (!match->public_ && !authorized(srv, req)) {
		char peer[64];
		log_warn("refused %s %s from %s: %s bearer token", req->method, req->path,
			 peer_address(req->conn, peer, sizeof(peer)),
			 http_header(req, "Authorization") ? "wrong" : "no");
		http_problem(resp, 401, NULL, "missing or wrong bearer token");
		resp->extra_headers[0][0] = strdup("WWW-Authenticate");
		resp->extra_headers[0][1] = strdup("Bearer");
		return;
	}
	if (req->body_len > 0 && !match->raw_body && !content_type_json(req)) {
		http_problem(resp, 415, NULL, "request body must be application/json in UTF-8");
		return;
	}
	_cleanup_free_ char *path_copy = strdup(req->path);
	if (!path_copy) {
		http_problem(resp, 500, NULL, "out of memory");
		return;
	}
	terminate_params(req, path_copy, req->path); /* params are the matching route's */
	match->handler(srv->opts.app, req, resp);
	if (!resp->status)
		http_problem(resp, 500, NULL, "handler gave no response");
}

static void response_free(struct http_response *resp)
{
	if (resp->stream_read && resp->stream_free)
		resp->stream_free(resp->stream_arg);
	json_decref(resp->json);
	free(resp->text);
	for (size_t i = 0; i < ARRAY_SIZE(resp->extra_headers); i++) {
		free(resp->extra_headers[i][0]);
		free(resp->extra_headers[i][1]);
	}
}

static void add_headers(struct MHD_Response *r, struct http_response *resp)
{
	for (size_t i = 0; i < ARRAY_SIZE(resp->extra_headers); i++)
		if (resp->extra_headers[i][0] && resp->extra_headers[i][1])
			MHD_add_response_header(r, resp->extra_headers[i][0], resp->extra_headers[i][1]);
}

static enum MHD_Result send_upgrade(struct MHD_Connection *conn, struct http_response *resp)
{
	struct http_response *keep = malloc(sizeof(*keep));
	if (!keep)
		return MHD_NO;
	*keep = *resp;
	memset(keep->extra_headers, 0, sizeof(keep->extra_headers));
	keep->json = NULL, keep->text = NULL;
	struct MHD_Response *r = MHD_create_response_for_upgrade(on_upgrade, keep);
	if (!r) {
		free(keep);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_UPGRADE,
				resp->upgrade_protocol ? resp->upgrade_protocol : "websocket");
	add_headers(r, resp);
	enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_SWITCHING_PROTOCOLS, r);
	MHD_destroy_response(r);
	if (ret != MHD_YES)
		free(keep);
	return ret;
}

struct stream {
	ssize_t (*read)(void *arg, char *buf, size_t max);
	void (*free)(void *arg);
	void *arg;
};

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *st = cls;
	(void)pos;
	ssize_t k = st->read(st->arg, buf, max);
	if (k > 0)
		return k;
	return k == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free_cb(void *cls)
{
	struct stream *st = cls;
	st->free(st->arg);
	free(st);
}

/* Chunked, read from the producer on this connection's thread. */
static enum MHD_Result send_stream(struct MHD_Connection *conn, struct http_response *resp)
{
	struct stream *st = malloc(sizeof(*st));
	if (!st) {
		resp->stream_free(resp->stream_arg);
		return MHD_NO;
	}
	*st = (struct stream){ resp->stream_read, resp->stream_free, resp->stream_arg };
	resp->stream_read = NULL;
	struct MHD_Response *r =
		MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_cb, st, stream_free_cb);
	if (!r) {
		stream_free_cb(st);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				resp->content_type ? resp->content_type : "application/octet-stream");
	add_headers(r, resp);
	enum MHD_Result ret = MHD_queue_response(conn, (unsigned)resp->status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_response(struct MHD_Connection *conn, struct http_server *srv, struct http_response *resp)
{
	enum MHD_Result ret;
	char *body;
	size_t len;

	if (srv->opts.on_status)
		srv->opts.on_status(srv->opts.app, resp->status);
	if (resp->status == 101 && resp->upgrade)
		return send_upgrade(conn, resp);
	if (resp->stream_read)
		return send_stream(conn, resp);
	if (resp->json) {
		body = json_dumps(resp->json, JSON_COMPACT);
		len = body ? strlen(body) : 0;
	} else {
		body = TAKE_PTR(resp->text);
		len = body ? strlen(body) : 0;
	}
	if (body && resp->json && len > 0) {
		char *n = realloc(body, len + 2); /* newline: friendlier for curl */
		if (n) {
			body = n;
			body[len++] = '\n';
			body[len] = '\0';
		}
	}
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body ? body : (char *)"",
								 body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	if (len > 0 || resp->content_type)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
					resp->content_type ? resp->content_type : "application/json");
	add_headers(r, resp);
	ret = MHD_queue_response(conn, (unsigned)resp->status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result reply_now(struct MHD_Connection *conn, struct http_server *srv, struct http_response *resp)
{
	enum MHD_Result ret = send_response(conn, srv, resp);
	response_free(resp);
	return ret;
}

static struct conn_track *conn_track_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return ci ? ci->socket_context : NULL;
}

/* libmicrohttpd closes the connection once its thread sees the shutdown.
 * The fd stays ours to use until the CLOSED notification, under the lock. */
static void conn_evict(struct http_server *srv, struct conn_track *t)
{
	shutdown(t->fd, SHUT_RDWR);
	t->evicted = true;
	srv->n_evicted++;
}

/* Caller holds srv->lock. */
static void conns_make_room(struct http_server *srv, int64_t now)
{
	unsigned soft = srv->opts.conn_limit - srv->opts.conn_limit / 4;
	int64_t deadline_ms = (int64_t)srv->opts.header_timeout_s * 1000;

	for (struct conn_track *t = srv->conns; t; t = t->next)
		if (t->pending && !t->evicted && now - t->since_ms >= deadline_ms)
			conn_evict(srv, t);
	while (srv->n_conns - srv->n_evicted >= soft) {
		struct conn_track *oldest = NULL;
		for (struct conn_track *t = srv->conns; t; t = t->next)
			if (t->pending && !t->evicted && (!oldest || t->since_ms < oldest->since_ms))
				oldest = t;
		if (!oldest)
			break;
		conn_evict(srv, oldest);
	}
}

static void conn_started(struct http_server *srv, struct MHD_Connection *conn, void **socket_context)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	struct conn_track *t;

	if (!ci || !(t = calloc(1, sizeof(*t))))
		return; /* untracked: served, never evicted */
	t->fd = ci->connect_fd;
	t->pending = true;
	pthread_mutex_lock(&srv->lock);
	t->since_ms = mono_ms();
	conns_make_room(srv, t->since_ms);
	t->next = srv->conns;
	if (t->next)
		t->next->prev = t;
	srv->conns = t;
	srv->n_conns++;
	*socket_context = t;
	pthread_mutex_unlock(&srv->lock);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct http_server *srv = cls;
	struct conn_track *t = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		conn_started(srv, conn, socket_context);
		return;
	}
	if (!t)
		return;
	pthread_mutex_lock(&srv->lock);
	if (t->prev)
		t->prev->next = t->next;
	else
		srv->conns = t->next;
	if (t->next)
		t->next->prev = t->prev;
	srv->n_conns--;
	srv->n_evicted -= t->evicted;
	*socket_context = NULL;
	pthread_mutex_unlock(&srv->lock);
	free(t);
}

/* The headers of a request are in (pending false), or a request ended and
 * the wait for the next one's headers starts (pending true). */
static void conn_set_pending(struct http_server *srv, struct MHD_Connection *conn, bool pending)
{
	struct conn_track *t = conn_track_of(conn);
	if (!t)
		return;
	pthread_mutex_lock(&srv->lock);
	t->pending = pending && !t->upgraded;
	t->since_ms = mono_ms();
	if (pending)
		t->bad_url = NULL;
	pthread_mutex_unlock(&srv->lock);
}

static void conn_mark_upgraded(struct http_server *srv, struct MHD_Connection *conn)
{
	struct conn_track *t = conn_track_of(conn);
	if (!t)
		return;
	pthread_mutex_lock(&srv->lock);
	t->upgraded = true;
	t->pending = false;
	pthread_mutex_unlock(&srv->lock);
}

static int hex_value(char c)
{
	return c >= '0' && c <= '9'    ? c - '0'
		: c >= 'a' && c <= 'f' ? c - 'a' + 10
		: c >= 'A' && c <= 'F' ? c - 'A' + 10
				       : -1;
}

const char *http_url_decode(char *s, size_t *ret_len)
{
	const char *bad = NULL;
	char *w = s;

	for (const char *r = s; *r; r++) {
		int hi = r[0] == '%' ? hex_value(r[1]) : -1, lo = hi >= 0 ? hex_value(r[2]) : -1;
		unsigned char c = lo >= 0 ? (unsigned char)(hi << 4 | lo) : (unsigned char)*r;
		if (c < 0x20 || c == 0x7f) {
			bad = "a control character";
			*w++ = *r;
			continue;
		}
		*w++ = (char)c;
		r += lo >= 0 ? 2 : 0;
	}
	*w = '\0';
	if (!bad && !utf8_valid(s, (size_t)(w - s)))
		bad = "bytes that are not UTF-8";
	*ret_len = (size_t)(w - s);
	return bad;
}

/* libmicrohttpd's unescape callback: http_url_decode, whose verdict
 * on_request answers with a 400. */
static size_t url_unescape(void *cls, struct MHD_Connection *conn, char *s)
{
	size_t len;
	const char *bad = http_url_decode(s, &len);
	(void)cls;
	struct conn_track *t = bad ? conn_track_of(conn) : NULL;
	if (t && !t->bad_url)
		t->bad_url = bad;
	return len;
}

/* Does (method, url) go to a route that spools its body? Unauthorized
 * requests never spool: their body is dropped and dispatch answers 401. */
static bool wants_spool(struct http_server *srv, struct MHD_Connection *conn, const char *url, const char *method)
{
	struct http_request req = { .method = method, .path = url, .conn = conn };
	for (size_t i = 0; i < srv->opts.n_routes; i++) {
		const struct http_route *r = &srv->opts.routes[i];
		if (r->raw_body == HTTP_BODY_SPOOL && !strcmp(r->method, method) && route_match(r->pattern, url, &req))
			return r->public_ || authorized(srv, &req);
	}
	return false;
}

static int spool_open(const char *dir)
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

static bool spool_write(struct req_ctx *ctx, const char *data, size_t n)
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

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct http_server *srv = cls;
	struct req_ctx *ctx = *con_cls;
	struct http_response resp = { 0 };
	(void)version;

	if (!ctx) {
		if (!(ctx = calloc(1, sizeof(*ctx))))
			return MHD_NO;
		ctx->srv = srv;
		ctx->spool_fd = -1;
		sha256_init(&ctx->hash);
		*con_cls = ctx;
		conn_set_pending(srv, conn, false);
		struct conn_track *t = conn_track_of(conn);
		if (t && t->bad_url) {
			http_problem(&resp, 400, "invalid_field", "the URL holds %s (after %%-decoding)", t->bad_url);
			return reply_now(conn, srv, &resp);
		}
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if ((ctx->spool = wants_spool(srv, conn, url, method))) {
			if (cl && strtoull(cl, NULL, 10) > srv->opts.max_spool_bytes) {
				ctx->too_large = true;
				http_problem(&resp, 413, NULL, "request body over %llu bytes (max_import_bytes)",
					     (unsigned long long)srv->opts.max_spool_bytes);
				return reply_now(conn, srv, &resp);
			}
			if ((ctx->spool_fd = spool_open(srv->opts.spool_dir)) < 0) {
				http_problem(&resp, 500, NULL, "cannot spool the request body: %m");
				return reply_now(conn, srv, &resp);
			}
			return MHD_YES;
		}
		if (cl && strtoull(cl, NULL, 10) > HTTP_MAX_BODY) {
			ctx->too_large = true;
			http_problem(&resp, 413, NULL, "request body over %d bytes", HTTP_MAX_BODY);
			return reply_now(conn, srv, &resp);
		}
		return MHD_YES;
	}
	if (*upload_size)
		sha256_update(&ctx->hash, *upload_size, (const uint8_t *)upload);
	if (*upload_size && ctx->spool) {
		if (!ctx->too_large && ctx->spool_len + *upload_size > srv->opts.max_spool_bytes)
			ctx->too_large = true;
		if (!ctx->too_large && ctx->spool_fd >= 0 && !spool_write(ctx, upload, *upload_size)) {
			log_warn("cannot spool a request body: %m");
			return MHD_NO;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (*upload_size) {
		if (!ctx->too_large && ctx->len + *upload_size > HTTP_MAX_BODY) {
			ctx->too_large = true;
			free(TAKE_PTR(ctx->body));
		}
		if (!ctx->too_large) {
			char *n = realloc(ctx->body, ctx->len + *upload_size + 1);
			if (!n)
				return MHD_NO;
			memcpy(n + ctx->len, upload, *upload_size);
			ctx->body = n;
			ctx->len += *upload_size;
			ctx->body[ctx->len] = '\0';
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (ctx->too_large && ctx->spool) {
		http_problem(&resp, 413, NULL, "request body over %llu bytes (max_import_bytes)",
			     (unsigned long long)srv->opts.max_spool_bytes);
		return reply_now(conn, srv, &resp);
	}
	if (ctx->too_large) {
		http_problem(&resp, 413, NULL, "request body over %d bytes", HTTP_MAX_BODY);
		return reply_now(conn, srv, &resp);
	}
	struct http_request req = {
		.method = method, .path = url, .body = ctx->body, .body_len = ctx->len, .conn = conn, .body_fd = -1
	};
	if (ctx->spool && ctx->spool_fd >= 0 && lseek(ctx->spool_fd, 0, SEEK_SET) == 0)
		req.body_fd = ctx->spool_fd, req.body_len = ctx->spool_len;
	uint8_t digest[SHA256_DIGEST_SIZE];
	sha256_digest(&ctx->hash, sizeof(digest), digest);
	for (size_t i = 0; i < sizeof(digest); i++)
		snprintf(req.body_sha256 + 2 * i, 3, "%02x", digest[i]);
	int64_t t0 = mono_ms();
	dispatch(srv, &req, &resp);
	if (log_is_verbose()) { /* one access line per request */
		char peer[64];
		log_info("%s %s %d %lld ms %zu bytes in, from %s", method, url, resp.status,
			 (long long)(mono_ms() - t0), req.body_len, peer_address(conn, peer, sizeof(peer)));
	}
	if (resp.status == 101 && resp.upgrade)
		conn_mark_upgraded(srv, conn);
	return reply_now(conn, srv, &resp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct req_ctx *ctx = *con_cls;
	(void)toe;
	conn_set_pending(cls, conn, true);
	if (ctx) {
		free(ctx->body);
		if (ctx->spool_fd >= 0)
			close(ctx->spool_fd);
		free(ctx);
		*con_cls = NULL;
	}
}

static int listen_unix(const char *path, char **ret_path, ckpt_error *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return err_set(err, ENAMETOOLONG, NULL, "unix socket path too long: '%s'", path);
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return err_set(err, errno, NULL, "socket: %m");
	unlink(path); /* a stale socket from an earlier run */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, 0660) < 0 || listen(fd, HTTP_BACKLOG) < 0) {
		int e = errno;
		close(fd);
		return err_set(err, e, NULL, "cannot listen on unix:%s: %s", path, strerror(e));
	}
	*ret_path = strdup(path);
	return fd;
}

static int listen_tcp(const char *spec, ckpt_error *err)
{
	_cleanup_free_ char *host = strdup(spec);
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *res = NULL;
	char *port;
	int fd = -1, one = 1, e = 0;

	if (!host || !(port = strrchr(host, ':')))
		return err_set(err, EINVAL, NULL, "listen address '%s' is not HOST:PORT or unix:PATH", spec);
	*port++ = '\0';
	if (host[0] == '[' && host[strlen(host) - 1] == ']') {
		host[strlen(host) - 1] = '\0';
		memmove(host, host + 1, strlen(host));
	}
	if ((e = getaddrinfo(host[0] ? host : NULL, port, &hints, &res)) != 0)
		return err_set(err, EINVAL, NULL, "listen address '%s': %s", spec, gai_strerror(e));
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, HTTP_BACKLOG) == 0)
			break;
		e = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return err_set(err, e ? e : EADDRNOTAVAIL, NULL, "cannot listen on %s: %s", spec,
			       strerror(e ? e : EADDRNOTAVAIL));
	return fd;
}

static int http_listen_one(struct http_server *s, const char *spec, ckpt_error *err)
{
	int fd;
	if (!strncmp(spec, "unix:", 5))
		fd = listen_unix(spec + 5, &s->unix_paths[s->n], err);
	else if (!strncmp(spec, "fd:", 3))
		fd = atoi(spec + 3);
	else
		fd = listen_tcp(spec, err);
	if (fd < 0)
		return fd;
	unsigned flags =
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_ALLOW_UPGRADE | MHD_USE_POLL;
	s->mhd[s->n] =
		MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
				 MHD_OPTION_CONNECTION_TIMEOUT, s->opts.conn_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
				 s->opts.conn_limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT, s->opts.per_client_limit,
				 MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_UNESCAPE_CALLBACK,
				 url_unescape, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
	if (!s->mhd[s->n]) {
		close(fd);
		return err_set(err, EIO, NULL, "libmicrohttpd could not serve %s", spec);
	}
	s->n++;
	return 0;
}

/* A connection is a descriptor (and a thread): the usual soft limit of 1024
 * would refuse clients before the connection limit does. */
static void http_raise_fd_limit(rlim_t want)
{
	struct rlimit rl;
	want += 256; /* the engine's own files */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
		rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

int http_start(const struct http_server_opts *opts, char *const *listen, size_t n_listen, struct http_server **ret,
	       ckpt_error *err)
{
	struct http_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_rwlock_wrlock(&upgrade_lock);
	upgrades_stopped = false; /* one server at a time in a process */
	pthread_rwlock_unlock(&upgrade_lock);
	s->opts = *opts;
	pthread_mutex_init(&s->lock, NULL);
	if (!s->opts.conn_limit)
		s->opts.conn_limit = 1024;
	if (!s->opts.per_client_limit)
		s->opts.per_client_limit = 64;
	if (!s->opts.conn_timeout_s)
		s->opts.conn_timeout_s = 60;
	if (!s->opts.header_timeout_s)
		s->opts.header_timeout_s = 10;
	http_raise_fd_limit((rlim_t)s->opts.conn_limit * (n_listen ? n_listen : 1));
	for (size_t i = 0; i < n_listen && i < MAX_SERVERS; i++) {
		int r = http_listen_one(s, listen[i], err);
		if (r < 0) {
			http_stop(s);
			return r;
		}
	}
	*ret = s;
	return 0;
}

void http_stop(struct http_server *s)
{
	if (!s)
		return;
	pthread_rwlock_wrlock(&upgrade_lock);
	upgrades_stopped = true;
	pthread_rwlock_unlock(&upgrade_lock);
	for (size_t i = 0; i < s->n; i++) {
		MHD_stop_daemon(s->mhd[i]);
		if (s->unix_paths[i])
			unlink(s->unix_paths[i]);
		free(s->unix_paths[i]);
	}
	pthread_mutex_destroy(&s->lock);
	free(s);
}
