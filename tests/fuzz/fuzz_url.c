/* fuzz_url.c: the %-decoding of a URL path or query value (http_url_decode,
 * which libmicrohttpd calls for the path, query names and values), checked
 * against a plain left-to-right %XX decoding:
 *   - a decoded control character (NUL included) is refused, and the output
 *     never holds one that the input held escaped: "victim%00zzz" is never
 *     cut to "victim";
 *   - otherwise bytes that are not strict UTF-8 are refused;
 *   - otherwise the output is exactly the plain decoding;
 *   - the output is never longer than the input and has no NUL inside. */
#include "http/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int hexv(char c)
{
	return c >= '0' && c <= '9'    ? c - '0'
		: c >= 'a' && c <= 'f' ? c - 'a' + 10
		: c >= 'A' && c <= 'F' ? c - 'A' + 10
				       : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	_cleanup_free_ char *s = strndup((const char *)data, size); /* libmicrohttpd hands a C string */
	_cleanup_free_ char *ref = s ? malloc(strlen(s) + 1) : NULL;
	if (!s || !ref)
		return 0;
	size_t in = strlen(s), n = 0;
	bool control = false;
	for (size_t i = 0; i < in; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '%' && hexv(s[i + 1]) >= 0 && hexv(s[i + 2]) >= 0) {
			c = (unsigned char)(hexv(s[i + 1]) << 4 | hexv(s[i + 2]));
			i += 2;
		}
		control |= c < 0x20 || c == 0x7f;
		ref[n++] = (char)c;
	}
	size_t len = 0;
	const char *bad = http_url_decode(s, &len);
	if (len > in || s[len] != '\0' || strlen(s) != len)
		abort();
	if (control) {
		if (!bad || strcmp(bad, "a control character"))
			abort();
		for (size_t i = 0; i < len; i++) /* only the input's own raw bytes may be controls */
			if (((unsigned char)s[i] < 0x20 || s[i] == 0x7f) && !memchr(data, s[i], size))
				abort();
	} else if (!utf8_valid(ref, n)) {
		if (!bad || strcmp(bad, "bytes that are not UTF-8"))
			abort();
	} else if (bad || len != n || memcmp(s, ref, n)) {
		abort();
	}
	return 0;
}
