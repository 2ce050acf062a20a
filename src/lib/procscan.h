/* procscan.h: what processes hold, read from a proc filesystem: their working
 * directory, root, open files and mapped files. One callback per reference,
 * with its path and, when asked, the inode it names, so a caller can match by
 * path prefix today and by (dev, ino) where a path can lie (a chroot, a
 * mount namespace, a file renamed since it was opened). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

enum procscan_kind {
	PROCSCAN_CWD,
	PROCSCAN_ROOT,
	PROCSCAN_FD,
	PROCSCAN_MAP
};

struct procscan_pid; /* the scan's, for procscan_ref_same_mntns */

struct procscan_ref {
	pid_t pid;
	struct procscan_pid *pid_state;
	enum procscan_kind kind;
	const char *path; /* absolute, without the kernel's " (deleted)" suffix */
	bool deleted;     /* the kernel marked the path " (deleted)" */
	bool has_id;      /* dev and ino are set (PROCSCAN_STAT) */
	dev_t dev;
	ino_t ino;
	int link_dirfd;        /* cwd, root, fd: the magic link is link_name below this fd; */
	const char *link_name; /* maps: -1 and NULL */
	bool shared;           /* maps: a shared mapping (perms ...s) */
	bool shared_write;     /* maps: a shared mapping that may be written (perms rw-s) */
};

/* Fill dev and ino: a link's target by stat through the proc link itself (so
 * the right inode even when the path no longer names it), a mapping from the
 * device and inode columns of its maps line. */
#define PROCSCAN_STAT 1u
/* Only the mappings: no cwd, root or fd is read. */
#define PROCSCAN_MAPS_ONLY 2u
/* Let a caller ask whether a process shares the scanner's mount namespace
 * (procscan_ref_same_mntns): its paths then read as the scanner's would, so
 * a caller can decide by path which links to stat (procscan_ref_stat) rather
 * than stat every one, the most of a scan's cost on a busy machine. A
 * mapping's id, which its maps line gives, is filled with this flag too. */
#define PROCSCAN_MNTNS 4u
/* No cwd or root: the fds and mappings only (files, not directories in use). */
#define PROCSCAN_NO_DIRS 8u
/* Of the mappings, only the shared ones (writable or not: shared_write
 * says), asked of the kernel where it answers (PROCMAP_QUERY, Linux 6.11) rather than read
 * from the text of maps, which the kernel writes line by line for every
 * mapping of a process: most of a scan's cost on a busy machine. */
#define PROCSCAN_SHARED_MAPS 16u

/* What the callback returns: < 0 stops the scan with that error. */
#define PROCSCAN_CONTINUE 0
#define PROCSCAN_NEXT_PID 1 /* this pid is decided: skip its other references */

typedef int (*procscan_fn)(void *ctx, const struct procscan_ref *ref);

/* Every process of the proc filesystem mounted at proc (normally "/proc")
 * except skip_pid (0: none), each of its references in the order cwd, root,
 * fds, maps; references that name no file (sockets, pipes, anonymous
 * inodes) are left out, and a mapped file is given once per run of lines
 * (again where a line of the run maps it shared and writable). A
 * process that goes away during the scan is skipped, and so are the links
 * of one whose links the kernel refuses to read (it refuses all of them,
 * as it does its maps). 0, fn's error or -errno when proc cannot be listed. */
int procscan_each(const char *proc, pid_t skip_pid, unsigned flags, procscan_fn fn, void *ctx);

/* With PROCSCAN_MNTNS: whether ref's process shares the scanner's mount
 * namespace, read once per process at the first call (false without the
 * flag, or when it cannot be told). */
bool procscan_ref_same_mntns(const struct procscan_ref *ref);

/* Fill ref's dev and ino (has_id) where the scan did not (no PROCSCAN_STAT):
 * a link's target stat'ed through the proc link. 0, or -errno (the process
 * or its fd gone since). */
int procscan_ref_stat(struct procscan_ref *ref);

/* path is root itself or below it. Both absolute; trailing '/' of root
 * ignored; root "/" holds every absolute path. */
bool procscan_path_under(const char *path, const char *root);

/* Pids (other than skip_pid) with any reference under one of roots, in the
 * order proc lists them. *ret malloc'd (NULL when none). */
int procscan_pids_under(const char *proc, char *const *roots, size_t n_roots, pid_t skip_pid, pid_t **ret,
			size_t *ret_n);

/* The command name of pid (its comm, up to 15 bytes) into buf; "" when gone. */
void procscan_comm(const char *proc, pid_t pid, char *buf, size_t len);

/* A directory a caller asks about, by identity: a reference uses it when it
 * is that directory or anything below it. */
struct procscan_target {
	const char *path; /* how the directory reads (absolute) */
	dev_t dev;        /* its identity: stat() of the directory */
	ino_t ino;
	int tag; /* the caller's, returned with the pids found */
};

/* The target ref uses, or -1. A cwd or root (and a directory fd whose path
 * reads below a target) is matched by walking its parents with ".." from the
 * proc link itself, so a directory hidden under a mount, renamed, or reading
 * the same path as a mount is still told apart; a file or mapping, which has
 * no parent to walk, by its path below a target's path, preferring the
 * target on its device. */
int procscan_ref_target(const struct procscan_ref *ref, const struct procscan_target *t, size_t n);

struct procscan_user {
	pid_t pid;
	int tag; /* of the target its first matching reference uses */
};

/* Processes (other than skip_pid) using any of targets, each once, in the
 * order proc lists them. *ret malloc'd (NULL when none). */
int procscan_users(const char *proc, const struct procscan_target *t, size_t n, pid_t skip_pid,
		   struct procscan_user **ret, size_t *ret_n);
