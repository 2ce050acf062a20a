/* tar_compact.c: fold an incremental checkpoint's chain into one full
 * archive. The checkpoint's own archive is copied entry by entry, then from
 * each older archive the entries its manifest takes from there; the new
 * manifest is the old one with every data source cleared. Nothing is
 * extracted: headers and data blocks go from reader to writer. */
#include "backend/tar/tar_compact.h"

#include <archive.h>
#include <archive_entry.h>
#include <limits.h>
#include <nettle/sha2.h>

#include "backend/tar/tar_create.h"
#include "backend/tar/tar_fs.h"
#include "backend/tar/tar_restore.h"
#include "backend/tar/tar_seek.h"
#include "lib/failpoint.h"

#define TAR_BLOCK (1 << 20)

struct kctx {
	struct tar_manifest m;
	struct archive *w;
	struct sha256_ctx h; /* the entry being copied, as the manifest hashed it */
	ckpt_error *err;
};

/* Write data of the entry being copied, and hash it. */
static int put_data(struct kctx *k, const void *buf, size_t len)
{
	sha256_update(&k->h, len, buf);
	return len && archive_write_data(k->w, buf, len) < 0 ? -1 : 0;
}

static int werr(struct kctx *k, const char *what)
{
	int e = tar_errno_norm(archive_errno(k->w));
	return err_set(k->err, e, NULL, "cannot write the compacted %s: %s", what,
		       archive_error_string(k->w) ?: strerror(e));
}

/* The manifest entry an archive entry is (pax writes "dir/" for dirs). */
static struct tar_mentry *entry_of(struct kctx *k, struct archive_entry *ae)
{
	const char *path = archive_entry_pathname(ae);
	char buf[PATH_MAX];
	size_t len = path ? strlen(path) : 0;

	if (len > 1 && path[len - 1] == '/') {
		snprintf(buf, sizeof(buf), "%.*s", (int)(len - 1), path);
		path = buf;
	}
	return path && tar_path_valid(path) ? tar_manifest_find(&k->m, path) : NULL;
}

static int write_zeros(struct kctx *k, la_int64_t n)
{
	static const char zeros[64 << 10];
	while (n > 0) {
		size_t len = n < (la_int64_t)sizeof(zeros) ? (size_t)n : sizeof(zeros);
		if (put_data(k, zeros, len) < 0)
			return -1;
		n -= (la_int64_t)len;
	}
	return 0;
}

/* Copy the entries of one archive that the new one takes from it: from the
 * checkpoint's own (src NULL) those its manifest keeps there, from an older
 * one those its manifest names it for. */
