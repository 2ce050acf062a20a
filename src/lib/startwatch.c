/* startwatch.c: whether a start still makes progress (startwatch.h says how
 * it is judged). The judgement is pure; the sample reads /proc. */
#include "lib/startwatch.h"
#include "lib/util.h"

void startwatch_init(struct startwatch *w, int64_t now_ms, int64_t quiet_ms)
{
	*w = (struct startwatch){ .progress_ms = now_ms,
				  .quiet_ms = quiet_ms > STARTWATCH_QUIET_MS ? quiet_ms : STARTWATCH_QUIET_MS };
}

static bool startwatch_moved(const struct startwatch_sample *a, const struct startwatch_sample *b)
{
	return a->io != b->io || a->cpu != b->cpu || a->switches != b->switches;
}

enum startwatch_verdict startwatch_step(struct startwatch *w, const struct startwatch_sample *s, int64_t now_ms)
{
	if (!s->known) { /* ckptd does not fail a start it cannot see */
		w->progress_ms = now_ms;
		return STARTWATCH_BLIND;
	}
	if (!w->have || startwatch_moved(&w->last, s))
		w->progress_ms = now_ms;
	w->last = *s;
	w->have = true;
	int64_t quiet = startwatch_quiet_ms(w, now_ms);
	if (quiet < w->quiet_ms)
		return STARTWATCH_MOVING;
	if (s->disk_wait && quiet < STARTWATCH_WAIT_QUIET_MS)
		return STARTWATCH_WAITING;
	return STARTWATCH_STALLED;
}

int64_t startwatch_quiet_ms(const struct startwatch *w, int64_t now_ms)
{
	return now_ms > w->progress_ms ? now_ms - w->progress_ms : 0;
}

/* One small proc file, whole. 0 when the thread or process is gone. */
static ssize_t startwatch_read(int dirfd, const char *id, const char *name, char *buf, size_t size)
{
	char path[64];
	snprintf(path, sizeof(path), "%s/%s", id, name);
	_cleanup_close_ int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT || errno == ESRCH ? 0 : -errno;
	ssize_t n = read(fd, buf, size - 1);
	if (n < 0)
		return errno == ESRCH ? 0 : -errno;
	buf[n] = 0;
	return n;
}

/* stat: "TID (comm) S ..." where comm may hold spaces and parens; utime
 * and stime are its 14th and 15th fields: the 11th and 12th after the state. */
static int startwatch_parse_stat(const char *text, struct startwatch_sample *s)
{
	const char *p = strrchr(text, ')');
	char state;
	unsigned long long utime, stime;
	if (!p || sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &state, &utime, &stime) != 3)
		return -EINVAL;
	s->cpu += utime + stime;
	s->disk_wait |= state == 'D';
	return 0;
}

/* The text after key at the start of a line of text, or NULL. */
static const char *startwatch_line(const char *text, const char *key)
{
	size_t len = strlen(key);
	for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, key, len))
			return p + len;
	return NULL;
}

/* The sum of the values of keys, each at the start of a line of text. */
static int startwatch_parse_keys(const char *text, const char *const *keys, size_t n, uint64_t *sum)
{
	for (size_t i = 0; i < n; i++) {
		const char *p = startwatch_line(text, keys[i]);
		unsigned long long v;
		if (!p || sscanf(p, " %llu", &v) != 1)
			return -EINVAL;
		*sum += v;
	}
	return 0;
}

static const char *const startwatch_io_keys[] = { "rchar:", "wchar:", "syscr:", "syscw:" };
static const char *const startwatch_status_keys[] = { "voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:" };

/* The counters of dirfd/id: a thread (task/TID) or a child process (PID). */
static int startwatch_add(int dirfd, const char *id, struct startwatch_sample *s)
{
	char stat[1024], io[1024], status[4096];
	ssize_t a = startwatch_read(dirfd, id, "stat", stat, sizeof(stat));
	ssize_t b = a > 0 ? startwatch_read(dirfd, id, "io", io, sizeof(io)) : a;
	ssize_t c = b > 0 ? startwatch_read(dirfd, id, "status", status, sizeof(status)) : b;
	if (a <= 0 || b <= 0 || c <= 0) /* gone between readdir and open: it counts no more */
		return a < 0 ? (int)a : b < 0 ? (int)b : (int)c;
	int r = startwatch_parse_stat(stat, s);
	if (r >= 0)
		r = startwatch_parse_keys(io, startwatch_io_keys, 4, &s->io);
	if (r >= 0)
		r = startwatch_parse_keys(status, startwatch_status_keys, 2, &s->switches);
	return r;
}

/* A child's work (a runsc command the thread waits for) is progress too;
 * its counters reach ours only once it is reaped. A child that cannot be
 * read counts nothing. No children file (a kernel without
 * CONFIG_PROC_CHILDREN): no child is seen. */
static void startwatch_add_children(int procfd, int taskfd, const char *tid, struct startwatch_sample *s)
{
	char list[4096];
	ssize_t n = startwatch_read(taskfd, tid, "children", list, sizeof(list));
	if (n <= 0)
		return;
	if ((size_t)n == sizeof(list) - 1) /* the last pid may be cut */
		*(strrchr(list, ' ') ?: list) = 0;
	char *save = NULL;
	for (char *pid = strtok_r(list, " \n", &save); pid; pid = strtok_r(NULL, " \n", &save)) {
		struct startwatch_sample one = { 0 };
		if (startwatch_add(procfd, pid, &one) == 0) {
			s->io += one.io, s->cpu += one.cpu, s->switches += one.switches;
			s->disk_wait |= one.disk_wait;
		}
	}
}

static int startwatch_add_task(int procfd, int taskfd, const char *tid, struct startwatch_sample *s)
{
	int r = startwatch_add(taskfd, tid, s);
	if (r >= 0)
		startwatch_add_children(procfd, taskfd, tid, s);
	return r;
}

int startwatch_sample_self(const char *proc, pid_t skip_tid, struct startwatch_sample *s)
{
	char skip[24];
	*s = (struct startwatch_sample){ 0 };
	snprintf(skip, sizeof(skip), "%d", (int)skip_tid);
	_cleanup_close_ int procfd = open(proc, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int taskfd = procfd < 0 ? -1 : openat(procfd, "self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_closedir_ DIR *d = taskfd < 0 ? NULL : fdopendir(taskfd);
	if (!d) {
		int e = errno;
		if (taskfd >= 0)
			close(taskfd);
		return -e;
	}
	struct dirent *de;
	int r = 0;
	while (r >= 0 && (de = readdir(d)))
		if (de->d_name[0] != '.' && strcmp(de->d_name, skip) != 0)
			r = startwatch_add_task(procfd, dirfd(d), de->d_name, s);
	if (r < 0)
		*s = (struct startwatch_sample){ 0 };
	s->known = r >= 0;
	return r;
}
