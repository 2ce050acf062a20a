/* host.c: host mode's instance: configuration, and the background thread
 * that renews locks, hands sandboxes over to waiting instances and enforces
 * idle_timeout. reaper.c removes our containers if ckptd dies (so there are
 * never two running copies after a takeover). */
#include "host/host.h"
#include "host/sandbox.h"
#include "host/locks.h"
#include "host/reaper.h"
#include "host/session.h"
#include "config.h"

#define BG_TICK_MS 250

static bool instance_id_valid(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n >= LOCKS_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.", s[i]))
			return false;
	return s[0] != '.';
}

/* Kick the client of a sandbox that is leaving this instance. */
static void kick_client(struct host *h, struct sandbox *sb, const char *status, const char *msg, int code)
{
	struct session *s;

	pthread_mutex_lock(&h->mu);
	s = sb->client;
	if (s)
		s->refs++, s->kicked = true;
	pthread_mutex_unlock(&h->mu);
	if (!s)
		return;
	session_status(s, status);
	if (msg)
		session_error(s, "%s", msg);
	ws_close(s->ws, (uint16_t)code, NULL);
	session_unref(s);
}

static void drop(struct host *h, struct sandbox *sb)
{
	pthread_mutex_lock(&h->mu);
	sandbox_remove(h, sb);
	pthread_mutex_unlock(&h->mu);
}

void host_log_failure(struct host *h, const struct sandbox *sb, const char *what, const ckpt_error *err)
{
	log_warn("host: sandbox '%s' (container '%s'): %s failed: %s (runsc log '%s/%s.log')", sb->id, sb->cid, what,
		 err->msg[0] ? err->msg : "unknown error", h->logs_dir, sb->id);
}

/* Checkpoint and release (handoff, idle) or just stop: the sandbox leaves. */
static void leave(struct host *h, struct sandbox *sb, bool checkpoint, const char *why)
{
	ckpt_error err = { 0 };

	if (checkpoint && sandbox_checkpoint(h, sb, &err) < 0) {
		host_log_failure(h, sb, why, &err);
		pthread_mutex_lock(&h->mu);
		sb->state = SB_RUNNING;
		pthread_mutex_unlock(&h->mu);
		return;
	}
	if (!checkpoint)
		sandbox_stop(h, sb);
	log_info("host: sandbox '%s' %s (%s)", sb->id, checkpoint ? "checkpointed and released" : "destroyed", why);
	kick_client(h, sb, checkpoint ? "SANDBOX_CHECKPOINTED" : "SANDBOX_NOT_FOUND",
		    checkpoint ? NULL : "the sandbox was stopped",
		    checkpoint ? WS_CLOSE_NORMAL : WS_CLOSE_SERVER_ERROR);
	drop(h, sb);
}

/* Stop at once, e.g. when our lock was taken over: never a second copy. */
static void stop_now(struct host *h, struct sandbox *sb, const char *why)
{
	log_warn("host: sandbox '%s': stopping it (%s)", sb->id, why);
	runsc_delete(&h->runsc, sb->cid);
	reaper_note(h->reaper_fd, '-', sb->cid);
	kick_client(h, sb, "SANDBOX_NOT_FOUND", why, WS_CLOSE_SERVER_ERROR);
	if (sb->checkpointable && h->locks_fd >= 0)
		locks_release(h->locks_fd, sb->id, h->instance_id);
	pthread_mutex_lock(&h->mu);
	while (sb->exec_running)
		pthread_cond_wait(&h->cond, &h->mu);
	sandbox_remove(h, sb);
	pthread_mutex_unlock(&h->mu);
}

enum bg_action {
	BG_NONE,
	BG_HANDOFF,
	BG_LOST,
	BG_IDLE
};

/* Renew a due lock, under h->mu (lock files are small; sessions keep
 * streaming meanwhile, they do not take h->mu to send). */
static enum bg_action renew_locked(struct host *h, struct sandbox *sb, int64_t now_s)
{
	char waiter[LOCKS_NAME_MAX] = "";
	int r = locks_renew(h->locks_fd, sb->id, h->instance_id, now_s, waiter);

	if (r == -ESTALE || (r < 0 && now_s - sb->renewed_at >= h->lock_ttl))
		return BG_LOST;
	if (r == 0)
		sb->renewed_at = now_s;
	/* a waiter wants it: hand over, but let a running execution finish */
	return (r == 0 && waiter[0] && !sb->exec_running) ? BG_HANDOFF : BG_NONE;
}

