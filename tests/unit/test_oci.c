/* Unit tests of the registry code's pure parts: the pipe that makes a layer
 * on two threads (oci_pipe.c), the stream that reads a layer while it is
 * written (oci_stream.c), the feed from a pull's download to the thread
 * that applies (oci_feed.c) and the tree of hard links a pull starts from
 * (oci_clone.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <pthread.h>

#include "engine/oci_clone.h"
#include "engine/oci_feed.h"
#include "engine/oci_pipe.h"
#include "engine/oci_stream.h"
#include "testlib.h"

struct sink {
	unsigned char *got;
	size_t len, ends, fail_at;
};

static int sink_consume(void *ctx, const void *buf, size_t len, bool end)
{
	struct sink *s = ctx;
	if (end) {
		s->ends++;
		return 0;
	}
	if (s->fail_at && s->len + len >= s->fail_at)
		return -ENOSPC;
	memcpy(s->got + s->len, buf, len);
	s->len += len;
	return 0;
}

/* Blocks of every size, more than the pipe holds: all arrive, in order,
 * then one end. */
static void test_pipe_order(void **state)
{
	(void)state;
	size_t total = 0, cap = 8u << 20;
	unsigned char *want = malloc(cap);
	struct sink s = { .got = malloc(cap) };
	struct oci_pipe *p;
	for (size_t i = 0; i < cap; i++)
		want[i] = (unsigned char)(i * 7 + i / 251);
	assert_int_equal(oci_pipe_start(sink_consume, &s, &p), 0);
	for (size_t n = 1; total + n <= cap; n = n * 3 + 1) {
		assert_int_equal(oci_pipe_put(p, want + total, n), 0);
		total += n;
	}
	assert_int_equal(oci_pipe_finish(p, false), 0);
	assert_int_equal(s.len, total);
	assert_int_equal(s.ends, 1);
	assert_memory_equal(s.got, want, total);
	free(want);
	free(s.got);
}

/* The consumer's error reaches the producer and the finish; no end then. */
static void test_pipe_error_and_cancel(void **state)
{
	(void)state;
	static unsigned char block[64 * 1024];
	struct sink s = { .got = malloc(4u << 20), .fail_at = 1u << 20 };
	struct oci_pipe *p;
	int q = 0;
	assert_int_equal(oci_pipe_start(sink_consume, &s, &p), 0);
	for (size_t i = 0; i < 64 && q == 0; i++)
		q = oci_pipe_put(p, block, sizeof(block));
	assert_int_equal(q, -ENOSPC);
	assert_int_equal(oci_pipe_finish(p, false), -ENOSPC);
	assert_int_equal(s.ends, 0);

	struct sink c = { .got = s.got };
	assert_int_equal(oci_pipe_start(sink_consume, &c, &p), 0);
	assert_int_equal(oci_pipe_put(p, block, sizeof(block)), 0);
	assert_int_equal(oci_pipe_finish(p, true), 0);
	assert_int_equal(c.ends, 0); /* cancelled: no end */
	free(s.got);
}

/* A sender that reads the whole stream, then asks for the digest. */
struct reader {
	unsigned char *got;
	size_t len, cap;
	ssize_t last; /* the last read's answer */
	char digest[80];
	int fail_with; /* give up at once with this error */
};

static int reader_send(void *ctx, struct oci_stream *s, ckpt_error *err)
{
	struct reader *r = ctx;
	if (r->fail_with)
		return err_set(err, r->fail_with, NULL, "the registry went away");
	while ((r->last = oci_stream_read(s, r->got + r->len, r->cap - r->len > 1000 ? 1000 : r->cap - r->len)) > 0)
		r->len += (size_t)r->last;
	if (r->last < 0)
		return err_set(err, (int)-r->last, NULL, "aborted");
	oci_stream_digest(s, r->digest);
	return 0;
}

static int stream_file(char dir[TESTLIB_DIR_LEN], int *rfd)
{
	char p[128];
	assert_int_equal(testlib_mkdir(dir, "oci-stream"), 0);
	snprintf(p, sizeof(p), "%s/layer", dir);
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	*rfd = open(p, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0 && *rfd >= 0);
	return fd;
}

/* The reader gets every byte in order as the writer says it wrote them,
 * then the end and the digest, in memory that does not grow. */
