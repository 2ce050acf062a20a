/* test_startwatch.c: when a start still gets more time from systemd. The
 * judgement over samples (a working start, a slow one, a hang, a long
 * fsync, an unreadable /proc), the parsing of a proc tree, and the real
 * /proc of this process: a thread that works moves the sum, one that
 * blocks does not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>

#include "lib/startwatch.h"
#include "lib/util.h"
#include "testlib.h"

#define SEC 1000

static struct startwatch_sample sample(uint64_t io, uint64_t cpu, bool disk_wait)
{
	return (struct startwatch_sample){ .known = true, .io = io, .cpu = cpu, .switches = 1, .disk_wait = disk_wait };
}

static enum startwatch_verdict step(struct startwatch *w, struct startwatch_sample s, int64_t at)
{
	return startwatch_step(w, &s, at);
}

/* A recovery that writes is asked more time for as long as it writes. */
static void test_moving(void **state)
{
	(void)state;
	struct startwatch w;
	startwatch_init(&w, 0, 0);
	for (int64_t t = 0; t <= 3600 * SEC; t += 5 * SEC)
		assert_int_equal(step(&w, sample((uint64_t)t, 7, false), t), STARTWATCH_MOVING);
	/* CPU time alone is progress too (a checksum over a mapped file) */
	for (int64_t t = 3605 * SEC; t <= 7200 * SEC; t += 5 * SEC)
		assert_int_equal(step(&w, sample(3600 * SEC, (uint64_t)t, false), t), STARTWATCH_MOVING);
}

/* Slow but working: one counter moves just inside each window. */
static void test_slow(void **state)
{
	(void)state;
	struct startwatch w;
	startwatch_init(&w, 0, 0);
	uint64_t io = 1;
	for (int64_t t = 0; t <= 3600 * SEC; t += 5 * SEC) {
		if (t % (55 * SEC) == 0)
			io++;
		assert_int_equal(step(&w, sample(io, 0, false), t), STARTWATCH_MOVING);
	}
}

/* Blocked on a lock: nothing moves, and after the quiet window no more time. */
static void test_hang(void **state)
{
	(void)state;
	struct startwatch w;
	startwatch_init(&w, 0, 0);
	assert_int_equal(step(&w, sample(100, 3, false), 0), STARTWATCH_MOVING);
	assert_int_equal(step(&w, sample(200, 3, false), 10 * SEC), STARTWATCH_MOVING);
	assert_int_equal(step(&w, sample(200, 3, false), 10 * SEC + STARTWATCH_QUIET_MS - 1), STARTWATCH_MOVING);
	assert_int_equal(startwatch_quiet_ms(&w, 10 * SEC + STARTWATCH_QUIET_MS - 1), STARTWATCH_QUIET_MS - 1);
	assert_int_equal(step(&w, sample(200, 3, false), 10 * SEC + STARTWATCH_QUIET_MS), STARTWATCH_STALLED);
	assert_int_equal(step(&w, sample(200, 3, false), 3600 * SEC), STARTWATCH_STALLED);
	/* it moves again: more time again (systemd may have ended it by then) */
	assert_int_equal(step(&w, sample(201, 3, false), 3605 * SEC), STARTWATCH_MOVING);
}

/* A long fsync(): asleep in D with no counter moving, for longer, but not forever. */
static void test_disk_wait(void **state)
{
	(void)state;
	struct startwatch w;
	startwatch_init(&w, 0, 0);
	assert_int_equal(step(&w, sample(5, 5, true), 0), STARTWATCH_MOVING);
	assert_int_equal(step(&w, sample(5, 5, true), STARTWATCH_QUIET_MS), STARTWATCH_WAITING);
	assert_int_equal(step(&w, sample(5, 5, true), STARTWATCH_WAIT_QUIET_MS - 1), STARTWATCH_WAITING);
	/* out of D, still quiet: the short window applies */
	assert_int_equal(step(&w, sample(5, 5, false), STARTWATCH_WAIT_QUIET_MS - 1), STARTWATCH_STALLED);
	/* a volume that stopped answering: D forever */
	assert_int_equal(step(&w, sample(5, 5, true), STARTWATCH_WAIT_QUIET_MS), STARTWATCH_STALLED);
	/* the fsync returned and the recovery goes on */
	assert_int_equal(step(&w, sample(6, 5, false), STARTWATCH_WAIT_QUIET_MS + 1), STARTWATCH_MOVING);
}

/* A wait that polls wakes up: context switches alone are progress. */
static void test_wakeups(void **state)
{
	(void)state;
	struct startwatch w;
	startwatch_init(&w, 0, 0);
	struct startwatch_sample s = sample(1, 1, false);
	for (int64_t t = 0; t <= 3600 * SEC; t += 5 * SEC, s.switches++)
		assert_int_equal(startwatch_step(&w, &s, t), STARTWATCH_MOVING);
}

