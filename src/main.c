/* main.c: ckptd's main. Parses the configuration, recovers state, serves HTTP, and
 * talks to systemd (READY, STATUS, WATCHDOG, STOPPING, socket activation). */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>

#include "http/api.h"
#include "config.h"
#include "engine/engine.h"
#include "host/host.h"
#include "host/runsc.h"
#include "lib/failpoint.h"
#include "lib/startwatch.h"

struct app {
	struct config cfg;
	struct engine *engine;
	struct host *host;
	struct http_server *http;
	char *listen[MAX_LISTEN * 2];
	size_t n_listen;
	char fd_specs[MAX_LISTEN][16];
};

/* A unix path the service manager already passed us is not bound again. */
static bool passed_unix_path(int first, int n, const char *path)
{
	for (int fd = first; fd < first + n; fd++) {
		struct sockaddr_un sa;
		socklen_t len = sizeof(sa);
		if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_family == AF_UNIX &&
		    !strncmp(sa.sun_path, path, sizeof(sa.sun_path)))
			return true;
	}
	return false;
}

static void app_listeners(struct app *a)
{
	int n = sd_listen_fds(1);
	for (int i = 0; i < n && i < MAX_LISTEN; i++) {
		snprintf(a->fd_specs[i], sizeof(a->fd_specs[i]), "fd:%d", SD_LISTEN_FDS_START + i);
		a->listen[a->n_listen++] = a->fd_specs[i];
	}
	for (size_t i = 0; i < a->cfg.n_listen; i++) {
		const char *spec = a->cfg.listen[i];
		if (n > 0 && !strncmp(spec, "unix:", 5) && passed_unix_path(SD_LISTEN_FDS_START, n, spec + 5))
			continue;
		a->listen[a->n_listen++] = a->cfg.listen[i];
	}
}

static void app_http_limits(const struct config *cfg, struct http_server_opts *o)
{
	o->conn_limit = (unsigned)(cfg->max_connections > 65536 ? 65536 : cfg->max_connections);
	o->per_client_limit =
		(unsigned)(cfg->max_connections_per_client > 65536 ? 65536 : cfg->max_connections_per_client);
	o->header_timeout_s = (unsigned)(cfg->header_timeout_secs > 3600 ? 3600 : cfg->header_timeout_secs);
}

/* A start may take long: it finishes a restore cut short, which rewrites
 * every file of the roots (of the whole system, for a root "/"). That grows
 * with the roots, so no fixed TimeoutStartSec= fits every sandbox. While the
 * start makes progress, ckptd asks systemd for more time (EXTEND_TIMEOUT_USEC:
 * first at once, then from a thread every APP_EXTEND_EVERY_MS) and pets the
 * watchdog. Progress is judged by lib/startwatch.c from the process's I/O,
 * CPU and wakeup counters, and its children's. After app_extend_quiet_ms()
 * without progress (STARTWATCH_WAIT_QUIET_MS while waiting on a disk) the thread
 * says so in the log and asks for nothing more: a start that hangs then
 * meets systemd's start timeout, and fails. */
#define APP_EXTEND_EVERY_MS 5000
#define APP_EXTEND_USEC (3ULL * APP_EXTEND_EVERY_MS * 1000)

struct app_extend {
	int64_t quiet_ms; /* the quiet window, app_extend_quiet_ms() */
	pthread_t thread;
	int pipe[2]; /* closed at the write end when the start is done */
	bool running;
};

static void app_extend_send(bool wd)
{
	sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)APP_EXTEND_USEC);
	if (wd)
		sd_notify(0, "WATCHDOG=1");
}

/* One line when the verdict changes between asking and not asking. */
static void app_extend_say(enum startwatch_verdict was, enum startwatch_verdict now, int64_t quiet_ms)
{
	if (now == STARTWATCH_STALLED && was != STARTWATCH_STALLED)
		log_error("start: no progress for %lld s (no read, write, CPU time or wakeup%s); no longer asking "
			  "systemd for more time, so its start timeout ends this start",
			  (long long)(quiet_ms / 1000), was == STARTWATCH_WAITING ? ", though waiting on I/O" : "");
	else if (now != STARTWATCH_STALLED && was == STARTWATCH_STALLED)
		log_notice("start: %s; asking systemd for more time again",
			   now == STARTWATCH_WAITING ? "waiting on I/O" : "progressing again");
	else if (now == STARTWATCH_BLIND && was != STARTWATCH_BLIND)
		log_warn("start: cannot read /proc/self/task to judge progress; asking systemd for more time anyway");
}

