/* ws.c: RFC 6455 framing and handshake for host mode's WebSocket sessions.
 * libmicrohttpd hands over the raw socket after 101; the framing is ours,
 * SHA-1 and base64 are nettle's (already loaded through GnuTLS). */
#include "host/ws.h"

#include <nettle/base64.h>
#include <nettle/sha1.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

void ws_sha1(const void *data, size_t len, uint8_t out[20])
{
	struct sha1_ctx c;
	sha1_init(&c);
	sha1_update(&c, len, data);
	sha1_digest(&c, SHA1_DIGEST_SIZE, out);
}

size_t ws_base64(const uint8_t *in, size_t len, char *out)
{
	size_t n = BASE64_ENCODE_RAW_LENGTH(len);
	base64_encode_raw(out, len, in);
	out[n] = '\0';
	return n;
}

int ws_accept_key(const char *key, char out[29])
{
	char buf[64];
	uint8_t digest[20];
	size_t n = key ? strlen(key) : 0;

	/* 16 random bytes in base64: 22 characters and "==". */
	if (n != 24 || key[22] != '=' || key[23] != '=')
		return -EINVAL;
	for (size_t i = 0; i < 22; i++)
		if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", key[i]))
			return -EINVAL;
	snprintf(buf, sizeof(buf), "%s%s", key, WS_GUID);
	ws_sha1(buf, strlen(buf), digest);
	ws_base64(digest, sizeof(digest), out);
	return 0;
}

int ws_frame_header(const uint8_t *buf, size_t len, struct ws_frame *f)
{
	size_t need = 2;
	uint64_t plen;

	if (len < 2)
		return 0;
	f->fin = buf[0] & 0x80;
	f->opcode = buf[0] & 0x0F;
	f->masked = buf[1] & 0x80;
	plen = buf[1] & 0x7F;
	if (buf[0] & 0x70)
		return -EPROTO; /* no extension negotiated */
	need += plen == 126 ? 2 : plen == 127 ? 8 : 0;
	need += f->masked ? 4 : 0;
	if (len < need)
		return 0;
	if (plen == 126) {
		plen = (uint64_t)buf[2] << 8 | buf[3];
	} else if (plen == 127) {
		plen = 0;
		for (int i = 0; i < 8; i++)
			plen = plen << 8 | buf[2 + i];
		if (plen >> 63)
			return -EPROTO;
	}
	if (f->opcode >= WS_OP_CLOSE && (!f->fin || plen > 125))
		return -EPROTO; /* control frames are short and whole */
	if ((f->opcode > WS_OP_BINARY && f->opcode < WS_OP_CLOSE) || f->opcode > WS_OP_PONG)
		return -EPROTO;
	f->len = plen;
	if (f->masked)
		memcpy(f->mask, buf + need - 4, 4);
	f->header_len = need;
	return (int)need;
}

size_t ws_frame_encode_header(uint8_t *out, int opcode, uint64_t len)
{
	out[0] = (uint8_t)(0x80 | (opcode & 0x0F));
	if (len < 126) {
		out[1] = (uint8_t)len;
		return 2;
	}
	if (len <= 0xFFFF) {
		out[1] = 126;
		out[2] = (uint8_t)(len >> 8);
		out[3] = (uint8_t)len;
		return 4;
	}
	out[1] = 127;
	for (int i = 0; i < 8; i++)
		out[2 + i] = (uint8_t)(len >> (56 - 8 * i));
	return 10;
}

void ws_unmask(uint8_t *data, size_t len, const uint8_t mask[4], uint64_t offset)
{
	for (size_t i = 0; i < len; i++)
		data[i] ^= mask[(offset + i) & 3];
}

struct ws_conn {
	int fd;
	pthread_mutex_t wlock;
	bool close_sent;
	bool broken;
	uint8_t *rbuf; /* unparsed input */
	size_t rlen, rcap;
	uint8_t *msg; /* message being reassembled */
	size_t msg_len;
	int msg_op;
};

