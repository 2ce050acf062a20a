/* pathindex.h: sets of paths below a tree, shared by the backends: an
 * index of relative paths to the identity (inode, ctime, size) of the file
 * seen there (an overlay upper's index; the files change tracking suspects),
 * and the list of changed directories change tracking reports. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

/* relpath -> identity of the source file when it was copied (an upper's index). */
struct pathindex;

struct pathindex *pathindex_new(void);
void pathindex_free(struct pathindex *ix);
static inline void pathindex_freep(struct pathindex **ix)
{
	pathindex_free(*ix);
}
size_t pathindex_count(const struct pathindex *ix);
int pathindex_put(struct pathindex *ix, const char *relpath, const struct stat *st);
/* True when relpath was recorded with the same inode, ctime and size as st. */
bool pathindex_match(const struct pathindex *ix, const char *relpath, const struct stat *st);
/* Record relpath so that no stat matches it: a file written through a shared
 * mapping may change with no new ctime (a write into a page already dirty
 * makes no fault), so the next update compares its data, and the next copy
 * copies it again rather than link it. */
int pathindex_put_untrusted(struct pathindex *ix, const char *relpath, const struct stat *st);
/* relpath was recorded untrusted with the same inode, ctime and size as st:
 * its metadata is unchanged, its data must be compared. */
bool pathindex_match_untrusted(const struct pathindex *ix, const char *relpath, const struct stat *st);
/* relpath has an entry (ix may be NULL: false). Used as a set of paths. */
bool pathindex_has(const struct pathindex *ix, const char *relpath);
/* Serialize with a tag (e.g. the layer name the index points into). Not fsynced:
 * a lost or torn index only costs a full copy next time. */
int pathindex_save(const struct pathindex *ix, const char *tag, int dirfd, const char *name);
/* ret_tag: malloc'd tag. -ENOENT when absent, -EBADMSG when torn. */
int pathindex_load(int dirfd, const char *name, struct pathindex **ret, char **ret_tag);

/* A copy of ix (NULL when out of memory). */
struct pathindex *pathindex_copy(const struct pathindex *ix);
/* fn(ctx, path) for each path of ix (may be NULL), in no order, until one
 * answers < 0: that answer. */
int pathindex_each(const struct pathindex *ix, int (*fn)(void *ctx, const char *path), void *ctx);
/* The paths of src added to *dst (made when NULL), as a set of paths. */
int pathindex_merge(struct pathindex **dst, const struct pathindex *src);

/* A directory below src (relative, "" for src itself) that changed since
 * dst was copied from it: its entries and own metadata are compared, and with
 * deep its whole subtree (a directory made, moved or removed under that name).
 * named: every event that marked it named the entry it changed, and those
 * entries are all in names (sorted, at most PATHINDEX_DIRTY_NAMES): a
 * reader may compare only them, and the directory's own metadata. */
#define PATHINDEX_DIRTY_NAMES 128
struct pathindex_dirty {
	char *path;
	bool deep;
	/* The events say no name left it since the last collect (no delete, no
	 * move away): every name it had then is still there, so a delta need
	 * not read what the previous layers held (overlay_delta.c). False
	 * where a directory is named for another reason (a file in use). */
	bool kept;
	bool named;
	/* deep, and its directories are in the delta's list of the upper's
	 * already: folded from earlier deltas (overlay_rebase.c) */
	bool known;
	size_t n_names;
	char **names;
};
void pathindex_dirty_free(struct pathindex_dirty *v, size_t n);
/* d's entries are all to be compared: its names go (named false). */
void pathindex_dirty_unname(struct pathindex_dirty *d);
/* v[0..*n) sorted by path, each path once: the deep one kept (its names
 * gone), kept only when every entry of the path is, named only when every
 * one is and their names fit (joined, sorted), known only while every deep
 * one is. Entries merged away are freed. */
void pathindex_dirty_dedup(struct pathindex_dirty *v, size_t *n);
/* d is named, and name is one of its names. */
bool pathindex_dirty_named(const struct pathindex_dirty *d, const char *name);
/* In a list sorted by path: the entry for path, or NULL. */
const struct pathindex_dirty *pathindex_dirty_find(const struct pathindex_dirty *v, size_t n, const char *path);
/* Some directory above path ("" included, path itself not) is listed deep. */
bool pathindex_dirty_below_deep(const struct pathindex_dirty *v, size_t n, const char *path);
/* The entries of directory dir ("" the top) changed: dir is listed, or lies
 * below a directory listed deep. */
bool pathindex_dirty_covers(const struct pathindex_dirty *v, size_t n, const char *dir);
