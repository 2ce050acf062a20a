/* tar_seek.c: zstd archives as independent frames, and readers that start
 * in the middle of one (tar_seek.h). */
#include "backend/tar/tar_seek.h"

#include <limits.h>
#include <sys/stat.h>
#include <zstd.h>

#include "lib/util.h"

#define FRAMES_MAGIC "CKPTFRM1"
#define ZSTD_LEVEL 1

void tar_frames_free(struct tar_frames *fr)
{
	free(fr->coff);
	*fr = (struct tar_frames){ 0 };
}

static int frames_add(struct tar_frames *fr, uint64_t off)
{
	if (fr->n == fr->cap) {
		size_t cap = fr->cap ? 2 * fr->cap : 64;
		uint64_t *v = realloc(fr->coff, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		fr->coff = v;
		fr->cap = cap;
	}
	fr->coff[fr->n++] = off;
	return 0;
}

/* The writer's client: the tar stream gathered a block at a time, each
 * block one zstd frame. */
struct wctx {
	int fd;
	struct tar_frames *fr; /* NULL: no compression */
	ZSTD_CCtx *cctx;
	char *in, *out;
	size_t in_len, out_cap;
	uint64_t written; /* compressed bytes so far */
};

static int write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		buf += n, len -= (size_t)n;
	}
	return 0;
}

static int emit_frame(struct wctx *w)
{
	size_t n = ZSTD_compressCCtx(w->cctx, w->out, w->out_cap, w->in, w->in_len, ZSTD_LEVEL);
	if (ZSTD_isError(n))
		return -EIO;
	int r = frames_add(w->fr, w->written);
	if (r >= 0)
		r = write_all(w->fd, w->out, n);
	w->written += n;
	w->in_len = 0;
	return r;
}

static la_ssize_t w_write(struct archive *a, void *ctx, const void *buf, size_t len)
{
	struct wctx *w = ctx;
	const char *p = buf;
	size_t left = len;
	int r = 0;

	if (!w->fr)
		r = write_all(w->fd, p, len);
	while (w->fr && r >= 0 && left > 0) {
		size_t take = TAR_SEEK_BLOCK - w->in_len < left ? TAR_SEEK_BLOCK - w->in_len : left;
		memcpy(w->in + w->in_len, p, take);
		w->in_len += take, p += take, left -= take;
		if (w->in_len == TAR_SEEK_BLOCK)
			r = emit_frame(w);
	}
	if (r < 0) {
		archive_set_error(a, -r, "cannot write the archive: %s", strerror(-r));
		return -1;
	}
	return (la_ssize_t)len;
}

static int w_close(struct archive *a, void *ctx)
{
	struct wctx *w = ctx;
	int r = 0;
	if (w->fr && w->in_len > 0)
		r = emit_frame(w);
	if (r >= 0 && w->fr)
		r = frames_add(w->fr, w->written); /* the end */
	if (r < 0) {
		archive_set_error(a, -r, "cannot write the archive: %s", strerror(-r));
		return ARCHIVE_FATAL;
	}
	return ARCHIVE_OK;
}

static int w_free(struct archive *a, void *ctx)
{
	struct wctx *w = ctx;
	(void)a;
	if (w) {
		ZSTD_freeCCtx(w->cctx);
		free(w->in);
		free(w->out);
		free(w);
	}
	return ARCHIVE_OK;
}

int tar_writer_open(struct archive *a, int fd, struct tar_frames *fr)
{
	struct wctx *w = calloc(1, sizeof(*w));
	if (!w) {
		archive_set_error(a, ENOMEM, "out of memory");
		return ARCHIVE_FATAL;
	}
	w->fd = fd;
	w->fr = fr;
	if (fr) {
		w->out_cap = ZSTD_compressBound(TAR_SEEK_BLOCK);
		w->cctx = ZSTD_createCCtx();
		w->in = malloc(TAR_SEEK_BLOCK);
		w->out = malloc(w->out_cap);
		if (!w->cctx || !w->in || !w->out) {
			w_free(a, w);
			archive_set_error(a, ENOMEM, "out of memory");
			return ARCHIVE_FATAL;
		}
	}
	return archive_write_open2(a, w, NULL, w_write, w_close, w_free);
}

