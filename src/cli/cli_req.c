/* cli_req.c: one API request as every subcommand sends it: retried when
 * its outcome is unknown, its failure reported (transport or problem) as
 * the exit status, and a checkpoint named by id or name resolved to its path. */
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include "cli/cli.h"

#define CLI_RETRIES 3

/* Why a unix socket cannot be reached, in ckptd's words rather than curl's. */
static void cli_req_socket_problem(const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0) {
		fprintf(stderr,
			"ckpt: cannot reach ckptd: no socket at %s (%s); is ckptd running with --listen unix:%s? "
			"The shipped unit listens on /run/ckptd/ckptd.sock\n",
			path, strerror(errno), path);
		return;
	}
	if (!S_ISSOCK(st.st_mode)) {
		fprintf(stderr, "ckpt: cannot reach ckptd: %s is not a socket\n", path);
		return;
	}
	fprintf(stderr, "ckpt: cannot reach ckptd: nothing accepts connections on %s; is ckptd running?\n", path);
}

int cli_req_transport(const struct cli_opts *o, const struct cli_reply *r)
{
	switch (r->curl_code) {
	case CURLE_COULDNT_CONNECT:
		if (o->conn.socket_path)
			cli_req_socket_problem(o->conn.socket_path);
		else
			fprintf(stderr,
				"ckpt: cannot reach ckptd: nothing answers at %s; is it running, on that address? "
				"(%s)\n",
				o->conn.base_url, r->errbuf);
		return CKPT_EXIT_CONNECT;
	case CURLE_COULDNT_RESOLVE_HOST:
		fprintf(stderr, "ckpt: cannot reach ckptd: unknown host in %s\n", o->conn.base_url);
		return CKPT_EXIT_CONNECT;
	case CURLE_URL_MALFORMAT:
	case CURLE_UNSUPPORTED_PROTOCOL:
		fprintf(stderr, "ckpt: %s is not a URL ckpt can use (http://HOST:PORT or unix:PATH)\n",
			o->conn.base_url);
		return CKPT_EXIT_USAGE;
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
		/* The request may have reached ckptd: say so, a retry could repeat it. */
		fprintf(stderr,
			"ckpt: ckptd did not finish answering (%s): the outcome is unknown; check with `ckpt list`\n",
			r->errbuf);
		return CKPT_EXIT_CONNECT;
	}
	if (o->conn.socket_path)
		fprintf(stderr, "ckpt: cannot reach ckptd on unix socket %s: %s\n", o->conn.socket_path, r->errbuf);
	else
		fprintf(stderr, "ckpt: cannot reach ckptd at %s: %s\n", o->conn.base_url, r->errbuf);
	return CKPT_EXIT_CONNECT;
}

/* An error answer: the problem document to stdout with --json (scripts parse
 * it), its detail and code to stderr always. */
int cli_req_fail(const struct cli_opts *o, const struct cli_reply *r)
{
	if (o->json)
		cli_out_verbatim(r);
	cli_out_problem(r);
	if (r->status == 401)
		fprintf(stderr,
			o->conn.token ? "hint: the token ckpt sent was refused; check --token-file or CKPTD_TOKEN\n"
				      : "hint: ckptd wants a token: pass --token-file FILE or set CKPTD_TOKEN\n");
	return CKPT_EXIT_SERVER;
}

static bool cli_req_outcome_unknown(int curl_code)
{
	return curl_code == CURLE_OPERATION_TIMEDOUT || curl_code == CURLE_RECV_ERROR ||
		curl_code == CURLE_GOT_NOTHING || curl_code == CURLE_PARTIAL_FILE;
}

static bool cli_req_code_is(const struct cli_reply *r, const char *code)
{
	const char *c = json_string_value(json_object_get(r->json, "code"));
	return c && strcmp(c, code) == 0;
}

/* Send a request; returns -1 when it succeeded (2xx), else the exit status. */
int cli_req_send(const struct cli_opts *o, const char *method, const char *path, json_t *body, struct cli_reply *r,
		 cli_tick_fn tick, void *tick_arg)
{
	if (!path) {
		fprintf(stderr, "ckpt: out of memory\n");
		return CKPT_EXIT_SERVER;
	}
	/* A POST carries the run's Idempotency-Key, so it can be sent again when its
	 * outcome is unknown (the connection broke after sending) or ckptd was busy
	 * (503, or 409 while the first try with this key still runs): the daemon
	 * answers a repeat with the first result instead of doing the work twice. */
	bool retry_ok = strcmp(method, "POST") == 0 && o->conn.idem_key[0];
	int q;
	for (int attempt = 0;; attempt++) {
		q = cli_http_request(&o->conn, method, path, body, r, tick, tick_arg);
		bool unknown = q < 0 && cli_req_outcome_unknown(r->curl_code);
		bool busy = q == 0 &&
			(r->status == 503 || (r->status == 409 && cli_req_code_is(r, "idempotency_in_progress")));
		if (!retry_ok || attempt >= CLI_RETRIES || !(unknown || busy))
			break;
		cli_reply_free(r);
		cli_req_sleep_ms(500L << attempt);
	}
	if (q < 0)
		return cli_req_transport(o, r);
	if (r->status < 200 || r->status > 299)
		return cli_req_fail(o, r);
	return -1;
}

/* The newest checkpoint named name, through the list: the daemon decodes %2F
 * before routing, so a name holding '/' cannot travel in the path. */
static int cli_req_resolve_name(const struct cli_opts *o, const char *name, char **ret_id)
{
	_cli_cleanup_free_ char *path = cli_http_path("/v1/checkpoints?name=", name, "&limit=1000");
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_req_send(o, "GET", path, NULL, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	/* The daemon's rule for names: the newest active checkpoint, else the newest. */
	json_t *all = json_object_get(r.json, "checkpoints"), *c, *pick = json_array_get(all, 0);
	size_t i;
	json_array_foreach (all, i, c) {
		if (strcmp(json_string_value(json_object_get(c, "status")) ?: "", "active") == 0) {
			pick = c;
			break;
		}
	}
	const char *id = json_string_value(json_object_get(pick, "checkpoint_id"));
	if (!id) {
		fprintf(stderr, "ckpt: no checkpoint with id or name '%s' (not_found)\n", name);
		return CKPT_EXIT_SERVER;
	}
	*ret_id = strdup(id);
	return *ret_id ? -1 : CKPT_EXIT_SERVER;
}

/* "/v1/checkpoints/{ref}{suffix}" for an id or a name; -1 on success, else the exit status. */
int cli_req_ref_path(const struct cli_opts *o, const char *ref, const char *suffix, char **ret)
{
	_cli_cleanup_free_ char *id = NULL;
	if (strchr(ref, '/')) {
		int rc = cli_req_resolve_name(o, ref, &id);
		if (rc >= 0)
			return rc;
		ref = id;
	}
	*ret = cli_http_path("/v1/checkpoints/", ref, suffix);
	if (!*ret) {
		fprintf(stderr, "ckpt: out of memory\n");
		return CKPT_EXIT_SERVER;
	}
	return -1;
}

void cli_req_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0)
		;
}
