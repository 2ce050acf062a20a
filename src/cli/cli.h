/* cli.h: the ckpt command-line client. Self-contained: it speaks to ckptd
 * only through the HTTP API (libcurl + jansson) and shares no daemon code,
 * so api/openapi.yaml is the one contract between the two. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define CKPT_DEFAULT_URL "http://127.0.0.1:7070"

/* Exit statuses, documented in docs/cli.md. */
enum {
	CKPT_EXIT_OK = 0,
	CKPT_EXIT_SERVER = 1,  /* the daemon answered with an error, or the operation failed */
	CKPT_EXIT_USAGE = 2,   /* bad command line */
	CKPT_EXIT_CONNECT = 3, /* no answer: connection refused, bad socket, transport error */
};

static inline void cli_freep(void *p)
{
	free(*(void **)p);
}
#define _cli_cleanup_free_ __attribute__((cleanup(cli_freep)))
#define CLI_TAKE_PTR(p)                 \
	({                              \
		__typeof__(p) _t = (p); \
		(p) = NULL;             \
		_t;                     \
	})

/* ---- cli_http.c: one request to the daemon ---- */

struct cli_conn {
	char *base_url;    /* without a trailing slash */
	char *socket_path; /* unix socket, or NULL for TCP */
	char *token;       /* bearer token, or NULL */
	char idem_key[40]; /* Idempotency-Key sent with every POST of this run */
};

struct cli_reply {
	long status;
	char *body; /* NUL-terminated, may be empty */
	size_t len;
	json_t *json;     /* parsed body when it is JSON, else NULL */
	int curl_code;    /* CURLcode of a transport failure, else 0 */
	char errbuf[256]; /* transport error text */
};

/* Called about every 100 ms while a request is in flight (spinners). */
typedef void (*cli_tick_fn)(void *arg);

/* Send method path (already escaped) with an optional JSON body. Returns 0
 * when the daemon answered (any status), <0 on a transport failure (errbuf). */
int cli_http_request(const struct cli_conn *c, const char *method, const char *path, json_t *body,
		     struct cli_reply *ret, cli_tick_fn tick, void *tick_arg);
void cli_reply_free(struct cli_reply *r);
static inline void cli_reply_freep(struct cli_reply *r)
{
	cli_reply_free(r);
}
#define _cli_cleanup_reply_ __attribute__((cleanup(cli_reply_freep)))
/* Progress of a file transfer: bytes received, bytes sent of up_total. */
typedef void (*cli_xfer_fn)(void *arg, uint64_t down, uint64_t up, uint64_t up_total);
/* method path with the body read from in_fd (in_size bytes; -1: none); a 2xx
 * answer's body goes to out_fd (-1: into ret), any other answer into ret.
 * Returns as cli_http_request; a cut stream is a transport failure. */
int cli_http_file(const struct cli_conn *c, const char *method, const char *path, int in_fd, uint64_t in_size,
		  int out_fd, struct cli_reply *ret, cli_xfer_fn fn, cli_tick_fn tick, void *arg);
/* "/v1/checkpoints/" + escaped id + suffix; caller frees. */
char *cli_http_path(const char *prefix, const char *segment, const char *suffix);

/* ---- cli_out.c: human output ---- */

/* 1536 -> "1.5 KiB"; buf >= 16. */
const char *cli_out_size(uint64_t bytes, char *buf, size_t len);
/* "2026-11-22T10:00:00.123Z" -> "2026-11-22 10:00:00"; null -> dflt. */
const char *cli_out_time(json_t *v, const char *dflt, char *buf, size_t len);
void cli_out_table(json_t *records);
void cli_out_record(json_t *record);
void cli_out_restore(json_t *report);
void cli_out_health(json_t *health);
void cli_out_status(json_t *health);
/* Print the reply body as is (with a final newline). */
void cli_out_verbatim(const struct cli_reply *r);
/* "ckpt: detail (code, HTTP status)" on stderr. */
void cli_out_problem(const struct cli_reply *r);

/* ---- cli_progress.c: terminal animations (only on a tty) ---- */

