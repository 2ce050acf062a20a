/* host_api.c: host mode's protocol and route table: WS /create and
 * WS /attach/{id} (one session each: executions, client checkpoints, restore
 * on attach, waiting for another instance to hand the sandbox over) and
 * GET /v1/health. The top of host/: it calls everything below, nothing
 * below calls it. */
#include "host/host.h"
#include "host/sandbox.h"
#include "host/session.h"
#include "host/exec.h"
#include "host/locks.h"
#include "config.h"

#define FIRST_MESSAGE_TIMEOUT_MS 30000
#define LOCK_POLL_MS 250

/* Drop a sandbox that never became usable. */
static void forget(struct session *s, struct sandbox *sb)
{
	pthread_mutex_lock(&s->h->mu);
	sandbox_remove(s->h, sb);
	s->sb = NULL;
	pthread_mutex_unlock(&s->h->mu);
}

static void become_running(struct session *s, struct sandbox *sb)
{
	pthread_mutex_lock(&s->h->mu);
	sb->state = SB_RUNNING;
	pthread_mutex_unlock(&s->h->mu);
}

static int parse_config(struct session *s, const char *msg, int64_t *idle, bool *ckpt, char *why, size_t len)
{
	json_auto_t *o = json_loads(msg, 0, NULL);
	json_t *v;
	int r = 0;

	*idle = s->h->default_idle;
	*ckpt = false;
	if (!json_is_object(o))
		r = -EINVAL,
		snprintf(why, len, "the first message must be a JSON object {idle_timeout, enable_checkpoint}");
	else if ((v = json_object_get(o, "idle_timeout")) && !json_is_null(v) &&
		 (!json_is_integer(v) || json_integer_value(v) < 0))
		r = -EINVAL, snprintf(why, len, "idle_timeout must be a whole number of seconds >= 0");
	else if ((v = json_object_get(o, "enable_checkpoint")) && !json_is_boolean(v) && !json_is_null(v))
		r = -EINVAL, snprintf(why, len, "enable_checkpoint must be true or false");
	if (r == 0 && (v = json_object_get(o, "idle_timeout")) && json_is_integer(v))
		*idle = json_integer_value(v);
	if (r == 0)
		*ckpt = json_is_true(json_object_get(o, "enable_checkpoint"));
	return r;
}

static int create_sandbox(struct session *s, int64_t idle, bool ckpt)
{
	struct host *h = s->h;
	char id[40] = "sandbox-";
	ckpt_error err = { 0 };
	struct sandbox *sb;

	if (random_hex(id + 8, 12) < 0)
		return -EIO;
	pthread_mutex_lock(&h->mu);
	sb = sandbox_add(h, id);
	if (sb) {
		sb->idle_timeout_s = idle;
		sb->checkpointable = ckpt;
		sb->client = s;
		s->sb = sb;
	}
	pthread_mutex_unlock(&h->mu);
	if (!sb)
		return -ENOMEM;
	session_status(s, "SANDBOX_CREATING");
	if (ckpt && (sandbox_lock(h, sb, NULL) < 0 || sandbox_write_metadata(h, sb, "", &err) < 0)) {
		host_log_failure(h, sb, "locking the new sandbox", &err);
		sandbox_unlock(h, sb);
		forget(s, sb);
		session_fail(s, "SANDBOX_CREATION_ERROR", WS_CLOSE_APP_ERROR,
			     err.msg[0] ? err.msg : "cannot lock the new sandbox");
		return -EIO;
	}
	if (sandbox_start(h, sb, &err) < 0) {
		host_log_failure(h, sb, "create", &err);
		sandbox_unlock(h, sb);
		forget(s, sb);
		session_fail(s, "SANDBOX_CREATION_ERROR", WS_CLOSE_APP_ERROR, err.msg);
		return -EIO;
	}
	become_running(s, sb);
	session_send(s, json_pack("{s:s, s:s}", "event", "sandbox_id", "sandbox_id", id));
	session_status(s, "SANDBOX_RUNNING");
	return 0;
}

