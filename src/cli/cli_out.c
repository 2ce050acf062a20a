/* cli_out.c: human-readable output of the API's records: tables with aligned
 * columns, detail blocks, and error messages from problem+json bodies. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "cli/cli.h"

enum {
	COL_ID,
	COL_NAME,
	COL_STATUS,
	COL_CREATED,
	COL_EXPIRES,
	COL_SIZE,
	N_COLS
};
static const char *const cli_out_headers[N_COLS] = {
	"ID", "NAME", "STATUS", "CREATED", "EXPIRES", "SIZE",
};

const char *cli_out_size(uint64_t bytes, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	if (bytes < 1024) {
		snprintf(buf, len, "%" PRIu64 " B", bytes);
		return buf;
	}
	double v = (double)bytes / 1024.0;
	size_t u = 0;
	while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, units[u]);
	return buf;
}

const char *cli_out_time(json_t *v, const char *dflt, char *buf, size_t len)
{
	const char *s = json_string_value(v);
	if (!s)
		return dflt;
	/* RFC 3339 "YYYY-MM-DDTHH:MM:SS.mmmZ": seconds are enough in a table. */
	if (strlen(s) >= 19 && s[10] == 'T') {
		snprintf(buf, len, "%.10s %.8sZ", s, s + 11);
		return buf;
	}
	snprintf(buf, len, "%s", s);
	return buf;
}

static const char *cli_out_str(json_t *obj, const char *key, const char *dflt)
{
	const char *s = json_string_value(json_object_get(obj, key));
	return s ? s : dflt;
}

static uint64_t cli_out_uint(json_t *obj, const char *key)
{
	json_int_t v = json_integer_value(json_object_get(obj, key));
	return v > 0 ? (uint64_t)v : 0;
}

/* Display width of UTF-8 text: one column per code point is close enough. */
static size_t cli_out_width(const char *s)
{
	size_t w = 0;
	for (; *s; s++)
		if (((unsigned char)*s & 0xC0) != 0x80)
			w++;
	return w;
}

static void cli_out_cell(const char *s, size_t width, bool last)
{
	fputs(s, stdout);
	if (last)
		return;
	for (size_t w = cli_out_width(s); w < width + 2; w++)
		putchar(' ');
}

static void cli_out_row_cells(json_t *r, char cells[N_COLS][160])
{
	char tmp[64];
	snprintf(cells[COL_ID], 160, "%s", cli_out_str(r, "checkpoint_id", "-"));
	snprintf(cells[COL_NAME], 160, "%s", cli_out_str(r, "name", "-"));
	snprintf(cells[COL_STATUS], 160, "%s", cli_out_str(r, "status", "-"));
	snprintf(cells[COL_CREATED], 160, "%s", cli_out_time(json_object_get(r, "created_at"), "-", tmp, sizeof(tmp)));
	snprintf(cells[COL_EXPIRES], 160, "%s",
		 cli_out_time(json_object_get(r, "expires_at"), "never", tmp, sizeof(tmp)));
	snprintf(cells[COL_SIZE], 160, "%s", cli_out_size(cli_out_uint(r, "size_bytes"), tmp, sizeof(tmp)));
}

void cli_out_table(json_t *records)
{
	size_t n = json_array_size(records), width[N_COLS];
	char(*cells)[N_COLS][160] = calloc(n ? n : 1, sizeof(*cells));
	if (!cells)
		return;
	for (int c = 0; c < N_COLS; c++)
		width[c] = strlen(cli_out_headers[c]);
	for (size_t i = 0; i < n; i++) {
		cli_out_row_cells(json_array_get(records, i), cells[i]);
		for (int c = 0; c < N_COLS; c++)
			if (cli_out_width(cells[i][c]) > width[c])
				width[c] = cli_out_width(cells[i][c]);
	}
	for (int c = 0; c < N_COLS; c++)
		cli_out_cell(cli_out_headers[c], width[c], c == N_COLS - 1);
	putchar('\n');
	for (size_t i = 0; i < n; i++) {
		for (int c = 0; c < N_COLS; c++)
			cli_out_cell(cells[i][c], width[c], c == N_COLS - 1);
		putchar('\n');
	}
	free(cells);
}

