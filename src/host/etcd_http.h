/* etcd_http.h: the transport of locks_etcd.c to etcd's v3 JSON gateway.
 * POSTs over http or https (a CA file to verify etcd, a client certificate
 * and key), tried on each endpoint in turn, the one that answered last first.
 * With a user, a token from /v3/auth/authenticate rides in the Authorization
 * header and is fetched again when etcd answers that it expired or is
 * invalid. The password and the token never reach a log or an error. */
#pragma once
#include <curl/curl.h>
#include <jansson.h>
#include "lib/util.h"

struct etcd_http;

struct etcd_http_conf {
	char *const *endpoints; /* "http://HOST:PORT" or "https://HOST:PORT" */
	size_t n;
	const char *ca_file;   /* NULL: the system's CAs */
	const char *cert_file; /* client certificate, with key_file; NULL: none */
	const char *key_file;
	const char *user; /* NULL: no etcd authentication */
	const char *password;
};

/* A growing response body, NUL-terminated, bounded. */
struct etcd_http_buf {
	char *p;
	size_t len;
};
/* A CURLOPT_WRITEFUNCTION appending to the etcd_http_buf in its arg. */
size_t etcd_http_collect(char *data, size_t size, size_t nmemb, void *arg);

/* Check and copy conf (endpoints must be http:// or https://). */
int etcd_http_new(const struct etcd_http_conf *conf, struct etcd_http **ret, ckpt_error *err);
void etcd_http_free(struct etcd_http *H);
size_t etcd_http_endpoints(const struct etcd_http *H);
/* With a user: get a token now, so that a wrong password stops the start
 * with a clear error. 0 without a user. */
int etcd_http_login(struct etcd_http *H, ckpt_error *err);
/* POST body (stolen) to path: 0 with *ret the JSON answer; -EIO when no
 * endpoint answered well (etcd_http_why says why). */
int etcd_http_call(struct etcd_http *H, const char *path, json_t *body, json_t **ret);
/* A streaming POST of body to path on endpoint at (modulo their number):
 * write(data, 1, n, arg) gets the stream, xfer(xarg, ...) may stop it. */
CURLcode etcd_http_stream(struct etcd_http *H, size_t at, const char *path, const char *body, curl_write_callback write,
			  void *arg, curl_xferinfo_callback xfer, void *xarg);
/* The stream's answer carried message: if it says the token is stale, drop
 * it so the next request logs in again. */
void etcd_http_stream_error(struct etcd_http *H, const char *message);
/* The last failure, in words (no credentials): for the error at start. */
void etcd_http_why(struct etcd_http *H, char *buf, size_t len);