struct ws_conn *ws_conn_new(int fd, const char *extra, size_t extra_len)
{
	struct ws_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->fd = fd;
	pthread_mutex_init(&c->wlock, NULL);
	c->rcap = 64 * 1024 > extra_len ? 64 * 1024 : extra_len;
	c->rbuf = malloc(c->rcap);
	if (!c->rbuf) {
		free(c);
		return NULL;
	}
	if (extra_len)
		memcpy(c->rbuf, extra, extra_len);
	c->rlen = extra_len;
	return c;
}

void ws_conn_free(struct ws_conn *c)
{
	if (!c)
		return;
	pthread_mutex_destroy(&c->wlock);
	free(c->rbuf);
	free(c->msg);
	free(c);
}

static int send_all(int fd, const uint8_t *p, size_t len)
{
	while (len) {
		ssize_t k = send(fd, p, len, MSG_NOSIGNAL);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd pfd = { .fd = fd, .events = POLLOUT };
				if (poll(&pfd, 1, 10000) <= 0)
					return -ETIMEDOUT;
				continue;
			}
			return -errno;
		}
		p += k, len -= (size_t)k;
	}
	return 0;
}

/* Caller holds wlock. */
static int send_frame_locked(struct ws_conn *c, int opcode, const void *data, size_t len)
{
	uint8_t hdr[10];
	size_t hl = ws_frame_encode_header(hdr, opcode, len);
	int r;

	if (c->broken)
		return -EPIPE;
	r = send_all(c->fd, hdr, hl);
	if (r == 0 && len)
		r = send_all(c->fd, data, len);
	if (r < 0)
		c->broken = true;
	return r;
}

static int send_frame(struct ws_conn *c, int opcode, const void *data, size_t len)
{
	int r;
	pthread_mutex_lock(&c->wlock);
	r = (c->close_sent && opcode != WS_OP_CLOSE) ? -EPIPE : send_frame_locked(c, opcode, data, len);
	pthread_mutex_unlock(&c->wlock);
	return r;
}

int ws_send_text(struct ws_conn *c, const char *s, size_t len)
{
	return send_frame(c, WS_OP_TEXT, s, len);
}

int ws_close(struct ws_conn *c, uint16_t code, const char *reason)
{
	uint8_t buf[125];
	size_t n = reason ? strnlen(reason, sizeof(buf) - 2) : 0;
	int r = 0;

	buf[0] = (uint8_t)(code >> 8);
	buf[1] = (uint8_t)code;
	if (n)
		memcpy(buf + 2, reason, n);
	pthread_mutex_lock(&c->wlock);
	if (!c->close_sent) {
		c->close_sent = true;
		r = send_frame_locked(c, WS_OP_CLOSE, buf, n + 2);
	}
	pthread_mutex_unlock(&c->wlock);
	return r;
}

bool ws_closed(struct ws_conn *c)
{
	bool v;
	pthread_mutex_lock(&c->wlock);
	v = c->close_sent || c->broken;
	pthread_mutex_unlock(&c->wlock);
	return v;
}

/* Read more bytes into rbuf: 1 got some, 0 timeout, <0 EOF/error. */
static int fill(struct ws_conn *c, int timeout_ms)
{
	struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
	int p = poll(&pfd, 1, timeout_ms);

	if (p < 0)
		return errno == EINTR ? 0 : -errno;
	if (p == 0)
		return 0;
	if (c->rlen == c->rcap)
		return -EPROTO;
	ssize_t k = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
	if (k < 0)
		return (errno == EINTR || errno == EAGAIN) ? 0 : -errno;
	if (k == 0)
		return -ECONNRESET;
	c->rlen += (size_t)k;
	return 1;
}