int64_t tar_writer_offset(struct archive *a)
{
	/* the last entry's data may not be padded to its 512-byte block yet
	 * (that comes with its finish or the next header): where the next
	 * header goes is the next block */
	return (archive_filter_bytes(a, 0) + 511) & ~(int64_t)511;
}

int tar_frames_save(int dirfd, const char *name, const struct tar_frames *fr)
{
	size_t len = 8 + 8 + fr->n * 8;
	_cleanup_free_ char *buf = malloc(len);
	uint64_t n = fr->n;
	if (!buf)
		return -ENOMEM;
	memcpy(buf, FRAMES_MAGIC, 8);
	memcpy(buf + 8, &n, 8);
	memcpy(buf + 16, fr->coff, fr->n * 8);
	return write_file_atomic(dirfd, name, buf, len, 0600);
}

static bool frames_parse(const char *text, size_t len, int afd, struct tar_frames *fr)
{
	struct stat st;
	uint64_t n;

	*fr = (struct tar_frames){ 0 };
	if (fstat(afd, &st) < 0 || len < 16 || memcmp(text, FRAMES_MAGIC, 8))
		return false;
	memcpy(&n, text + 8, 8);
	if (n < 1 || n > (len - 16) / 8 || len != 16 + n * 8 || !(fr->coff = malloc(n * 8)))
		return false;
	memcpy(fr->coff, text + 16, n * 8);
	fr->n = fr->cap = n;
	bool ok = fr->coff[0] == 0 && fr->coff[n - 1] == (uint64_t)st.st_size;
	for (size_t k = 1; ok && k < n; k++)
		ok = fr->coff[k] > fr->coff[k - 1] &&
			fr->coff[k] - fr->coff[k - 1] <= ZSTD_compressBound(TAR_SEEK_BLOCK);
	if (!ok)
		tar_frames_free(fr);
	return ok;
}

bool tar_frames_load(int dirfd, const char *name, int afd, struct tar_frames *fr)
{
	_cleanup_free_ char *text = NULL;
	size_t len = 0;
	*fr = (struct tar_frames){ 0 };
	return read_file_at(dirfd, name, 64u << 20, &text, &len) >= 0 && frames_parse(text, len, afd, fr);
}

bool tar_frames_load_fd(int ffd, int afd, struct tar_frames *fr)
{
	struct stat st;
	*fr = (struct tar_frames){ 0 };
	if (fstat(ffd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 16 || st.st_size > (64 << 20))
		return false;
	_cleanup_free_ char *text = malloc((size_t)st.st_size);
	size_t got = 0;
	while (text && got < (size_t)st.st_size) {
		ssize_t k = pread(ffd, text + got, (size_t)st.st_size - got, (off_t)got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return false;
		got += (size_t)k;
	}
	return text && frames_parse(text, got, afd, fr);
}

/* The reader's client: frames decompressed one at a time from the one that
 * holds the start, or the plain file read from the start on. */
struct rctx_seek {
	int fd;
	const struct tar_frames *fr;
	size_t k;     /* next frame */
	uint64_t pos; /* plain: next offset */
	size_t skip;  /* bytes of the first block before the start */
	ZSTD_DCtx *dctx;
	char *in, *out;
};

static la_ssize_t r_read(struct archive *a, void *ctx, const void **buf)
{
	struct rctx_seek *s = ctx;
	ssize_t n;

	if (!s->fr) {
		do
			n = pread(s->fd, s->out, TAR_SEEK_BLOCK, (off_t)s->pos);
		while (n < 0 && errno == EINTR);
		if (n < 0) {
			archive_set_error(a, errno, "cannot read the archive: %m");
			return -1;
		}
		s->pos += (uint64_t)n;
		*buf = s->out;
		return n;
	}
	if (s->k + 1 >= s->fr->n)
		return 0; /* the end */
	size_t clen = (size_t)(s->fr->coff[s->k + 1] - s->fr->coff[s->k]);
	do
		n = pread(s->fd, s->in, clen, (off_t)s->fr->coff[s->k]);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)clen) {
		archive_set_error(a, n < 0 ? errno : EIO, "cannot read frame %zu of the archive", s->k);
		return -1;
	}
	size_t out = ZSTD_decompressDCtx(s->dctx, s->out, TAR_SEEK_BLOCK, s->in, clen);
	if (ZSTD_isError(out) || out <= s->skip) {
		archive_set_error(a, EIO, "frame %zu of the archive does not decompress", s->k);
		return -1;
	}
	s->k++;
	*buf = s->out + s->skip;
	out -= s->skip;
	s->skip = 0;
	return (la_ssize_t)out;
}

