/* fuzz_ws.c: bytes from a WebSocket client: the frame header parser, then a
 * connection reading whole messages from them (pings answered, fragments
 * joined, close handled) until the stream ends. */
#include <sys/socket.h>
#include "host/ws.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void frames(const uint8_t *data, size_t size)
{
	struct ws_frame f;
	for (size_t off = 0; off < size;) {
		int n = ws_frame_header(data + off, size - off, &f);
		if (n <= 0)
			return;
		if ((size_t)n != f.header_len || f.opcode < 0 || f.opcode > 0xF)
			abort();
		if (f.len > size - off - (size_t)n)
			return;
		off += (size_t)n + f.len;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];
	char *msg = NULL;
	size_t len;

	frames(data, size);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	close(sv[1]); /* the client is gone after these bytes: reads end, writes fail */
	struct ws_conn *c = ws_conn_new(sv[0], (const char *)data, size);
	if (!c)
		abort();
	for (int i = 0; i < 64; i++) {
		int r = ws_recv(c, 5, &msg, &len);
		if (r <= 0 || r == WS_OP_CLOSE)
			break;
		if ((r != WS_OP_TEXT && r != WS_OP_BINARY) || !msg || msg[len] != '\0' || len > WS_MAX_MESSAGE)
			abort();
		free(msg);
		msg = NULL;
	}
	free(msg);
	ws_conn_free(c);
	close(sv[0]);
	return 0;
}