static int copy_from(struct kctx *k, int afd, const char *src)
{
	struct archive *a = archive_read_new();
	struct archive_entry *ae;
	int r = 0, q;

	if (!a)
		return err_set(k->err, ENOMEM, NULL, "out of memory");
	archive_read_support_format_tar(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_none(a);
	if (archive_read_open_fd(a, afd, TAR_BLOCK) != ARCHIVE_OK)
		r = err_set(k->err, EBADMSG, NULL, "cannot open archive of '%s': %s", src ? src : "itself",
			    archive_error_string(a));
	while (r >= 0 && (q = archive_read_next_header(a, &ae)) != ARCHIVE_EOF) {
		const void *buf;
		size_t len;
		la_int64_t off;
		if (q < ARCHIVE_WARN) {
			r = err_set(k->err, EBADMSG, NULL, "cannot read archive: %s", archive_error_string(a));
			break;
		}
		struct tar_mentry *e = entry_of(k, ae);
		bool take = e && (src ? e->src && !strcmp(e->src, src) : !e->src);
		if (!take)
			continue; /* the reader skips the data */
		e->off = tar_writer_offset(k->w);
		if (archive_write_header(k->w, ae) < ARCHIVE_WARN) {
			r = werr(k, "header");
			break;
		}
		/* the writer takes the file's whole logical data and drops what
		 * its sparse map calls holes: give the holes back as zeros */
		la_int64_t pos = 0;
		sha256_init(&k->h);
		while (r >= 0 && (q = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK) {
			if ((off > pos && write_zeros(k, off - pos) < 0) || put_data(k, buf, len) < 0) {
				r = werr(k, "data");
				break;
			}
			pos = off + (la_int64_t)len;
		}
		if (r >= 0 && q != ARCHIVE_EOF)
			r = err_set(k->err, EBADMSG, NULL, "cannot read '%s' from the archive: %s", e->path,
				    archive_error_string(a));
		if (r >= 0 && archive_entry_size_is_set(ae) && archive_entry_size(ae) > pos &&
		    write_zeros(k, archive_entry_size(ae) - pos) < 0)
			r = werr(k, "data");
		/* what a restore of the result would write is what was captured */
		unsigned char d[TAR_SHA256_LEN];
		sha256_digest(&k->h, sizeof(d), d);
		if (r >= 0 && e->type == 'f' && e->has_sha256 && !archive_entry_hardlink(ae) &&
		    memcmp(d, e->sha256, sizeof(d)))
			r = err_set(k->err, EBADMSG, NULL, "'%s' read from %s does not match its digest", e->path,
				    src ? src : "its own archive");
		if (r >= 0 && archive_write_finish_entry(k->w) < ARCHIVE_WARN)
			r = werr(k, "entry");
	}
	archive_read_free(a);
	return r;
}

static int write_manifest(struct kctx *k, int out_fd, const char *manifest)
{
	int fd = openat(out_fd, manifest, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	int r = 0;

	if (!f) {
		if (fd >= 0)
			close(fd);
		return err_set(k->err, tar_errno_norm(errno), NULL, "cannot create '%s': %m", manifest);
	}
	r = tar_manifest_write_header(f, &k->m.root, k->m.root_xattrs, k->m.n_root_xattrs);
	for (size_t i = 0; r >= 0 && i < k->m.n; i++) {
		struct tar_mentry e = k->m.v[i];
		e.src = NULL;
		r = tar_manifest_write_entry(f, &e);
	}
	if (r >= 0 && (fflush(f) != 0 || fsync(fileno(f)) < 0))
		r = -errno;
	if (fclose(f) != 0 && r >= 0)
		r = -errno;
	if (r < 0) {
		int e = tar_errno_norm(r);
		return err_set(k->err, e, NULL, "cannot write '%s': %s", manifest, strerror(e));
	}
	return 0;
}

int tar_compact_root(int store_fd, int cfd, int out_fd, const char *archive, const char *manifest, bool zstd,
		     ckpt_error *err)
{
	struct kctx k = { .err = err };
	_cleanup_close_ int afd = -1, own = -1;
	const char **srcs = NULL;
	struct tar_frames fr = { 0 };
	size_t n_srcs = 0;
	int r;

	r = tar_manifest_load(cfd, manifest, &k.m, err);
	if (r < 0)
		return r;
	afd = openat(out_fd, archive, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	own = openat(cfd, archive, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	k.w = tar_writer_new();
	srcs = calloc(k.m.n + 1, sizeof(*srcs));
	if (afd < 0 || own < 0)
		r = err_set(err, tar_errno_norm(errno), NULL, "cannot open the archives of '%s': %m", archive);
	else if (!k.w || !srcs)
		r = err_set(err, ENOMEM, NULL, "out of memory");
	else if (tar_writer_open(k.w, afd, zstd ? &fr : NULL) != ARCHIVE_OK)
		r = werr(&k, "archive");
	if (r >= 0)
		r = copy_from(&k, own, NULL);
	for (size_t i = 0; r >= 0 && i < k.m.n; i++) { /* each older archive once, in order met */
		const char *src = k.m.v[i].src;
		size_t j = 0;
		if (!src)
			continue;
		while (j < n_srcs && strcmp(srcs[j], src))
			j++;
		if (j < n_srcs)
			continue;
		srcs[n_srcs++] = src;
		_cleanup_close_ int sfd = tar_source_open(store_fd, src, archive);
		r = sfd < 0 ? err_set(err, -sfd, NULL, "cannot open the archive of '%s': %s", src, strerror(-sfd))
			    : copy_from(&k, sfd, src);
	}
	if (r >= 0 && archive_write_close(k.w) != ARCHIVE_OK)
		r = werr(&k, "archive");
	if (r >= 0 && FAILPOINT_AROUND("tar.compact.archive.fsync", fsync(afd)) < 0)
		r = err_set(err, tar_errno_norm(errno), NULL, "cannot sync the compacted archive: %m");
	if (r >= 0 && zstd && (r = tar_frames_save_for(out_fd, archive, &fr)) < 0)
		err_set(err, -r, NULL, "cannot write the frames of the compacted archive: %s", strerror(-r));
	if (r >= 0)
		r = write_manifest(&k, out_fd, manifest);
	if (k.w)
		archive_write_free(k.w); /* closes it, if not yet: it may still add frames */
	tar_frames_free(&fr);
	free(srcs);
	tar_manifest_free(&k.m);
	return r;
}
