/* http_problem.c: the one table of HTTP statuses, and the responses built
 * from it: JSON bodies and RFC 9457 problems, from a status or from an
 * engine error's kind. */
#include "http/http_internal.h"

/* The one table of statuses: title, default code, and the error kind that
 * answers with it (OpenBSD httpd's server_abort_http keeps one such table). */
static const struct http_status_row {
	int status;
	const char *title, *code;
	enum ckpt_err_kind kind;
} statuses[] = {
	{ 400, "Bad Request", "bad_request", ERR_INVALID },
	{ 401, "Unauthorized", "unauthorized", ERR_UNSET },
	{ 403, "Forbidden", "forbidden", ERR_LIMIT },
	{ 404, "Not Found", "not_found", ERR_NOT_FOUND },
	{ 405, "Method Not Allowed", "method_not_allowed", ERR_UNSET },
	{ 409, "Conflict", "conflict", ERR_CONFLICT },
	{ 410, "Gone", "gone", ERR_EXPIRED },
	{ 413, "Content Too Large", "body_too_large", ERR_UNSET },
	{ 415, "Unsupported Media Type", "unsupported_media_type", ERR_UNSET },
	{ 422, "Unprocessable Content", "unprocessable", ERR_UNSET },
	{ 500, "Internal Server Error", "internal", ERR_INTERNAL },
	{ 502, "Bad Gateway", "bad_gateway", ERR_UPSTREAM },
	{ 503, "Service Unavailable", "unavailable", ERR_UNAVAILABLE },
	{ 507, "Insufficient Storage", "insufficient_storage", ERR_NO_SPACE },
};

/* A status missing from the table answers as 500, as does an unset kind: a
 * failure nobody classified. */
static const struct http_status_row *status_row(int status)
{
	const struct http_status_row *internal = NULL;
	for (size_t i = 0; i < ARRAY_SIZE(statuses); i++) {
		if (statuses[i].status == status)
			return &statuses[i];
		if (statuses[i].kind == ERR_INTERNAL)
			internal = &statuses[i];
	}
	return internal;
}

static const struct http_status_row *kind_row(enum ckpt_err_kind kind)
{
	for (size_t i = 0; kind != ERR_UNSET && i < ARRAY_SIZE(statuses); i++)
		if (statuses[i].kind == kind)
			return &statuses[i];
	return status_row(500);
}

int http_status_of(const ckpt_error *err, const char **ret_code)
{
	const struct http_status_row *row = kind_row(err->kind);
	if (ret_code)
		*ret_code = err->kind != ERR_UNSET && err->code ? err->code : row->code;
	return row->status;
}

void http_json(struct http_response *resp, int status, json_t *body)
{
	json_decref(resp->json);
	resp->status = status;
	resp->json = body;
	resp->content_type = "application/json";
}

/* A detail may quote what the client sent; JSON strings must be UTF-8, or
 * jansson gives no body at all. */
static void utf8_scrub(char *s)
{
	if (utf8_valid(s, strlen(s)))
		return;
	for (; *s; s++)
		if ((unsigned char)*s >= 0x80)
			*s = '?';
}

void http_problem(struct http_response *resp, int status, const char *code, const char *fmt, ...)
{
	char detail[1024];
	va_list ap;
	const struct http_status_row *row = status_row(status);

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	utf8_scrub(detail);
	json_t *p = json_pack("{s:s, s:s, s:i, s:s, s:s}", "type", "about:blank", "title", row->title, "status", status,
			      "detail", detail, "code", code ? code : row->code);
	http_json(resp, status, p);
	resp->content_type = "application/problem+json";
}

void http_error(struct http_response *resp, const ckpt_error *err)
{
	const char *code;
	int status = http_status_of(err, &code);
	const char *detail = err->msg[0] ? err->msg : strerror(err->errnum ? err->errnum : EIO);

	/* the client sees the message; the log keeps the errno too */
	if (status >= 500 && err->errnum)
		log_warn("answering %d: %s (%s)", status, detail, strerror(err->errnum));
	else if (status >= 500)
		log_warn("answering %d: %s", status, detail);
	http_problem(resp, status, code, "%s", detail);
}

void http_fail(struct http_response *resp, enum ckpt_err_kind kind, const char *code, const char *fmt, ...)
{
	ckpt_error err = { .kind = kind, .code = code }; /* no errno: the caller decided */
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err.msg, sizeof(err.msg), fmt, ap);
	va_end(ap);
	http_error(resp, &err);
}
