/* test_metrics.c: the Prometheus text the metrics module renders: cumulative
 * histogram buckets, counters by label, gauges and build info. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "lib/metrics.h"
#include "lib/util.h"

static char *render(struct metrics *m)
{
	struct metrics_gauges g = { .creating = 1,
				    .active = 3,
				    .deleting = 0,
				    .failed = 2,
				    .checkpoint_bytes = 12345,
				    .version = "9.9.9",
				    .backend = "tar" };
	char *text = metrics_render(m, &g);
	assert_non_null(text);
	return text;
}

static void assert_has(const char *text, const char *line)
{
	if (!strstr(text, line))
		fail_msg("missing \"%s\" in:\n%s", line, text);
}

static void test_empty(void **state)
{
	(void)state;
	struct metrics m;
	metrics_init(&m);
	char *t = render(&m);
	assert_has(t, "# TYPE ckptd_checkpoint_create_duration_seconds histogram\n");
	assert_has(t, "# TYPE ckptd_checkpoint_restore_duration_seconds histogram\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_bucket{le=\"+Inf\"} 0\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_count 0\n");
	assert_has(t, "# TYPE ckptd_operations_total counter\n");
	assert_has(t, "ckptd_operations_total{op=\"sweep\",result=\"error\"} 0\n");
	assert_null(strstr(t, "ckptd_http_requests_total")); /* the HTTP server's to render */
	assert_has(t, "ckptd_checkpoints{state=\"creating\"} 1\n");
	assert_has(t, "ckptd_checkpoints{state=\"active\"} 3\n");
	assert_has(t, "ckptd_checkpoints{state=\"deleting\"} 0\n");
	assert_has(t, "ckptd_checkpoints{state=\"failed\"} 2\n");
	assert_has(t, "ckptd_checkpoint_bytes 12345\n");
	assert_has(t, "ckptd_build_info{version=\"9.9.9\",backend=\"tar\"} 1\n");
	assert_int_equal(t[strlen(t) - 1], '\n');
	free(t);
	metrics_destroy(&m);
}

static void test_histogram_is_cumulative(void **state)
{
	(void)state;
	struct metrics m;
	metrics_init(&m);
	metrics_op(&m, OP_CREATE, true, 0.003);
	metrics_op(&m, OP_CREATE, true, 0.2);
	metrics_op(&m, OP_CREATE, true, 100);  /* beyond the last bucket: +Inf only */
	metrics_op(&m, OP_CREATE, false, 0.5); /* failures count, but not as durations */
	metrics_op(&m, OP_RESTORE, true, 1);
	char *t = render(&m);
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_bucket{le=\"0.001\"} 0\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_bucket{le=\"0.005\"} 1\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_bucket{le=\"0.1\"} 1\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_bucket{le=\"0.25\"} 2\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_bucket{le=\"60\"} 2\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_bucket{le=\"+Inf\"} 3\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_sum 100.203000\n");
	assert_has(t, "ckptd_checkpoint_create_duration_seconds_count 3\n");
	assert_has(t, "ckptd_checkpoint_restore_duration_seconds_bucket{le=\"0.5\"} 0\n");
	assert_has(t, "ckptd_checkpoint_restore_duration_seconds_bucket{le=\"1\"} 1\n");
	assert_has(t, "ckptd_operations_total{op=\"create\",result=\"success\"} 3\n");
	assert_has(t, "ckptd_operations_total{op=\"create\",result=\"error\"} 1\n");
	assert_has(t, "ckptd_operations_total{op=\"restore\",result=\"success\"} 1\n");
	free(t);
	metrics_destroy(&m);
}

static void test_http_codes(void **state)
{
	(void)state;
	struct metrics_statuses s = { 0 };
	char *t = metrics_status_render(&s);
	assert_has(t, "# TYPE ckptd_http_requests_total counter\n");
	assert_null(strstr(t, "ckptd_http_requests_total{"));
	free(t);
	metrics_status_count(&s, 200);
	metrics_status_count(&s, 200);
	metrics_status_count(&s, 410);
	metrics_status_count(&s, 99); /* out of range: ignored, not a crash */
	metrics_status_count(&s, 600);
	t = metrics_status_render(&s);
	assert_has(t, "ckptd_http_requests_total{code=\"200\"} 2\n");
	assert_has(t, "ckptd_http_requests_total{code=\"410\"} 1\n");
	assert_null(strstr(t, "code=\"99\""));
	assert_null(strstr(t, "code=\"600\""));
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_histogram_is_cumulative),
		cmocka_unit_test(test_http_codes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