/* A caller that waits longer on purpose (a unit's stop timeout) widens the
 * window; a shorter one is raised to the minute. */
static void test_window(void **state)
{
	(void)state;
	struct startwatch w;
	startwatch_init(&w, 0, 5 * STARTWATCH_QUIET_MS);
	assert_int_equal(step(&w, sample(1, 1, false), 0), STARTWATCH_MOVING);
	assert_int_equal(step(&w, sample(1, 1, false), 5 * STARTWATCH_QUIET_MS - 1), STARTWATCH_MOVING);
	assert_int_equal(step(&w, sample(1, 1, false), 5 * STARTWATCH_QUIET_MS), STARTWATCH_STALLED);
	startwatch_init(&w, 0, 1000);
	assert_int_equal(step(&w, sample(1, 1, false), 0), STARTWATCH_MOVING);
	assert_int_equal(step(&w, sample(1, 1, false), STARTWATCH_QUIET_MS - 1), STARTWATCH_MOVING);
	assert_int_equal(step(&w, sample(1, 1, false), STARTWATCH_QUIET_MS), STARTWATCH_STALLED);
}

/* /proc unreadable: no judgement, the window starts again once it reads. */
static void test_blind(void **state)
{
	(void)state;
	struct startwatch w;
	startwatch_init(&w, 0, 0);
	struct startwatch_sample unknown = { .known = false };
	assert_int_equal(step(&w, sample(9, 9, false), 0), STARTWATCH_MOVING);
	assert_int_equal(step(&w, unknown, 100 * SEC), STARTWATCH_BLIND);
	assert_int_equal(step(&w, sample(9, 9, false), 101 * SEC), STARTWATCH_MOVING);
	assert_int_equal(step(&w, sample(9, 9, false), 100 * SEC + STARTWATCH_QUIET_MS), STARTWATCH_STALLED);
}

/* The start itself is progress: a first sample is never stalled. */
static void test_first_sample(void **state)
{
	(void)state;
	struct startwatch w;
	startwatch_init(&w, 0, 0);
	assert_int_equal(step(&w, sample(0, 0, false), 10 * STARTWATCH_WAIT_QUIET_MS), STARTWATCH_MOVING);
}

static void put(const char *dir, const char *name, const char *text)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	_cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
}

/* proc/where/{stat,io,status,children}, each left out when NULL. */
static void task(const char *proc, const char *where, const char *stat, const char *io, const char *status,
		 const char *children)
{
	char dir[256];
	snprintf(dir, sizeof(dir), "%s/%s", proc, where);
	assert_int_equal(mkdir_p(dir, 0755), 0);
	if (stat)
		put(dir, "stat", stat);
	if (io)
		put(dir, "io", io);
	if (status)
		put(dir, "status", status);
	if (children)
		put(dir, "children", children);
}

/* A proc tree as the kernel writes it: comm may hold ") (" and spaces; the
 * watcher's own task is left out, with its children; a task or child gone
 * since it was listed is skipped. */
static void test_parse(void **state)
{
	(void)state;
	char proc[TESTLIB_DIR_LEN];
	assert_int_equal(testlib_mkdir(proc, "startwatch"), 0);
	const char *io = "rchar: 1000\nwchar: 200\nsyscr: 30\nsyscw: 4\nread_bytes: 99999\nwrite_bytes: 8888\n"
			 "cancelled_write_bytes: 0\n";
	const char *status = "Name:\tckptd\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t40\n"
			     "nonvoluntary_ctxt_switches:\t2\n";
	task(proc, "self/task/100", "100 (ckptd) S 1 100 100 0 -1 4194560 500 0 0 0 7 3 0 0 20 0 3 0 1 0 0\n", io,
	     status, "");
	task(proc, "self/task/101", "101 (a ) (b c) S 1 100 100 0 -1 4194560 500 0 0 0 11 2 0 0 20 0 3 0 1 0 0\n", io,
	     status, "4242 4243 ");
	task(proc, "self/task/102", "102 (watch) R 1 100 100 0 -1 4194560 500 0 0 0 999 999 0 0 20 0 3 0 1 0 0\n",
	     "rchar: 5\nwchar: 5\nsyscr: 5\nsyscw: 5\n",
	     "voluntary_ctxt_switches:\t9\nnonvoluntary_ctxt_switches:\t9\n", "4244 ");
	task(proc, "self/task/103", NULL, NULL, NULL, NULL); /* exited: the directory without its files */
	/* 101's child runsc, writing in D; 4243 is gone; 4244 is the watcher's */
	task(proc, "4242", "4242 (runsc) D 101 4242 100 0 -1 4194560 9 0 0 0 50 50 0 0 20 0 9 0 1 0 0\n",
	     "rchar: 1\nwchar: 1\nsyscr: 1\nsyscw: 1\n",
	     "voluntary_ctxt_switches:\t3\nnonvoluntary_ctxt_switches:\t3\n", NULL);
	task(proc, "4244", "4244 (sh) R 102 4244 100 0 -1 4194560 9 0 0 0 70 70 0 0 20 0 9 0 1 0 0\n",
	     "rchar: 7\nwchar: 7\nsyscr: 7\nsyscw: 7\n",
	     "voluntary_ctxt_switches:\t7\nnonvoluntary_ctxt_switches:\t7\n", NULL);

	struct startwatch_sample s;
	assert_int_equal(startwatch_sample_self(proc, 102, &s), 0);
	assert_true(s.known);
	assert_int_equal(s.io, 2 * (1000 + 200 + 30 + 4) + 4);
	assert_int_equal(s.cpu, 7 + 3 + 11 + 2 + 50 + 50);
	assert_int_equal(s.switches, 2 * (40 + 2) + 6);
	assert_true(s.disk_wait); /* the child's */

	/* with 101 left out, its child is too: no disk wait; the watcher's child counts */
	assert_int_equal(startwatch_sample_self(proc, 101, &s), 0);
	assert_false(s.disk_wait);
	assert_int_equal(s.io, 1000 + 200 + 30 + 4 + 20 + 28);
	assert_int_equal(s.cpu, 7 + 3 + 999 + 999 + 70 + 70);
	assert_int_equal(s.switches, 40 + 2 + 9 + 9 + 14);

	/* a child that cannot be parsed counts nothing, and fails nothing */
	task(proc, "4243", "4243 (x) S 1\n", io, status, NULL);
	assert_int_equal(startwatch_sample_self(proc, 102, &s), 0);
	assert_int_equal(s.io, 2 * (1000 + 200 + 30 + 4) + 4);

	/* a thread file the kernel would never write: no sample, no judgement */
	task(proc, "self/task/104", "104 (x) S 1\n", io, status, NULL);
	assert_true(startwatch_sample_self(proc, 102, &s) < 0);
	assert_false(s.known);
	testlib_rmdir(proc);
}