/* Renew what is due and claim one sandbox needing work, under h->mu. */
static struct sandbox *next_work(struct host *h, enum bg_action *act, int64_t now_s)
{
	for (struct sandbox *sb = h->sandboxes; sb; sb = sb->next) {
		if (sb->state != SB_RUNNING)
			continue;
		*act = BG_NONE;
		if (!sb->client && !sb->exec_running && sb->idle_timeout_s > 0 &&
		    mono_ms() - sb->detached_mono_ms >= sb->idle_timeout_s * 1000)
			*act = BG_IDLE;
		else if (sb->checkpointable && now_s - sb->renewed_at >= h->lock_renew)
			*act = renew_locked(h, sb, now_s);
		if (*act != BG_NONE) {
			sb->state = SB_BUSY;
			return sb;
		}
	}
	return NULL;
}

static void bg_tick(struct host *h)
{
	enum bg_action act = BG_NONE;
	struct sandbox *sb;

	for (;;) {
		int64_t now_s = now_ms() / 1000;
		pthread_mutex_lock(&h->mu);
		sb = h->stopping ? NULL : next_work(h, &act, now_s);
		pthread_mutex_unlock(&h->mu);
		if (!sb)
			return;
		if (act == BG_LOST)
			stop_now(h, sb, "the sandbox moved to another instance");
		else if (act == BG_HANDOFF)
			leave(h, sb, true, "handoff");
		else
			leave(h, sb, sb->checkpointable, "idle timeout");
	}
}

