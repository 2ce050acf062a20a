/* services_bus.c: the real services_ops. systemd's manager on the system
 * bus: jobs are queued in parallel and waited for through JobRemoved signals,
 * subscribed to before any job is queued so no completion can be missed;
 * EnqueueUnitJob names the jobs systemd adds for other units in the same transaction. Waits use
 * sd_bus_wait with deadlines, never sleeps. Units of processes come from
 * sd-login over the /proc scan. */
#include <signal.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-login.h>
#include "services/services_internal.h"

#define SD_DEST "org.freedesktop.systemd1"
#define SD_PATH "/org/freedesktop/systemd1"
#define SD_MANAGER "org.freedesktop.systemd1.Manager"
/* After SIGKILL a stop job normally ends at once; this bounds the wait. */
#define KILL_GRACE_MS 5000

struct services_bus {
	sd_bus *bus;
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

struct job_batch {
	struct services_jobs *jobs;
};

static bool bus_booted(void)
{
	return sd_booted() > 0;
}

static int bus_pid_unit(pid_t pid, char **ret)
{
	return sd_pid_get_unit(pid, ret);
}

static int bus_units_using(char *const *roots, size_t n_roots, struct strv *ret)
{
	_cleanup_free_ pid_t *pids = NULL;
	size_t n = 0;
	int r = services_scan_pids("/proc", roots, n_roots, getpid(), &pids, &n);
	for (size_t i = 0; r >= 0 && i < n; i++) {
		_cleanup_free_ char *unit = NULL;
		if (sd_pid_get_unit(pids[i], &unit) >= 0)
			r = services_strv_add(ret, unit);
	}
	return r;
}

static int bus_connect(void **ret, ckpt_error *err)
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

static void bus_disconnect(void *conn)
{
	struct services_bus *b = conn;
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

static int bus_active_state(void *conn, const char *unit, char **ret)
{
	return unit_property(conn, unit, "org.freedesktop.systemd1.Unit", "ActiveState", ret);
}

static int bus_unit_result(void *conn, const char *unit, char **ret)
{
	return unit_property(conn, unit, "org.freedesktop.systemd1.Service", "Result", ret);
}

struct services_job *services_jobs_add(struct services_jobs *jobs, const char *unit)
{
	if (jobs->n == jobs->cap) {
		size_t cap = jobs->cap ? jobs->cap * 2 : 8;
		struct services_job *v = realloc(jobs->v, cap * sizeof(*v));
		if (!v)
			return NULL;
		jobs->v = v, jobs->cap = cap;
	}
	struct services_job *j = &jobs->v[jobs->n];
	memset(j, 0, sizeof(*j));
	if (!(j->unit = strdup(unit)))
		return NULL;
	jobs->n++;
	return j;
}

void services_jobs_clear(struct services_jobs *jobs)
{
	for (size_t i = 0; i < jobs->n; i++) {
		struct services_job *j = &jobs->v[i];
		free(j->unit);
		free(j->path);
		free(j->result);
		free(j->error);
	}
	free(jobs->v);
	memset(jobs, 0, sizeof(*jobs));
}

static struct services_job *jobs_find_unit(struct services_jobs *jobs, const char *unit)
{
	for (size_t i = 0; i < jobs->n; i++)
		if (!strcmp(jobs->v[i].unit, unit))
			return &jobs->v[i];
	return NULL;
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
	j->ended_ms = mono_ms();
}

static int on_job_removed(sd_bus_message *m, void *userdata, sd_bus_error *ret_error)
{
	struct job_batch *batch = userdata;
	const char *path, *unit, *result;
	uint32_t id;
	(void)ret_error;
	if (sd_bus_message_read(m, "uoss", &id, &path, &unit, &result) < 0)
		return 0;
	for (size_t i = 0; i < batch->jobs->n; i++) {
		struct services_job *j = &batch->jobs->v[i];
		if (!j->done && j->path && strcmp(j->path, path) == 0) {
			j->result = strdup(result);
			j->done = true;
			j->ended_ms = mono_ms();
		}
	}
	return 0;
}

/* A stop job systemd added to the transaction for another unit (a unit that
 * Requires=, BindsTo= or is PartOf= the one stopped): waited for too. */
static void job_side_effect(struct services_jobs *jobs, const struct services_job *cause, const char *path,
			    const char *unit, const char *type)
{
	if (strcmp(type, "stop") || jobs_find_unit(jobs, unit))
		return;
	ptrdiff_t at = cause - jobs->v; /* jobs->v may move */
	struct services_job *j = services_jobs_add(jobs, unit);
	if (!j)
		return;
	cause = &jobs->v[at];
	j->side_effect = true;
	j->queued_ms = cause->queued_ms, j->deadline = cause->deadline;
	if (!(j->path = strdup(path)))
		job_fail(j, "out of memory");
	log_debug("services: systemd stops \"%s\" with \"%s\"", unit, cause->unit);
}

/* EnqueueUnitJob's reply: "uososa(uosos)", the job and the transaction's others. */
static int job_read_reply(sd_bus_message *reply, struct services_jobs *jobs, size_t at)
{
	const char *path, *unit, *unit_path, *type;
	uint32_t id;
	int r = sd_bus_message_read(reply, "uosos", &id, &path, &unit, &unit_path, &type);
	if (r < 0)
		return r;
	if (!(jobs->v[at].path = strdup(path)))
		return -ENOMEM;
	r = sd_bus_message_enter_container(reply, 'a', "(uosos)");
	while (r >= 0 && (r = sd_bus_message_read(reply, "(uosos)", &id, &path, &unit, &unit_path, &type)) > 0)
		job_side_effect(jobs, &jobs->v[at], path, unit, type);
	return r < 0 ? r : 0;
}

/* StopUnit / StartUnit, for a systemd older than 246: no side effects seen. */
static int job_queue_plain(struct services_bus *b, struct services_job *j, enum services_job_kind kind, sd_bus_error *e)
{
	_cleanup_bus_message_ sd_bus_message *reply = NULL;
	const char *path;
	sd_bus_error_free(e);
	int r = sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER,
				   kind == SERVICES_JOB_STOP ? "StopUnit" : "StartUnit", e, &reply, "ss", j->unit,
				   "replace");
	if (r >= 0)
		r = sd_bus_message_read(reply, "o", &path);
	if (r >= 0 && !(j->path = strdup(path)))
		r = -ENOMEM;
	return r;
}

/* EnqueueUnitJob (systemd >= 246) for one job; a refused call ends the job. */
static void job_queue(struct services_bus *b, struct services_jobs *jobs, size_t at, enum services_job_kind kind,
		      int64_t timeout_ms)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	_cleanup_bus_message_ sd_bus_message *reply = NULL;
	struct services_job *j = &jobs->v[at];
	j->queued_ms = mono_ms();
	j->deadline = j->queued_ms + timeout_ms;
	int r = sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER, "EnqueueUnitJob", &e, &reply, "sss", j->unit,
				   kind == SERVICES_JOB_STOP ? "stop" : "start", "replace");
	if (r >= 0)
		r = job_read_reply(reply, jobs, at);
	j = &jobs->v[at];
	if (r < 0 && sd_bus_error_has_name(&e, SD_BUS_ERROR_UNKNOWN_METHOD))
		r = job_queue_plain(b, j, kind, &e);
	if (r < 0 && !j->path) {
		j->error = bus_reason(&e, r);
		j->done = true;
		j->ended_ms = mono_ms();
	}
}

