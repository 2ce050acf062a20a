/* startwatch.h: whether a start still makes progress, judged from the
 * process's own counters. main.c asks systemd for more time
 * (EXTEND_TIMEOUT_USEC) only while it does: a start that hangs then meets
 * systemd's start timeout instead of staying "activating" forever.
 *
 * A sample sums, over the threads of this process but the watcher's own,
 * and over their child processes, what /proc/.../{io,stat,status} count:
 * bytes and calls of read and write (rchar, wchar, syscr, syscw), CPU time
 * (utime, stime) and wakeups (context switches). Any change is progress. A
 * recovery that rewrites files moves them all the time; so does a wait that
 * polls, or a child (a runsc command) that works. A thread blocked on a
 * lock, or on a network volume that stopped answering, moves none. A thread
 * asleep in the kernel on I/O (state D: one long fsync() on a slow disk)
 * gets a longer window. A start that spins, or polls for something that
 * never comes, is not caught. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* No counter moved for a minute: no working recovery is that quiet. A
 * caller that waits longer on purpose, silently, passes a longer window. */
#define STARTWATCH_QUIET_MS (60 * 1000)
/* ... unless a thread waits on I/O (D): one fsync() of a large file on a
 * slow disk may take minutes. A network volume that stopped answering also
 * sleeps in D, so this is bounded too. */
#define STARTWATCH_WAIT_QUIET_MS (10 * 60 * 1000)

struct startwatch_sample {
	bool known;        /* false: /proc could not be read; no judgement */
	uint64_t io;       /* rchar + wchar + syscr + syscw */
	uint64_t cpu;      /* utime + stime, in clock ticks */
	uint64_t switches; /* voluntary and involuntary context switches */
	bool disk_wait;    /* a thread or child sleeps uninterruptibly (D): waiting on I/O */
};

enum startwatch_verdict {
	STARTWATCH_MOVING,  /* a counter moved within the quiet window */
	STARTWATCH_WAITING, /* quiet longer, but waiting on I/O (D), within STARTWATCH_WAIT_QUIET_MS */
	STARTWATCH_BLIND,   /* the sample is unknown: counted as progress */
	STARTWATCH_STALLED, /* no progress: ask for no more time */
};

struct startwatch {
	bool have;                     /* last holds a known sample */
	struct startwatch_sample last; /* the previous known sample */
	int64_t progress_ms;           /* when a counter last moved (monotonic) */
	int64_t quiet_ms;              /* the window: STARTWATCH_QUIET_MS or more */
};

/* Start watching at now_ms (monotonic): the start itself counts as progress.
 * quiet_ms: the longest silent wait the start makes on purpose (raised to
 * STARTWATCH_QUIET_MS). */
void startwatch_init(struct startwatch *w, int64_t now_ms, int64_t quiet_ms);
/* Take sample s at now_ms and judge. Pure: no clock, no /proc. */
enum startwatch_verdict startwatch_step(struct startwatch *w, const struct startwatch_sample *s, int64_t now_ms);
/* How long no counter has moved, at now_ms. */
int64_t startwatch_quiet_ms(const struct startwatch *w, int64_t now_ms);
/* Sum the counters of every thread of this process but skip_tid (the
 * watcher: its own reads of /proc would count as progress). proc is the
 * proc filesystem's mount ("/proc"). On failure s->known is false and a
 * negative errno is returned. */
int startwatch_sample_self(const char *proc, pid_t skip_tid, struct startwatch_sample *s);