static void test_stream_reads_as_written(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN];
	int rfd, fd = stream_file(dir, &rfd);
	size_t cap = 1u << 20, n = 0;
	unsigned char *want = malloc(cap);
	struct reader r = { .got = malloc(cap), .cap = cap };
	struct oci_stream *s;
	for (size_t i = 0; i < cap; i++)
		want[i] = (unsigned char)(i * 13 + i / 509);
	assert_int_equal(oci_stream_start(rfd, reader_send, &r, &s), 0);
	for (size_t k = 1; n + k <= cap; k = k * 2 + 3) {
		assert_int_equal(write(fd, want + n, k), (ssize_t)k);
		n += k;
		assert_int_equal(oci_stream_grew(s, n), 0);
	}
	oci_stream_end(s, 0, n, "sha256:feed");
	ckpt_error err = { 0 };
	assert_int_equal(oci_stream_wait(s, &err), 0);
	assert_int_equal(r.len, n);
	assert_int_equal(r.last, 0);
	assert_memory_equal(r.got, want, n);
	assert_string_equal(r.digest, "sha256:feed");
	close(fd);
	free(want);
	free(r.got);
	testlib_rmdir(dir);
}

/* A writer that fails stops the reader; its error is the one to tell. */
static void test_stream_writer_fails(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN];
	int rfd, fd = stream_file(dir, &rfd);
	struct reader r = { .got = malloc(4096), .cap = 4096 };
	struct oci_stream *s;
	assert_int_equal(oci_stream_start(rfd, reader_send, &r, &s), 0);
	assert_int_equal(write(fd, "abc", 3), 3);
	assert_int_equal(oci_stream_grew(s, 3), 0);
	oci_stream_end(s, -EIO, 0, NULL);
	ckpt_error err = { 0 };
	assert_int_equal(oci_stream_wait(s, &err), 0);
	assert_int_equal(r.last, -EIO);
	assert_string_equal(err.msg, "");
	close(fd);
	free(r.got);
	testlib_rmdir(dir);
}

/* A sender that fails tells the writer to stop, and its error comes back. */
static void test_stream_sender_fails(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN];
	int rfd, fd = stream_file(dir, &rfd);
	struct reader r = { .fail_with = EPIPE };
	struct oci_stream *s;
	assert_int_equal(oci_stream_start(rfd, reader_send, &r, &s), 0);
	int q = 0;
	for (int i = 0; i < 5000 && q == 0; i++) { /* until the sender has given up */
		q = oci_stream_grew(s, 0);
		if (q == 0)
			usleep(1000);
	}
	assert_int_equal(q, -ECANCELED);
	oci_stream_end(s, q, 0, NULL);
	ckpt_error err = { 0 };
	assert_int_equal(oci_stream_wait(s, &err), -EPIPE);
	assert_string_equal(err.msg, "the registry went away");
	close(fd);
	testlib_rmdir(dir);
}

#define FEED_BLOBS 3
static const size_t feed_sizes[FEED_BLOBS] = { 3u << 20, 0, 700001 };
static const int feed_status[FEED_BLOBS] = { 0, 0, -EBADMSG };

static unsigned char feed_byte(size_t blob, size_t i)
{
	return (unsigned char)(i * 13 + i / 4093 + blob);
}

/* The producer: each blob in puts of growing sizes, then its end. */
static void *feed_producer(void *arg)
{
	struct oci_feed *f = arg;
	static unsigned char buf[1u << 20];
	for (size_t b = 0; b < FEED_BLOBS; b++) {
		for (size_t done = 0, n = 1; done < feed_sizes[b]; done += n, n = n * 2 + 1) {
			if (n > sizeof(buf))
				n = sizeof(buf);
			if (n > feed_sizes[b] - done)
				n = feed_sizes[b] - done;
			for (size_t i = 0; i < n; i++)
				buf[i] = feed_byte(b, done + i);
			oci_feed_put(f, buf, n);
		}
		oci_feed_end(f, feed_status[b]);
	}
	return NULL;
}

/* Blobs arrive whole, in order, each with its end and status; a read after
 * the end gives the status again and never the next blob's bytes. */
static void test_feed_blobs(void **state)
{
	(void)state;
	struct oci_feed *f;
	pthread_t t;
	assert_int_equal(oci_feed_new(&f), 0);
	assert_int_equal(pthread_create(&t, NULL, feed_producer, f), 0);
	for (size_t b = 0; b < FEED_BLOBS; b++) {
		const void *buf;
		size_t got = 0;
		ssize_t k;
		while ((k = oci_feed_read(f, &buf)) > 0) {
			for (ssize_t i = 0; i < k; i++)
				assert_int_equal(((const unsigned char *)buf)[i], feed_byte(b, got + (size_t)i));
			got += (size_t)k;
		}
		assert_int_equal(got, feed_sizes[b]);
		assert_int_equal(k, feed_status[b]);
		assert_int_equal(oci_feed_read(f, &buf), feed_status[b]);
		assert_int_equal(oci_feed_skip(f), feed_status[b]);
		oci_feed_next(f);
	}
	pthread_join(t, NULL);
	assert_false(oci_feed_cancelled(f));
	oci_feed_free(f);
}