static int r_close(struct archive *a, void *ctx)
{
	struct rctx_seek *s = ctx;
	(void)a;
	ZSTD_freeDCtx(s->dctx);
	free(s->in);
	free(s->out);
	free(s);
	return ARCHIVE_OK;
}

struct archive *tar_seek_reader(int afd, const struct tar_frames *fr, int64_t off)
{
	struct rctx_seek *s = calloc(1, sizeof(*s));
	struct archive *a = archive_read_new();

	if (!s || !a || off < 0)
		goto fail;
	s->fd = afd;
	s->fr = fr;
	s->out = malloc(TAR_SEEK_BLOCK);
	if (!s->out)
		goto fail;
	if (fr) {
		s->k = (size_t)(off / TAR_SEEK_BLOCK);
		s->skip = (size_t)(off % TAR_SEEK_BLOCK);
		s->dctx = ZSTD_createDCtx();
		s->in = malloc(ZSTD_compressBound(TAR_SEEK_BLOCK));
		if (!s->dctx || !s->in || s->k + 1 >= fr->n)
			goto fail;
	} else {
		s->pos = (uint64_t)off;
	}
	archive_read_support_format_tar(a);
	archive_read_support_filter_none(a);
	if (archive_read_open2(a, s, NULL, r_read, NULL, r_close) != ARCHIVE_OK) {
		archive_read_free(a); /* r_close has run */
		return NULL;
	}
	return a;
fail:
	if (s) {
		ZSTD_freeDCtx(s->dctx);
		free(s->in);
		free(s->out);
		free(s);
	}
	if (a)
		archive_read_free(a);
	return NULL;
}

bool tar_seek_reuse(struct archive *a, int64_t base, int64_t off)
{
	/* consumed so far: at most the last data block short of all read,
	 * which only ever lets it go on a little further */
	int64_t pos = base + archive_filter_bytes(a, 0);
	return off >= pos && off / TAR_SEEK_BLOCK <= pos / TAR_SEEK_BLOCK + 1;
}

bool tar_seek_header(struct archive *a, int64_t base, int64_t off, struct archive_entry **ae)
{
	for (;;) {
		if (archive_read_next_header(a, ae) != ARCHIVE_OK)
			return false;
		int64_t at = base + archive_read_header_position(a);
		if (at >= off)
			return at == off;
	}
}

int tar_frames_save_for(int dirfd, const char *archive, const struct tar_frames *fr)
{
	char name[PATH_MAX];
	snprintf(name, sizeof(name), "%s.frames", archive);
	return tar_frames_save(dirfd, name, fr);
}

bool tar_frames_load_for(int dirfd, const char *archive, int afd, struct tar_frames *fr)
{
	char name[PATH_MAX];
	snprintf(name, sizeof(name), "%s.frames", archive);
	return tar_frames_load(dirfd, name, afd, fr);
}
