/* http_conn.c: the per-connection tracker that refuses slow clients
 * (slowloris): a deadline for a request's headers, and eviction of the
 * oldest waiting connections when the limit nears, or when one client
 * address reaches its own limit (struct conn_track). */
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

/* The client's IP address, IPv4 mapped into IPv6 so both compare alike. */
static bool conn_client_addr(struct MHD_Connection *conn, uint8_t addr[16])
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;

	if (sa && sa->sa_family == AF_INET6) {
		memcpy(addr, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
		return true;
	}
	if (!sa || sa->sa_family != AF_INET)
		return false;
	memset(addr, 0, 10);
	addr[10] = addr[11] = 0xff;
	memcpy(addr + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
	return true;
}

/* Caller holds srv->lock; t is not in the list yet. At the limit of t's
 * address, its oldest connection still waiting for headers makes room; when
 * every one is busy with a request, t itself is refused. */
static void conns_make_room_for_client(struct http_server *srv, struct conn_track *t)
{
	struct conn_track *oldest = NULL;
	unsigned n = 0;

	if (!t->has_addr)
		return;
	for (struct conn_track *o = srv->conns; o; o = o->next) {
		if (o->evicted || !o->has_addr || memcmp(o->addr, t->addr, 16))
			continue;
		n++;
		if (o->pending && (!oldest || o->since_ms < oldest->since_ms))
			oldest = o;
	}
	if (n >= srv->opts.per_client_limit)
		conn_evict(srv, oldest ? oldest : t);
}

static void conn_started(struct http_server *srv, struct MHD_Connection *conn, void **socket_context)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	struct conn_track *t;

	if (!ci || !(t = calloc(1, sizeof(*t))))
		return; /* untracked: served, never evicted */
	t->fd = ci->connect_fd;
	t->pending = true;
	t->has_addr = conn_client_addr(conn, t->addr);
	pthread_mutex_lock(&srv->lock);
	t->since_ms = mono_ms();
	conns_make_room(srv, t->since_ms);
	conns_make_room_for_client(srv, t);
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
