/* beside.h: work handed to a thread on another CPU than its caller's, which
 * goes on with work of its own meanwhile. Left to the scheduler, such a
 * thread was queued behind its caller (an idle vCPU is halted, slow to
 * wake) and the two ran one after the other. Measured on a 2-vCPU VM: 2 ms
 * of the caller's work beside a 1.5 ms thread took 3.5 ms so, 2.05 ms with
 * the hint. The threads are kept between uses, asleep: a new one cost the
 * caller 0.2 ms each time (a create's look, beside.c). */
#pragma once
#include <sched.h>
#include <stdbool.h>

struct beside_thread;
struct beside {
	struct beside_thread *t; /* to be waited for */
	bool hinted;             /* sent off the caller's CPU: cpus gives it all back */
	cpu_set_t cpus;
};

/* fn(arg) on a thread beside the caller: true; false when no thread is to be
 * had (the caller then runs fn itself). */
bool beside_spawn(struct beside *b, void *(*fn)(void *), void *arg);
/* Wait for it (nothing when none was started). The caller waits, so its CPU
 * is as good: the thread may run anywhere from now. */
void beside_join(struct beside *b);