/* "a, b, c" from an array of strings; "-" when empty. */
static void cli_out_list(const char *label, json_t *arr)
{
	printf("%-16s", label);
	if (json_array_size(arr) == 0) {
		puts("-");
		return;
	}
	size_t i;
	json_t *v;
	json_array_foreach (arr, i, v) {
		const char *s = json_string_value(v);
		_cli_cleanup_free_ char *dump = s ? NULL : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		printf("%s%s", i ? ", " : "", s ? s : dump ? dump : "?");
	}
	putchar('\n');
}

static void cli_out_labels(json_t *labels)
{
	printf("%-16s", "Labels:");
	if (json_object_size(labels) == 0) {
		puts("-");
		return;
	}
	const char *k;
	json_t *v;
	bool first = true;
	json_object_foreach (labels, k, v) {
		printf("%s%s=%s", first ? "" : ", ", k, json_string_value(v) ? json_string_value(v) : "");
		first = false;
	}
	putchar('\n');
}

static void cli_out_progress_line(json_t *p)
{
	char a[32], b[32];
	if (!json_is_object(p))
		return;
	printf("%-16s%s / %s, %" PRIu64 " / %" PRIu64 " files\n",
	       "Progress:", cli_out_size(cli_out_uint(p, "bytes_done"), a, sizeof(a)),
	       cli_out_size(cli_out_uint(p, "bytes_total"), b, sizeof(b)), cli_out_uint(p, "files_done"),
	       cli_out_uint(p, "files_total"));
}

void cli_out_record(json_t *r)
{
	char t[64], sz[32];
	printf("%-16s%s\n", "ID:", cli_out_str(r, "checkpoint_id", "-"));
	printf("%-16s%s\n", "Name:", cli_out_str(r, "name", "-"));
	printf("%-16s%s\n", "Status:", cli_out_str(r, "status", "-"));
	printf("%-16s%s\n", "Backend:", cli_out_str(r, "backend", "-"));
	printf("%-16s%s\n", "Created:", cli_out_time(json_object_get(r, "created_at"), "-", t, sizeof(t)));
	printf("%-16s%s\n", "Expires:", cli_out_time(json_object_get(r, "expires_at"), "never", t, sizeof(t)));
	printf("%-16s%s\n", "Last used:", cli_out_time(json_object_get(r, "last_used_at"), "never", t, sizeof(t)));
	printf("%-16s%s (%" PRIu64 " bytes)\n", "Size:", cli_out_size(cli_out_uint(r, "size_bytes"), sz, sizeof(sz)),
	       cli_out_uint(r, "size_bytes"));
	printf("%-16s%" PRIu64 " ms\n", "Duration:", cli_out_uint(r, "duration_ms"));
	cli_out_labels(json_object_get(r, "labels"));
	cli_out_list("Frozen:", json_object_get(r, "frozen_services"));
	cli_out_progress_line(json_object_get(r, "progress"));
}

/* "Verified: yes (12 ms)" or the differing paths, one per line. */
static void cli_out_verify(json_t *rep)
{
	json_t *v = json_object_get(rep, "verified"), *d;
	size_t i;

	if (!json_is_boolean(v))
		return;
	printf("%-16s%s (%" PRIu64 " ms)\n", "Verified:", json_is_true(v) ? "yes" : "NO, the roots differ",
	       cli_out_uint(rep, "verify_ms"));
	if (json_object_get(rep, "verify_error"))
		printf("%-16s%s\n", "", cli_out_str(rep, "verify_error", "-"));
	json_array_foreach (json_object_get(rep, "verify_differences"), i, d)
		printf("%-16s%s: %s\n", "", cli_out_str(d, "reason", "-"), cli_out_str(d, "path", "-"));
}

