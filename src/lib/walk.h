/* walk.h: the one way ckptd lists a directory. Directories are opened
 * relative to a directory fd with O_NOFOLLOW; "." and ".." never reach the
 * caller; a read error is told apart from the end of the directory. */
#pragma once
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

/* A stream over name below dirfd (never following a final symlink), or over
 * dirfd itself when name is NULL: then through a new open file description, so
 * reading never moves dirfd's own offset. 0, or -errno. */
int walk_open(int dirfd, const char *name, DIR **ret);

/* The next entry other than "." and "..". NULL at the end with errno 0, or on
 * a read error with errno set. dirfd(d) names the directory for *at() calls. */
struct dirent *walk_next(DIR *d);

/* fn for each entry of name below dirfd (as walk_open): dirfd is the listed
 * directory. A negative return of fn stops the walk and is returned; a failure
 * to open or read gives -errno. */
typedef int (*walk_fn)(void *ctx, int dirfd, const char *name);
int walk_each(int dirfd, const char *name, walk_fn fn, void *ctx);

/* walk_tree: the one recursive walk. It goes down by fds only (openat with
 * O_NOFOLLOW, fstatat with AT_SYMLINK_NOFOLLOW): a symlink is an entry,
 * never followed, and no path is resolved twice. Its depth is bounded, so a
 * deep tree ends in -ELOOP instead of the stack. */

/* The deepest directory a walk lists: the root is depth 0, its entries 1. */
#define WALK_DEPTH_MAX 4096

enum {
	WALK_SORTED = 1 << 0, /* each directory's entries in strcmp order of names, each once */
	WALK_STAT = 1 << 1,   /* fstatat every entry; else e->st only where d_type is unknown */
	WALK_DIRS = 1 << 2,   /* only directories reach the hooks: files are not stat'ed */
};

/* What a hook may return besides 0 (go on) and -errno (stop; walk_tree
 * returns it). WALK_SKIP from pre: do not go below this directory.
 * WALK_STOP: end the walk; walk_tree returns WALK_STOP. */
enum {
	WALK_SKIP = 1,
	WALK_STOP = 2
};

/* Where a walk failed, for the fail hook. */
enum walk_step {
	WALK_AT_PATH = 1, /* the path would pass path_max: -ENAMETOOLONG */
	WALK_AT_STAT,     /* fstatat of the entry */
	WALK_AT_DEPTH,    /* a directory deeper than max_depth: -ELOOP */
	WALK_AT_OPEN,     /* opening a directory pre let the walk enter */
	WALK_AT_READ,     /* reading directory e (e->fd >= 0) */
};

struct walk_entry {
	struct walk_entry *parent; /* the directory listed (depth 0: the root); hooks may mark its data */
	int dirfd;                 /* parent's fd: name is relative to it */
	const char *name;
	const char *path; /* below the root, prefixed as walk_opts.prefix; valid in this call only */
	size_t path_len;
	int depth;           /* 1 for the root's entries */
	unsigned char type;  /* DT_* (never DT_UNKNOWN); pre may correct it from a stat of its own */
	struct stat st;      /* with WALK_STAT, or where d_type was DT_UNKNOWN */
	int fd;              /* a directory's own fd in post and in fail at WALK_AT_READ; else -1.
			      * pre may set it to the directory, opened as it likes: the walk then
			      * reads through that fd (and closes it) instead of opening the name */
	int err;             /* in post: 0, or why this directory did not end well */
	enum walk_step step; /* in fail: where */
	intptr_t data;       /* the caller's, per directory: set in pre, seen by children and post */
};

/* pre: each entry, a directory before its contents. post: each directory
 * pre returned 0 for, after its contents; also when it could not be
 * entered (e->fd -1) or the walk ends below it: then e->err says why, post
 * only releases what pre took, and its return is ignored.
 * fail: a failure at entry e, e->step says where (at WALK_AT_PATH e->path
 * is still the parent's). 0 skips e and goes on (after a read error, with
 * what was read); so does WALK_SKIP at WALK_AT_PATH; WALK_SKIP at
 * WALK_AT_READ skips the rest of directory e (post sees the read error in
 * e->err; at the root the walk ends there, with 0); anything else ends
 * the walk with it. Without fail every failure ends the walk. */
