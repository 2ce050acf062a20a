/* cli_fork.c: ckpt fork, forks, fork-delete, diff and release. */
#include "cli/cli.h"

#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cli_cmd_fork(const struct cli_opts *o, const char *ref)
{
	_cli_cleanup_free_ char *path = NULL;
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	char dir[2 * PATH_MAX + 2], cwd[PATH_MAX];
	/* DIR is the caller's: a relative one is made absolute here (not resolved:
	 * the daemon refuses symlinks and says why). */
	if (o->arg2[0] != '/' && getcwd(cwd, sizeof(cwd)))
		snprintf(dir, sizeof(dir), "%s/%s", cwd, o->arg2);
	else
		snprintf(dir, sizeof(dir), "%s", o->arg2);
	int rc = cli_req_ref_path(o, ref, "/fork", &path);
	if (rc >= 0)
		return rc;
	json_t *body = json_pack("{s:s}", "path", dir);
	rc = cli_req_send(o, "POST", path, body, &r, NULL, NULL);
	json_decref(body);
	if (rc >= 0)
		return rc;
	if (o->json)
		cli_out_verbatim(&r);
	else
		printf("%s\n", json_string_value(json_object_get(r.json, "fork_id")) ?: "?");
	return CKPT_EXIT_OK;
}

/* Send; with --json print the answer as is. <0: the caller prints it. */
static int cli_send_or_json(const struct cli_opts *o, const char *method, const char *path, json_t *body,
			    struct cli_reply *r)
{
	int rc = cli_req_send(o, method, path, body, r, NULL, NULL);
	if (rc < 0 && o->json) {
		cli_out_verbatim(r);
		return CKPT_EXIT_OK;
	}
	return rc;
}

int cli_cmd_forks(const struct cli_opts *o, const char *unused)
{
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	(void)unused;
	int rc = cli_send_or_json(o, "GET", "/v1/forks", NULL, &r);
	if (rc >= 0)
		return rc;
	size_t i;
	json_t *f;
	json_t *list = json_object_get(r.json, "forks");
	if (json_array_size(list))
		printf("%-28s %-28s %s\n", "FORK", "CHECKPOINT", "DIR");
	json_array_foreach (list, i, f)
		printf("%-28s %-28s %s%s\n", json_string_value(json_object_get(f, "fork_id")),
		       json_string_value(json_object_get(f, "checkpoint_id")),
		       json_string_value(json_object_get(f, "path")),
		       json_is_false(json_object_get(f, "mounted")) ? " (not mounted)" : "");
	return CKPT_EXIT_OK;
}

int cli_cmd_fork_delete(const struct cli_opts *o, const char *fid)
{
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	_cli_cleanup_free_ char *path = cli_http_path("/v1/forks/", fid, NULL);
	int rc = cli_req_send(o, "DELETE", path, NULL, &r, NULL, NULL);
	if (rc >= 0)
		return rc;
	if (!o->json)
		printf("Deleted fork %s\n", fid);
	return CKPT_EXIT_OK;
}

static char cli_diff_letter(json_t *c)
{
	const char *kind = json_string_value(json_object_get(c, "change")) ?: "";
	size_t i;
	json_t *v;
	json_array_foreach (json_object_get(c, "changes"), i, v)
		if (!strcmp(json_string_value(v), "type"))
			return 'T';
	return kind[0] == 'a' ? 'A' : kind[0] == 'd' ? 'D' : 'M';
}

int cli_diff_print(const struct cli_opts *o, const char *ref, const char *against, size_t *ret_n, json_t **ret_services)
{
	_cli_cleanup_free_ char *base = NULL, *token = NULL;
	int rc = cli_req_ref_path(o, ref, "/diff", &base);
	if (rc >= 0)
		return rc;
	*ret_n = 0;
	for (;;) {
		_cli_cleanup_reply_ struct cli_reply r = { 0 };
		_cli_cleanup_free_ char *q = NULL, *path = NULL;
		if (asprintf(&q, "%s?limit=1000%s", base, against ? "&against=" : "") < 0)
			return CKPT_EXIT_SERVER;
		_cli_cleanup_free_ char *with = against ? cli_http_path(q, against, NULL) : strdup(q);
		/* the token is hex: nothing to escape */
		if (!with || asprintf(&path, "%s%s%s", with, token ? "&page_token=" : "", token ? token : "") < 0)
			return CKPT_EXIT_SERVER;
		rc = cli_req_send(o, "GET", path, NULL, &r, NULL, NULL);
		if (rc >= 0)
			return rc;
		if (ret_services && !*ret_services)
			*ret_services = json_incref(json_object_get(r.json, "services"));
		if (o->json) {
			cli_out_verbatim(&r);
		} else {
			size_t i;
			json_t *c;
			json_array_foreach (json_object_get(r.json, "changes"), i, c) {
				const char *p = json_string_value(json_object_get(c, "path"));
				printf("%c %s%s\n", cli_diff_letter(c), p ? p : "?",
				       !strcmp(json_string_value(json_object_get(c, "type")) ?: "", "directory") ? "/"
														 : "");
				(*ret_n)++;
			}
		}
		const char *next = json_string_value(json_object_get(r.json, "next_page_token"));
		free(token);
		token = next ? strdup(next) : NULL;
		if (!token)
			return -1;
	}
}

int cli_cmd_diff(const struct cli_opts *o, const char *ref)
{
	size_t n;
	int rc = cli_diff_print(o, ref, o->against, &n, NULL);
	return rc >= 0 ? rc : CKPT_EXIT_OK;
}

int cli_cmd_release(const struct cli_opts *o, const char *root)
{
	_cli_cleanup_reply_ struct cli_reply r = { 0 };
	char abs[2 * PATH_MAX + 2], cwd[PATH_MAX];
	/* ckptd knows its roots by canonical path */
	if (root && realpath(root, abs))
		;
	else if (root && root[0] != '/' && getcwd(cwd, sizeof(cwd)))
		snprintf(abs, sizeof(abs), "%s/%s", cwd, root);
	else
		snprintf(abs, sizeof(abs), "%s", root ? root : "");
	json_t *body = json_pack("{s:b}", "drop_checkpoints", o->drop_checkpoints);
	if (root)
		json_object_set_new(body, "root", json_string(abs));
	int rc = cli_send_or_json(o, "POST", "/v1/roots/release", body, &r);
	json_decref(body);
	if (rc >= 0)
		return rc;
	size_t i;
	json_t *v;
	json_array_foreach (json_object_get(r.json, "released"), i, v)
		printf("Released %s: a plain directory now; ckptd adopts it again when it restarts\n",
		       json_string_value(v));
	size_t dropped = json_array_size(json_object_get(r.json, "dropped_checkpoints"));
	if (dropped)
		printf("Dropped %zu checkpoint%s\n", dropped, dropped == 1 ? "" : "s");
	if (json_is_true(json_object_get(r.json, "checkpoints_kept")))
		printf("Checkpoints kept: they restore once the root is adopted again\n");
	return CKPT_EXIT_OK;
}
