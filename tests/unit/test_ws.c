/* test_ws.c: SHA-1, handshake key, frame parsing and a connection over a socketpair. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/socket.h>

#include "host/ws.h"

static void hex(const uint8_t *d, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void test_sha1_vectors(void **state)
{
	(void)state;
	uint8_t d[20];
	char h[41];
	static const char *long_in = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";

	ws_sha1("abc", 3, d);
	hex(d, 20, h);
	assert_string_equal(h, "a9993e364706816aba3e25717850c26c9cd0d89d");
	ws_sha1("", 0, d);
	hex(d, 20, h);
	assert_string_equal(h, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
	ws_sha1(long_in, strlen(long_in), d);
	hex(d, 20, h);
	assert_string_equal(h, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");

	char *mil = malloc(1000000);
	memset(mil, 'a', 1000000);
	ws_sha1(mil, 1000000, d);
	free(mil);
	hex(d, 20, h);
	assert_string_equal(h, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

static void test_base64(void **state)
{
	(void)state;
	char out[16];
	assert_int_equal(ws_base64((const uint8_t *)"f", 1, out), 4);
	assert_string_equal(out, "Zg==");
	ws_base64((const uint8_t *)"fo", 2, out);
	assert_string_equal(out, "Zm8=");
	ws_base64((const uint8_t *)"foobar", 6, out);
	assert_string_equal(out, "Zm9vYmFy");
}

static void test_accept_key(void **state)
{
	(void)state;
	char out[29];
	assert_int_equal(ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", out), 0);
	assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
	assert_int_equal(ws_accept_key("short", out), -EINVAL);
	assert_int_equal(ws_accept_key(NULL, out), -EINVAL);
	assert_int_equal(ws_accept_key("dGhlIHNhbXBsZSBub25jZQ!=", out), -EINVAL);
	assert_int_equal(ws_accept_key("dGhlIH$hbXBsZSBub25jZQ==", out), -EINVAL);
}

static void test_frame_header(void **state)
{
	(void)state;
	/* RFC 6455 5.7: a masked "Hello". */
	uint8_t hello[] = { 0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58 };
	struct ws_frame f;

	assert_int_equal(ws_frame_header(hello, 1, &f), 0);
	assert_int_equal(ws_frame_header(hello, 5, &f), 0);
	assert_int_equal(ws_frame_header(hello, sizeof(hello), &f), 6);
	assert_true(f.fin);
	assert_true(f.masked);
	assert_int_equal(f.opcode, WS_OP_TEXT);
	assert_int_equal(f.len, 5);
	ws_unmask(hello + 6, 5, f.mask, 0);
	assert_memory_equal(hello + 6, "Hello", 5);

	uint8_t ext[] = { 0x82, 0x7E, 0x01, 0x00 };
	assert_int_equal(ws_frame_header(ext, sizeof(ext), &f), 4);
	assert_int_equal(f.len, 256);
	uint8_t big[] = { 0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0 };
	assert_int_equal(ws_frame_header(big, sizeof(big), &f), 10);
	assert_int_equal(f.len, 65536);
	uint8_t huge[] = { 0x82, 0x7F, 0x80, 0, 0, 0, 0, 0, 0, 0 };
	assert_int_equal(ws_frame_header(huge, sizeof(huge), &f), -EPROTO);
	uint8_t rsv[] = { 0xC1, 0x00 };
	assert_int_equal(ws_frame_header(rsv, 2, &f), -EPROTO);
	uint8_t bad_op[] = { 0x83, 0x00 };
	assert_int_equal(ws_frame_header(bad_op, 2, &f), -EPROTO);
	uint8_t long_ping[] = { 0x89, 0x7E, 0x00, 0x80 };
	assert_int_equal(ws_frame_header(long_ping, 4, &f), -EPROTO);
	uint8_t frag_close[] = { 0x08, 0x00 };
	assert_int_equal(ws_frame_header(frag_close, 2, &f), -EPROTO);
}

static void test_encode_header(void **state)
{
	(void)state;
	uint8_t h[10];
	struct ws_frame f;
	assert_int_equal(ws_frame_encode_header(h, WS_OP_TEXT, 5), 2);
	assert_int_equal(h[0], 0x81);
	assert_int_equal(h[1], 5);
	assert_int_equal(ws_frame_encode_header(h, WS_OP_TEXT, 300), 4);
	assert_int_equal(ws_frame_header(h, 4, &f), 4);
	assert_int_equal(f.len, 300);
	assert_int_equal(ws_frame_encode_header(h, WS_OP_BINARY, 70000), 10);
	assert_int_equal(ws_frame_header(h, 10, &f), 10);
	assert_int_equal(f.len, 70000);
	assert_false(f.masked);
}

