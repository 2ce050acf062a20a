/* api_export.c: export streams the archive the engine writes; import hands
 * the spooled body to the engine. */
#include "http/api.h"

#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/engine_export.h"

static ssize_t export_read(void *arg, char *buf, size_t max)
{
	return engine_export_read(arg, buf, max);
}

static void export_free(void *arg)
{
	engine_export_free(arg);
}

void api_export(void *app, const struct http_request *req, struct http_response *resp)
{
	struct engine_export *x;
	ckpt_error err = { 0 };
	char disp[96];

	if (engine_export_open(app, req->params[0], &x, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	resp->status = 200;
	resp->content_type = "application/zstd";
	resp->stream_read = export_read;
	resp->stream_free = export_free;
	resp->stream_arg = x;
	snprintf(disp, sizeof(disp), "attachment; filename=\"%.40s.ckpt.tar.zst\"", req->params[0]);
	resp->extra_headers[0][0] = strdup("Content-Disposition");
	resp->extra_headers[0][1] = strdup(disp);
}

void api_import(void *app, const struct http_request *req, struct http_response *resp)
{
	ckpt_error err = { 0 };
	struct ckpt_view v;

	if (req->body_fd < 0 || req->body_len == 0) {
		http_fail(resp, ERR_INVALID, "invalid_archive", "the body must be an archive made by export");
		return;
	}
	struct ckpt_idem k;
	if (engine_import(app, req->body_fd, api_idem_of(req, 201, &k) ? &k : NULL, &v, &err) < 0) {
		http_error(resp, &err);
		return;
	}
	json_t *o = api_record_json(&v);
	ckpt_view_free(&v);
	if (o)
		http_json(resp, 201, o);
	else
		http_fail(resp, ERR_INTERNAL, NULL, "out of memory");
}
