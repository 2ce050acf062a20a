/* cli_http.c: requests to ckptd over TCP or a unix socket with libcurl.
 * The multi interface lets a caller animate a spinner while a long,
 * synchronous request (restore) is in flight, without threads. */
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "cli/cli.h"

#define CLI_HTTP_MAX_BODY (64u * 1024 * 1024)
#define CLI_HTTP_TICK_MS 100

static size_t cli_http_write(char *data, size_t size, size_t n, void *arg)
{
	struct cli_reply *r = arg;
	size_t add = size * n;
	if (r->len + add > CLI_HTTP_MAX_BODY)
		return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
	char *nb = realloc(r->body, r->len + add + 1);
	if (!nb)
		return 0;
	memcpy(nb + r->len, data, add);
	r->body = nb;
	r->len += add;
	r->body[r->len] = '\0';
	return add;
}

static struct curl_slist *cli_http_headers(const struct cli_conn *c, const char *method, bool has_body)
{
	struct curl_slist *h = NULL;
	if (c->idem_key[0] && strcmp(method, "POST") == 0) {
		char line[64];
		snprintf(line, sizeof(line), "Idempotency-Key: %s", c->idem_key);
		h = curl_slist_append(h, line);
	}
	h = curl_slist_append(h, "Accept: application/json, application/problem+json");
	/* libcurl would add "Expect: 100-continue" to bodies over 1 KiB: a round trip for nothing. */
	h = curl_slist_append(h, "Expect:");
	if (has_body)
		h = curl_slist_append(h, "Content-Type: application/json");
	if (c->token) {
		_cli_cleanup_free_ char *auth = NULL;
		if (asprintf(&auth, "Authorization: Bearer %s", c->token) >= 0)
			h = curl_slist_append(h, auth);
	}
	return h;
}

static CURL *cli_http_easy(const struct cli_conn *c, const char *method, const char *url, const char *payload,
			   struct curl_slist *hdrs, struct cli_reply *r)
{
	CURL *e = curl_easy_init();
	if (!e)
		return NULL;
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, cli_http_write);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->errbuf);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
	curl_easy_setopt(e, CURLOPT_USERAGENT, "ckpt/" CKPTD_VERSION);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	if (c->socket_path)
		curl_easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, c->socket_path);
	if (payload) {
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, payload);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(payload));
	} else if (strcmp(method, "HEAD") == 0) {
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	}
	return e;
}

/* Drive one easy handle to completion, ticking between polls. */
static CURLcode cli_http_run(CURL *e, cli_tick_fn tick, void *tick_arg)
{
	CURLM *m = curl_multi_init();
	if (!m)
		return CURLE_OUT_OF_MEMORY;
	CURLcode res = CURLE_OK;
	curl_multi_add_handle(m, e);
	for (;;) {
		int running = 0;
		CURLMcode mc = curl_multi_perform(m, &running);
		if (mc != CURLM_OK) {
			res = CURLE_RECV_ERROR;
			break;
		}
		if (!running) {
			int left;
			CURLMsg *msg = curl_multi_info_read(m, &left);
			res = msg && msg->msg == CURLMSG_DONE ? msg->data.result : CURLE_RECV_ERROR;
			break;
		}
		curl_multi_poll(m, NULL, 0, CLI_HTTP_TICK_MS, NULL);
		if (tick)
			tick(tick_arg);
	}
	curl_multi_remove_handle(m, e);
	curl_multi_cleanup(m);
	return res;
}

static void cli_http_parse(struct cli_reply *r)
{
	if (!r->body || r->len == 0)
		return;
	r->json = json_loadb(r->body, r->len, JSON_DECODE_ANY, NULL);
}

/* The status (also of a transfer cut midway), the error text, cleanup. */
static int cli_http_finish(CURL *e, struct curl_slist *hdrs, CURLcode res, struct cli_reply *r)
{
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
	if (res != CURLE_OK && !r->errbuf[0])
		snprintf(r->errbuf, sizeof(r->errbuf), "%s", curl_easy_strerror(res));
	curl_easy_cleanup(e);
	curl_slist_free_all(hdrs);
	if (res != CURLE_OK) {
		r->curl_code = (int)res;
		return -EIO;
	}
	cli_http_parse(r);
	return 0;
}

