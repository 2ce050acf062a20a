/* http_reply.c: a handler's response sent through libmicrohttpd: JSON or
 * text, a stream read piece by piece, or an upgrade to a WebSocket (whose
 * close must not outlive http_stop). */
#include "http/http_internal.h"

/* A WebSocket session may end after http_stop freed its handle (host mode
 * stops the server before the sessions end): a close that starts after the
 * stop is skipped, and the stop waits for one already under way. */
static pthread_rwlock_t upgrade_lock = PTHREAD_RWLOCK_INITIALIZER;
static bool upgrades_stopped;

struct stream {
	ssize_t (*read)(void *arg, char *buf, size_t max);
	void (*free)(void *arg);
	void *arg;
};

/* true at http_stop: a close that starts after this is skipped, one under
 * way is waited for; false at http_start. */
void http_reply_upgrades_stopped(bool stopped)
{
	pthread_rwlock_wrlock(&upgrade_lock);
	upgrades_stopped = stopped;
	pthread_rwlock_unlock(&upgrade_lock);
}

void http_upgrade_close(void *handle)
{
	pthread_rwlock_rdlock(&upgrade_lock);
	if (!upgrades_stopped)
		MHD_upgrade_action(handle, MHD_UPGRADE_ACTION_CLOSE);
	pthread_rwlock_unlock(&upgrade_lock);
}

static void on_upgrade(void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra, size_t extra_len,
		       MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
	struct http_response *resp = cls;
	(void)conn, (void)con_cls;
	resp->upgrade(resp->upgrade_arg, sock, extra, extra_len, urh);
	free(resp);
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

char *http_metrics(const struct http_request *req)
{
	static const struct metrics_statuses none; /* a request no server read */
	return metrics_status_render(req->server ? &req->server->statuses : &none);
}

static enum MHD_Result send_response(struct MHD_Connection *conn, struct http_server *srv, struct http_response *resp)
{
	enum MHD_Result ret;
	char *body;
	size_t len;

	metrics_status_count(&srv->statuses, resp->status);
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

enum MHD_Result http_reply_now(struct MHD_Connection *conn, struct http_server *srv, struct http_response *resp)
{
	enum MHD_Result ret = send_response(conn, srv, resp);
	response_free(resp);
	return ret;
}