static void job_kill(struct services_bus *b, struct services_job *j)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	int r = sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER, "KillUnit", &e, NULL, "ssi", j->unit, "all",
				   (int32_t)SIGKILL);
	j->killed = true;
	j->deadline = mono_ms() + KILL_GRACE_MS;
	log_event(LOG_WARN_, &(struct log_fields){ "stop", NULL, j->unit, mono_ms() - j->queued_ms },
		  "services: \"%s\" did not stop in time: SIGKILL%s%s", j->unit, r < 0 ? " failed: " : "",
		  r < 0 ? (e.message ? e.message : strerror(-r)) : "");
}

/* Handle jobs past their deadline; returns the nearest remaining deadline or
 * INT64_MAX when no job is pending. */
static int64_t jobs_expire(struct services_bus *b, enum services_job_kind kind, struct services_jobs *jobs,
			   int64_t timeout_ms)
{
	int64_t now = mono_ms(), next = INT64_MAX;
	for (size_t i = 0; i < jobs->n; i++) {
		struct services_job *j = &jobs->v[i];
		if (j->done)
			continue;
		if (j->deadline <= now) {
			if (kind == SERVICES_JOB_STOP && !j->killed) {
				job_kill(b, j);
			} else {
				job_fail(j, "%s job timed out after %llds%s",
					 kind == SERVICES_JOB_STOP ? "stop" : "start", (long long)(timeout_ms / 1000),
					 j->killed ? " and SIGKILL" : "");
				j->timed_out = true;
				continue;
			}
		}
		if (j->deadline < next)
			next = j->deadline;
	}
	return next;
}

