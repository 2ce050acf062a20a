/* reaper.c: the child that removes our containers when ckptd goes away. It
 * learns container ids through a pipe ("+id\n", "-id\n") and deletes the
 * ones still listed when the pipe closes, i.e. when ckptd exits or dies. */
#include "host/reaper.h"

#include <signal.h>
#include <sys/prctl.h>

#define REAPER_LINE_MAX 256

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
	for (size_t j = 0; j < n; j++)
		if (ids[j])
			runsc_delete(rs, ids[j]);
	_exit(0);
}

int reaper_start(const struct runsc *rs, int *ret_fd)
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(p[0]), close(p[1]);
		return -errno;
	}
	if (pid == 0) {
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