static void *app_extend_main(void *arg)
{
	struct app_extend *x = arg;
	uint64_t wd_usec = 0;
	bool wd = sd_watchdog_enabled(0, &wd_usec) > 0;
	int every = wd && wd_usec / 2000 < APP_EXTEND_EVERY_MS ? (int)(wd_usec / 2000) : APP_EXTEND_EVERY_MS;
	struct pollfd pfd = { .fd = x->pipe[0], .events = POLLIN };
	struct startwatch w;
	struct startwatch_sample s;
	enum startwatch_verdict was = STARTWATCH_MOVING;
	pid_t self = gettid();

	startwatch_init(&w, mono_ms(), x->quiet_ms);
	startwatch_sample_self("/proc", self, &s);
	startwatch_step(&w, &s, mono_ms());
	for (;;) {
		int r = poll(&pfd, 1, every > 10 ? every : 10);
		if (r != 0 && !(r < 0 && errno == EINTR))
			return NULL; /* the write end closed: the start is done */
		startwatch_sample_self("/proc", self, &s);
		int64_t now = mono_ms();
		enum startwatch_verdict v = startwatch_step(&w, &s, now);
		app_extend_say(was, v, startwatch_quiet_ms(&w, now));
		was = v;
		if (v != STARTWATCH_STALLED)
			app_extend_send(wd);
	}
}

/* A start may wait silently, on purpose, for a unit that will not stop
 * (service_timeout_secs, then SIGKILL and a few seconds), or in host mode
 * for a runsc command that says nothing (RUNSC_TIMEOUT_MS, then killed).
 * Those waits end by themselves: no hang. */
static int64_t app_extend_quiet_ms(const struct config *cfg)
{
	int64_t ms = (int64_t)cfg->service_timeout_secs * 1000;
	if (cfg->mode == MODE_HOST && ms < RUNSC_TIMEOUT_MS)
		ms = RUNSC_TIMEOUT_MS;
	ms += STARTWATCH_QUIET_MS / 2;
	return ms > STARTWATCH_QUIET_MS ? ms : STARTWATCH_QUIET_MS;
}

/* Only when systemd waits for READY: without NOTIFY_SOCKET there is nobody to ask. */
static void app_extend_begin(struct app_extend *x, const struct config *cfg)
{
	*x = (struct app_extend){ .pipe = { -1, -1 }, .quiet_ms = app_extend_quiet_ms(cfg) };
	if (!getenv("NOTIFY_SOCKET") || pipe2(x->pipe, O_CLOEXEC) < 0)
		return;
	uint64_t wd_usec;
	app_extend_send(sd_watchdog_enabled(0, &wd_usec) > 0);
	x->running = pthread_create(&x->thread, NULL, app_extend_main, x) == 0;
}

static void app_extend_end(struct app_extend *x)
{
	if (x->pipe[1] >= 0)
		close(x->pipe[1]);
	if (x->running)
		pthread_join(x->thread, NULL);
	if (x->pipe[0] >= 0)
		close(x->pipe[0]);
}

static int app_start_sandbox(struct app *a, ckpt_error *err)
{
	struct http_server_opts o;
	int r = engine_open(&a->cfg, NULL, &a->engine, err);
	if (r < 0)
		return r;
	api_server_opts(a->engine, a->cfg.token, a->cfg.metrics_token_free, &o);
	app_http_limits(&a->cfg, &o);
	o.spool_dir = a->cfg.state_dir; /* import bodies, as unlinked files */
	o.max_spool_bytes = (uint64_t)a->cfg.max_import_bytes;
	return http_start(&o, a->listen, a->n_listen, &a->http, err);
}

static int app_start_host(struct app *a, ckpt_error *err)
{
	int r = host_open(&a->cfg, &a->host, err);
	if (r < 0)
		return r;
	struct http_server_opts o = { .app = a->host, .token = a->cfg.token };
	o.routes = host_routes(&o.n_routes);
	app_http_limits(&a->cfg, &o);
	return http_start(&o, a->listen, a->n_listen, &a->http, err);
}

static void app_notify_status(struct app *a)
{
	char line[200] = "serving host mode";
	if (a->engine)
		engine_status_line(a->engine, line, sizeof(line));
	sd_notifyf(0, "STATUS=%s", line);
}

/* Wait for a stop signal, petting the watchdog on the way. */
static int app_wait(struct app *a)
{
	uint64_t wd_usec = 0;
	sigset_t set;
	siginfo_t si;
	bool wd = sd_watchdog_enabled(0, &wd_usec) > 0;
	int64_t tick_ms = wd ? (int64_t)(wd_usec / 2000) : 2000;

	if (tick_ms < 10)
		tick_ms = 10;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	for (;;) {
		struct timespec ts = { .tv_sec = tick_ms / 1000, .tv_nsec = (tick_ms % 1000) * 1000000 };
		int sig = sigtimedwait(&set, &si, &ts);
		if (sig == SIGTERM || sig == SIGINT)
			return sig;
		if (wd)
			sd_notify(0, "WATCHDOG=1");
		app_notify_status(a);
	}
}

