/* tar_create.h: capture one root as a pax archive plus its manifest. */
#pragma once
#include <stdatomic.h>
#include "backend/backend.h"
#include "backend/pathindex.h"
#include "backend/rootexcl.h"
#include "backend/tar/tar_manifest.h"

struct tar_create_opts {
	bool zstd;                   /* compress with zstd (else no filter) */
	dev_t skip_dev;              /* a directory never captured (the state dir, */
	ino_t skip_ino;              /* should it live inside a root) */
	const struct rootexcl *excl; /* what else is never captured (NULL: nothing) */
	struct progress *p;          /* may be NULL */
	struct timespec max_ctime;   /* out: newest ctime recorded */
	/* Incremental: a regular file (one link) that the parent manifest lists
	 * as the same inode, ctime, mtime and size (or that a restore of the
	 * parent wrote: its alias) is not archived again; its line names the
	 * archive that holds its data. NULL: a full archive. */
	const struct tar_manifest *parent;
	const char *parent_name; /* the parent's checkpoint directory */
	/* When the parent's capture began (coarse clock): an entry whose ctime
	 * is not older may have changed while it was read, so its content is
	 * compared before it is reused. */
	struct timespec parent_started;
	/* Change tracking (the journal): the directories that changed since the
	 * parent's capture began (sorted, each before those below it; deep: its
	 * whole subtree), when the caller vouches that nothing else did. A
	 * directory not named has its entries taken from the parent's manifest
	 * instead of read and stat-ed: regular files as they are, the rest
	 * (directories, links, special files, files the parent was unsure of)
	 * stat-ed and archived as always. journal false: the whole tree is read. */
	bool journal;
	const struct pathindex_dirty *dirty;
	size_t n_dirty;
	/* Files a process maps shared and writable (or NULL): a write through a
	 * mapping may leave no new ctime, so they are archived, never reused. */
	const struct pathindex *suspects;
	/* What this filesystem changes without a new ctime (tar_probe.c):
	 * xattrs_blind, a file is reused only when its xattrs are the parent's
	 * too; mapped_blind, a suspect is given a new ctime (a chmod to its own
	 * mode) before it is read, so that no older checkpoint's (inode, ctime)
	 * names the data it holds now. */
	bool xattrs_blind;
	bool mapped_blind;
	/* Files mapped shared at this capture and at the last operation (each
	 * may be NULL): a suspect among them is given a new ctime on any
	 * filesystem, for a store into a page already dirty leaves ctime. */
	const struct pathindex *mapped_now, *mapped_last;
	uint64_t dirs_read; /* out: directories read rather than taken */
	uint64_t reused;    /* out: files whose data stayed in an older archive */
	char **srcs;        /* out: the distinct checkpoints those are in */
	size_t n_srcs;      /* (the caller frees each and the array) */
};

/* Write <out_dirfd>/<archive> and <out_dirfd>/<manifest> for the tree below
 * root_fd (the root's contents, plus the root directory's own metadata in the
 * manifest), then fsync both. */
int tar_create_root(int root_fd, int out_dirfd, const char *archive, const char *manifest, struct tar_create_opts *o,
		    ckpt_error *err);

/* The progress totals of a create in journal mode: the parent's entries in
 * directories that did not change, and those of the ones that did, read
 * (a directory made or moved, deep, with its whole subtree). This spares
 * the walk of the whole root a count beside the create would make. */
bool tar_create_count_journal(int root_fd, const struct tar_create_opts *o, uint64_t *files, uint64_t *bytes);

/* track_check (ckptd.json(5), the tests): every entry of the live tree that has not
 * changed since `since` (the create's start) is in the manifest just
 * written, as the same inode with the same ctime: -EIO names the first one
 * the journal missed. */
int tar_create_check(int root_fd, int out_dirfd, const char *manifest, const struct tar_create_opts *o,
		     struct timespec since, ckpt_error *err);

/* A pax writer as checkpoints use, not opened: tar_writer_open (tar_seek.h)
 * compresses it, with zstd level 1 in independent frames, or not. */
struct archive *tar_writer_new(void);

/* Can libarchive write zstd here? */
bool tar_create_zstd_available(void);