struct worker {
	int go[2], done[2];
	pid_t tid;
};

/* Writes, says so, then blocks on a pipe: what a hung start looks like. */
static void *worker_main(void *arg)
{
	struct worker *k = arg;
	_cleanup_close_ int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
	char c = 1;
	k->tid = gettid();
	for (int i = 0; i < 1000; i++)
		assert_int_equal(write(null, "x", 1), 1);
	assert_int_equal(write(k->done[1], &c, 1), 1);
	assert_int_equal(read(k->go[0], &c, 1), 1);
	return NULL;
}

/* Until the worker sleeps in its read (S): samples taken then must agree. */
static void worker_wait_asleep(pid_t tid)
{
	char path[64], text[512];
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	for (int i = 0; i < 100000; i++) {
		_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
		if (n <= 0)
			fail_msg("cannot read '%s'", path);
		text[n > 0 ? n : 0] = 0;
		const char *p = strrchr(text, ')');
		if (p && p[1] == ' ' && p[2] == 'S')
			return;
		sched_yield();
	}
	fail_msg("the worker never blocked");
}

static void test_self(void **state)
{
	(void)state;
	struct worker k;
	pthread_t t;
	char c;
	struct startwatch_sample a, b;
	assert_int_equal(pipe2(k.go, O_CLOEXEC), 0);
	assert_int_equal(pipe2(k.done, O_CLOEXEC), 0);
	assert_int_equal(pthread_create(&t, NULL, worker_main, &k), 0);
	assert_int_equal(read(k.done[0], &c, 1), 1);
	worker_wait_asleep(k.tid);

	/* this thread is the watcher: its own reads of /proc do not count */
	assert_int_equal(startwatch_sample_self("/proc", gettid(), &a), 0);
	assert_int_equal(startwatch_sample_self("/proc", gettid(), &b), 0);
	assert_true(a.known);
	assert_true(a.io >= 1000 + 1000); /* the worker's bytes and calls */
	assert_true(a.io == b.io);        /* it blocks: nothing moves */
	assert_true(a.cpu == b.cpu);
	assert_true(a.switches == b.switches);
	assert_false(a.disk_wait); /* asleep on a pipe: S, not D */

	/* counted, this thread moves the sum with every read of /proc */
	assert_int_equal(startwatch_sample_self("/proc", 0, &a), 0);
	assert_int_equal(startwatch_sample_self("/proc", 0, &b), 0);
	assert_true(b.io > a.io);

	assert_int_equal(write(k.go[1], &c, 1), 1);
	assert_int_equal(pthread_join(t, NULL), 0);
	for (int i = 0; i < 2; i++)
		close(k.go[i]), close(k.done[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_moving),    cmocka_unit_test(test_slow),  cmocka_unit_test(test_hang),
		cmocka_unit_test(test_disk_wait), cmocka_unit_test(test_blind), cmocka_unit_test(test_first_sample),
		cmocka_unit_test(test_parse),     cmocka_unit_test(test_self),  cmocka_unit_test(test_wakeups),
		cmocka_unit_test(test_window),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
