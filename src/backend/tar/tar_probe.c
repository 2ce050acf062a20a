/* tar_probe.c: what a root's filesystem changes without a new ctime.
 * A create takes a file whose (inode, ctime, size) is its parent's as
 * unchanged, and a restore keeps such a file. That holds only where every
 * change of data or xattrs moves ctime. gVisor moves it neither for a
 * setxattr nor for a store through a shared mapping, not even at msync or
 * munmap (runsc 20221219: its root overlay, its tmpfs and gofer mounts
 * alike). So this is probed once per root, when ckptd starts, on a file of
 * the root's filesystem. */
#include "backend/tar/tar_internal.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/xattr.h>

/* fd's ctime moved past *was (which becomes the new one). */
static bool probe_moved(int fd, struct timespec *was)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return false;
	bool moved = st.st_ctim.tv_sec != was->tv_sec || st.st_ctim.tv_nsec != was->tv_nsec;
	*was = st.st_ctim;
	return moved;
}

/* A user xattr set: -1 when this filesystem takes none (no xattr can
 * change there, so none is missed), else whether ctime moved. */
static int probe_xattr(int fd, struct timespec *ct)
{
	tar_wait_past(*ct);
	if (fsetxattr(fd, "user.ckptd-probe", "1", 1, 0) < 0)
		return errno == ENOTSUP ? -1 : 0;
	return probe_moved(fd, ct);
}

/* A store through a shared writable mapping, unmapped. The store is made
 * in a child: a filesystem that fails the page in (EIO from a FUSE or
 * network root) raises SIGBUS, which must end the probe, not ckptd. A
 * child that did not exit cleanly counts as blind. */
static bool probe_mapped(int fd, struct timespec *ct)
{
	tar_wait_past(*ct);
	pid_t pid = fork();
	if (pid < 0)
		return false;
	if (pid == 0) {
		/* die of it quietly: a sanitizer's handler would report it */
		signal(SIGBUS, SIG_DFL);
		signal(SIGSEGV, SIG_DFL);
		char *m = mmap(NULL, 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			_exit(1);
		m[0] = 'y';
		munmap(m, 1);
		_exit(0);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return false;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return false;
	return probe_moved(fd, ct);
}

/* The probe file stays linked while probed: gVisor's gofer refuses
 * fsetxattr on an unlinked file (EINVAL). Unsure counts as blind. */
static int probe_in(int dirfd, const char *name, struct tar_ctime_probe *p)
{
	struct stat st;
	unlinkat(dirfd, name, 0); /* left by a run cut short */
	_cleanup_close_ int fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	int r = write(fd, "x", 1) == 1 && fstat(fd, &st) == 0 ? 0 : -EIO;
	if (r == 0) {
		struct timespec ct = st.st_ctim;
		int x = probe_xattr(fd, &ct);
		p->xattrs_blind = x == 0;
		p->mapped_blind = !probe_mapped(fd, &ct);
		p->probed = true;
	}
	unlinkat(dirfd, name, 0);
	return r;
}

/* On the root's filesystem: in the state dir when it is on the same one,
 * else in the root itself (a hidden file, there for a moment, before the
 * trackers are armed and the base is taken). */
void tar_probe_ctime(int tar_fd, const char *root, struct tar_ctime_probe *p)
{
	struct stat rs, ts;
	*p = (struct tar_ctime_probe){ .xattrs_blind = true, .mapped_blind = true };
	_cleanup_close_ int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	bool here = rfd >= 0 && fstat(rfd, &rs) == 0 && fstat(tar_fd, &ts) == 0 && rs.st_dev == ts.st_dev;
	int r = here ? probe_in(tar_fd, ".ctime-probe", p) : rfd >= 0 ? probe_in(rfd, ".ckptd-ctime-probe", p) : -errno;
	if (r < 0)
		log_warn("tar: cannot probe what '%s' changes without a new ctime (%s): xattrs are compared and "
			 "files written through mappings get a new ctime",
			 root, strerror(-r));
	else if (p->xattrs_blind || p->mapped_blind)
		log_info("tar: on '%s' %s%s%s leave ctime as it was: %s%s%s", root,
			 p->xattrs_blind ? "xattr changes" : "", p->xattrs_blind && p->mapped_blind ? " and " : "",
			 p->mapped_blind ? "writes through shared mappings" : "",
			 p->xattrs_blind ? "xattrs are compared" : "", p->xattrs_blind && p->mapped_blind ? ", " : "",
			 p->mapped_blind ? "a file written through a mapping gets a new ctime when captured" : "");
}