/* A masked client frame into out; returns its length. */
static size_t client_frame(uint8_t *out, int op, bool fin, const char *data, size_t len)
{
	static const uint8_t mask[4] = { 1, 2, 3, 4 };
	size_t h = ws_frame_encode_header(out, op, len);
	out[0] = (uint8_t)((fin ? 0x80 : 0) | op);
	out[1] |= 0x80;
	memcpy(out + h, mask, 4);
	memcpy(out + h + 4, data, len);
	ws_unmask(out + h + 4, len, mask, 0);
	return h + 4 + len;
}

static void test_conn_messages(void **state)
{
	(void)state;
	int sv[2];
	uint8_t buf[512], in[256];
	size_t n = 0, len;
	char *msg = NULL;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	/* "extra" holds the start of the first frame; the rest comes on the socket. */
	n += client_frame(buf, WS_OP_TEXT, false, "hel", 3);
	n += client_frame(buf + n, WS_OP_PING, true, "p", 1);
	n += client_frame(buf + n, WS_OP_CONT, true, "lo", 2);
	struct ws_conn *c = ws_conn_new(sv[0], (const char *)buf, 4);
	assert_non_null(c);
	assert_int_equal(write(sv[1], buf + 4, n - 4), (ssize_t)(n - 4));
	assert_int_equal(ws_recv(c, 1000, &msg, &len), WS_OP_TEXT);
	assert_int_equal(len, 5);
	assert_string_equal(msg, "hello");
	free(msg);
	/* the ping was answered with a pong carrying its payload */
	assert_int_equal(read(sv[1], in, sizeof(in)), 3);
	assert_int_equal(in[0], 0x8A);
	assert_int_equal(in[1], 1);
	assert_int_equal(in[2], 'p');

	assert_int_equal(ws_recv(c, 50, &msg, &len), 0); /* timeout */
	assert_int_equal(ws_send_text(c, "{}", 2), 0);
	assert_int_equal(read(sv[1], in, sizeof(in)), 4);
	assert_memory_equal(in, "\x81\x02{}", 4);

	n = client_frame(buf, WS_OP_CLOSE, true, "\x03\xe8", 2);
	assert_int_equal(write(sv[1], buf, n), (ssize_t)n);
	assert_int_equal(ws_recv(c, 1000, &msg, &len), WS_OP_CLOSE);
	assert_int_equal(read(sv[1], in, sizeof(in)), 4);
	assert_memory_equal(in, "\x88\x02\x03\xe8", 4);
	assert_true(ws_closed(c));
	assert_int_equal(ws_send_text(c, "x", 1), -EPIPE);
	ws_conn_free(c);
	close(sv[0]);
	close(sv[1]);
}

static void test_conn_errors(void **state)
{
	(void)state;
	int sv[2];
	uint8_t buf[64], in[64];
	char *msg = NULL;
	size_t len;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	struct ws_conn *c = ws_conn_new(sv[0], NULL, 0);
	/* unmasked client frame: protocol error, close 1002 */
	assert_int_equal(write(sv[1], "\x81\x01x", 3), 3);
	assert_int_equal(ws_recv(c, 1000, &msg, &len), -EPROTO);
	assert_int_equal(read(sv[1], in, sizeof(in)), 4);
	assert_memory_equal(in, "\x88\x02\x03\xea", 4);
	ws_conn_free(c);

	c = ws_conn_new(sv[0], NULL, 0);
	/* announced length over the cap: 1009 */
	uint8_t big[] = { 0x81, 0xFF, 0, 0, 0, 0, 0, 0x20, 0, 0, 1, 2, 3, 4 };
	assert_int_equal(write(sv[1], big, sizeof(big)), (ssize_t)sizeof(big));
	assert_int_equal(ws_recv(c, 1000, &msg, &len), -EMSGSIZE);
	assert_int_equal(read(sv[1], in, sizeof(in)), 4);
	assert_memory_equal(in, "\x88\x02\x03\xf1", 4);
	ws_conn_free(c);

	c = ws_conn_new(sv[0], NULL, 0);
	close(sv[1]);
	assert_true(ws_recv(c, 1000, &msg, &len) < 0);
	ws_conn_free(c);
	close(sv[0]);
	(void)buf;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sha1_vectors),  cmocka_unit_test(test_base64),
		cmocka_unit_test(test_accept_key),    cmocka_unit_test(test_frame_header),
		cmocka_unit_test(test_encode_header), cmocka_unit_test(test_conn_messages),
		cmocka_unit_test(test_conn_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
