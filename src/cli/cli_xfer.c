/* cli_xfer.c: ckpt export and ckpt import, streamed to and from files with a
 * progress line on a terminal. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli/cli.h"

struct cli_xfer_view {
	struct cli_progress p;
	char label[160];
};

/* An upload: its own bytes make the bar. */
static void cli_xfer_tick(void *arg, uint64_t down, uint64_t up, uint64_t up_total)
{
	struct cli_xfer_view *v = arg;
	(void)down;
	if (!up_total || (v->p.drawn && cli_progress_now_ms() - v->p.last_ms < 100))
		return;
	json_auto_t *pr = json_pack("{s:I, s:I}", "bytes_done", (json_int_t)up, "bytes_total", (json_int_t)up_total);
	cli_progress_bar(&v->p, pr);
}

int cli_cmd_export(const struct cli_opts *o, const char *id)
{
	struct cli_reply r;
	_cli_cleanup_free_ char *path = NULL, *part = NULL, *record_path = NULL, *label = NULL;
	bool to_stdout = o->output && !strcmp(o->output, "-");
	int rc, fd;

	if (!o->output) {
		fputs("ckpt: export needs -o FILE (\"-\" for stdout)\nTry 'ckpt --help'.\n", stderr);
		return CKPT_EXIT_USAGE;
	}
	if ((rc = cli_req_ref_path(o, id, "/export", &path)) >= 0 ||
	    (rc = cli_req_ref_path(o, id, NULL, &record_path)) >= 0)
		return rc;
	if (to_stdout) {
		fd = STDOUT_FILENO;
	} else {
		if (asprintf(&part, "%s.part", o->output) < 0)
			return CKPT_EXIT_SERVER;
		fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0) {
			fprintf(stderr, "ckpt: cannot write %s: %s\n", part, strerror(errno));
			return CKPT_EXIT_USAGE;
		}
	}
	/* The record shows the export's progress (bytes of file content archived). */
	bool show = o->tty && !to_stdout;
	struct cli_watch w = { .o = o, .record_path = record_path };
	if (asprintf(&label, "exporting %s", id) < 0)
		label = NULL;
	cli_progress_start(&w.p, label ? label : "exporting");
	int q = cli_http_file(&o->conn, "GET", path, -1, 0, fd, &r, NULL, show ? cli_cmd_watch_tick : NULL, &w);
	if (show) {
		if (q == 0 && r.status == 200 && w.progress) { /* the last frame says it all arrived */
			json_object_set(w.progress, "bytes_done", json_object_get(w.progress, "bytes_total"));
			json_object_set(w.progress, "files_done", json_object_get(w.progress, "files_total"));
			cli_progress_bar(&w.p, w.progress);
		}
		cli_progress_end(&w.p, w.progress != NULL && q == 0 && r.status == 200);
	}
	json_decref(w.progress);
	if (!to_stdout && (fsync(fd) < 0 || close(fd) < 0) && q == 0)
		snprintf(r.errbuf, sizeof(r.errbuf), "cannot write %s: %s", part, strerror(errno)), q = -EIO;
	if (q < 0)
		rc = r.curl_code ? cli_req_transport(o, &r)
				 : (fprintf(stderr, "ckpt: %s\n", r.errbuf), CKPT_EXIT_SERVER);
	else if (r.status < 200 || r.status > 299)
		rc = cli_req_fail(o, &r);
	else if (!to_stdout && rename(part, o->output) < 0)
		rc = (fprintf(stderr, "ckpt: cannot rename %s: %s\n", part, strerror(errno)), CKPT_EXIT_SERVER);
	else
		rc = CKPT_EXIT_OK;
	if (rc != CKPT_EXIT_OK && part)
		unlink(part); /* never leave a file that looks complete */
	if (rc == CKPT_EXIT_OK && !to_stdout) {
		struct stat st;
		char a[32];
		if (stat(o->output, &st) == 0)
			fprintf(o->json ? stderr : stdout, "Exported %s to %s (%s)\n", id, o->output,
				cli_out_size((uint64_t)st.st_size, a, sizeof(a)));
	}
	cli_reply_free(&r);
	return rc;
}

int cli_cmd_import(const struct cli_opts *o, const char *file)
{
	struct cli_reply r;
	struct cli_xfer_view v;
	struct stat st;
	int rc;

	int fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		fprintf(stderr, "ckpt: cannot read %s: %s\n", file, fd < 0 ? strerror(errno) : "not a regular file");
		if (fd >= 0)
			close(fd);
		return CKPT_EXIT_USAGE;
	}
	snprintf(v.label, sizeof(v.label), "importing %s", file);
	cli_progress_start(&v.p, v.label);
	int q = cli_http_file(&o->conn, "POST", "/v1/checkpoints/import", fd, (uint64_t)st.st_size, -1, &r,
			      o->tty ? cli_xfer_tick : NULL, NULL, &v);
	close(fd);
	if (o->tty)
		cli_progress_end(&v.p, false);
	if (q < 0)
		rc = cli_req_transport(o, &r);
	else if (r.status < 200 || r.status > 299)
		rc = cli_req_fail(o, &r);
	else if (o->json)
		rc = (cli_out_verbatim(&r), CKPT_EXIT_OK);
	else if (!json_is_object(r.json))
		rc = (fprintf(stderr, "ckpt: unexpected answer from ckptd (HTTP %ld)\n", r.status), CKPT_EXIT_SERVER);
	else
		rc = (cli_out_record(r.json), CKPT_EXIT_OK);
	cli_reply_free(&r);
	return rc;
}
