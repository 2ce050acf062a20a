/* ws.h: RFC 6455 WebSocket, server side: handshake accept key (SHA-1 and
 * base64 from nettle), frame parsing and encoding, and a connection
 * that reads whole messages (answering pings, reassembling fragments) and
 * writes from several threads. */
#pragma once
#include <stdint.h>
#include "lib/util.h"

#define WS_MAX_MESSAGE (1024 * 1024)

enum {
	WS_OP_CONT = 0x0,
	WS_OP_TEXT = 0x1,
	WS_OP_BINARY = 0x2,
	WS_OP_CLOSE = 0x8,
	WS_OP_PING = 0x9,
	WS_OP_PONG = 0xA,
};

enum {
	WS_CLOSE_NORMAL = 1000,
	WS_CLOSE_PROTOCOL = 1002,
	WS_CLOSE_TOO_BIG = 1009,
	WS_CLOSE_SERVER_ERROR = 1011,
	WS_CLOSE_APP_ERROR = 4000,
};

void ws_sha1(const void *data, size_t len, uint8_t out[20]);
/* Standard base64 with padding; out needs 4*ceil(len/3)+1 bytes. Returns length. */
size_t ws_base64(const uint8_t *in, size_t len, char *out);
/* Sec-WebSocket-Accept for a client key; -EINVAL unless the key is the
 * base64 of 16 bytes. out >= 29 bytes. */
int ws_accept_key(const char *client_key, char out[29]);

struct ws_frame {
	bool fin;
	int opcode;
	bool masked;
	uint8_t mask[4];
	uint64_t len; /* payload length */
	size_t header_len;
};

/* Parse a frame header at buf: >0 its length, 0 need more bytes, <0 -EPROTO. */
int ws_frame_header(const uint8_t *buf, size_t len, struct ws_frame *f);
/* Unmasked header of a final frame (server to client); out >= 10 bytes. */
size_t ws_frame_encode_header(uint8_t *out, int opcode, uint64_t len);
void ws_unmask(uint8_t *data, size_t len, const uint8_t mask[4], uint64_t offset);

struct ws_conn;
/* extra: bytes already read past the HTTP headers (start of the first frame). */
struct ws_conn *ws_conn_new(int fd, const char *extra, size_t extra_len);
void ws_conn_free(struct ws_conn *c);

/* Wait up to timeout_ms for a whole text or binary message: returns its opcode
 * with *ret a NUL-terminated malloc'd buffer; 0 on timeout; WS_OP_CLOSE when
 * the peer closed (answered already); <0 on a broken connection or a protocol
 * error (a close frame is sent). */
int ws_recv(struct ws_conn *c, int timeout_ms, char **ret, size_t *ret_len);
/* Thread-safe writers. After ws_close no more data frames go out. */
int ws_send_text(struct ws_conn *c, const char *s, size_t len);
int ws_close(struct ws_conn *c, uint16_t code, const char *reason);
bool ws_closed(struct ws_conn *c);