struct cli_progress {
	const char *label; /* "creating \"name\"" */
	int64_t start_ms;
	int64_t last_ms; /* when the last frame was drawn */
	unsigned frame;
	bool drawn;
};
void cli_progress_start(struct cli_progress *p, const char *label);
/* Draw a bar from a record's progress object (spinner when totals are unknown). */
void cli_progress_bar(struct cli_progress *p, json_t *progress);
/* Draw a spinner with the elapsed time. */
void cli_progress_spin(struct cli_progress *p);
/* Leave the last frame on its own line (keep = true) or erase it. */
void cli_progress_end(struct cli_progress *p, bool keep);
int64_t cli_progress_now_ms(void);

/* ---- cli_cmd.c: the subcommands ---- */

struct cli_opts {
	struct cli_conn conn;
	bool json;
	/* create */
	bool has_ttl;
	int64_t ttl_secs;
	json_t *labels; /* object */
	bool async;
	/* list */
	const char *name_filter;
	bool quiet; /* -q: ids only */
	/* restore */
	bool force;
	const char *if_expired;
	bool yes, dry_run;
	bool drop_checkpoints; /* release */
	bool verify;
	bool tty; /* stdout is a terminal */
	/* fork: the second positional argument (DIR); diff */
	const char *arg2;
	const char *against;
	/* export */
	const char *output;
};

/* ---- cli_req.c: one request as the commands send it ---- */
/* Send a request; -1 when it succeeded (2xx), else the exit status. */
int cli_req_send(const struct cli_opts *o, const char *method, const char *path, json_t *body, struct cli_reply *r,
		 cli_tick_fn tick, void *tick_arg);
/* "/v1/checkpoints/{ref}{suffix}" for an id or a name; -1 on success, else the exit status. */
int cli_req_ref_path(const struct cli_opts *o, const char *ref, const char *suffix, char **ret);
/* A transport failure or an error answer, reported (the exit status). */
int cli_req_transport(const struct cli_opts *o, const struct cli_reply *r);
int cli_req_fail(const struct cli_opts *o, const struct cli_reply *r);
void cli_req_sleep_ms(long ms);

/* ---- cli_cmd.c: the checkpoint commands ---- */
int cli_cmd_create(const struct cli_opts *o, const char *name);
int cli_cmd_list(const struct cli_opts *o, const char *unused);
int cli_cmd_show(const struct cli_opts *o, const char *id);
int cli_cmd_delete(const struct cli_opts *o, const char *id);
int cli_cmd_restore(const struct cli_opts *o, const char *id);
int cli_cmd_health(const struct cli_opts *o, const char *unused);
int cli_cmd_status(const struct cli_opts *o, const char *unused);
/* A long request in flight: the tick polls the record at record_path and
 * draws a bar from its progress (a spinner while it has none). */
struct cli_watch {
	const struct cli_opts *o;
	const char *record_path;
	struct cli_progress p;
	int64_t polled_ms;
	json_t *progress; /* last seen with totals, or NULL */
};
void cli_cmd_watch_tick(void *arg);

/* ---- cli_oci.c: push and pull ---- */
int cli_cmd_push(const struct cli_opts *o, const char *ref);
int cli_cmd_pull(const struct cli_opts *o, const char *ref);

/* ---- cli_fork.c: forks and diffs ---- */
int cli_cmd_fork(const struct cli_opts *o, const char *id);
int cli_cmd_forks(const struct cli_opts *o, const char *unused);
int cli_cmd_fork_delete(const struct cli_opts *o, const char *fork_id);
int cli_cmd_release(const struct cli_opts *o, const char *root);
int cli_cmd_diff(const struct cli_opts *o, const char *id);
/* Print every change from checkpoint ref to against (NULL: live) like
 * `git status --short`; -1 on success, else the exit status. */
/* ret_services (may be NULL): the first page's "services" (units a restore
 * would stop and start; only against live), a new reference or NULL. */
int cli_diff_print(const struct cli_opts *o, const char *ref, const char *against, size_t *ret_n,
		   json_t **ret_services);
/* cli_xfer.c */
int cli_cmd_export(const struct cli_opts *o, const char *id);
int cli_cmd_import(const struct cli_opts *o, const char *file);
