/* failpoint.c: the test build's crash points (failpoint.h says what they are).
 * In the production build this file is empty. */
#include "lib/failpoint.h"

#ifdef CKPTD_FAILPOINTS
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const struct failpoint __start_ckptd_fp[], __stop_ckptd_fp[];

static char failpoint_armed[128];
static long failpoint_nth;
static atomic_long failpoint_hits;
static int failpoint_trace;
static int failpoint_hang;

int failpoint_arm(const char *spec, int hang, int trace)
{
	failpoint_trace = trace;
	failpoint_hang = hang;
	failpoint_armed[0] = 0;
	if (!spec || !*spec)
		return 0;
	const char *colon = strrchr(spec, ':');
	size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
	if (len == 0 || len >= sizeof(failpoint_armed))
		return -EINVAL;
	failpoint_nth = 1;
	if (colon) {
		char *end;
		failpoint_nth = strtol(colon + 1, &end, 10);
		if (*end || failpoint_nth < 1)
			return -EINVAL;
	}
	memcpy(failpoint_armed, spec, len);
	failpoint_armed[len] = 0;
	return 0;
}

/* One write(2) each: a line is never torn and nothing waits in a buffer. */
static void failpoint_say(const char *what, const struct failpoint *fp)
{
	char line[256];
	int n = snprintf(line, sizeof(line), "failpoint %s %s\n", what, fp->name);
	if (n > 0 && write(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1) < 0)
		return;
}

void failpoint_hit(const struct failpoint *fp)
{
	int e = errno; /* FAILPOINT_AROUND's caller reads errno after us */
	if (failpoint_trace)
		failpoint_say("hit", fp);
	errno = e;
	if (!failpoint_armed[0] || strcmp(fp->name, failpoint_armed) != 0)
		return;
	if (atomic_fetch_add(&failpoint_hits, 1) + 1 != failpoint_nth)
		return;
	if (failpoint_hang) {
		failpoint_say("hang", fp);
		for (;;) /* asleep (S), not spinning: the signals are blocked, SIGKILL ends it */
			pause();
	}
	failpoint_say("kill", fp);
	/* SIGKILL: no handler, no exit hook, no stdio flush runs. */
	raise(SIGKILL);
	_exit(137);
}

static int failpoint_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void failpoint_list(FILE *f)
{
	size_t n = (size_t)(__stop_ckptd_fp - __start_ckptd_fp);
	const char **names = calloc(n ? n : 1, sizeof(*names));
	if (!names)
		return;
	for (size_t i = 0; i < n; i++)
		names[i] = __start_ckptd_fp[i].name;
	qsort(names, n, sizeof(*names), failpoint_cmp);
	for (size_t i = 0; i < n; i++)
		if (i == 0 || strcmp(names[i], names[i - 1]))
			fprintf(f, "%s\n", names[i]);
	free(names);
}
#endif