static int session_create(struct session *s)
{
	_cleanup_free_ char *msg = NULL;
	char why[200];
	size_t len;
	int64_t idle;
	bool ckpt;
	int op = ws_recv(s->ws, FIRST_MESSAGE_TIMEOUT_MS, &msg, &len);

	if (op <= 0 || op == WS_OP_CLOSE) {
		if (op == 0)
			session_fail(s, "SANDBOX_CREATION_ERROR", WS_CLOSE_APP_ERROR,
				     "no configuration message received");
		return -EIO;
	}
	if (parse_config(s, msg, &idle, &ckpt, why, sizeof(why)) < 0) {
		session_fail(s, "SANDBOX_CREATION_ERROR", WS_CLOSE_APP_ERROR, why);
		return -EINVAL;
	}
	if (ckpt && !s->h->mount) {
		session_fail(s, "SANDBOX_CREATION_ERROR", WS_CLOSE_APP_ERROR,
			     "checkpointing is not configured on this server (SANDBOX_CHECKPOINT_BUCKET and "
			     "SANDBOX_CHECKPOINT_MOUNT_PATH)");
		return -ENOTSUP;
	}
	if (ckpt && !host_checkpointing(s->h)) {
		session_fail(s, "SANDBOX_CREATION_ERROR", WS_CLOSE_APP_ERROR, s->h->no_checkpoint_why);
		return -ENOTSUP;
	}
	return create_sandbox(s, idle, ckpt);
}

/* Wait until the lock is ours: the owner hands over when it sees us as the
 * waiter, or its lock expires. 1 = ours, 0 = the client left, <0 = gave up. */
static int wait_for_lock(struct session *s, struct sandbox *sb, char *why, size_t len)
{
	struct host *h = s->h;
	const char *id = sb->id;
	int64_t deadline = mono_ms() + (2 * (h->lock_ttl + h->lock_margin) + 120) * 1000;
	struct lock_info cur;

	for (;;) {
		int r = sandbox_lock(h, sb, &cur);
		if (r == 0)
			return 1;
		if (r != -EBUSY) {
			snprintf(why, len, "lock of sandbox '%s': %s", id, strerror(-r));
			return r;
		}
		locks_add_waiter(&h->locks, id, h->instance_id);
		if (mono_ms() > deadline) {
			snprintf(why, len, "instance '%s' did not hand sandbox '%s' over in time", cur.owner, id);
			return -ETIMEDOUT;
		}
		/* etcd: woken by the watch when the lock is released; the
		 * volume has nothing to watch and waits in ws_recv instead */
		locks_wait(&h->locks, id, LOCK_POLL_MS);
		_cleanup_free_ char *msg = NULL;
		size_t mlen;
		int op = ws_recv(s->ws, h->locks.etcd ? 1 : LOCK_POLL_MS, &msg, &mlen);
		if (op < 0 || op == WS_OP_CLOSE)
			return 0;
	}
}

/* Attach to a sandbox this instance does not run: restore it from the volume. */
static int attach_restore(struct session *s, struct sandbox *sb)
{
	struct host *h = s->h;
	ckpt_error err = { 0 };
	struct lock_info cur;
	char why[400];
	int r;

	if (!h->mount || (locks_read(&h->locks, sb->id, &cur) == -ENOENT && !sandbox_has_checkpoint(h, sb->id))) {
		forget(s, sb);
		session_fail(s, "SANDBOX_NOT_FOUND", WS_CLOSE_SERVER_ERROR, NULL);
		return -ENOENT;
	}
	if (!host_checkpointing(h)) {
		forget(s, sb);
		session_fail(s, "SANDBOX_RESTORE_ERROR", WS_CLOSE_APP_ERROR, h->no_checkpoint_why);
		return -ENOTSUP;
	}
	if ((r = wait_for_lock(s, sb, why, sizeof(why))) <= 0) {
		forget(s, sb);
		if (r < 0)
			session_fail(s, "SANDBOX_RESTORE_ERROR", WS_CLOSE_APP_ERROR, why);
		return -EIO;
	}
	sb->checkpointable = true;
	if ((r = sandbox_restore(h, sb, &err)) < 0) {
		host_log_failure(h, sb, "restore", &err);
		sandbox_unlock(h, sb);
		forget(s, sb);
		if (r == -ENOENT)
			session_fail(s, "SANDBOX_NOT_FOUND", WS_CLOSE_SERVER_ERROR, NULL);
		else
			session_fail(s, "SANDBOX_RESTORE_ERROR", WS_CLOSE_APP_ERROR, err.msg);
		return r;
	}
	become_running(s, sb);
	session_status(s, "SANDBOX_RUNNING");
	return 0;
}

