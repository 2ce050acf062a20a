/* session.h: one WebSocket client's events and lifetime (struct session is
 * in sandbox.h). Thread-safe: executions and the background thread send
 * while the session's own thread reads. */
#pragma once
#include "host/sandbox.h"
#include "http/http.h"

int session_send(struct session *s, json_t *ev); /* steals ev */
int session_status(struct session *s, const char *status);
int session_error(struct session *s, const char *fmt, ...) _printf_(2, 3);
/* A stdout/stderr event; bytes that are not UTF-8 become U+FFFD. */
int session_output(struct session *s, const char *stream, const char *buf, size_t len);
/* Send a final status (and error, if msg), then close with code. */
void session_fail(struct session *s, const char *status, int code, const char *msg);
/* The client left: its sandbox starts counting idle time. */
void session_detach(struct session *s);
void session_unref(struct session *s);
