/* services_bus.c: systemd's manager on the system bus. Jobs are queued in
 * parallel and waited for through JobRemoved signals, subscribed to before any
 * job is queued so no completion can be missed; waits use sd_bus_wait with
 * deadlines, never sleeps. */
#include <signal.h>
#include <systemd/sd-bus.h>
#include "services/services_internal.h"

#define SD_DEST "org.freedesktop.systemd1"
#define SD_PATH "/org/freedesktop/systemd1"
#define SD_MANAGER "org.freedesktop.systemd1.Manager"
/* After SIGKILL a stop job normally ends at once; this bounds the wait. */
#define KILL_GRACE_MS 5000

struct services_bus {
	sd_bus *bus;
};

struct job_batch {
	struct services_job *jobs;
	size_t n;
};

static void bus_error_freep(sd_bus_error *e)
{
	sd_bus_error_free(e);
}
static void bus_message_unrefp(sd_bus_message **m)
{
	sd_bus_message_unref(*m);
}
#define _cleanup_bus_error_ _cleanup_(bus_error_freep)
#define _cleanup_bus_message_ _cleanup_(bus_message_unrefp)

static char *bus_reason(const sd_bus_error *e, int r)
{
	char *s = NULL;
	if (sd_bus_error_is_set(e) && e->message)
		return strdup(e->message);
	return asprintf(&s, "%s", strerror(r < 0 ? -r : r)) < 0 ? NULL : s;
}

int services_bus_open(struct services_bus **ret, ckpt_error *err)
{
	_cleanup_free_ struct services_bus *b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	int r = sd_bus_open_system(&b->bus);
	if (r < 0)
		return err_set(err, -r, NULL, "cannot connect to the system bus: %s", strerror(-r));
	*ret = TAKE_PTR(b);
	return 0;
}

void services_bus_close(struct services_bus *b)
{
	if (!b)
		return;
	sd_bus_flush_close_unref(b->bus);
	free(b);
}

static int unit_property(struct services_bus *b, const char *unit, const char *iface, const char *prop, char **ret)
{
	_cleanup_free_ char *path = NULL;
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	int r = sd_bus_path_encode(SD_PATH "/unit", unit, &path);
	if (r < 0)
		return r;
	return sd_bus_get_property_string(b->bus, SD_DEST, path, iface, prop, &e, ret);
}

int services_bus_active_state(struct services_bus *b, const char *unit, char **ret)
{
	return unit_property(b, unit, "org.freedesktop.systemd1.Unit", "ActiveState", ret);
}

int services_bus_unit_result(struct services_bus *b, const char *unit, char **ret)
{
	return unit_property(b, unit, "org.freedesktop.systemd1.Service", "Result", ret);
}

void services_job_clear(struct services_job *j)
{
	free(j->path);
	free(j->result);
	free(j->error);
	j->path = j->result = j->error = NULL;
	j->done = j->killed = false;
}

static bool job_pending(const struct services_job *j)
{
	return !j->done;
}

static void job_fail(struct services_job *j, const char *fmt, ...) _printf_(2, 3);
static void job_fail(struct services_job *j, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&j->error, fmt, ap) < 0)
		j->error = NULL;
	va_end(ap);
	j->done = true;
}

static int on_job_removed(sd_bus_message *m, void *userdata, sd_bus_error *ret_error)
{
	struct job_batch *batch = userdata;
	const char *path, *unit, *result;
	uint32_t id;
	(void)ret_error;
	if (sd_bus_message_read(m, "uoss", &id, &path, &unit, &result) < 0)
		return 0;
	for (size_t i = 0; i < batch->n; i++) {
		struct services_job *j = &batch->jobs[i];
		if (job_pending(j) && j->path && strcmp(j->path, path) == 0) {
			j->result = strdup(result);
			j->done = true;
		}
	}
	return 0;
}

