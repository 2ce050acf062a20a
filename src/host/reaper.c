/* reaper.c: the child that removes our containers when ckptd goes away. It
 * learns container ids through a pipe ("+id\n", "-id\n") and deletes the
 * ones still listed when the pipe closes, i.e. when ckptd exits or dies.
 *
 * A `runsc run` (or restore) that ckptd spawned may outlive it and create
 * its container only later, so the reaper waits for those to end before its
 * delete. Container ids repeat across restarts of one instance, so the
 * reaper holds reaper.lock until it is done, and a restarted ckptd takes
 * that lock, then removes whatever is left in its runsc root, before it
 * creates anything: an old reaper never deletes a new container. */
#include "host/reaper.h"

#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <time.h>

#define REAPER_LINE_MAX 256
#define REAPER_POLL_US (100 * 1000)

static int64_t reaper_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait (until deadline) for the runsc processes still creating id (NULL:
 * any) to end; past it, kill them. Then nothing creates id any more. */
static void reaper_wait_creators(const struct runsc *rs, const char *id, int64_t deadline)
{
	while (runsc_creating(rs, id, false) > 0 && reaper_mono_ms() < deadline)
		usleep(REAPER_POLL_US);
	for (int i = 0; i < 50 && runsc_creating(rs, id, reaper_mono_ms() >= deadline) > 0; i++)
		usleep(REAPER_POLL_US / 5);
}

static void reaper_main(int fd, const struct runsc *rs)
{
	char **ids = NULL, buf[4096], line[REAPER_LINE_MAX];
	size_t n = 0, ll = 0;
	ssize_t k;

	prctl(PR_SET_NAME, "ckptd-reaper");
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_IGN);
	while ((k = read(fd, buf, sizeof(buf))) != 0) {
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			break;
		for (ssize_t i = 0; i < k; i++) {
			if (buf[i] != '\n') {
				if (ll < sizeof(line) - 1)
					line[ll++] = buf[i];
				continue;
			}
			line[ll] = '\0', ll = 0;
			char **grown = line[0] == '+' ? realloc(ids, (n + 1) * sizeof(*ids)) : NULL;
			if (grown) /* on failure ids stays as it was: those sandboxes are still reaped */
				ids = grown, ids[n++] = strdup(line + 1);
			for (size_t j = 0; line[0] == '-' && j < n; j++)
				if (ids[j] && !strcmp(ids[j], line + 1))
					free(ids[j]), ids[j] = NULL;
		}
	}
	int64_t deadline = reaper_mono_ms() + RUNSC_TIMEOUT_MS;
	for (size_t j = 0; j < n; j++) {
		if (!ids[j])
			continue;
		reaper_wait_creators(rs, ids[j], deadline);
		runsc_delete(rs, ids[j]);
	}
	_exit(0); /* and reaper.lock is free for a restarted ckptd */
}

/* Wait for the reaper of a previous run of this instance to finish: it is
 * bounded by RUNSC_TIMEOUT_MS and its deletes. */
static int reaper_lock(const char *lock_path, int *ret_fd)
{
	_cleanup_close_ int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	int64_t deadline = reaper_mono_ms() + 4 * (int64_t)RUNSC_TIMEOUT_MS;
	bool said = false;

	if (fd < 0)
		return -errno;
	while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		if (errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		if (reaper_mono_ms() >= deadline)
			return -EBUSY;
		if (!said)
			log_notice("host: waiting for the reaper of a previous run to remove its containers");
		said = true;
		usleep(REAPER_POLL_US);
	}
	*ret_fd = TAKE_FD(fd);
	return 0;
}

/* Remove what a previous run left in our runsc root (its reaper may have
 * been killed too): wait for its orphaned creators, then delete them all. */
static void reaper_sweep(const struct runsc *rs)
{
	char **ids = NULL;
	size_t n = 0;

	reaper_wait_creators(rs, NULL, reaper_mono_ms() + RUNSC_TIMEOUT_MS);
	if (runsc_list(rs, &ids, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		log_notice("host: removing container '%s' left by a previous run", ids[i]);
		runsc_delete(rs, ids[i]);
	}
	runsc_strv_free(ids);
}

int reaper_start(const struct runsc *rs, const char *lock_path, int *ret_fd)
{
	_cleanup_close_ int lock = -1;
	int p[2], r;
	pid_t pid;

	if ((r = reaper_lock(lock_path, &lock)) < 0)
		return r;
	reaper_sweep(rs);
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(p[0]), close(p[1]);
		return -errno;
	}
	if (pid == 0) { /* keeps lock (O_CLOEXEC: runsc never inherits it) until it exits */
		close(p[1]);
		reaper_main(p[0], rs);
	}
	close(p[0]);
	*ret_fd = p[1];
	return 0;
}

void reaper_note(int fd, char op, const char *container)
{
	char line[REAPER_LINE_MAX];
	int n = snprintf(line, sizeof(line), "%c%s\n", op, container);
	if (fd >= 0 && n > 0 && n < (int)sizeof(line) && write(fd, line, (size_t)n) != n)
		log_debug("host: reaper note for '%s' failed", container);
}