int cli_http_request(const struct cli_conn *c, const char *method, const char *path, json_t *body, struct cli_reply *r,
		     cli_tick_fn tick, void *tick_arg)
{
	memset(r, 0, sizeof(*r));
	_cli_cleanup_free_ char *payload = body ? json_dumps(body, JSON_COMPACT) : NULL;
	_cli_cleanup_free_ char *url = NULL;
	if ((body && !payload) || asprintf(&url, "%s%s", c->base_url, path) < 0) {
		snprintf(r->errbuf, sizeof(r->errbuf), "out of memory");
		return -ENOMEM;
	}
	struct curl_slist *hdrs = cli_http_headers(c, method, payload != NULL);
	CURL *e = cli_http_easy(c, method, url, payload, hdrs, r);
	if (!e) {
		curl_slist_free_all(hdrs);
		snprintf(r->errbuf, sizeof(r->errbuf), "cannot initialise libcurl");
		return -ENOMEM;
	}
	return cli_http_finish(e, hdrs, cli_http_run(e, tick, tick_arg), r);
}

/* A transfer with files: the request body read from in_fd (in_size bytes),
 * a 2xx answer's body written to out_fd; any other answer lands in r. */
struct cli_http_xfer {
	CURL *e;
	struct cli_reply *r;
	int in_fd, out_fd;
	cli_xfer_fn fn;
	void *arg;
	bool write_failed;
};

static size_t cli_http_xfer_write(char *data, size_t size, size_t n, void *arg)
{
	struct cli_http_xfer *x = arg;
	long status = 0;
	curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &status);
	if (status < 200 || status > 299 || x->out_fd < 0)
		return cli_http_write(data, size, n, x->r);
	for (size_t done = 0; done < size * n;) {
		ssize_t k = write(x->out_fd, data + done, size * n - done);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			x->write_failed = true;
			return 0;
		}
		done += (size_t)k;
	}
	return size * n;
}

static size_t cli_http_xfer_read(char *buf, size_t size, size_t n, void *arg)
{
	struct cli_http_xfer *x = arg;
	ssize_t k;
	while ((k = read(x->in_fd, buf, size * n)) < 0 && errno == EINTR)
		;
	return k < 0 ? CURL_READFUNC_ABORT : (size_t)k;
}

static int cli_http_xfer_info(void *arg, curl_off_t dl_total, curl_off_t dl, curl_off_t ul_total, curl_off_t ul)
{
	struct cli_http_xfer *x = arg;
	(void)dl_total;
	if (x->fn)
		x->fn(x->arg, (uint64_t)dl, (uint64_t)ul, (uint64_t)ul_total);
	return 0;
}

int cli_http_file(const struct cli_conn *c, const char *method, const char *path, int in_fd, uint64_t in_size,
		  int out_fd, struct cli_reply *r, cli_xfer_fn fn, cli_tick_fn tick, void *arg)
{
	memset(r, 0, sizeof(*r));
	_cli_cleanup_free_ char *url = NULL;
	if (asprintf(&url, "%s%s", c->base_url, path) < 0) {
		snprintf(r->errbuf, sizeof(r->errbuf), "out of memory");
		return -ENOMEM;
	}
	struct curl_slist *hdrs = cli_http_headers(c, method, false);
	if (in_fd >= 0)
		hdrs = curl_slist_append(hdrs, "Content-Type: application/zstd");
	CURL *e = cli_http_easy(c, method, url, NULL, hdrs, r);
	struct cli_http_xfer x = { .e = e, .r = r, .in_fd = in_fd, .out_fd = out_fd, .fn = fn, .arg = arg };
	if (!e) {
		curl_slist_free_all(hdrs);
		snprintf(r->errbuf, sizeof(r->errbuf), "cannot initialise libcurl");
		return -ENOMEM;
	}
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, cli_http_xfer_write);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, cli_http_xfer_info);
	curl_easy_setopt(e, CURLOPT_XFERINFODATA, &x);
	if (in_fd >= 0) {
		curl_easy_setopt(e, CURLOPT_POST, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, cli_http_xfer_read);
		curl_easy_setopt(e, CURLOPT_READDATA, &x);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)in_size);
	}
	CURLcode res = cli_http_run(e, tick, arg);
	if (x.write_failed)
		snprintf(r->errbuf, sizeof(r->errbuf), "cannot write the output file: %s", strerror(errno));
	return cli_http_finish(e, hdrs, res, r);
}

void cli_reply_free(struct cli_reply *r)
{
	free(r->body);
	r->body = NULL;
	json_decref(r->json);
	r->json = NULL;
}

char *cli_http_path(const char *prefix, const char *segment, const char *suffix)
{
	/* Names may hold any printable character ('/', '?', '%', spaces). */
	char *esc = curl_easy_escape(NULL, segment, 0);
	char *out = NULL;
	if (esc && asprintf(&out, "%s%s%s", prefix, esc, suffix ? suffix : "") < 0)
		out = NULL;
	curl_free(esc);
	return out;
}
