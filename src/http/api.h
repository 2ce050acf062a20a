/* api.h: the v1 routes: HTTP requests translated to engine calls and back. */
#pragma once
#include "http/http.h"

struct create_req;
struct engine;
struct restore_req;

/* Request decoding, exposed for unit tests. On failure they fill resp with a
 * 400 problem and return NULL / false. */
json_t *api_parse_object(const struct http_request *req, bool required, struct http_response *resp);
/* Refuse (400 invalid_field) a member not in allowed (NULL-terminated). */
bool api_only_fields(json_t *obj, const char *const *allowed, struct http_response *resp);
bool api_decode_create(json_t *obj, struct create_req *cr, struct http_response *resp);
bool api_decode_restore(json_t *obj, struct restore_req *rr, struct http_response *resp);
struct ckpt_idem;
bool api_idem_of(const struct http_request *req, int status, struct ckpt_idem *ret);
/* The restore report as the response's JSON (exposed for unit tests). */
struct restore_report;
json_t *api_restore_json(const struct restore_report *rep);
/* api_json.c: a checkpoint as the response's JSON: its public record, with
 * progress while an operation runs. */
struct ckpt_view;
json_t *api_record_json(const struct ckpt_view *v);
/* api_json.c: unit names as an array of strings, a report's failures as
 * {unit: reason}. */
struct strv;
struct svc_report;
struct health_report;
json_t *api_health_json(const struct health_report *h);
json_t *api_names_json(const struct strv *l);
json_t *api_failures_json(const struct svc_report *r);

/* Server options of sandbox mode: its routes over engine e, and every answer
 * counted in e's metrics. With metrics_token_free, GET /metrics needs no
 * token (for Prometheus). */
void api_server_opts(struct engine *e, const char *token, bool metrics_token_free, struct http_server_opts *ret);

/* api_export.c: GET /v1/checkpoints/{id}/export, POST /v1/checkpoints/import. */
void api_export(void *app, const struct http_request *req, struct http_response *resp);
void api_import(void *app, const struct http_request *req, struct http_response *resp);
/* api_oci.c: POST /v1/checkpoints/{id}/push, POST /v1/checkpoints/pull. */
void api_push(void *app, const struct http_request *req, struct http_response *resp);
void api_pull(void *app, const struct http_request *req, struct http_response *resp);
