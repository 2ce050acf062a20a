/* failpoint.h: named crash points at durable steps, for the test build only.
 * FAILPOINT("overlay.create.layer.renamed") compiles to nothing unless the
 * build defines CKPTD_FAILPOINTS (make FAILPOINTS=1). There each point is
 * registered in the linker section ckptd_fp, so `ckptd --list-failpoints`
 * prints every point there is, and the point armed by CKPTD_FAILPOINT
 * ("name" or "name:N") kills the process with SIGKILL at its Nth hit (or,
 * armed to hang, blocks the thread there). */
#pragma once
#include <stdio.h>

struct failpoint {
	const char *name;
	const char *file;
	int line;
};

#ifdef CKPTD_FAILPOINTS
void failpoint_hit(const struct failpoint *fp);
/* Arm the point spec names ("name" or "name:N", N >= 1); NULL disarms.
 * hang: block the thread at that hit forever instead of killing the
 * process, as a lock never released or a volume that stopped answering would.
 * trace: print every hit on stderr (how a test learns what a workload reaches). */
int failpoint_arm(const char *spec, int hang, int trace);
/* Print every registered name, one a line, sorted, each once. */
void failpoint_list(FILE *f);

/* The struct lives in its own section; aligned so the section is an array. */
#define FAILPOINT(n)                                                                                           \
	do {                                                                                                   \
		static const struct failpoint _fp                                                              \
			__attribute__((section("ckptd_fp"), used, aligned(sizeof(void *)))) = { (n), __FILE__, \
												__LINE__ };    \
		failpoint_hit(&_fp);                                                                           \
	} while (0)
/* A point before and after one durable call: FAILPOINT_AROUND("x.rename",
 * renameat(...)) hits "x.rename.before" and "x.rename.after" around it and
 * gives the call's value (errno kept). */
#define FAILPOINT_AROUND(n, call)                \
	({                                       \
		FAILPOINT(n ".before");          \
		__typeof__(call) _fp_r = (call); \
		FAILPOINT(n ".after");           \
		_fp_r;                           \
	})
#else
#define FAILPOINT(n) \
	do {         \
	} while (0)
#define FAILPOINT_AROUND(n, call) (call)
#endif
