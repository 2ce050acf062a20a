/* cli_oci.c: ckpt push and ckpt pull (docs/registry.md). */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

int cli_cmd_push(const struct cli_opts *o, const char *ref)
{
	_cli_cleanup_free_ char *path = NULL, *record_path = NULL, *label = NULL;
	int rc = cli_req_ref_path(o, ref, "/push", &path);
	if (rc >= 0 || (rc = cli_req_ref_path(o, ref, NULL, &record_path)) >= 0)
		return rc;
	/* The record shows the push's progress (bytes of layers sent or found). */
	struct cli_watch w = { .o = o, .record_path = record_path };
	bool watch = o->tty && !o->json;
	if (asprintf(&label, "pushing %s", ref) < 0)
		label = NULL;
	cli_progress_start(&w.p, label ? label : "pushing");
	if (watch)
		cli_progress_spin(&w.p);
	json_t *body = json_pack("{s:s}", "ref", o->arg2);
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	rc = cli_req_send(o, "POST", path, body, &r, watch ? cli_cmd_watch_tick : NULL, &w);
	json_decref(body);
	if (watch) {
		if (rc < 0 && !w.progress && r.json) { /* done before a tick saw it: the answer's bytes */
			json_int_t n = json_integer_value(json_object_get(r.json, "uploaded_bytes")) +
				json_integer_value(json_object_get(r.json, "reused_bytes"));
			w.progress = json_pack("{s:I, s:I, s:I, s:I}", "bytes_done", n, "bytes_total", n, "files_done",
					       (json_int_t)0, "files_total", (json_int_t)0);
		}
		if (rc < 0 && w.progress) { /* the last frame says it all went */
			json_object_set(w.progress, "bytes_done", json_object_get(w.progress, "bytes_total"));
			cli_progress_bar(&w.p, w.progress);
		}
		cli_progress_end(&w.p, rc < 0 && w.progress != NULL);
	}
	json_decref(w.progress);
	if (rc >= 0)
		return rc;
	if (o->json) {
		cli_out_verbatim(&r);
		return CKPT_EXIT_OK;
	}
	char up[32], reused[32];
	json_t *u = json_object_get(r.json, "uploaded_bytes"), *k = json_object_get(r.json, "reused_bytes");
	printf("Pushed %s to %s\n  digest %s\n  %zu layers, %s sent, %s already there\n", ref,
	       json_string_value(json_object_get(r.json, "ref")) ?: "?",
	       json_string_value(json_object_get(r.json, "digest")) ?: "?",
	       json_array_size(json_object_get(r.json, "layers")),
	       cli_out_size((uint64_t)json_integer_value(u), up, sizeof(up)),
	       cli_out_size((uint64_t)json_integer_value(k), reused, sizeof(reused)));
	return CKPT_EXIT_OK;
}

static void cli_oci_spin(void *arg)
{
	cli_progress_spin(arg);
}

int cli_cmd_pull(const struct cli_opts *o, const char *ref)
{
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	json_t *body = json_pack("{s:s}", "ref", ref);
	struct cli_progress p;
	cli_progress_start(&p, "pulling");
	bool spin = o->tty && !o->json;
	int rc = cli_req_send(o, "POST", "/v1/checkpoints/pull", body, &r, spin ? cli_oci_spin : NULL, &p);
	json_decref(body);
	if (spin)
		cli_progress_end(&p, false);
	if (rc >= 0)
		return rc;
	if (o->json)
		cli_out_verbatim(&r);
	else
		cli_out_record(r.json);
	return CKPT_EXIT_OK;
}
