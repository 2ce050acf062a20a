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

struct procscan_ref {
	pid_t pid;
	int pid_fd; /* <proc>/<pid>, for further reads by the callback */
	enum procscan_kind kind;
	const char *path; /* absolute, without the kernel's " (deleted)" suffix */
	bool deleted;     /* the kernel marked the path " (deleted)" */
	bool has_id;      /* dev and ino are set (PROCSCAN_STAT) */
	dev_t dev;
	ino_t ino;
};

/* Fill dev and ino: a link's target by stat through the proc link itself (so
 * the right inode even when the path no longer names it), a mapping from the
 * device and inode columns of its maps line. */
#define PROCSCAN_STAT 1u

/* What the callback returns: < 0 stops the scan with that error. */
#define PROCSCAN_CONTINUE 0
#define PROCSCAN_NEXT_PID 1 /* this pid is decided: skip its other references */

typedef int (*procscan_fn)(void *ctx, const struct procscan_ref *ref);

/* Every process of the proc filesystem mounted at proc (normally "/proc")
 * except skip_pid (0: none), each of its references in the order cwd, root,
 * fds, maps; references that name no file (sockets, pipes, anonymous
 * inodes) are left out, and a mapped file is given once per run of lines. A
 * process that goes away during the scan is skipped. 0, fn's error or -errno
 * when proc cannot be listed. */
int procscan_each(const char *proc, pid_t skip_pid, unsigned flags, procscan_fn fn, void *ctx);

/* path is root itself or below it. Both absolute; trailing '/' of root
 * ignored; root "/" holds every absolute path. */
bool procscan_path_under(const char *path, const char *root);

/* Pids (other than skip_pid) with any reference under one of roots, in the
 * order proc lists them. *ret malloc'd (NULL when none). */
int procscan_pids_under(const char *proc, char *const *roots, size_t n_roots, pid_t skip_pid, pid_t **ret,
			size_t *ret_n);

/* The command name of pid (its comm, up to 15 bytes) into buf; "" when gone. */
void procscan_comm(const char *proc, pid_t pid, char *buf, size_t len);
