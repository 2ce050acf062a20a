/* api_fork.h: the routes of forks and diffs (api_fork.c), listed in api.c. */
#pragma once
#include "http/http.h"

void api_fork_create(void *app, const struct http_request *req, struct http_response *resp);
void api_fork_list(void *app, const struct http_request *req, struct http_response *resp);
void api_fork_delete(void *app, const struct http_request *req, struct http_response *resp);
void api_diff(void *app, const struct http_request *req, struct http_response *resp);
void api_release(void *app, const struct http_request *req, struct http_response *resp);