static int jobs_wait(struct services_bus *b, enum services_job_kind kind, struct services_jobs *jobs,
		     int64_t timeout_ms)
{
	for (;;) {
		int r = sd_bus_process(b->bus, NULL);
		if (r < 0)
			return r;
		if (r > 0)
			continue;
		int64_t next = jobs_expire(b, kind, jobs, timeout_ms);
		if (next == INT64_MAX)
			return 0;
		int64_t left = next - mono_ms();
		r = sd_bus_wait(b->bus, left > 0 ? (uint64_t)left * 1000 : 0);
		if (r < 0 && r != -EINTR)
			return r;
	}
}

static int bus_run_jobs(void *conn, enum services_job_kind kind, struct services_jobs *jobs, int64_t timeout_ms)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	struct services_bus *b = conn;
	struct job_batch batch = { jobs };
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
	for (size_t i = 0, n = jobs->n; i < n; i++)
		job_queue(b, jobs, i, kind, timeout_ms);
	r = jobs_wait(b, kind, jobs, timeout_ms);
	sd_bus_slot_unref(slot);
	return r;
}

/* The unit's cgroup, by systemd's ControlGroup: v2's cgroup.events says
 * whether a process is left; on v1 the name=systemd hierarchy's cgroup.procs. */
static int bus_cgroup_empty(void *conn, const char *unit)
{
	_cleanup_free_ char *cg = NULL, *path = NULL, *line = NULL;
	size_t cap = 0;
	int r = unit_property(conn, unit, "org.freedesktop.systemd1.Service", "ControlGroup", &cg);
	if (r < 0)
		return r;
	if (!cg[0])
		return 1; /* systemd removed it: nothing left */
	if (asprintf(&path, "/sys/fs/cgroup%s/cgroup.events", cg) < 0)
		return -ENOMEM;
	bool v1 = access(path, F_OK) < 0 && errno == ENOENT && access("/sys/fs/cgroup/systemd", F_OK) == 0;
	if (v1) {
		free(path);
		if (asprintf(&path, "/sys/fs/cgroup/systemd%s/cgroup.procs", cg) < 0)
			return -ENOMEM;
	}
	_cleanup_fclose_ FILE *f = fopen(path, "re");
	if (!f)
		return errno == ENOENT ? 1 : -errno;
	r = 1;
	while (getline(&line, &cap, f) > 0)
		if (v1 || !strcmp(line, "populated 1\n"))
			r = 0;
	return r;
}

static int bus_reset_failed(void *conn, const char *unit)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	struct services_bus *b = conn;
	return sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER, "ResetFailedUnit", &e, NULL, "s", unit);
}

static int bus_freeze(void *conn, const char *unit, bool freeze, int64_t timeout_ms, char **reason)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	_cleanup_bus_message_ sd_bus_message *m = NULL;
	struct services_bus *b = conn;
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

/* Reload returns once the manager has read its unit files again. */
static int bus_reload(void *conn, char **reason)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	struct services_bus *b = conn;
	int r = sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER, "Reload", &e, NULL, "");
	if (r < 0)
		*reason = bus_reason(&e, r);
	return r;
}

/* LoadUnit, not GetUnit: a unit the manager dropped is loaded afresh, so
 * a unit whose file is gone reads "not-found". */
static int bus_loaded_prop(void *conn, const char *unit, const char *prop, char **ret)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	_cleanup_bus_message_ sd_bus_message *reply = NULL;
	struct services_bus *b = conn;
	const char *path = NULL;
	int r = sd_bus_call_method(b->bus, SD_DEST, SD_PATH, SD_MANAGER, "LoadUnit", &e, &reply, "s", unit);
	if (r >= 0)
		r = sd_bus_message_read(reply, "o", &path);
	if (r < 0)
		return r;
	return sd_bus_get_property_string(b->bus, SD_DEST, path, "org.freedesktop.systemd1.Unit", prop, &e, ret);
}

static int bus_load_state(void *conn, const char *unit, char **ret)
{
	return bus_loaded_prop(conn, unit, "LoadState", ret);
}