static void *bg_main(void *arg)
{
	struct host *h = arg;

	pthread_mutex_lock(&h->mu);
	while (!h->stopping) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += BG_TICK_MS * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		pthread_cond_timedwait(&h->cond, &h->mu, &ts);
		pthread_mutex_unlock(&h->mu);
		bg_tick(h);
		pthread_mutex_lock(&h->mu);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

static int open_checkpoint_volume(struct host *h, ckpt_error *err)
{
	const char *bucket = getenv("SANDBOX_CHECKPOINT_BUCKET");
	const char *mount = getenv("SANDBOX_CHECKPOINT_MOUNT_PATH");
	_cleanup_free_ char *locks = NULL;

	h->locks_fd = -1;
	if (!bucket || !*bucket || !mount || !*mount)
		return 0; /* checkpointing off: create with enable_checkpoint fails */
	if (mount[0] != '/')
		return err_set(err, EINVAL, NULL, "SANDBOX_CHECKPOINT_MOUNT_PATH must be absolute");
	if (!(h->mount = strdup(mount)) || !(locks = path_join(mount, "locks")))
		return -ENOMEM;
	if (mkdir_p(locks, 0755) < 0 || (h->locks_fd = open(locks, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return err_set(err, errno, NULL, "checkpoint volume '%s': %s", locks, strerror(errno));
	return 0;
}

static int instance_dirs(struct host *h, const struct config *cfg, ckpt_error *err)
{
	_cleanup_free_ char *base =
		cfg->sandbox_state_dir ? strdup(cfg->sandbox_state_dir) : path_join(cfg->state_dir, "sandboxes");
	_cleanup_free_ char *inst = base ? path_join(base, h->instance_id) : NULL;

	if (!inst || !(h->runsc_root = path_join(inst, "runsc")) || !(h->bundles_dir = path_join(inst, "bundles")) ||
	    !(h->logs_dir = path_join(inst, "logs")))
		return -ENOMEM;
	if (mkdir_p(h->runsc_root, 0700) < 0 || mkdir_p(h->bundles_dir, 0700) < 0 || mkdir_p(h->logs_dir, 0700) < 0)
		return err_set(err, errno, NULL, "sandbox state dir '%s': %s", inst, strerror(errno));
	h->runsc.root = h->runsc_root;
	return 0;
}

static int default_instance_id(struct host *h)
{
	char host[64] = "host", rnd[9];
	gethostname(host, sizeof(host) - 1);
	for (char *p = host; *p; p++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", *p))
			*p = '-';
	if (random_hex(rnd, 4) < 0)
		return -EIO;
	return asprintf(&h->instance_id, "%s-%d-%s", host, (int)getpid(), rnd) < 0 ? -ENOMEM : 0;
}

/* The instance's part of container ids: the instance id itself when it is
 * short enough for runsc, else its head and an FNV-1a hash of the whole. */
static void cid_tag(struct host *h)
{
	uint32_t x = 2166136261u;
	size_t n = strlen(h->instance_id);

	if (n <= SANDBOX_CID_TAG_MAX) {
		memcpy(h->cid_tag, h->instance_id, n + 1);
		return;
	}
	for (size_t i = 0; i < n; i++)
		x = (x ^ (uint8_t)h->instance_id[i]) * 16777619u;
	snprintf(h->cid_tag, sizeof(h->cid_tag), "%.*s-%08x", SANDBOX_CID_TAG_MAX - 9, h->instance_id, x);
}

static int host_setup(struct host *h, const struct config *cfg, ckpt_error *err)
{
	int r;

	if (cfg->instance_id ? !(h->instance_id = strdup(cfg->instance_id)) : default_instance_id(h) < 0)
		return -ENOMEM;
	if (!instance_id_valid(h->instance_id))
		return err_set(err, EINVAL, NULL, "instance id '%s': use letters, digits, '-', '_', '.'",
			       h->instance_id);
	cid_tag(h);
	h->runsc.path = cfg->runsc_path ? cfg->runsc_path : "runsc";
	h->rootfs = cfg->sandbox_rootfs ? cfg->sandbox_rootfs : "/";
	h->lock_ttl = cfg->lock_ttl_secs;
	h->lock_renew = cfg->lock_renew_secs;
	h->default_idle = cfg->default_idle_timeout_secs;
	if ((r = runsc_version(h->runsc.path, h->runsc_version, sizeof(h->runsc_version), err)) < 0)
		return r;
	if ((r = runsc_cpu_features(&h->cpu_features, &h->n_cpu_features)) < 0)
		return err_set(err, -r, NULL, "/proc/cpuinfo: %s", strerror(-r));
	if ((r = instance_dirs(h, cfg, err)) < 0 || (r = open_checkpoint_volume(h, err)) < 0)
		return r;
	if ((r = reaper_start(&h->runsc, &h->reaper_fd)) < 0)
		return err_set(err, -r, NULL, "reaper: %s", strerror(-r));
	return 0;
}

int host_open(const struct config *cfg, struct host **ret, ckpt_error *err)
{
	struct host *h = calloc(1, sizeof(*h));
	int r;

	if (!h)
		return err_set(err, ENOMEM, NULL, "out of memory");
	h->reaper_fd = -1;
	h->locks_fd = -1;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cond, NULL);
	if ((r = host_setup(h, cfg, err)) < 0 || (r = -pthread_create(&h->bg, NULL, bg_main, h)) < 0) {
		if (r == -ENOMEM && !err->msg[0])
			err_set(err, ENOMEM, NULL, "out of memory");
		host_close(h);
		return r;
	}
	h->bg_started = true;
	log_info("host: instance '%s', runsc %s, checkpoints %s%s", h->instance_id, h->runsc_version,
		 h->mount ? "in " : "off", h->mount ? h->mount : "");
	*ret = h;
	return 0;
}

json_t *host_health(struct host *h)
{
	size_t n = 0;
	if (!h)
		return json_object();
	pthread_mutex_lock(&h->mu);
	for (struct sandbox *sb = h->sandboxes; sb; sb = sb->next)
		n++;
	pthread_mutex_unlock(&h->mu);
	return json_pack("{s:s, s:s, s:b, s:s?, s:I, s:I}", "instance_id", h->instance_id, "runsc_version",
			 h->runsc_version, "checkpointing", h->mount != NULL, "checkpoint_mount", h->mount, "sandboxes",
			 (json_int_t)n, "lock_ttl_secs", (json_int_t)h->lock_ttl);
}

/* On shutdown, checkpointable sandboxes are saved and released so another
 * instance can take them at once; the others are destroyed. */
static void host_shutdown_sandboxes(struct host *h)
{
	for (;;) {
		struct sandbox *sb;
		bool save;
		pthread_mutex_lock(&h->mu);
		for (sb = h->sandboxes; sb && sb->state == SB_STARTING; sb = sb->next)
			;
		if (sb)
			sb->state = SB_BUSY;
		save = sb && sb->checkpointable && !sb->exec_running;
		pthread_mutex_unlock(&h->mu);
		if (!sb)
			return;
		if (!save || sandbox_checkpoint(h, sb, NULL) < 0)
			stop_now(h, sb, "the server is shutting down");
		else
			kick_client(h, sb, "SANDBOX_CHECKPOINTED", NULL, WS_CLOSE_NORMAL), drop(h, sb);
	}
}

void host_close(struct host *h)
{
	if (!h)
		return;
	if (h->bg_started) {
		pthread_mutex_lock(&h->mu);
		h->stopping = true;
		pthread_cond_broadcast(&h->cond);
		pthread_mutex_unlock(&h->mu);
		pthread_join(h->bg, NULL);
		host_shutdown_sandboxes(h);
	}
	/* Sessions may still hold h: it stays allocated until exit; the reaper
	 * removes whatever is left when its pipe closes. */
	if (h->reaper_fd >= 0)
		close(TAKE_FD(h->reaper_fd));
	if (h->locks_fd >= 0)
		close(TAKE_FD(h->locks_fd));
}
