/* treecopy.h: copy an overlay upper dir (or a layer) into a new layer dir.
 * Keeps every file type (whiteouts are char 0/0 devices), modes, owners,
 * times, xattrs (trusted.overlay.* included), hardlinks and sparse holes.
 * Regular files unchanged since the previous layer are hard-linked from it. */
#pragma once
#include <sys/stat.h>
#include "backend/pathindex.h"
#include "lib/util.h"

struct progress;

enum treecopy_mode {
	TREECOPY_NEW,   /* dst is an empty dir: copy src into it */
	TREECOPY_MERGE, /* dst holds lower layers: apply src on top (overlay rules) */
};

/* The directories a copy made, relative ("" for the top), parents first. */
struct treecopy_dirs {
	char **v;
	size_t n, cap;
};
void treecopy_dirs_free(struct treecopy_dirs *d);

struct treecopy_opts {
	enum treecopy_mode mode;
	int prev_fd;                     /* layer to hard-link unchanged files from, or -1 */
	const struct pathindex *prev_ix; /* the source's index at prev_fd's creation */
	struct pathindex *new_ix;        /* filled with every copied regular file, or NULL */
	bool link_sources;               /* src is immutable: hard-link its files (flatten) */
	struct progress *progress;       /* may be NULL */
	/* copy: filled with every directory made (NULL: not kept); update_dirs:
	 * the directories of that copy, whose metadata is then checked by path
	 * instead of reading every directory to find them (NULL: read them) */
	struct treecopy_dirs *dirs;
	/* files whose data may have changed with no new ctime (mapped shared
	 * and writable, or closed after a write: see change_track.h), or NULL:
	 * never linked from prev_fd on the strength of their index entry, nor
	 * kept by update unless their data is compared equal; recorded in
	 * new_ix untrusted */
	const struct pathindex *suspects;
	/* gVisor: an xattr change moves no ctime, so a file its index matches
	 * keeps its copy only when their xattrs are the same too */
	bool xattrs_keep_ctime;
};

struct treecopy_stats {
	uint64_t files, bytes_copied, linked;
	uint64_t replaced;  /* update: entries removed or copied anew */
	uint64_t refreshed; /* update: of those, files rewritten in place where they differ */
};

/* Copy the contents and metadata of directory src_fd into directory dst_fd. */
int treecopy_copy(int src_fd, int dst_fd, const struct treecopy_opts *o, struct treecopy_stats *stats, ckpt_error *err);

/* Bring dst_fd, a copy of src_fd made earlier whose index then was
 * o->prev_ix, to what treecopy_copy of src_fd into an empty dir linking
 * unchanged files from that copy would make: a regular file whose inode,
 * size and ctime still match keeps its copy; a changed file of one name
 * whose copy has one name too (made by that copy, not linked from another
 * layer) and no holes is rewritten in place where its blocks differ;
 * whatever else differs is removed and copied again; names src no longer
 * has go. No inode of dst with several names changes (they may be links
 * into other layers).
 * o->mode, o->prev_fd and o->link_sources are ignored. */
int treecopy_update(int src_fd, int dst_fd, const struct treecopy_opts *o, struct treecopy_stats *stats,
		    ckpt_error *err);

/* treecopy_update limited to the directories dirty names (sorted, each
 * before those below it): what changed elsewhere is not looked at, so the
 * caller vouches that nothing did. Every directory's own metadata is checked
 * too: those of o->dirs when given (a directory made since comes with an
 * event in its parent, which is then dirty), else all, found by reading
 * them. o->new_ix should start as a copy of o->prev_ix (names removed stay
 * in it, harmless: a path's identity never comes back). -EAGAIN, with dst
 * partly updated (a full treecopy_update of it is still right), when a
 * changed file has other names (hard links) or dst lacks a directory src has
 * that no dirty parent explains. */
int treecopy_update_dirs(int src_fd, int dst_fd, const struct pathindex_dirty *dirty, size_t n,
			 const struct treecopy_opts *o, struct treecopy_stats *stats, ckpt_error *err);

/* What treecopy_copy of src_fd would count as progress: the entries below
 * it, and the bytes of regular files prev_ix (may be NULL) does not
 * match, i.e. those it copies rather than links. A stat walk, no reads. */
int treecopy_measure(int src_fd, const struct pathindex *prev_ix, uint64_t *ret_files, uint64_t *ret_bytes);

/* Copy one regular file's data: FICLONE, else copy_file_range over data
 * extents (holes stay holes), else read/write. */
int treecopy_file_data(int in, int out, off_t size, uint64_t *ret_copied);

bool treecopy_is_whiteout(const struct stat *st);
/* Owner, mode, xattrs, then times of a created inode, from st and the source:
 * through fds (sfd_entry, dfd_entry >= 0) or by (sfd|dfd, name). */
int treecopy_copy_meta(int sfd, int dfd, const char *name, int sfd_entry, int dfd_entry, const struct stat *st);
/* The same, leaving out the xattrs skip names. */
int treecopy_copy_meta_but(int sfd, int dfd, const char *name, int sfd_entry, int dfd_entry, const struct stat *st,
			   bool (*skip)(const char *));

/* The same xattr names and values on (afd, a) and (bfd, b) (treecopy_data.c). */
bool treecopy_same_xattrs(int afd, const char *a, int bfd, const char *b);
