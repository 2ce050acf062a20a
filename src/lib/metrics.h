/* metrics.h: counters and histograms, rendered in Prometheus text format 0.0.4. */
#pragma once
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define METRICS_BUCKETS 14
enum metrics_op {
	OP_CREATE,
	OP_RESTORE,
	OP_DELETE,
	OP_SWEEP,
	OP_COUNT_
};

struct metrics_hist {
	uint64_t buckets[METRICS_BUCKETS]; /* cumulative at render time */
	uint64_t count;
	double sum;
};

struct metrics {
	pthread_mutex_t lock;
	struct metrics_hist create_s, restore_s;
	uint64_t ops[OP_COUNT_][2];      /* [op][0 = success, 1 = error] */
	uint64_t interrupted[OP_COUNT_]; /* operations a crash cut short, found at start */
};

/* Responses by HTTP status code: the HTTP server keeps one (src/http). */
struct metrics_statuses {
	_Atomic uint64_t by_status[600];
};

/* What the engine knows at render time. */
struct metrics_gauges {
	uint64_t creating, active, deleting, failed; /* failed: async creates that did not make it */
	uint64_t checkpoint_bytes;
	uint64_t tracking_fallbacks; /* change tracking lost events or watches: the tree was walked */
	uint64_t tracking_events;    /* events change tracking read (fanotify, inotify) */
	const char *version, *backend;
};

void metrics_init(struct metrics *m);
void metrics_destroy(struct metrics *m);
void metrics_op(struct metrics *m, enum metrics_op op, bool ok, double seconds);
/* An operation that a crash cut short, found at start (its units brought back). */
void metrics_interrupted(struct metrics *m, enum metrics_op op);
char *metrics_render(struct metrics *m, const struct metrics_gauges *g);
/* A status out of 100..599 is not counted. */
void metrics_status_count(struct metrics_statuses *s, int status);
/* The ckptd_http_requests_total family; caller frees, NULL when out of memory. */
char *metrics_status_render(const struct metrics_statuses *s);