/* test_tar_seek.c: archives written through tar_writer_open and entered in
 * the middle with tar_seek_reader, compressed in frames and not; a frames
 * file that does not match its archive is refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <archive.h>
#include <archive_entry.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/tar/tar_create.h"
#include "backend/tar/tar_seek.h"
#include "testlib.h"

#define N_ENTRIES 4
static const size_t sizes[N_ENTRIES] = { 100, 3 << 20, 7, 1 << 20 }; /* spans frames */

static char dir[TESTLIB_DIR_LEN];

static int setup(void **state)
{
	(void)state;
	return testlib_mkdir(dir, "seek");
}

static int teardown(void **state)
{
	(void)state;
	testlib_rmdir(dir);
	return 0;
}

static unsigned char byte_of(int entry, size_t k)
{
	return (unsigned char)((k * 2654435761u) >> 13) ^ (unsigned char)(entry * 37);
}

/* Write the entries; their offsets into off[] (no entry finished before
 * the next header: its padding is not written yet when the offset is read). */
static int write_archive(const char *path, struct tar_frames *fr, int64_t *off)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	struct archive *a = tar_writer_new();
	assert_non_null(a);
	assert_int_equal(tar_writer_open(a, fd, fr), ARCHIVE_OK);
	unsigned char *buf = malloc(3 << 20);
	assert_non_null(buf);
	for (int i = 0; i < N_ENTRIES; i++) {
		char name[32];
		snprintf(name, sizeof(name), "dir/file%d", i);
		struct archive_entry *e = archive_entry_new();
		archive_entry_set_pathname(e, name);
		archive_entry_set_filetype(e, AE_IFREG);
		archive_entry_set_perm(e, 0644);
		archive_entry_set_size(e, (la_int64_t)sizes[i]);
		for (size_t k = 0; k < sizes[i]; k++)
			buf[k] = byte_of(i, k);
		off[i] = tar_writer_offset(a);
		assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
		assert_int_equal(archive_write_data(a, buf, sizes[i]), (la_ssize_t)sizes[i]);
		archive_entry_free(e);
	}
	assert_int_equal(archive_write_close(a), ARCHIVE_OK);
	archive_write_free(a);
	free(buf);
	assert_int_equal(close(fd), 0);
	return 0;
}

/* Entering at each offset finds that entry, whole, first. */
static void check_entries(int afd, const struct tar_frames *fr, const int64_t *off)
{
	for (int i = N_ENTRIES - 1; i >= 0; i--) {
		struct archive *r = tar_seek_reader(afd, fr, off[i]);
		struct archive_entry *e;
		char name[32];
		assert_non_null(r);
		assert_int_equal(archive_read_next_header(r, &e), ARCHIVE_OK);
		snprintf(name, sizeof(name), "dir/file%d", i);
		assert_string_equal(archive_entry_pathname(e), name);
		assert_int_equal(archive_entry_size(e), (la_int64_t)sizes[i]);
		size_t got = 0;
		char buf[65536];
		la_ssize_t n;
		while ((n = archive_read_data(r, buf, sizeof(buf))) > 0) {
			for (la_ssize_t k = 0; k < n; k++)
				assert_int_equal((unsigned char)buf[k], byte_of(i, got + (size_t)k));
			got += (size_t)n;
		}
		assert_int_equal(n, 0);
		assert_int_equal(got, sizes[i]);
		archive_read_free(r);
	}
}

/* One reader goes on from entry to entry: to one in the block it is in or
 * the next, not to one further or behind it; a header must begin at off. */
static void check_going_on(int afd, const struct tar_frames *fr, const int64_t *off)
{
	struct archive *r = tar_seek_reader(afd, fr, off[0]);
	struct archive_entry *e;
	char buf[65536];
	assert_non_null(r);
	assert_true(tar_seek_header(r, off[0], off[0], &e));
	assert_string_equal(archive_entry_pathname(e), "dir/file0");
	assert_false(tar_seek_reuse(r, off[0], off[2]));            /* blocks ahead */
	assert_true(tar_seek_reuse(r, off[0], off[3] - (3 << 20))); /* the same or next block */
	assert_true(tar_seek_header(r, off[0], off[1], &e));        /* skips file0's data */
	assert_string_equal(archive_entry_pathname(e), "dir/file1");
	assert_false(tar_seek_reuse(r, off[0], off[0])); /* behind it */
	while (archive_read_data(r, buf, sizeof(buf)) > 0)
		;
	assert_true(tar_seek_reuse(r, off[0], off[2]));             /* file1 read: file2 is next */
	assert_false(tar_seek_header(r, off[0], off[2] + 512, &e)); /* no header there */
	archive_read_free(r);
	r = tar_seek_reader(afd, fr, off[2]);
	assert_non_null(r);
	assert_true(tar_seek_header(r, off[2], off[3], &e));
	assert_string_equal(archive_entry_pathname(e), "dir/file3");
	archive_read_free(r);
}

static void test_framed(void **state)
{
	(void)state;
	char path[PATH_MAX];
	int64_t off[N_ENTRIES];
	struct tar_frames fr = { 0 }, loaded;
	snprintf(path, sizeof(path), "%s/a.tar.zst", dir);
	write_archive(path, &fr, off);
	assert_true(fr.n >= 5); /* over 4 MiB of tar stream: 5 frames, and the end */
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_int_equal(tar_frames_save_for(dfd, "a.tar.zst", &fr), 0);
	int afd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(tar_frames_load_for(dfd, "a.tar.zst", afd, &loaded));
	assert_int_equal(loaded.n, fr.n);
	check_entries(afd, &loaded, off);
	check_going_on(afd, &loaded, off);
	/* the whole stream is one zstd stream to libarchive's own reader */
	struct archive *r = archive_read_new();
	struct archive_entry *e;
	int n = 0;
	archive_read_support_format_tar(r);
	archive_read_support_filter_zstd(r);
	assert_int_equal(archive_read_open_filename(r, path, 1 << 16), ARCHIVE_OK);
	while (archive_read_next_header(r, &e) == ARCHIVE_OK)
		n++;
	archive_read_free(r);
	assert_int_equal(n, N_ENTRIES);
	/* frames that do not end where the archive does are refused */
	struct tar_frames cut = { 0 };
	assert_int_equal(ftruncate(afd, 0), -1); /* read-only: keep it whole */
	int wfd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
	assert_int_equal(write(wfd, "x", 1), 1);
	close(wfd);
	assert_false(tar_frames_load_for(dfd, "a.tar.zst", afd, &cut));
	assert_null(cut.coff);
	tar_frames_free(&loaded);
	tar_frames_free(&fr);
	close(afd);
	close(dfd);
}

static void test_plain(void **state)
{
	(void)state;
	char path[PATH_MAX];
	int64_t off[N_ENTRIES];
	snprintf(path, sizeof(path), "%s/a.tar", dir);
	write_archive(path, NULL, off);
	int afd = open(path, O_RDONLY | O_CLOEXEC);
	check_entries(afd, NULL, off);
	check_going_on(afd, NULL, off);
	close(afd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_framed),
		cmocka_unit_test(test_plain),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
