/* cli_cmd.c: the ckpt subcommands. Each sends one API request (create with a
 * progress bar polls), prints the answer, and returns the exit status. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "cli/cli.h"

#define CLI_POLL_MS 100

static void cli_cmd_reply_freep(struct cli_reply *r)
{
	cli_reply_free(r);
}
#define _cleanup_reply_ __attribute__((cleanup(cli_cmd_reply_freep)))

static int cli_cmd_transport(const struct cli_opts *o, const struct cli_reply *r)
{
	if (o->conn.socket_path)
		fprintf(stderr, "ckpt: cannot reach ckptd on unix socket %s: %s\n", o->conn.socket_path, r->errbuf);
	else
		fprintf(stderr, "ckpt: cannot reach ckptd at %s: %s\n", o->conn.base_url, r->errbuf);
	return CKPT_EXIT_CONNECT;
}

/* An error answer: the problem document to stdout with --json (scripts parse
 * it), its detail and code to stderr always. */
static int cli_cmd_fail(const struct cli_opts *o, const struct cli_reply *r)
{
	if (o->json)
		cli_out_verbatim(r);
	cli_out_problem(r);
	return CKPT_EXIT_SERVER;
}

/* Send a request; returns -1 when it succeeded (2xx), else the exit status. */
static int cli_cmd_send(const struct cli_opts *o, const char *method, const char *path, json_t *body,
			struct cli_reply *r, cli_tick_fn tick, void *tick_arg)
{
	if (!path) {
		fprintf(stderr, "ckpt: out of memory\n");
		return CKPT_EXIT_SERVER;
	}
	if (cli_http_request(&o->conn, method, path, body, r, tick, tick_arg) < 0)
		return cli_cmd_transport(o, r);
	if (r->status < 200 || r->status > 299)
		return cli_cmd_fail(o, r);
	return -1;
}

/* Success: the body verbatim with --json, else the human form when it parsed. */
static int cli_cmd_print(const struct cli_opts *o, const struct cli_reply *r, void (*human)(json_t *))
{
	if (o->json) {
		cli_out_verbatim(r);
		return CKPT_EXIT_OK;
	}
	if (!json_is_object(r->json)) {
		fprintf(stderr, "ckpt: unexpected answer from ckptd (HTTP %ld, not a JSON object)\n", r->status);
		return CKPT_EXIT_SERVER;
	}
	human(r->json);
	return CKPT_EXIT_OK;
}

static json_t *cli_cmd_create_body(const struct cli_opts *o, const char *name, bool async)
{
	json_t *b = json_pack("{s:s}", "name", name);
	if (!b)
		return NULL;
	if (o->has_ttl)
		json_object_set_new(b, "ttl_secs", json_integer(o->ttl_secs));
	if (json_object_size(o->labels))
		json_object_set(b, "labels", o->labels);
	if (async)
		json_object_set_new(b, "async", json_true());
	return b;
}

/* The newest checkpoint named name, through the list: the daemon decodes %2F
 * before routing, so a name holding '/' cannot travel in the path. */