void cli_out_restore(json_t *rep)
{
	json_t *ok = json_object_get(rep, "ok");
	bool swapped = !json_is_false(json_object_get(rep, "swapped"));
	printf("%s %s in %" PRIu64 " ms\n",
	       json_is_true(ok)  ? "Restored"
		       : swapped ? "Restore finished with failures:"
				 : "Not restored (a unit using the roots still runs; roots unchanged):",
	       cli_out_str(rep, "checkpoint_id", "-"), cli_out_uint(rep, "restore_duration_ms"));
	if (json_is_false(json_object_get(rep, "restored_from_checkpoint")))
		puts("Note:           the checkpoint had expired; the roots were reset to their base");
	json_t *ph = json_object_get(rep, "phases");
	if (json_is_object(ph))
		printf("%-16sstop %" PRIu64 " ms, swap %" PRIu64 " ms, start %" PRIu64 " ms\n",
		       "Phases:", cli_out_uint(ph, "stop_ms"), cli_out_uint(ph, "swap_ms"),
		       cli_out_uint(ph, "start_ms"));
	json_t *tar = json_object_get(rep, "tar");
	if (json_is_object(tar))
		printf("%-16srewritten %" PRIu64 ", removed %" PRIu64 ", unchanged %" PRIu64 " (%" PRIu64
		       " bytes written)\n",
		       "Entries:", cli_out_uint(tar, "rewritten"), cli_out_uint(tar, "removed"),
		       cli_out_uint(tar, "kept"), cli_out_uint(tar, "bytes"));
	cli_out_verify(rep);
	printf("%-16s%s\n", "Services:", cli_out_str(rep, "services", "-"));
	cli_out_list("Stopped:", json_object_get(rep, "stopped_services"));
	cli_out_list("Started:", json_object_get(rep, "started_services"));
	cli_out_list("Failed:", json_object_get(rep, "failed_services"));
	if (json_array_size(json_object_get(rep, "activating_services")))
		cli_out_list("Activating:", json_object_get(rep, "activating_services"));
	const char *unit;
	json_t *why;
	json_object_foreach (json_object_get(rep, "failures"), unit, why) {
		printf("%-16s%s: %s\n", "Failure:", unit, json_string_value(why) ? json_string_value(why) : "?");
	}
	if (json_array_size(json_object_get(rep, "busy_processes")))
		cli_out_list("Busy:", json_object_get(rep, "busy_processes"));
}

void cli_out_health(json_t *h)
{
	const char *reason = cli_out_str(h, "backend_reason", NULL);
	printf("%-16s%s\n", "Status:", cli_out_str(h, "status", "-"));
	printf("%-16s%s\n", "Version:", cli_out_str(h, "version", "-"));
	printf("%-16s%s\n", "Mode:", cli_out_str(h, "mode", "-"));
	printf("%-16s%s%s%s%s\n", "Backend:", cli_out_str(h, "backend", "-"), reason ? " (" : "", reason ? reason : "",
	       reason ? ")" : "");
	cli_out_list("Roots:", json_object_get(h, "roots"));
	json_t *svc = json_object_get(h, "services");
	if (json_is_string(svc))
		printf("%-16s%s\n", "Services:", json_string_value(svc));
	else if (svc) {
		_cli_cleanup_free_ char *d = json_dumps(svc, JSON_COMPACT | JSON_ENCODE_ANY);
		printf("%-16s%s\n", "Services:", d ? d : "?");
	}
}

