/* tar_seek.h: archives that can be entered in the middle. A zstd archive is
 * written as a run of independent zstd frames, one per TAR_SEEK_BLOCK bytes
 * of the tar stream (still one valid zstd stream to any reader), and
 * <archive>.frames records where each frame begins in the compressed file.
 * With an entry's offset in the tar stream (the manifest's off column), a
 * restore decompresses from the frame holding it instead of from the start.
 * The frames file is only an aid: missing or not matching its archive, the
 * archive is read from the start as before. */
#pragma once
#include <archive.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define TAR_SEEK_BLOCK (1 << 20)

struct tar_frames {
	uint64_t *coff; /* compressed offset of frame k (frame k holds the */
	size_t n, cap;  /* tar stream from k * TAR_SEEK_BLOCK), then the end */
};

void tar_frames_free(struct tar_frames *fr);

/* Open writer a (pax, no filter: tar_writer_new) on fd; with frames, the
 * tar stream is compressed with zstd at level 1 a block per frame, and fr
 * (zeroed by the caller) filled for tar_frames_save once a is closed;
 * without, written as it is. < ARCHIVE_OK as archive_write_open. */
int tar_writer_open(struct archive *a, int fd, struct tar_frames *fr);

/* Where the next entry written to a begins in the tar stream. */
int64_t tar_writer_offset(struct archive *a);

/* <name> below dirfd, written and fsynced (the caller syncs the dir). */
int tar_frames_save(int dirfd, const char *name, const struct tar_frames *fr);
/* The same as the frames of archive (its name with ".frames"). */
int tar_frames_save_for(int dirfd, const char *archive, const struct tar_frames *fr);
bool tar_frames_load_for(int dirfd, const char *archive, int afd, struct tar_frames *fr);

/* Load <name> below dirfd for the archive afd; false (and fr empty) when it
 * is missing, torn, or does not end where the archive does. */
bool tar_frames_load(int dirfd, const char *name, int afd, struct tar_frames *fr);
/* The same from an open frames file. */
bool tar_frames_load_fd(int ffd, int afd, struct tar_frames *fr);

/* A reader (tar format, no filter) over the tar stream of archive afd from
 * offset off on: decompressed from the frame that holds off when fr is not
 * NULL, else read as it is (an archive written without compression). NULL
 * when it cannot be set up. The reader owns nothing of afd's: close it
 * after freeing the reader. */
struct archive *tar_seek_reader(int afd, const struct tar_frames *fr, int64_t off);

/* Whether reader a (begun at base in the tar stream by tar_seek_reader)
 * should go on to the entry at off rather than a new reader start there:
 * off is ahead of it, in the block it is in or the next. A new reader
 * decompresses the whole block holding off; going on decompresses at most
 * that block, so the entries of one block cost one pass, not one each. */
bool tar_seek_reuse(struct archive *a, int64_t base, int64_t off);

/* The header of the entry at off read from reader a (begun at base),
 * skipping the entries before it; false when no header begins there. */
bool tar_seek_header(struct archive *a, int64_t base, int64_t off, struct archive_entry **ae);
