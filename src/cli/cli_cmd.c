/* cli_cmd.c: the ckpt subcommands on checkpoints. Each sends one API request
 * (cli_req.c; create with a progress bar polls), prints the answer, and
 * returns the exit status. */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "cli/cli.h"

#define CLI_POLL_MS 100

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

static bool cli_cmd_quiet;

static void cli_cmd_created(json_t *r)
{
	char sz[32];
	if (cli_cmd_quiet) {
		puts(json_string_value(json_object_get(r, "checkpoint_id")) ?: "");
		return;
	}
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
	json_auto_t *done = json_pack("{s:I,s:I,s:I,s:I}", "bytes_done", (json_int_t)bt, "bytes_total", (json_int_t)bt,
				      "files_done", ft, "files_total", ft);
	cli_progress_bar(p, done);
	cli_progress_end(p, true);
}

/* One poll of a creating checkpoint: 0 still creating, 1 done, else an exit status + 2. */
static int cli_cmd_poll_once(const struct cli_opts *o, const char *path, struct cli_progress *p, json_t **last,
			     struct cli_reply *r)
{
	int rc = cli_req_send(o, "GET", path, NULL, r, NULL, NULL);
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

/* Ctrl-C stops ckpt, not the create: say so, and how to follow it. The text
 * is made before the signal can come; the handler only writes it. */
static char cli_cmd_sigint_msg[512];

static void cli_cmd_on_sigint(int sig)
{
	(void)sig;
	ssize_t n = write(STDERR_FILENO, cli_cmd_sigint_msg, strlen(cli_cmd_sigint_msg));
	(void)n;
	_exit(130);
}

static void cli_cmd_sigint_say(const char *fmt, const char *a, const char *b)
{
	snprintf(cli_cmd_sigint_msg, sizeof(cli_cmd_sigint_msg), fmt, a, b);
	struct sigaction sa = { .sa_handler = cli_cmd_on_sigint };
	sigaction(SIGINT, &sa, NULL);
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
	cli_cmd_sigint_say("\nckpt: interrupted; ckptd goes on creating %s in the background: "
			   "`ckpt show %s` follows it\n",
			   id, id);
	cli_progress_start(&p, label);
	json_t *last = json_incref(json_object_get(accepted, "progress"));
	cli_progress_bar(&p, last);
	for (;;) {
		cli_req_sleep_ms(CLI_POLL_MS);
		_cli_cleanup_reply_ struct cli_reply r = { 0 };
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
	bool bar = o->tty && !o->json && !o->async && !o->quiet;
	cli_cmd_quiet = o->quiet;
	cli_cmd_sigint_say("\nckpt: interrupted; ckptd may still be creating \"%s\" in the background: "
			   "`ckpt list --name %s` shows it\n",
			   name, name);
	json_auto_t *body = cli_cmd_create_body(o, name, o->async || bar);
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_req_send(o, "POST", "/v1/checkpoints", body, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	if (bar && r.status == 202 && json_is_object(r.json))
		return cli_cmd_follow(o, r.json);
	return cli_cmd_print(o, &r, cli_cmd_created);
}

static void cli_cmd_list_human(json_t *body)
{
	json_t *all = json_object_get(body, "checkpoints"), *c;
	size_t i;
	if (cli_cmd_quiet) {
		json_array_foreach (all, i, c)
			puts(json_string_value(json_object_get(c, "checkpoint_id")) ?: "");
		return;
	}
	if (json_array_size(all) == 0) {
		puts("No checkpoints.");
		return;
	}
	cli_out_table(all);
}

/* Append the pages after the first reply's to its "checkpoints"; -1 when
 * all are in, else the exit status. */
static int cli_cmd_list_rest(const struct cli_opts *o, const char *first_path, json_t *body)
{
	json_t *all = json_object_get(body, "checkpoints");
	while (json_is_string(json_object_get(body, "next_page_token")) && json_is_array(all)) {
		const char *token = json_string_value(json_object_get(body, "next_page_token"));
		_cli_cleanup_free_ char *path = cli_http_path(first_path, token, NULL);
		_cli_cleanup_reply_ struct cli_reply r = { 0 };
		int rc = path ? cli_req_send(o, "GET", path, NULL, &r, NULL, NULL) : CKPT_EXIT_SERVER;
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
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	cli_cmd_quiet = o->quiet;
	if (!filter || asprintf(&path, "/v1/checkpoints%.*s", (int)strlen(filter) - 1, filter) < 0 ||
	    asprintf(&next, "/v1/checkpoints%spage_token=", filter) < 0)
		return CKPT_EXIT_SERVER;
	int rc = cli_req_send(o, "GET", path, NULL, &r, NULL, NULL);
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
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_req_ref_path(o, id, NULL, &path);
	if (rc < 0)
		rc = cli_req_send(o, "GET", path, NULL, &r, NULL, NULL);
	return rc >= 0 ? rc : cli_cmd_print(o, &r, cli_out_record);
}

int cli_cmd_delete(const struct cli_opts *o, const char *ref)
{
	_cli_cleanup_free_ char *path = NULL, *id_path = NULL;
	_cli_cleanup_reply_ struct cli_reply rec = { 0 }, r = { 0 };
	/* The record first: a name means one checkpoint, and the output names it by id. */
	int rc = cli_req_ref_path(o, ref, NULL, &path);
	if (rc < 0)
		rc = cli_req_send(o, "GET", path, NULL, &rec, NULL, NULL);
	if (rc >= 0)
		return rc;
	const char *id = json_string_value(json_object_get(rec.json, "checkpoint_id"));
	id_path = id ? cli_http_path("/v1/checkpoints/", id, NULL) : NULL;
	rc = cli_req_send(o, "DELETE", id_path ? id_path : path, NULL, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	if (o->json)
		cli_out_verbatim(&r); /* 204: nothing */
	else if (o->quiet)
		puts(id ? id : ref);
	else
		printf("Deleted %s\n", id ? id : ref);
	return CKPT_EXIT_OK;
}

#define CLI_WATCH_MS 250

/* A restore in flight: the API answers only at the end, but the record shows
 * the backend's progress meanwhile (tar), so the tick polls it for a bar and
 * falls back to a spinner when there is nothing to show. */
static void cli_cmd_watch_poll(struct cli_watch *w)
{
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
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

void cli_cmd_watch_tick(void *arg)
{
	struct cli_watch *w = arg;
	if (cli_progress_now_ms() - w->polled_ms >= CLI_WATCH_MS)
		cli_cmd_watch_poll(w);
	if (w->progress)
		cli_progress_bar(&w->p, w->progress);
	else
		cli_progress_spin(&w->p);
}

/* What a restore would do, from the record: nothing is changed. */
static void cli_cmd_restore_preview(json_t *rec, FILE *out)
{
	char when[40];
	fprintf(out, "Restore would roll every managed root back to %s \"%s\" (created %s, %s)\n",
		json_string_value(json_object_get(rec, "checkpoint_id")) ?: "?",
		json_string_value(json_object_get(rec, "name")) ?: "",
		cli_out_time(json_object_get(rec, "created_at"), "?", when, sizeof(when)),
		json_string_value(json_object_get(rec, "backend")) ?: "?");
	fputs("and discard every change made since. The systemd units that use the roots are\n"
	      "stopped first and the ones that were running are started again.\n",
	      out);
}

/* Read one line from the terminal: true for y or yes. */
static bool cli_cmd_confirm(void)
{
	char line[16];
	fputs("Restore? [y/N] ", stderr);
	fflush(stderr);
	if (!fgets(line, sizeof(line), stdin))
		return false;
	line[strcspn(line, "\r\n")] = '\0';
	return strcasecmp(line, "y") == 0 || strcasecmp(line, "yes") == 0;
}

/* --dry-run, or a person at a terminal without --yes: show the checkpoint first. */
static int cli_cmd_restore_check(const struct cli_opts *o, const char *path)
{
	bool ask = !o->yes && !o->json && isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
	if (!o->dry_run && !ask)
		return -1;
	_cli_cleanup_free_ char *record_path = strndup(path, strlen(path) - strlen("/restore"));
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_req_send(o, "GET", record_path, NULL, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	if (o->dry_run) {
		if (o->json)
			cli_out_verbatim(&r);
		else
			cli_cmd_restore_preview(r.json, stdout);
		const char *id = json_string_value(json_object_get(r.json, "checkpoint_id"));
		size_t n = 0;
		if (!o->json && id) { /* what the restore would undo, as `ckpt diff` prints it */
			puts("\nChanges since the checkpoint (the restore undoes them):");
			json_auto_t *units = NULL;
			if (cli_diff_print(o, id, NULL, &n, &units) < 0 && n == 0)
				puts("  none");
			/* the services plan, as the restore would make it */
			puts("\nUnits the restore would stop, then start again:");
			size_t i;
			json_t *u;
			json_array_foreach (units, i, u)
				printf("  %s\n", json_string_value(u));
			if (json_array_size(units) == 0)
				puts("  none");
		}
		return CKPT_EXIT_OK;
	}
	cli_cmd_restore_preview(r.json, stderr);
	if (cli_cmd_confirm())
		return -1;
	fputs("ckpt: not restored\n", stderr);
	return CKPT_EXIT_SERVER;
}

int cli_cmd_restore(const struct cli_opts *o, const char *id)
{
	json_auto_t *body = json_object();
	if (o->force)
		json_object_set_new(body, "force", json_true());
	if (o->if_expired)
		json_object_set_new(body, "if_expired", json_string(o->if_expired));
	if (o->verify)
		json_object_set_new(body, "verify", json_true());
	_cli_cleanup_free_ char *path = NULL;
	int rc = cli_req_ref_path(o, id, "/restore", &path);
	if (rc < 0)
		rc = cli_cmd_restore_check(o, path);
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
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	rc = cli_req_send(o, "POST", path, body, &r, watch ? cli_cmd_watch_tick : NULL, &w);
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
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_req_send(o, "GET", "/v1/health", NULL, &r, NULL, NULL);
	return rc >= 0 ? rc : cli_cmd_print(o, &r, cli_out_health);
}

int cli_cmd_status(const struct cli_opts *o, const char *unused __attribute__((unused)))
{
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	int rc = cli_req_send(o, "GET", "/v1/health", NULL, &r, NULL, NULL);
	return rc >= 0 ? rc : cli_cmd_print(o, &r, cli_out_status);
}