static int session_attach(struct session *s)
{
	struct host *h = s->h;
	struct sandbox *sb;
	bool in_use = false, local = false;

	pthread_mutex_lock(&h->mu);
	sb = sandbox_find(h, s->attach_id);
	if (sb && (sb->client || sb->state != SB_RUNNING || sb->fenced)) {
		in_use = true;
	} else if (sb) {
		local = true;
	} else if ((sb = sandbox_add(h, s->attach_id))) {
		sb->state = SB_STARTING;
	}
	if (sb && !in_use) {
		sb->client = s;
		s->sb = sb;
	}
	pthread_mutex_unlock(&h->mu);
	if (in_use) {
		session_fail(s, "SANDBOX_IN_USE", WS_CLOSE_APP_ERROR, "another client is attached to this sandbox");
		return -EBUSY;
	}
	if (!sb)
		return -ENOMEM;
	if (local)
		return session_status(s, "SANDBOX_RUNNING") < 0 ? -EIO : 0;
	session_status(s, "SANDBOX_RESTORING");
	return attach_restore(s, sb);
}

static void client_checkpoint(struct session *s)
{
	struct host *h = s->h;
	struct sandbox *sb;
	ckpt_error err = { 0 };
	const char *refuse = NULL;
	bool executing;

	session_status(s, "SANDBOX_CHECKPOINTING");
	pthread_mutex_lock(&h->mu);
	sb = s->sb;
	executing = sb && sb->exec_running;
	if (!sb)
		refuse = "the sandbox is gone";
	else if (executing)
		refuse = "Cannot checkpoint while an execution is in progress.";
	else if (!sb->checkpointable)
		refuse = "checkpointing was not enabled for this sandbox (enable_checkpoint)";
	else if (sb->state != SB_RUNNING || sb->fenced)
		refuse = sb->fenced ? "lost ownership" : "the sandbox is busy";
	else
		sb->state = SB_BUSY;
	pthread_mutex_unlock(&h->mu);
	if (executing) {
		session_status(s, "SANDBOX_EXECUTION_IN_PROGRESS_ERROR");
		session_error(s, "%s", refuse);
		return;
	}
	if (refuse) {
		session_fail(s, "SANDBOX_CHECKPOINT_ERROR", WS_CLOSE_APP_ERROR, refuse);
		return;
	}
	if (sandbox_checkpoint(h, sb, &err) < 0) {
		host_log_failure(h, sb, "checkpoint", &err);
		pthread_mutex_lock(&h->mu);
		sb->state = SB_RUNNING;
		pthread_mutex_unlock(&h->mu);
		session_fail(s, "SANDBOX_CHECKPOINT_ERROR", WS_CLOSE_APP_ERROR, err.msg);
		return;
	}
	forget(s, sb);
	session_status(s, "SANDBOX_CHECKPOINTED");
	ws_close(s->ws, WS_CLOSE_NORMAL, NULL);
}

static void exec_output(void *arg, const char *stream, const char *buf, size_t len)
{
	session_output(arg, stream, buf, len);
}

static void exec_done(void *arg, int status)
{
	struct session *s = arg;
	session_send(s,
		     json_pack("{s:s, s:s, s:i}", "event", "status_update", "status", "SANDBOX_EXECUTION_DONE",
			       "exit_code", status));
	session_unref(s);
}

static void client_execute(struct session *s, const char *language, const char *code)
{
	struct host *h = s->h;
	const struct exec_sink sink = { exec_output, exec_done, s };
	struct sandbox *sb;
	ckpt_error err = { 0 };
	bool busy;

	pthread_mutex_lock(&h->mu);
	sb = s->sb;
	busy = !sb || sb->exec_running || sb->state != SB_RUNNING || sb->fenced;
	if (!busy)
		sb->exec_running = true, s->refs++; /* the execution's reference */
	pthread_mutex_unlock(&h->mu);
	if (busy) {
		session_status(s, "SANDBOX_EXECUTION_ERROR");
		session_error(s, "an execution is already in progress; wait for SANDBOX_EXECUTION_DONE");
		return;
	}
	session_status(s, "SANDBOX_EXECUTION_RUNNING");
	if (exec_start(h, sb, language, code, &sink, &err) < 0) {
		pthread_mutex_lock(&h->mu);
		sb->exec_running = false;
		pthread_mutex_unlock(&h->mu);
		session_unref(s);
		host_log_failure(h, sb, "exec", &err);
		session_status(s, "SANDBOX_EXECUTION_ERROR");
		session_error(s, "%s", err.msg);
	}
}