static int cli_cmd_resolve_name(const struct cli_opts *o, const char *name, char **ret_id)
{
	_cli_cleanup_free_ char *path = cli_http_path("/v1/checkpoints?name=", name, "&limit=1000");
	_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_cmd_send(o, "GET", path, NULL, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	/* The daemon's rule for names: the newest active checkpoint, else the newest. */
	json_t *all = json_object_get(r.json, "checkpoints"), *c, *pick = json_array_get(all, 0);
	size_t i;
	json_array_foreach(all, i, c)
	{
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
static int cli_cmd_ref_path(const struct cli_opts *o, const char *ref, const char *suffix, char **ret)
{
	_cli_cleanup_free_ char *id = NULL;
	if (strchr(ref, '/')) {
		int rc = cli_cmd_resolve_name(o, ref, &id);
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

static void cli_cmd_created(json_t *r)
{
	char sz[32];
	const char *status = json_string_value(json_object_get(r, "status"));
	const char *id = json_string_value(json_object_get(r, "checkpoint_id"));
	const char *name = json_string_value(json_object_get(r, "name"));
	if (status && strcmp(status, "creating") == 0) {
		printf("Creating %s \"%s\" in the background; see `ckpt show %s`\n", id ? id : "?", name ? name : "",
		       id ? id : "?");
		return;
	}
	json_int_t size = json_integer_value(json_object_get(r, "size_bytes"));
	printf("Created %s \"%s\" (%s in %" PRId64 " ms)\n", id ? id : "?", name ? name : "",
	       cli_out_size(size > 0 ? (uint64_t)size : 0, sz, sizeof(sz)),
	       (int64_t)json_integer_value(json_object_get(r, "duration_ms")));
}

static void cli_cmd_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0)
		;
}

/* The last frame shows completion: totals from the last progress seen, or the size. */
static void cli_cmd_final_frame(struct cli_progress *p, json_t *last, json_t *record)
{
	json_int_t bt = json_integer_value(json_object_get(last, "bytes_total"));
	json_int_t ft = json_integer_value(json_object_get(last, "files_total"));
	json_int_t size = json_integer_value(json_object_get(record, "size_bytes"));
	if (bt <= 0)
		bt = size;
	if (bt <= 0 && ft <= 0)
		bt = 1; /* an empty tree: still a full bar */
	json_t *done = json_pack("{s:I,s:I,s:I,s:I}", "bytes_done", (json_int_t)bt, "bytes_total", (json_int_t)bt,
				 "files_done", ft, "files_total", ft);
	cli_progress_bar(p, done);
	json_decref(done);
	cli_progress_end(p, true);
}

/* One poll of a creating checkpoint: 0 still creating, 1 done, else an exit status + 2. */
static int cli_cmd_poll_once(const struct cli_opts *o, const char *path, struct cli_progress *p, json_t **last,
			     struct cli_reply *r)
{
	int rc = cli_cmd_send(o, "GET", path, NULL, r, NULL, NULL);
	if (rc >= 0) {
		cli_progress_end(p, false);
		if (r->status == 404)
			fprintf(stderr, "ckpt: the checkpoint is gone: its creation failed (see the ckptd log)\n");
		return rc + 2;
	}
	const char *status = json_string_value(json_object_get(r->json, "status"));
	json_t *prog = json_object_get(r->json, "progress");
	if (status && strcmp(status, "creating") == 0) {
		if (json_is_object(prog)) {
			json_decref(*last);
			*last = json_incref(prog);
		}
		cli_progress_bar(p, *last);
		return 0;
	}
	if (status && strcmp(status, "active") == 0) {
		cli_cmd_final_frame(p, *last, r->json);
		return 1;
	}
	cli_progress_end(p, false);
	json_t *error = json_object_get(r->json, "error");
	const char *why = json_string_value(json_object_get(error, "detail"));
	const char *code = json_string_value(json_object_get(error, "code"));
	fprintf(stderr, "ckpt: checkpoint creation ended in state \"%s\": %s (%s)\n", status ? status : "?",
		why ? why : "no reason given", code ? code : "no code");
	return CKPT_EXIT_SERVER + 2;
}

/* Poll GET /v1/checkpoints/{id} until the checkpoint leaves "creating". */
static int cli_cmd_follow(const struct cli_opts *o, json_t *accepted)
{
	const char *id = json_string_value(json_object_get(accepted, "checkpoint_id"));
	const char *name = json_string_value(json_object_get(accepted, "name"));
	_cli_cleanup_free_ char *path = id ? cli_http_path("/v1/checkpoints/", id, NULL) : NULL;
	_cli_cleanup_free_ char *label = NULL;
	if (!path || asprintf(&label, "creating \"%s\"", name ? name : id) < 0) {
		fprintf(stderr, "ckpt: unexpected answer to an async create (no checkpoint_id)\n");
		return CKPT_EXIT_SERVER;
	}
	struct cli_progress p;
	cli_progress_start(&p, label);
	json_t *last = json_incref(json_object_get(accepted, "progress"));
	cli_progress_bar(&p, last);
	for (;;) {
		cli_cmd_sleep_ms(CLI_POLL_MS);
		_cleanup_reply_ struct cli_reply r = { 0 };
		int rc = cli_cmd_poll_once(o, path, &p, &last, &r);
		if (rc == 0)
			continue;
		json_decref(last);
		if (rc == 1)
			cli_cmd_created(r.json);
		return rc == 1 ? CKPT_EXIT_OK : rc - 2;
	}
}

int cli_cmd_create(const struct cli_opts *o, const char *name)
{
	/* A bar only for a person watching: a tty, no --json, and not --async. */
	bool bar = o->tty && !o->json && !o->async;
	json_auto_t *body = cli_cmd_create_body(o, name, o->async || bar);
	_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_cmd_send(o, "POST", "/v1/checkpoints", body, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	if (bar && r.status == 202 && json_is_object(r.json))
		return cli_cmd_follow(o, r.json);
	return cli_cmd_print(o, &r, cli_cmd_created);
}

static void cli_cmd_list_human(json_t *body)
{
	cli_out_table(json_object_get(body, "checkpoints"));
}

/* Append the pages after the first reply's to its "checkpoints"; -1 when
 * all are in, else the exit status. */
static int cli_cmd_list_rest(const struct cli_opts *o, const char *first_path, json_t *body)
{
	json_t *all = json_object_get(body, "checkpoints");
	while (json_is_string(json_object_get(body, "next_page_token")) && json_is_array(all)) {
		const char *token = json_string_value(json_object_get(body, "next_page_token"));
		_cli_cleanup_free_ char *path = cli_http_path(first_path, token, NULL);
		_cleanup_reply_ struct cli_reply r = { 0 };
		int rc = path ? cli_cmd_send(o, "GET", path, NULL, &r, NULL, NULL) : CKPT_EXIT_SERVER;
		if (rc >= 0)
			return rc;
		json_array_extend(all, json_object_get(r.json, "checkpoints"));
		json_object_set(body, "next_page_token", json_object_get(r.json, "next_page_token") ?: json_null());
	}
	json_object_del(body, "next_page_token");
	return -1;
}

int cli_cmd_list(const struct cli_opts *o, const char *unused __attribute__((unused)))
{
	/* pages of the server's default size */
	_cli_cleanup_free_ char *filter = o->name_filter ? cli_http_path("?name=", o->name_filter, "&") : strdup("?");
	_cli_cleanup_free_ char *path = NULL, *next = NULL;
	_cleanup_reply_ struct cli_reply r = { 0 };
	if (!filter || asprintf(&path, "/v1/checkpoints%.*s", (int)strlen(filter) - 1, filter) < 0 ||
	    asprintf(&next, "/v1/checkpoints%spage_token=", filter) < 0)
		return CKPT_EXIT_SERVER;
	int rc = cli_cmd_send(o, "GET", path, NULL, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	if (!json_is_string(json_object_get(r.json, "next_page_token")))
		return cli_cmd_print(o, &r, cli_cmd_list_human); /* one page: the answer verbatim */
	if ((rc = cli_cmd_list_rest(o, next, r.json)) >= 0)
		return rc;
	if (o->json) {
		json_dumpf(r.json, stdout, JSON_COMPACT);
		putchar('\n');
	} else {
		cli_cmd_list_human(r.json);
	}
	return CKPT_EXIT_OK;
}

int cli_cmd_show(const struct cli_opts *o, const char *id)
{
	_cli_cleanup_free_ char *path = NULL;
	_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_cmd_ref_path(o, id, NULL, &path);
	if (rc < 0)
		rc = cli_cmd_send(o, "GET", path, NULL, &r, NULL, NULL);
	return rc >= 0 ? rc : cli_cmd_print(o, &r, cli_out_record);
}

int cli_cmd_delete(const struct cli_opts *o, const char *id)
{
	_cli_cleanup_free_ char *path = NULL;
	_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_cmd_ref_path(o, id, NULL, &path);
	if (rc < 0)
		rc = cli_cmd_send(o, "DELETE", path, NULL, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	if (o->json)
		cli_out_verbatim(&r); /* 204: nothing */
	else
		printf("Deleted %s\n", id);
	return CKPT_EXIT_OK;
}

#define CLI_WATCH_MS 250

/* A restore in flight: the API answers only at the end, but the record shows
 * the backend's progress meanwhile (tar), so the tick polls it for a bar and
 * falls back to a spinner when there is nothing to show. */
struct cli_watch {
	const struct cli_opts *o;
	const char *record_path;
	struct cli_progress p;
	int64_t polled_ms;
	json_t *progress; /* last seen with totals, or NULL */
};

static void cli_cmd_watch_poll(struct cli_watch *w)
{
	_cleanup_reply_ struct cli_reply r = { 0 };
	w->polled_ms = cli_progress_now_ms();
	if (cli_http_request(&w->o->conn, "GET", w->record_path, NULL, &r, NULL, NULL) < 0 || r.status != 200)
		return;
	json_t *prog = json_object_get(r.json, "progress");
	if (json_integer_value(json_object_get(prog, "bytes_total")) > 0 ||
	    json_integer_value(json_object_get(prog, "files_total")) > 0) {
		json_decref(w->progress);
		w->progress = json_incref(prog);
	}
}

static void cli_cmd_watch_tick(void *arg)
{
	struct cli_watch *w = arg;
	if (cli_progress_now_ms() - w->polled_ms >= CLI_WATCH_MS)
		cli_cmd_watch_poll(w);
	if (w->progress)
		cli_progress_bar(&w->p, w->progress);
	else
		cli_progress_spin(&w->p);
}

int cli_cmd_restore(const struct cli_opts *o, const char *id)
{
	json_auto_t *body = json_object();
	if (o->force)
		json_object_set_new(body, "force", json_true());
	if (o->if_expired)
		json_object_set_new(body, "if_expired", json_string(o->if_expired));
	_cli_cleanup_free_ char *path = NULL;
	int rc = cli_cmd_ref_path(o, id, "/restore", &path);
	if (rc >= 0)
		return rc;
	_cli_cleanup_free_ char *label = NULL, *record_path = NULL;
	if (asprintf(&label, "restoring %s", id) < 0)
		label = NULL;
	record_path = strndup(path, strlen(path) - strlen("/restore"));
	bool watch = o->tty && !o->json && label && record_path;
	struct cli_watch w = { .o = o, .record_path = record_path, .polled_ms = cli_progress_now_ms() };
	cli_progress_start(&w.p, label);
	if (watch)
		cli_progress_spin(&w.p);
	_cleanup_reply_ struct cli_reply r = { 0 };
	rc = cli_cmd_send(o, "POST", path, body, &r, watch ? cli_cmd_watch_tick : NULL, &w);
	cli_progress_end(&w.p, false);
	json_decref(w.progress);
	if (rc >= 0)
		return rc;
	rc = cli_cmd_print(o, &r, cli_out_restore);
	if (rc == CKPT_EXIT_OK && json_is_false(json_object_get(r.json, "ok"))) {
		fprintf(stderr, "ckpt: restore of %s reported failures\n", id);
		return CKPT_EXIT_SERVER;
	}
	return rc;
}

int cli_cmd_health(const struct cli_opts *o, const char *unused __attribute__((unused)))
{
	_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_cmd_send(o, "GET", "/v1/health", NULL, &r, NULL, NULL);
	return rc >= 0 ? rc : cli_cmd_print(o, &r, cli_out_health);
}