/* A consumer that gives up mid-blob: the producer's puts no longer wait
 * (it reads its blob to the end), and it learns not to start another. */
static void test_feed_cancel(void **state)
{
	(void)state;
	static unsigned char block[1u << 20];
	struct oci_feed *f;
	const void *buf;
	assert_int_equal(oci_feed_new(&f), 0);
	oci_feed_put(f, block, sizeof(block)); /* four blocks published */
	assert_int_equal(oci_feed_read(f, &buf), 256 * 1024);
	oci_feed_cancel(f);
	for (size_t i = 0; i < 16; i++) /* 16 MiB: far more than the feed holds */
		oci_feed_put(f, block, sizeof(block));
	oci_feed_end(f, 0);
	assert_true(oci_feed_cancelled(f));
	assert_int_equal(oci_feed_read(f, &buf), -ECANCELED);
	oci_feed_free(f);
}

/* Files linked, the rest made anew with the same metadata, the top's too. */
static void test_clone(void **state)
{
	(void)state;
	char dir[TESTLIB_DIR_LEN], src[128], dst[128], p[256];
	struct stat a, b;
	assert_int_equal(testlib_mkdir(dir, "oci-clone"), 0);
	snprintf(src, sizeof(src), "%s/src", dir);
	snprintf(dst, sizeof(dst), "%s/dst", dir);
	assert_int_equal(mkdir(src, 0750), 0);
	assert_int_equal(mkdir(dst, 0700), 0);
	snprintf(p, sizeof(p), "%s/sub", src);
	assert_int_equal(mkdir(p, 0711), 0);
	snprintf(p, sizeof(p), "%s/sub/f", src);
	int f = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
	assert_true(f >= 0 && write(f, "data", 4) == 4);
	close(f);
	assert_int_equal(setxattr(p, "user.k", "v", 1, 0), 0);
	snprintf(p, sizeof(p), "%s/link", src);
	assert_int_equal(symlink("sub/f", p), 0);
	snprintf(p, sizeof(p), "%s/fifo", src);
	assert_int_equal(mkfifo(p, 0600), 0);
	snprintf(p, sizeof(p), "%s/sub", src);
	struct timespec ts[2] = { { 1000, 5 }, { 2000, 7 } };
	assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);

	int fd = open(dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ckpt_error err = { 0 };
	assert_int_equal(oci_clone_tree(src, fd, &err), 0);
	close(fd);

	snprintf(p, sizeof(p), "%s/sub/f", src);
	assert_int_equal(stat(p, &a), 0);
	snprintf(p, sizeof(p), "%s/sub/f", dst);
	assert_int_equal(stat(p, &b), 0);
	assert_true(a.st_ino == b.st_ino && b.st_nlink == 2); /* linked */
	char v[8];
	assert_int_equal(getxattr(p, "user.k", v, sizeof(v)), 1);
	snprintf(p, sizeof(p), "%s/sub", dst);
	assert_int_equal(stat(p, &b), 0);
	assert_int_equal(b.st_mode & 07777, 0711);
	assert_true(b.st_mtim.tv_sec == 2000 && b.st_mtim.tv_nsec == 7);
	assert_int_equal(stat(dst, &b), 0);
	assert_int_equal(b.st_mode & 07777, 0750);
	snprintf(p, sizeof(p), "%s/link", dst);
	char t[32] = "";
	assert_int_equal(readlink(p, t, sizeof(t) - 1), 5);
	assert_string_equal(t, "sub/f");
	snprintf(p, sizeof(p), "%s/fifo", dst);
	assert_int_equal(lstat(p, &b), 0);
	assert_true(S_ISFIFO(b.st_mode));
	testlib_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pipe_order),
		cmocka_unit_test(test_pipe_error_and_cancel),
		cmocka_unit_test(test_stream_reads_as_written),
		cmocka_unit_test(test_stream_writer_fails),
		cmocka_unit_test(test_stream_sender_fails),
		cmocka_unit_test(test_feed_blobs),
		cmocka_unit_test(test_feed_cancel),
		cmocka_unit_test(test_clone),
	};
	return cmocka_run_group_tests_name("oci", tests, NULL, NULL);
}