/* The units to start after READY, off the main thread: a unit that is slow
 * to start (one still stopping, say) must not keep the watchdog unpetted. */
static void *app_adoption_main(void *engine)
{
	engine_adoption_finish(engine);
	return NULL;
}

/* A walk holds a descriptor per directory level in each tree it reads (two
 * or three in a merge), so a tree 2,000 levels deep needs thousands at
 * once; the usual soft limit of 1024 would end it in EMFILE. The hard limit
 * is what the system allows this process: take all of it. */
static void app_raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rlim_t was = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		log_warn("open files: cannot raise the soft limit of %llu to %llu: %m", (unsigned long long)was,
			 (unsigned long long)rl.rlim_max);
	else
		log_notice("open files: soft limit raised from %llu to the hard limit, %llu", (unsigned long long)was,
			   (unsigned long long)rl.rlim_max);
}

static void app_block_signals(void)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
}

static void app_stop(struct app *a)
{
	http_stop(a->http);
	engine_close(a->engine);
	host_close(a->host);
	config_free(&a->cfg);
}

#ifdef CKPTD_FAILPOINTS
/* The test build: --list-failpoints prints every crash point; CKPTD_FAILPOINT
 * ("name" or "name:N") arms one, CKPTD_FAILPOINT_TRACE=1 prints each hit.
 * CKPTD_FAILPOINT_ACTION=hang blocks the thread there instead of killing. */
static int app_failpoints(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--list-failpoints")) {
		failpoint_list(stdout);
		return 1;
	}
	const char *trace = getenv("CKPTD_FAILPOINT_TRACE");
	const char *action = getenv("CKPTD_FAILPOINT_ACTION");
	bool hang = action && !strcmp(action, "hang");
	if (action && *action && !hang && strcmp(action, "kill") != 0) {
		fprintf(stderr, "ckptd: CKPTD_FAILPOINT_ACTION: expected kill or hang\n");
		return -1;
	}
	if (failpoint_arm(getenv("CKPTD_FAILPOINT"), hang, trace && *trace == '1') < 0) {
		fprintf(stderr, "ckptd: CKPTD_FAILPOINT: expected NAME or NAME:N\n");
		return -1;
	}
	return 0;
}
#else
static int app_failpoints(_unused_ int argc, _unused_ char **argv)
{
	return 0;
}
#endif

int main(int argc, char **argv)
{
	static struct app a;
	ckpt_error err = { 0 };
	int r = app_failpoints(argc, argv);

	if (r != 0)
		return r > 0 ? 0 : 2;
	r = config_parse(&a.cfg, argc, argv, &err);

	if (r > 0)
		return 0;
	if (a.cfg.check_only) {
		if (r < 0)
			fprintf(stderr, "ckptd: %s\n", err.msg);
		else
			printf("ckptd: configuration is valid%s%s\n", a.cfg.config_file ? ": " : "",
			       a.cfg.config_file ? a.cfg.config_file : "");
		config_free(&a.cfg);
		return r < 0 ? 1 : 0;
	}
	log_init(a.cfg.verbose);
	if (r < 0) {
		log_error("%s", err.msg);
		return 2;
	}
	app_raise_fd_limit();
	app_block_signals(); /* before any thread starts, so all inherit the mask */
	app_listeners(&a);
	struct app_extend extend;
	app_extend_begin(&extend, &a.cfg);
	r = a.cfg.mode == MODE_HOST ? app_start_host(&a, &err) : app_start_sandbox(&a, &err);
	app_extend_end(&extend);
	if (r < 0) {
		log_error("cannot start: %s", err.msg);
		sd_notifyf(0, "STATUS=failed to start: %s", err.msg);
		app_stop(&a);
		return 1;
	}
	for (size_t i = 0; i < a.n_listen; i++)
		log_notice("listening on %s", a.listen[i]);
	log_notice("ckptd %s ready (%s mode%s%s)", CKPTD_VERSION, a.cfg.mode == MODE_HOST ? "host" : "sandbox",
		   a.engine ? ", backend " : "", a.engine ? engine_backend_name(a.engine) : "");
	sd_notify(0, "READY=1");
	pthread_t adopt; /* units After=ckptd.service can start now */
	bool adopting = pthread_create(&adopt, NULL, app_adoption_main, a.engine) == 0;
	if (!adopting)
		engine_adoption_finish(a.engine);
	app_notify_status(&a);
	int sig = app_wait(&a);
	log_notice("stopping on signal %d", sig);
	sd_notify(0, "STOPPING=1");
	if (adopting)
		pthread_join(adopt, NULL);
	app_stop(&a);
	return 0;
}
