/* tar_replace.h: how a restore replaces an entry as dpkg does (the new one
 * made beside it under a temporary name, then renamed over it), and the
 * record of what it replaced or removed, for the services step of a
 * whole-root restore (docs/whole-root.md). */
#pragma once
#include <stddef.h>
#include <sys/stat.h>
#include "backend/tar/tar_restore.h"

/* A new regular file (mode 0600) to take leaf's place in the directory pfd:
 * by_rename, under a fresh temporary name (into tmp; an existing entry is
 * never touched: a taken name makes it try the next), for tar_replace_commit;
 * else leaf itself, unlinked first, and tmp "". fd, or -errno.
 * Renaming over a file cost about twice the time in a restore that rewrote
 * 4,000 files on this ext4 (auto_da_alloc writes the new data out at a
 * rename over a file, most likely): only the whole root, whose programs run
 * from its files, pays it. */
int tar_new_open(int pfd, const char *leaf, bool by_rename, char *tmp, size_t len);
int tar_new_symlink(int pfd, const char *target, char *tmp, size_t len);
/* Rename tmp over leaf (both in pfd): 0 or -errno; nothing when tmp is "". */
int tar_replace_commit(int pfd, const char *tmp, const char *leaf);
/* Replace leaf of pfd by a symbolic link to target with this owner and
 * mtime, made beside it and renamed over it (nothing left on failure). */
int tar_replace_symlink(int pfd, const char *leaf, const char *target, uid_t uid, gid_t gid, struct timespec mtime);

/* Record in o->gone (when set) the regular file leaf of pfd, about to be
 * replaced or removed; and every regular file of a subtree about to go. */
void tar_gone_at(const struct tar_restore_opts *o, int pfd, const char *leaf, const char *path);
/* A path (below the root "/") the restore wrote or removed: note a unit
 * file change, and the name of a .service it wrote (a unit file or an
 * enablement link) in o->units_linked (o->gone set only). */
void tar_replace_note(struct tar_restore_opts *o, const char *path, bool written);
void tar_gone_tree(const struct tar_restore_opts *o, int dirfd, const char *name, const struct stat *st,
		   const char *path);
