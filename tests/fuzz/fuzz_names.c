/* fuzz_names.c: name_valid and id_valid, checked against their definitions. */
#include "lib/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
	uint32_t cp;

	if (!len || len > n)
		return 0;
	cp = len == 1 ? c : c & (0x7F >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3F);
	}
	static const uint32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
	if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		return 0;
	return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	_cleanup_free_ char *s = strndup((const char *)data, size);
	if (!s)
		return 0;
	size_t n = strlen(s);
	bool id = id_valid(s), name = name_valid(s);

	if (id) {
		/* "cp_" + 24 lowercase hex digits, nothing else. */
		if (n != 27 || strncmp(s, "cp_", 3) || strspn(s + 3, "0123456789abcdef") != 24)
			abort();
	}
	if (name) {
		size_t chars = 0;
		for (size_t i = 0; i < n; chars++) {
			size_t k = utf8_len((const unsigned char *)s + i, n - i);
			if (!k || (k == 1 && ((unsigned char)s[i] < 0x20 || s[i] == 0x7F)))
				abort(); /* invalid UTF-8 or a control character accepted */
			i += k;
		}
		if (chars < 1 || chars > 128)
			abort();
	}
	return 0;
}