static void handle_message(struct session *s, const char *msg)
{
	json_auto_t *o = json_loads(msg, 0, NULL);
	const char *action = json_string_value(json_object_get(o, "action"));
	const char *lang = json_string_value(json_object_get(o, "language"));
	const char *code = json_string_value(json_object_get(o, "code"));

	if (action && !strcmp(action, "checkpoint"))
		client_checkpoint(s);
	else if (action)
		session_error(s, "unknown action '%s'", action);
	else if (lang && code)
		client_execute(s, lang, code);
	else
		session_error(
			s,
			"expected {\"language\": \"python\"|\"bash\", \"code\": ...} or {\"action\": \"checkpoint\"}");
}

static void session_loop(struct session *s)
{
	int64_t closed_at = 0;

	for (;;) {
		_cleanup_free_ char *msg = NULL;
		size_t len;
		int op = ws_recv(s->ws, 500, &msg, &len);
		if (op < 0 || op == WS_OP_CLOSE)
			return;
		if (ws_closed(s->ws)) {
			/* we closed (checkpoint, handoff): give the client a moment to answer */
			if (!closed_at)
				closed_at = mono_ms();
			if (mono_ms() - closed_at > 2000)
				return;
			continue;
		}
		if (op == WS_OP_TEXT)
			handle_message(s, msg);
		else if (op == WS_OP_BINARY)
			session_error(s, "binary messages are not supported");
	}
}

static void *session_main(void *arg)
{
	struct session *s = arg;
	int r = s->attach_id[0] ? session_attach(s) : session_create(s);

	if (r == 0 || ws_closed(s->ws))
		session_loop(s);
	session_detach(s);
	session_unref(s);
	return NULL;
}

static void on_upgrade(void *arg, int fd, const char *extra, size_t extra_len, void *handle)
{
	struct session *s = arg;
	pthread_t t;

	s->handle = handle;
	s->ws = ws_conn_new(fd, extra, extra_len);
	if (!s->ws || pthread_create(&t, NULL, session_main, s) != 0) {
		ws_conn_free(s->ws);
		http_upgrade_close(handle);
		free(s);
		return;
	}
	pthread_detach(t);
}

static void upgrade_route(struct host *h, const struct http_request *req, struct http_response *resp, const char *id)
{
	const char *up = http_header(req, "Upgrade"), *ver = http_header(req, "Sec-WebSocket-Version");
	char accept[29];
	struct session *s;

	if (!up || strcasecmp(up, "websocket") || ws_accept_key(http_header(req, "Sec-WebSocket-Key"), accept) < 0 ||
	    !ver || strcmp(ver, "13")) {
		http_problem(resp, 400, "bad_request", "a WebSocket upgrade (version 13) is required here");
		return;
	}
	if (id && !sandbox_id_valid(id)) {
		http_problem(resp, 404, "not_found", "no sandbox with this id");
		return;
	}
	if (!(s = calloc(1, sizeof(*s)))) {
		http_problem(resp, 500, "internal", "out of memory");
		return;
	}
	s->h = h;
	s->refs = 1;
	snprintf(s->attach_id, sizeof(s->attach_id), "%s", id ? id : "");
	resp->status = 101;
	resp->upgrade = on_upgrade;
	resp->upgrade_arg = s;
	resp->upgrade_protocol = "websocket";
	resp->extra_headers[0][0] = strdup("Sec-WebSocket-Accept");
	resp->extra_headers[0][1] = strdup(accept);
}

static void route_create(void *app, const struct http_request *req, struct http_response *resp)
{
	upgrade_route(app, req, resp, NULL);
}

static void route_attach(void *app, const struct http_request *req, struct http_response *resp)
{
	char id[SANDBOX_ID_MAX + 2];
	const char *p = req->n_params ? req->params[0] : "";
	size_t n = strcspn(p, "/");

	snprintf(id, sizeof(id), "%.*s", (int)(n > SANDBOX_ID_MAX ? SANDBOX_ID_MAX + 1 : n), p);
	upgrade_route(app, req, resp, id);
}

static void route_health(void *app, const struct http_request *req, struct http_response *resp)
{
	(void)req;
	json_t *h = host_health(app);
	json_object_set_new(h, "status", json_string("ok"));
	json_object_set_new(h, "mode", json_string("host"));
	json_object_set_new(h, "version", json_string(CKPTD_VERSION));
	http_json(resp, 200, h);
}

/* Host mode's route table: the WebSocket sessions and health. */
static const struct http_route routes[] = {
	{ "GET", "/create", route_create, false, false },
	{ "GET", "/attach/{id}", route_attach, false, false },
	{ "GET", "/v1/health", route_health, true, false },
};

const struct http_route *host_routes(size_t *ret_n)
{
	*ret_n = ARRAY_SIZE(routes);
	return routes;
}
