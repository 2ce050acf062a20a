/* http_route.c: from a request to its handler: the URL's decoding, the
 * route table's match, the checks before a handler runs (token, peer,
 * content type, method) and the call itself. */
#include "http/http_internal.h"

const char *http_query(const struct http_request *req, const char *key)
{
	return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *http_header(const struct http_request *req, const char *key)
{
	return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, key);
}

/* "/v1/checkpoints/{id}" against "/v1/checkpoints/cp_1": segment by segment. */
bool http_route_match(const char *pattern, const char *path, struct http_request *req)
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

/* "203.0.113.7", "[2001:db8::1]" or "unix" for the logs. */
const char *http_route_peer(void *conn, char *buf, size_t len)
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

bool http_route_authorized(struct http_server *srv, const struct http_request *req)
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

void http_route_dispatch(struct http_server *srv, struct http_request *req, struct http_response *resp)
{
	const struct http_route *match = NULL;
	bool path_known = false;
	char allow[64] = "";
	bool literal = false; /* "/v1/checkpoints/import" is not checkpoint "import" */

	for (size_t i = 0; i < srv->opts.n_routes; i++)
		literal |= !strchr(srv->opts.routes[i].pattern, '{') &&
			http_route_match(srv->opts.routes[i].pattern, req->path, req);
	for (size_t i = 0; i < srv->opts.n_routes; i++) {
		const struct http_route *r = &srv->opts.routes[i];
		if ((literal && strchr(r->pattern, '{')) || !http_route_match(r->pattern, req->path, req))
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
	if (!match->public_ && !http_route_authorized(srv, req)) {
		char peer[64];
		log_warn("refused %s %s from %s: %s bearer token", req->method, req->path,
			 http_route_peer(req->conn, peer, sizeof(peer)),
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
size_t http_route_unescape(void *cls, struct MHD_Connection *conn, char *s)
{
	size_t len;
	const char *bad = http_url_decode(s, &len);
	(void)cls;
	struct conn_track *t = bad ? http_conn_of(conn) : NULL;
	if (t && !t->bad_url)
		t->bad_url = bad;
	return len;
}