/* StopUnit/StartUnit for one job; a refused call ends the job with error. */
static void job_queue(struct services_bus *b, struct services_job *j, const char *method, int64_t timeout_ms)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	_cleanup_bus_message_ sd_bus_message *reply = NULL;
	const char *path;
	int r = sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER, method, &e, &reply, "ss", j->unit, "replace");
	if (r >= 0)
		r = sd_bus_message_read(reply, "o", &path);
	if (r < 0) {
		j->error = bus_reason(&e, r);
		j->done = true;
		return;
	}
	j->path = strdup(path);
	if (!j->path)
		job_fail(j, "out of memory");
	j->deadline = mono_ms() + timeout_ms;
}

static void job_kill(struct services_bus *b, struct services_job *j)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	int r = sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER, "KillUnit", &e, NULL, "ssi", j->unit, "all",
				   (int32_t)SIGKILL);
	j->killed = true;
	j->deadline = mono_ms() + KILL_GRACE_MS;
	if (r < 0)
		log_debug("services: KillUnit '%s': %s", j->unit, e.message ? e.message : strerror(-r));
}

/* Handle jobs past their deadline; returns the nearest remaining deadline or
 * INT64_MAX when no job is pending. */
static int64_t jobs_expire(struct services_bus *b, enum services_job_kind kind, struct services_job *jobs, size_t n,
			   int64_t timeout_ms)
{
	int64_t now = mono_ms(), next = INT64_MAX;
	for (size_t i = 0; i < n; i++) {
		struct services_job *j = &jobs[i];
		if (!job_pending(j))
			continue;
		if (j->deadline <= now) {
			if (kind == SERVICES_JOB_STOP && !j->killed) {
				job_kill(b, j);
			} else {
				job_fail(j, "%s job timed out after %llds%s",
					 kind == SERVICES_JOB_STOP ? "stop" : "start", (long long)(timeout_ms / 1000),
					 j->killed ? " and SIGKILL" : "");
				continue;
			}
		}
		if (j->deadline < next)
			next = j->deadline;
	}
	return next;
}

static int jobs_wait(struct services_bus *b, enum services_job_kind kind, struct services_job *jobs, size_t n,
		     int64_t timeout_ms)
{
	for (;;) {
		int r = sd_bus_process(b->bus, NULL);
		if (r < 0)
			return r;
		if (r > 0)
			continue;
		int64_t next = jobs_expire(b, kind, jobs, n, timeout_ms);
		if (next == INT64_MAX)
			return 0;
		int64_t left = next - mono_ms();
		r = sd_bus_wait(b->bus, left > 0 ? (uint64_t)left * 1000 : 0);
		if (r < 0 && r != -EINTR)
			return r;
	}
}

int services_bus_run_jobs(struct services_bus *b, enum services_job_kind kind, struct services_job *jobs, size_t n,
			  int64_t timeout_ms)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	struct job_batch batch = { jobs, n };
	sd_bus_slot *slot = NULL;
	int r = sd_bus_match_signal(b->bus, &slot, SD_DEST, SD_PATH, SD_MANAGER, "JobRemoved", on_job_removed, &batch);
	if (r < 0)
		return r;
	r = sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER, "Subscribe", &e, NULL, NULL);
	/* Already subscribed on this connection is fine. */
	if (r < 0 && !sd_bus_error_has_name(&e, "org.freedesktop.systemd1.AlreadySubscribed")) {
		sd_bus_slot_unref(slot);
		return r;
	}
	for (size_t i = 0; i < n; i++)
		job_queue(b, &jobs[i], kind == SERVICES_JOB_STOP ? "StopUnit" : "StartUnit", timeout_ms);
	r = jobs_wait(b, kind, jobs, n, timeout_ms);
	sd_bus_slot_unref(slot);
	return r;
}

int services_bus_freeze(struct services_bus *b, const char *unit, bool freeze, int64_t timeout_ms, char **reason)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	_cleanup_bus_message_ sd_bus_message *m = NULL;
	const char *method = freeze ? "FreezeUnit" : "ThawUnit";
	int r = sd_bus_message_new_method_call(b->bus, &m, SD_DEST, SD_PATH, SD_MANAGER, method);
	if (r >= 0)
		r = sd_bus_message_append(m, "s", unit);
	if (r >= 0)
		r = sd_bus_call(b->bus, m, (uint64_t)timeout_ms * 1000, &e, NULL);
	if (r < 0)
		*reason = bus_reason(&e, r);
	return r;
}
