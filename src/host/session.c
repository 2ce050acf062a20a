/* session.c: one WebSocket client of host mode: its events (status, error,
 * output), its references and its end. The protocol that drives a session
 * is in host_api.c. */
#include "host/session.h"

int session_send(struct session *s, json_t *ev)
{
	_cleanup_free_ char *text = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
	json_decref(ev);
	return text ? ws_send_text(s->ws, text, strlen(text)) : -ENOMEM;
}

int session_status(struct session *s, const char *status)
{
	return session_send(s, json_pack("{s:s, s:s}", "event", "status_update", "status", status));
}

int session_error(struct session *s, const char *fmt, ...)
{
	char msg[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return session_send(s, json_pack("{s:s, s:s}", "event", "error", "message", msg));
}

int session_output(struct session *s, const char *stream, const char *buf, size_t len)
{
	json_t *data = json_stringn(buf, len);
	if (!data) {
		/* invalid UTF-8: replace byte by byte */
		_cleanup_free_ char *clean = malloc(len * 3 + 1);
		size_t o = 0;
		if (!clean)
			return -ENOMEM;
		for (size_t i = 0; i < len; i++) {
			unsigned char c = (unsigned char)buf[i];
			if (c < 0x80)
				clean[o++] = (char)c;
			else
				memcpy(clean + o, "\xEF\xBF\xBD", 3), o += 3;
		}
		data = json_stringn(clean, o);
	}
	return session_send(s, json_pack("{s:s, s:o}", "event", stream, "data", data));
}

void session_unref(struct session *s)
{
	pthread_mutex_lock(&s->h->mu);
	bool last = --s->refs == 0;
	pthread_mutex_unlock(&s->h->mu);
	if (!last)
		return;
	ws_close(s->ws, WS_CLOSE_NORMAL, NULL);
	http_upgrade_close(s->handle);
	ws_conn_free(s->ws);
	free(s);
}

void session_fail(struct session *s, const char *status, int code, const char *msg)
{
	session_status(s, status);
	if (msg)
		session_error(s, "%s", msg);
	ws_close(s->ws, (uint16_t)code, NULL);
}

void session_detach(struct session *s)
{
	struct host *h = s->h;
	pthread_mutex_lock(&h->mu);
	if (s->sb && s->sb->client == s) {
		s->sb->client = NULL;
		s->sb->detached_mono_ms = mono_ms();
	}
	s->sb = NULL;
	pthread_mutex_unlock(&h->mu);
}