static int grow_rbuf(struct ws_conn *c, size_t need)
{
	if (need <= c->rcap)
		return 0;
	uint8_t *n = realloc(c->rbuf, need);
	if (!n)
		return -ENOMEM;
	c->rbuf = n;
	c->rcap = need;
	return 0;
}

static int append_msg(struct ws_conn *c, const uint8_t *p, size_t len)
{
	if (c->msg_len + len > WS_MAX_MESSAGE)
		return -EMSGSIZE;
	uint8_t *n = realloc(c->msg, c->msg_len + len + 1);
	if (!n)
		return -ENOMEM;
	memcpy(n + c->msg_len, p, len);
	c->msg = n;
	c->msg_len += len;
	c->msg[c->msg_len] = '\0';
	return 0;
}

/* Handle one complete frame: >0 a message is complete (its opcode), 0 go on. */
static int handle_frame(struct ws_conn *c, const struct ws_frame *f, uint8_t *payload)
{
	int r;

	switch (f->opcode) {
	case WS_OP_PING:
		pthread_mutex_lock(&c->wlock);
		r = c->close_sent ? 0 : send_frame_locked(c, WS_OP_PONG, payload, f->len);
		pthread_mutex_unlock(&c->wlock);
		return r < 0 ? r : 0;
	case WS_OP_PONG:
		return 0;
	case WS_OP_CLOSE:
		ws_close(c, f->len >= 2 ? (uint16_t)(payload[0] << 8 | payload[1]) : WS_CLOSE_NORMAL, NULL);
		return WS_OP_CLOSE;
	case WS_OP_CONT:
		if (!c->msg_op)
			return -EPROTO;
		break;
	default:
		if (c->msg_op)
			return -EPROTO;
		c->msg_op = f->opcode;
		c->msg_len = 0;
	}
	if ((r = append_msg(c, payload, f->len)) < 0)
		return r;
	return f->fin ? c->msg_op : 0;
}

/* One frame from rbuf: >0 message opcode, 0 need more/went on, <0 error. */
static int take_frame(struct ws_conn *c, bool *consumed)
{
	struct ws_frame f;
	int h = ws_frame_header(c->rbuf, c->rlen, &f), r;

	*consumed = false;
	if (h <= 0)
		return h;
	if (!f.masked)
		return -EPROTO; /* clients must mask */
	if (f.len > WS_MAX_MESSAGE)
		return -EMSGSIZE;
	if ((r = grow_rbuf(c, f.header_len + f.len)) < 0)
		return r;
	if (c->rlen < f.header_len + f.len)
		return 0;
	ws_unmask(c->rbuf + f.header_len, f.len, f.mask, 0);
	r = handle_frame(c, &f, c->rbuf + f.header_len);
	memmove(c->rbuf, c->rbuf + f.header_len + f.len, c->rlen - f.header_len - f.len);
	c->rlen -= f.header_len + f.len;
	*consumed = true;
	return r;
}

static int deliver(struct ws_conn *c, int op, char **ret, size_t *ret_len)
{
	*ret = (char *)TAKE_PTR(c->msg);
	*ret_len = c->msg_len;
	c->msg_len = 0;
	c->msg_op = 0;
	return op;
}

int ws_recv(struct ws_conn *c, int timeout_ms, char **ret, size_t *ret_len)
{
	int64_t deadline = mono_ms() + timeout_ms;

	for (;;) {
		bool consumed;
		int r = take_frame(c, &consumed);
		if (r == WS_OP_CLOSE)
			return r;
		if (r > 0)
			return deliver(c, r, ret, ret_len);
		if (r < 0) {
			ws_close(c, r == -EMSGSIZE ? WS_CLOSE_TOO_BIG : WS_CLOSE_PROTOCOL, NULL);
			return r;
		}
		if (consumed)
			continue;
		int64_t left = deadline - mono_ms();
		if (left <= 0)
			return 0;
		if ((r = fill(c, (int)left)) < 0)
			return r;
	}
}
