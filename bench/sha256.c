/* SHA-256 speed of nettle (the daemon's) against OpenSSL's EVP on this machine.
 *
 *     make bench-sha256
 *
 * Hashes 256 MB in 64 KiB updates, five times each, the two libraries in
 * turn, and prints the medians of CPU time (getrusage, so a shared machine
 * moves it less than wall time). "in cache" rehashes one 64 KiB buffer, as
 * the layer writer hashes its reused blocks; "from memory" walks a 256 MB
 * buffer. Both must give the same digest. */
#include <nettle/sha2.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define SPAN (256UL << 20)
#define CHUNK (64UL << 10)
#define RUNS 5

static double sha256_bench_cpu(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static double sha256_bench_nettle(const unsigned char *buf, size_t step, unsigned char d[32])
{
	struct sha256_ctx h;
	double t0 = sha256_bench_cpu();
	sha256_init(&h);
	for (size_t n = 0; n < SPAN; n += CHUNK)
		sha256_update(&h, CHUNK, buf + (step ? n : 0));
	sha256_digest(&h, 32, d);
	return sha256_bench_cpu() - t0;
}

static double sha256_bench_openssl(const unsigned char *buf, size_t step, unsigned char d[32])
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	unsigned int len = 32;
	double t0 = sha256_bench_cpu();
	if (!c || !EVP_DigestInit_ex(c, EVP_sha256(), NULL))
		abort();
	for (size_t n = 0; n < SPAN; n += CHUNK)
		EVP_DigestUpdate(c, buf + (step ? n : 0), CHUNK);
	EVP_DigestFinal_ex(c, d, &len);
	double t = sha256_bench_cpu() - t0;
	EVP_MD_CTX_free(c);
	return t;
}

static int sha256_bench_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void sha256_bench_case(const char *name, const unsigned char *buf, size_t step)
{
	double tn[RUNS], to[RUNS];
	unsigned char dn[32], dopen[32];
	for (int i = 0; i < RUNS; i++) {
		tn[i] = sha256_bench_nettle(buf, step, dn);
		to[i] = sha256_bench_openssl(buf, step, dopen);
		if (memcmp(dn, dopen, 32)) {
			fprintf(stderr, "sha256: the two digests differ\n");
			exit(1);
		}
	}
	qsort(tn, RUNS, sizeof(*tn), sha256_bench_cmp);
	qsort(to, RUNS, sizeof(*to), sha256_bench_cmp);
	double mn = tn[RUNS / 2], mo = to[RUNS / 2];
	printf("| %s | %.0f ms, %.0f MB/s | %.0f ms, %.0f MB/s | %.2fx |\n", name, mn * 1e3, SPAN / 1e6 / mn, mo * 1e3,
	       SPAN / 1e6 / mo, mn / mo);
}

int main(void)
{
	unsigned char *buf = malloc(SPAN);
	if (!buf)
		return 1;
	for (size_t i = 0; i < SPAN; i++)
		buf[i] = (unsigned char)(i * 131 + 7);
	printf("SHA-256 of 256 MB in 64 KiB updates, median CPU of %d runs\n\n", RUNS);
	printf("| data | nettle | OpenSSL EVP | nettle / OpenSSL |\n| --- | --- | --- | --- |\n");
	sha256_bench_case("in cache", buf, 0);
	sha256_bench_case("from memory", buf, 1);
	free(buf);
	return 0;
}
