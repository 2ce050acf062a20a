/* metrics.c: Prometheus text exposition (format 0.0.4). */
#include "lib/metrics.h"
#include "lib/util.h"

#include <sys/resource.h>
#include <time.h>

static const double bucket_le[METRICS_BUCKETS] = {
	0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
};
static const char *op_names[OP_COUNT_] = { "create", "restore", "delete", "sweep" };

void metrics_init(struct metrics *m)
{
	memset(m, 0, sizeof(*m));
	pthread_mutex_init(&m->lock, NULL);
}

void metrics_destroy(struct metrics *m)
{
	pthread_mutex_destroy(&m->lock);
}

static void hist_observe(struct metrics_hist *h, double v)
{
	for (int i = 0; i < METRICS_BUCKETS; i++)
		if (v <= bucket_le[i])
			h->buckets[i]++;
	h->count++;
	h->sum += v;
}

void metrics_op(struct metrics *m, enum metrics_op op, bool ok, double seconds)
{
	pthread_mutex_lock(&m->lock);
	m->ops[op][ok ? 0 : 1]++;
	if (ok && op == OP_CREATE)
		hist_observe(&m->create_s, seconds);
	else if (ok && op == OP_RESTORE)
		hist_observe(&m->restore_s, seconds);
	pthread_mutex_unlock(&m->lock);
}

void metrics_status_count(struct metrics_statuses *s, int status)
{
	if (status >= 100 && status < 600)
		atomic_fetch_add(&s->by_status[status], 1);
}

void metrics_interrupted(struct metrics *m, enum metrics_op op)
{
	pthread_mutex_lock(&m->lock);
	m->interrupted[op]++;
	pthread_mutex_unlock(&m->lock);
}

static void render_hist(FILE *f, const char *name, const char *help, const struct metrics_hist *h)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (int i = 0; i < METRICS_BUCKETS; i++)
		fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, bucket_le[i], (unsigned long long)h->buckets[i]);
	fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
	fprintf(f, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

static void render_counters(FILE *f, const struct metrics *m)
{
	fputs("# HELP ckptd_operations_total Checkpoint operations by kind and result.\n"
	      "# TYPE ckptd_operations_total counter\n",
	      f);
	for (int op = 0; op < OP_COUNT_; op++)
		for (int r = 0; r < 2; r++)
			fprintf(f, "ckptd_operations_total{op=\"%s\",result=\"%s\"} %llu\n", op_names[op],
				r ? "error" : "success", (unsigned long long)m->ops[op][r]);
	fputs("# HELP ckptd_interrupted_operations_total Operations a crash cut short while units were stopped "
	      "or frozen, found at start.\n"
	      "# TYPE ckptd_interrupted_operations_total counter\n",
	      f);
	for (int op = OP_CREATE; op <= OP_RESTORE; op++)
		fprintf(f, "ckptd_interrupted_operations_total{op=\"%s\"} %llu\n", op_names[op],
			(unsigned long long)m->interrupted[op]);
}

static uint64_t process_open_fds(void)
{
	_cleanup_closedir_ DIR *d = opendir("/proc/self/fd");
	uint64_t n = 0;
	struct dirent *de;
	while (d && (de = readdir(d)))
		n += de->d_name[0] != '.';
	return n > 0 ? n - 1 : 0; /* the directory stream's own descriptor */
}

/* The standard process_* metrics of Prometheus client libraries. */
static void render_process(FILE *f)
{
	struct rusage ru = { 0 };
	struct rlimit rl = { 0 };
	unsigned long long pages_total = 0, pages_rss = 0;
	_cleanup_fclose_ FILE *statm = fopen("/proc/self/statm", "re");

	getrusage(RUSAGE_SELF, &ru);
	getrlimit(RLIMIT_NOFILE, &rl);
	if (!statm || fscanf(statm, "%llu %llu", &pages_total, &pages_rss) != 2)
		pages_total = pages_rss = 0;
	double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
		((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
	long page = sysconf(_SC_PAGESIZE);
	fprintf(f,
		"# HELP process_cpu_seconds_total User and system CPU time spent in seconds.\n"
		"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.3f\n"
		"# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
		"# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n"
		"# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
		"# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n"
		"# HELP process_open_fds Number of open file descriptors.\n"
		"# TYPE process_open_fds gauge\nprocess_open_fds %llu\n"
		"# HELP process_max_fds Maximum number of open file descriptors.\n"
		"# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
		cpu, pages_rss * (unsigned long long)page, pages_total * (unsigned long long)page,
		(unsigned long long)process_open_fds(), (unsigned long long)rl.rlim_cur);
}

char *metrics_render(struct metrics *m, const struct metrics_gauges *g)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	pthread_mutex_lock(&m->lock);
	render_hist(f, "ckptd_checkpoint_create_duration_seconds", "Time to create a checkpoint.", &m->create_s);
	render_hist(f, "ckptd_checkpoint_restore_duration_seconds", "Time to restore a checkpoint, services included.",
		    &m->restore_s);
	render_counters(f, m);
	pthread_mutex_unlock(&m->lock);
	fprintf(f,
		"# HELP ckptd_checkpoints Checkpoints by state.\n# TYPE ckptd_checkpoints gauge\n"
		"ckptd_checkpoints{state=\"creating\"} %llu\nckptd_checkpoints{state=\"active\"} %llu\n"
		"ckptd_checkpoints{state=\"deleting\"} %llu\nckptd_checkpoints{state=\"failed\"} %llu\n",
		(unsigned long long)g->creating, (unsigned long long)g->active, (unsigned long long)g->deleting,
		(unsigned long long)g->failed);
	fprintf(f,
		"# HELP ckptd_checkpoint_bytes Bytes on disk that checkpoints add.\n"
		"# TYPE ckptd_checkpoint_bytes gauge\nckptd_checkpoint_bytes %llu\n",
		(unsigned long long)g->checkpoint_bytes);
	fprintf(f,
		"# HELP ckptd_change_tracking_fallbacks_total Times change tracking lost events (queue overflow) or "
		"could not add a watch (the limit), so that a create or restore read the whole tree.\n"
		"# TYPE ckptd_change_tracking_fallbacks_total counter\nckptd_change_tracking_fallbacks_total %llu\n",
		(unsigned long long)g->tracking_fallbacks);
	fprintf(f,
		"# HELP ckptd_change_tracking_events_total Events change tracking read from its queues (fanotify, "
		"inotify).\n"
		"# TYPE ckptd_change_tracking_events_total counter\nckptd_change_tracking_events_total %llu\n",
		(unsigned long long)g->tracking_events);
	fprintf(f,
		"# HELP ckptd_build_info Build information.\n# TYPE ckptd_build_info gauge\n"
		"ckptd_build_info{version=\"%s\",backend=\"%s\"} 1\n",
		g->version, g->backend);
	render_process(f);
	fclose(f);
	return buf;
}

char *metrics_status_render(const struct metrics_statuses *s)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	fputs("# HELP ckptd_http_requests_total HTTP responses by status code.\n"
	      "# TYPE ckptd_http_requests_total counter\n",
	      f);
	for (int c = 100; c < 600; c++) {
		uint64_t n = atomic_load(&s->by_status[c]);
		if (n)
			fprintf(f, "ckptd_http_requests_total{code=\"%d\"} %llu\n", c, (unsigned long long)n);
	}
	fclose(f);
	return buf;
}
