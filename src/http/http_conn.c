/* http_conn.c: the per-connection tracker that refuses slow clients
 * (slowloris): a deadline for a request's headers, and eviction of the
 * oldest waiting connections when the limit nears (struct conn_track). */
#include "http/http_internal.h"

struct conn_track *http_conn_of(struct MHD_Connection *conn)
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

void http_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
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
void http_conn_set_pending(struct http_server *srv, struct MHD_Connection *conn, bool pending)
{
	struct conn_track *t = http_conn_of(conn);
	if (!t)
		return;
	pthread_mutex_lock(&srv->lock);
	t->pending = pending && !t->upgraded;
	t->since_ms = mono_ms();
	if (pending)
		t->bad_url = NULL;
	pthread_mutex_unlock(&srv->lock);
}

void http_conn_mark_upgraded(struct http_server *srv, struct MHD_Connection *conn)
{
	struct conn_track *t = http_conn_of(conn);
	if (!t)
		return;
	pthread_mutex_lock(&srv->lock);
	t->upgraded = true;
	t->pending = false;
	pthread_mutex_unlock(&srv->lock);
}
