/* runsc.h: the gVisor runtime behind a few calls. Every call runs the runsc
 * binary with posix_spawn and an argv, under a per-instance --root so two
 * instances on one machine never see each other's containers, and with the
 * same top-level flags for run and restore (runsc requires it). */
#pragma once
#include <sys/types.h>
#include "lib/util.h"

#define RUNSC_TIMEOUT_MS (120 * 1000)

struct runsc {
	const char *path; /* binary */
	const char *root; /* --root directory */
};

/* "0.0~20221219.0" from `runsc --version`. */
int runsc_version(const char *path, char *buf, size_t len, ckpt_error *err);
/* An OCI bundle: config.json whose root is rootfs (writable under --overlay,
 * so rootfs itself stays untouched) and whose init runs init_argv. */
int runsc_write_bundle(const char *bundle_dir, const char *rootfs, const char *const *init_argv, ckpt_error *err);
/* Start detached. runsc keeps its caller's stdout/stderr open, so they go to
 * log_path (a file), never a pipe. */
int runsc_run(const struct runsc *r, const char *bundle, const char *id, const char *log_path, ckpt_error *err);
/* image_dir must not exist yet. */
int runsc_checkpoint(const struct runsc *r, const char *id, const char *image_dir, const char *log_path,
		     ckpt_error *err);
int runsc_restore(const struct runsc *r, const char *bundle, const char *image_dir, const char *id,
		  const char *log_path, ckpt_error *err);
/* A pidfd of the container's sandbox process (runsc-sandbox), from `runsc
 * state`: killing it stops the sandbox at once, without a runsc call. */
int runsc_sandbox_pidfd(const struct runsc *r, const char *id);
/* The ids of every container under r->root (`runsc list -quiet`). */
int runsc_list(const struct runsc *r, char ***ret, size_t *ret_n);
/* How many `runsc run` or `runsc restore` processes that we spawned under
 * r->root still create container id (any id when NULL), from /proc. A dead
 * ckptd leaves them orphaned: the container appears only when they end.
 * kill_them SIGKILLs them. */
int runsc_creating(const struct runsc *r, const char *id, bool kill_them);
/* Kill and remove the container; 0 also when it does not exist. */
int runsc_delete(const struct runsc *r, const char *id);

struct runsc_proc {
	pid_t pid;
	int in_fd, out_fd, err_fd; /* pipe ends, O_CLOEXEC */
};
/* `runsc exec id argv...` with stdin, stdout and stderr on pipes. */
int runsc_exec(const struct runsc *r, const char *id, const char *const *argv, struct runsc_proc *ret, ckpt_error *err);
/* Wait for a child; returns its exit status (0..255, 128+signal) or <0. */
int runsc_wait(pid_t pid, int timeout_ms);

/* The host's CPU feature flags (from /proc/cpuinfo), as a malloc'd
 * NULL-terminated array of strings. */
int runsc_cpu_features(char ***ret, size_t *ret_n);
void runsc_strv_free(char **v);
