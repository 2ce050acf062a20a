/* rootexcl.h: what a root's checkpoints leave out, by identity. Every root
 * leaves out the state dir and the "exclude" paths of the config. The whole
 * sandbox as a root ("/", docs/whole-root.md) also leaves out /tmp and every
 * other mount point (pseudo-filesystems and the rest, from mountinfo), and
 * any directory on another filesystem. An excluded entry is neither captured
 * nor, on restore, removed or rewritten: a create and a restore skip the
 * same entries, so what the checkpoint lacks stays as it is live. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

struct rootexcl_item {
	char *path;   /* absolute */
	char *why;    /* "state dir", "mount point (proc)", "/tmp", "config exclude" */
	bool present; /* it exists: dev and ino are set */
	bool nested;  /* below another item: left out with it (health omits it) */
	dev_t dev;
	ino_t ino;
};

struct rootexcl {
	struct rootexcl_item *v;
	size_t n;
	bool one_fs; /* a directory not on root_dev is a mount point: left out */
	dev_t root_dev;
};

/* What leaves out of the roots, read now (mounts change). mountinfo: a path
 * ("/proc/self/mountinfo"), read only when whole is set. 0 or -errno. */
int rootexcl_build(struct rootexcl *x, bool whole, const char *state_dir, char *const *excludes, size_t n_excludes,
		   const char *mountinfo);
void rootexcl_free(struct rootexcl *x);

/* Is the entry st (lstat of a name below a root) left out? x may be NULL. */
bool rootexcl_has(const struct rootexcl *x, const struct stat *st);

/* One mountinfo line's mount point (field 5), unescaped (\040 and kin),
 * into buf; its filesystem type (after " - ") into type. 0 or -EINVAL. */
int rootexcl_parse_mountinfo(const char *line, char *buf, size_t len, char *type, size_t type_len);