static int bus_file_state(void *conn, const char *unit, char **ret)
{
	return bus_loaded_prop(conn, unit, "UnitFileState", ret);
}

/* ListUnitsByPatterns: the .service units active, activating or reloading. */
static int bus_running_units(void *conn, struct strv *ret)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	_cleanup_bus_message_ sd_bus_message *m = NULL, *reply = NULL;
	struct services_bus *b = conn;
	const char *states[] = { "active", "activating", "reloading", NULL }, *patterns[] = { "*.service", NULL };
	const char *name;
	int r = sd_bus_message_new_method_call(b->bus, &m, SD_DEST, SD_PATH, SD_MANAGER, "ListUnitsByPatterns");
	if (r >= 0)
		r = sd_bus_message_append_strv(m, (char **)states);
	if (r >= 0)
		r = sd_bus_message_append_strv(m, (char **)patterns);
	if (r >= 0)
		r = sd_bus_call(b->bus, m, 0, &e, &reply);
	if (r >= 0)
		r = sd_bus_message_enter_container(reply, 'a', "(ssssssouso)");
	while (r >= 0 && (r = sd_bus_message_enter_container(reply, 'r', "ssssssouso")) > 0) {
		r = sd_bus_message_read(reply, "s", &name);
		if (r >= 0)
			r = services_strv_add(ret, name);
		if (r >= 0)
			r = sd_bus_message_skip(reply, "sssssouso");
		if (r >= 0)
			r = sd_bus_message_exit_container(reply);
	}
	return r < 0 ? r : 0;
}

/* The path of each ExecStart entry, a(sasbttttuii). */
static int bus_exec_paths(struct services_bus *b, const char *path, struct strv *ret)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	_cleanup_bus_message_ sd_bus_message *reply = NULL;
	const char *exe;
	int r = sd_bus_get_property(b->bus, SD_DEST, path, "org.freedesktop.systemd1.Service", "ExecStart", &e, &reply,
				    "a(sasbttttuii)");
	if (r >= 0)
		r = sd_bus_message_enter_container(reply, 'a', "(sasbttttuii)");
	while (r >= 0 && (r = sd_bus_message_enter_container(reply, 'r', "sasbttttuii")) > 0) {
		r = sd_bus_message_read(reply, "s", &exe);
		if (r >= 0 && exe[0] == '/')
			r = services_strv_add(ret, exe);
		if (r >= 0)
			r = sd_bus_message_skip(reply, "asbttttuii");
		if (r >= 0)
			r = sd_bus_message_exit_container(reply);
	}
	return r < 0 ? r : 0;
}

static int bus_unit_files(void *conn, const char *unit, struct strv *ret)
{
	_cleanup_bus_error_ sd_bus_error e = SD_BUS_ERROR_NULL;
	_cleanup_free_ char *path = NULL, *fragment = NULL;
	char **dropins = NULL;
	struct services_bus *b = conn;
	int r = sd_bus_path_encode(SD_PATH "/unit", unit, &path);
	if (r >= 0)
		r = sd_bus_get_property_string(b->bus, SD_DEST, path, "org.freedesktop.systemd1.Unit", "FragmentPath",
					       &e, &fragment);
	if (r >= 0)
		r = services_strv_add(ret, fragment);
	if (r >= 0)
		r = sd_bus_get_property_strv(b->bus, SD_DEST, path, "org.freedesktop.systemd1.Unit", "DropInPaths", &e,
					     &dropins);
	for (size_t i = 0; r >= 0 && dropins && dropins[i]; i++)
		r = services_strv_add(ret, dropins[i]);
	for (size_t i = 0; dropins && dropins[i]; i++)
		free(dropins[i]);
	free(dropins);
	return r < 0 ? r : bus_exec_paths(b, path, ret);
}

const struct services_ops services_bus_ops = {
	.booted = bus_booted,
	.pid_unit = bus_pid_unit,
	.units_using = bus_units_using,
	.connect = bus_connect,
	.disconnect = bus_disconnect,
	.active_state = bus_active_state,
	.unit_result = bus_unit_result,
	.run_jobs = bus_run_jobs,
	.cgroup_empty = bus_cgroup_empty,
	.reset_failed = bus_reset_failed,
	.freeze = bus_freeze,
	.reload = bus_reload,
	.load_state = bus_load_state,
	.file_state = bus_file_state,
	.running_units = bus_running_units,
	.unit_files = bus_unit_files,
};