struct walk_opts {
	unsigned flags;
	int max_depth;      /* 0: WALK_DEPTH_MAX */
	size_t path_max;    /* 0: no bound; else paths of path_max bytes or more fail */
	const char *prefix; /* NULL or "": paths start at the root's entries ("a/b") */
	intptr_t data;      /* the root's data */
	int (*pre)(void *ctx, struct walk_entry *e);
	int (*post)(void *ctx, struct walk_entry *e);
	int (*fail)(void *ctx, const struct walk_entry *e, int err);
	void *ctx;
};

/* Walk below name in dirfd (as walk_open; the root itself reaches no hook).
 * 0, WALK_STOP, or -errno: the root's open, ENOMEM, or what a hook said. */
int walk_tree(int dirfd, const char *name, const struct walk_opts *o);

/* A fail hook for best-effort walks: what cannot be read is left out. */
int walk_fail_ignore(void *ctx, const struct walk_entry *e, int err);

/* walk_merge: the union of n trees walked as one, for comparing and
 * merging them. Each name comes once (a name readdir repeats included),
 * in strcmp order, with which trees
 * hold it and its stat in each; the walk goes below it in each tree where
 * it is a directory (pre may leave trees out). Same depth and path bounds,
 * hooks and answers as walk_tree; every entry is stat'ed. */
struct walk_merge_side {
	int dirfd;      /* the parent's fd in this tree, or -1 where the parent is not entered there */
	bool held;      /* this tree has the name (listed and stat'ed) */
	bool descend;   /* for pre: go below it in this tree; preset where held and a directory */
	struct stat st; /* where held */
	int fd;         /* the directory's own fd in this tree in post and at WALK_AT_READ; else -1 */
};

struct walk_merge_entry {
	struct walk_merge_entry *parent; /* depth 0: the roots */
	const char *name;
	const char *path; /* as walk_entry's */
	size_t path_len;
	int depth;
	size_t n;                     /* trees */
	struct walk_merge_side *side; /* n of them, in the order of the roots */
	int tree;                     /* in fail: the tree where it failed, or -1 */
	int err;                      /* in post, as walk_entry's */
	enum walk_step step;          /* in fail: where */
	intptr_t data;                /* the caller's, per directory, as walk_entry's */
};

/* As walk_opts, for walk_merge. fail at WALK_AT_STAT: 0 takes the entry as
 * not held by that tree; at WALK_AT_OPEN: 0 goes on without that tree,
 * WALK_SKIP skips the entry in every tree (post still runs); at
 * WALK_AT_READ: 0 goes on with what was read, WALK_SKIP skips the entry in
 * every tree (post sees the read error in e->err; at the roots the walk
 * ends there, with 0). An entry gone since it was
 * listed fails with ENOENT (or ENOTDIR, replaced); a hook that takes
 * failures as absence should take only those: EMFILE, ENFILE or EIO
 * there is not an answer about the tree. */
struct walk_merge_opts {
	int max_depth;
	size_t path_max;
	const char *prefix;
	intptr_t data;
	int (*pre)(void *ctx, struct walk_merge_entry *e);
	int (*post)(void *ctx, struct walk_merge_entry *e);
	int (*fail)(void *ctx, const struct walk_merge_entry *e, int err);
	void *ctx;
};

/* Walk the union of the directories roots[0..n) (-1: a tree that has
 * none; each opened anew, as walk_open with a NULL name). 0, WALK_STOP,
 * or -errno: a root's open, ENOMEM, or what a hook said. */
int walk_merge(const int *roots, size_t n, const struct walk_merge_opts *o);
