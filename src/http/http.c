/* http.c: libmicrohttpd transport. One thread per connection, so a long create
 * or restore never holds up other requests; bodies are read into a capped
 * buffer and the handler runs on the final call. This file holds the
 * listeners and a request's life; http_internal.h says which file does the
 * rest. */
#include "http/http_internal.h"

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
		http_conn_set_pending(srv, conn, false);
		struct conn_track *t = http_conn_of(conn);
		if (t && t->bad_url) {
			http_problem(&resp, 400, "invalid_field", "the URL holds %s (after %%-decoding)", t->bad_url);
			return http_reply_now(conn, srv, &resp);
		}
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if ((ctx->spool = http_body_wants_spool(srv, conn, url, method))) {
			if (cl && strtoull(cl, NULL, 10) > srv->opts.max_spool_bytes) {
				ctx->too_large = true;
				http_problem(&resp, 413, NULL, "request body over %llu bytes (max_import_bytes)",
					     (unsigned long long)srv->opts.max_spool_bytes);
				return http_reply_now(conn, srv, &resp);
			}
			if ((ctx->spool_fd = http_body_spool_open(srv->opts.spool_dir)) < 0) {
				http_problem(&resp, 500, NULL, "cannot spool the request body: %m");
				return http_reply_now(conn, srv, &resp);
			}
			return MHD_YES;
		}
		if (cl && strtoull(cl, NULL, 10) > HTTP_MAX_BODY) {
			ctx->too_large = true;
			http_problem(&resp, 413, NULL, "request body over %d bytes", HTTP_MAX_BODY);
			return http_reply_now(conn, srv, &resp);
		}
		return MHD_YES;
	}
	if (*upload_size)
		sha256_update(&ctx->hash, *upload_size, (const uint8_t *)upload);
	if (*upload_size && ctx->spool) {
		if (!ctx->too_large && ctx->spool_len + *upload_size > srv->opts.max_spool_bytes)
			ctx->too_large = true;
		if (!ctx->too_large && ctx->spool_fd >= 0 && !http_body_spool_write(ctx, upload, *upload_size)) {
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
		return http_reply_now(conn, srv, &resp);
	}
	if (ctx->too_large) {
		http_problem(&resp, 413, NULL, "request body over %d bytes", HTTP_MAX_BODY);
		return http_reply_now(conn, srv, &resp);
	}
	struct http_request req = { .method = method,
				    .path = url,
				    .body = ctx->body,
				    .body_len = ctx->len,
				    .conn = conn,
				    .body_fd = -1,
				    .server = srv };
	if (ctx->spool && ctx->spool_fd >= 0 && lseek(ctx->spool_fd, 0, SEEK_SET) == 0)
		req.body_fd = ctx->spool_fd, req.body_len = ctx->spool_len;
	uint8_t digest[SHA256_DIGEST_SIZE];
	sha256_digest(&ctx->hash, sizeof(digest), digest);
	for (size_t i = 0; i < sizeof(digest); i++)
		snprintf(req.body_sha256 + 2 * i, 3, "%02x", digest[i]);
	int64_t t0 = mono_ms();
	http_route_dispatch(srv, &req, &resp);
	if (log_is_verbose()) { /* one access line per request */
		char peer[64];
		log_info("%s %s %d %lld ms %zu bytes in, from %s", method, url, resp.status,
			 (long long)(mono_ms() - t0), req.body_len, http_route_peer(conn, peer, sizeof(peer)));
	}
	if (resp.status == 101 && resp.upgrade)
		http_conn_mark_upgraded(srv, conn);
	ctx->after = resp.after;
	ctx->after_arg = resp.after_arg;
	return http_reply_now(conn, srv, &resp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct req_ctx *ctx = *con_cls;
	(void)toe;
	if (ctx && ctx->after) /* before the connection counts as idle */
		ctx->after(ctx->after_arg);
	http_conn_set_pending(cls, conn, true);
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
	s->mhd[s->n] = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
					MHD_OPTION_CONNECTION_TIMEOUT, s->opts.conn_timeout_s,
					MHD_OPTION_CONNECTION_LIMIT, s->opts.conn_limit, MHD_OPTION_NOTIFY_CONNECTION,
					http_conn_notify, s, MHD_OPTION_UNESCAPE_CALLBACK, http_route_unescape, s,
					MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
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
	http_reply_upgrades_stopped(false); /* one server at a time in a process */
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
	http_reply_upgrades_stopped(true);
	for (size_t i = 0; i < s->n; i++) {
		MHD_stop_daemon(s->mhd[i]);
		if (s->unix_paths[i])
			unlink(s->unix_paths[i]);
		free(s->unix_paths[i]);
	}
	pthread_mutex_destroy(&s->lock);
	free(s);
}