/* Per root: its backend and why, and the overlay's options where it runs. */
static void cli_out_root_details(json_t *details)
{
	size_t i;
	json_t *d;
	json_array_foreach (details, i, d) {
		json_t *o = json_object_get(d, "overlay");
		printf("%-16s%s: %s (%s)\n", "Backend:", cli_out_str(d, "path", "?"), cli_out_str(d, "backend", "-"),
		       cli_out_str(d, "backend_reason", "-"));
		if (o)
			printf("%-16s%s overlay, redirect_dir %s, userxattr %s\n",
			       "Overlay:", cli_out_str(o, "kind", "?"),
			       json_is_true(json_object_get(o, "redirect_dir")) ? "on" : "off",
			       json_is_true(json_object_get(o, "userxattr")) ? "on" : "off");
	}
}

/* ckpt status: a few lines from health, and the warnings first. */
void cli_out_status(json_t *h)
{
	json_t *users = json_object_get(h, "unmanaged_users"), *u, *a = json_object_get(h, "adoption");
	size_t i;
	json_array_foreach (users, i, u) {
		printf("warning: process %lld (%s) uses a managed root%s and belongs to no managed unit\n",
		       (long long)json_integer_value(json_object_get(u, "pid")), cli_out_str(u, "command", "?"),
		       json_is_true(json_object_get(u, "hidden")) ? " through the directory hidden under the mount"
								  : "");
	}
	json_array_foreach (json_object_get(h, "released_roots"), i, u) {
		printf("warning: %s was released: a plain directory, not managed until ckptd restarts\n",
		       json_string_value(u));
	}
	json_array_foreach (json_object_get(h, "root_details"), i, u) {
		size_t k;
		json_t *g;
		json_array_foreach (json_object_get(u, "not_guaranteed"), k, g)
			printf("warning: %s: not guaranteed: %s\n", cli_out_str(u, "path", "?"), json_string_value(g));
	}
	printf("%-16s%s, %s backend, %lld checkpoint(s)\n", "Status:", cli_out_str(h, "status", "-"),
	       cli_out_str(h, "backend", "-"), (long long)json_integer_value(json_object_get(h, "checkpoints")));
	cli_out_list("Roots:", json_object_get(h, "roots"));
	bool first = true;
	json_array_foreach (json_object_get(h, "root_details"), i, u) {
		if (!json_object_get(u, "tracking"))
			continue;
		printf("%-16s%s: %s (%s)\n", first ? "Tracking:" : "", cli_out_str(u, "path", "?"),
		       cli_out_str(u, "tracking", "?"), cli_out_str(u, "tracking_reason", "?"));
		first = false;
	}
	cli_out_root_details(json_object_get(h, "root_details"));
	if (json_is_string(json_object_get(h, "services")))
		printf("%-16s%s\n", "Services:", cli_out_str(h, "services", "-"));
	if (a) {
		_cli_cleanup_free_ char *d = json_dumps(json_object_get(a, "restarted_units"), JSON_COMPACT);
		printf("%-16srestarted %s at %s\n", "Adoption:", d ? d : "?", cli_out_str(a, "at", "-"));
	}
	printf("%-16s%zu\n", "Unmanaged:", json_array_size(users));
}

void cli_out_verbatim(const struct cli_reply *r)
{
	if (!r->len)
		return;
	fwrite(r->body, 1, r->len, stdout);
	if (r->body[r->len - 1] != '\n')
		putchar('\n');
}

void cli_out_problem(const struct cli_reply *r)
{
	const char *detail = cli_out_str(r->json, "detail", NULL);
	const char *title = cli_out_str(r->json, "title", NULL);
	const char *code = cli_out_str(r->json, "code", NULL);
	if (!detail)
		detail = title;
	if (!detail && r->len) {
		/* Not problem+json: the first line of whatever came back. */
		fprintf(stderr, "ckpt: HTTP %ld: %.*s\n", r->status, (int)strcspn(r->body, "\r\n"), r->body);
		return;
	}
	fprintf(stderr, "ckpt: %s (%s%sHTTP %ld)\n", detail ? detail : "request failed", code ? code : "",
		code ? ", " : "", r->status);
}
