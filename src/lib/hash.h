/* hash.h: FNV-1a, the one non-cryptographic hash of ckptd (hash tables and
 * short stable names). Some values are stored on disk (overlay root folder
 * names, the tar manifest's xattr hash): the function must never change. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HASH_FNV32_INIT 2166136261u
#define HASH_FNV64_INIT 0xcbf29ce484222325ULL

/* Continue hash h over n bytes of p (start with HASH_FNV*_INIT). */
uint32_t hash_fnv32(uint32_t h, const void *p, size_t n);
uint64_t hash_fnv64(uint64_t h, const void *p, size_t n);

static inline uint64_t hash_str(const char *s)
{
	return hash_fnv64(HASH_FNV64_INIT, s, strlen(s));
}
