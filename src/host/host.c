/* host.c: host mode's instance: configuration, and the background thread
 * that renews locks, hands sandboxes over to waiting instances and enforces
 * idle_timeout. reaper.c removes our containers if ckptd dies (so there are
 * never two running copies after a takeover). */
#include "host/host.h"
#include "host/sandbox.h"
#include "host/locks.h"
#include "host/locks_etcd.h"
#include "host/reaper.h"
#include "host/session.h"
#include "config.h"

#include <signal.h>
#include <sys/syscall.h>

#define BG_TICK_MS 250 /* also how often an owner looks for a waiter */
#define WATCHDOG_TICK_MS 50
#define SHUTDOWN_STALL_MS 5000 /* plus the lease: how long shutdown waits without progress */

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
		sb->waiter_seen = false; /* retried when the next look sees the waiter */
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
	sandbox_unlock(h, sb); /* removes the lock only if it is still ours */
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

struct held {
	char id[SANDBOX_ID_MAX + 1];
	uint64_t token;
	bool due; /* renew; otherwise only look for a waiter */
};

/* Lock files this instance holds, copied under h->mu. */
static size_t held_locks(struct host *h, int64_t now_s, struct held **ret)
{
	size_t n = 0, i = 0;

	pthread_mutex_lock(&h->mu);
	for (struct sandbox *sb = h->sandboxes; sb; sb = sb->next)
		n += sb->token != 0;
	*ret = n ? calloc(n, sizeof(**ret)) : NULL;
	for (struct sandbox *sb = h->sandboxes; *ret && sb; sb = sb->next)
		if (sb->token) {
			snprintf((*ret)[i].id, sizeof((*ret)[i].id), "%s", sb->id);
			(*ret)[i].token = sb->token;
			(*ret)[i++].due = now_s - sb->renewed_at >= h->lock_renew;
		}
	pthread_mutex_unlock(&h->mu);
	return *ret ? n : 0;
}

/* The sandbox still holding this lock generation (under h->mu). */
static struct sandbox *holder(struct host *h, const struct held *l)
{
	struct sandbox *sb = sandbox_find(h, l->id);
	return sb && sb->token == l->token ? sb : NULL;
}

/* Renew one lock, or just read it for a waiter, without h->mu: the volume
 * may block here for as long as it likes; the watchdog keeps time. The
 * timestamp written and the lease's start are taken together, just before
 * the write: a lease never outlasts what a taker computes from the file. */
static void renew_one(struct host *h, const struct held *l)
{
	char waiter[LOCKS_NAME_MAX] = "";
	struct lock_info cur;
	int64_t t0 = 0, now_s = 0;
	struct sandbox *sb;
	bool renew;
	int r = 0;

	pthread_mutex_lock(&h->lock_io);
	pthread_mutex_lock(&h->mu);
	sb = holder(h, l);
	pthread_mutex_unlock(&h->mu);
	renew = sb && l->due;
	if (sb && !l->due) {
		r = locks_read(&h->locks, l->id, &cur);
		if (r == 0 && !strcmp(cur.owner, h->instance_id) && cur.token == l->token)
			memcpy(waiter, cur.waiter, sizeof(waiter));
		else if (r == 0 || r == -ENOENT)
			/* Not as we left it: the late write of a former owner
			 * (its renewal blocked on the volume), or a name a
			 * rename through FUSE has aside for a moment. The
			 * renewal tells which: it puts ours back over an older
			 * generation and reads a missing name again; only a
			 * newer owner makes it -ESTALE. */
			renew = true;
	}
	if (renew) {
		t0 = mono_ms();
		now_s = now_ms() / 1000;
		r = locks_renew(&h->locks, l->id, h->instance_id, l->token, now_s, waiter);
	}
	pthread_mutex_unlock(&h->lock_io);
	pthread_mutex_lock(&h->mu);
	if (sb && (sb = holder(h, l))) {
		if (r == 0 && renew)
			sb->lease_until = t0 + h->lock_ttl * 1000, sb->renewed_at = now_s;
		if (r == -ESTALE)
			sb->fenced = true; /* taken over: the watchdog kills it */
		if (r == 0 && waiter[0])
			sb->waiter_seen = true;
	}
	pthread_mutex_unlock(&h->mu);
}

static void renew_all(struct host *h)
{
	int64_t now_s = now_ms() / 1000;
	_cleanup_free_ struct held *l = NULL;
	size_t n = held_locks(h, now_s, &l);

	for (size_t i = 0; i < n; i++)
		renew_one(h, &l[i]);
}

/* Claim one sandbox needing work, under h->mu. */
static struct sandbox *next_work(struct host *h, enum bg_action *act)
{
	for (struct sandbox *sb = h->sandboxes; sb; sb = sb->next) {
		if (sb->state != SB_RUNNING)
			continue;
		*act = BG_NONE;
		if (sb->fenced)
			*act = BG_LOST;
		else if (!sb->client && !sb->exec_running && sb->idle_timeout_s > 0 &&
			 mono_ms() - sb->detached_mono_ms >= sb->idle_timeout_s * 1000)
			*act = BG_IDLE;
		else if (sb->waiter_seen && !sb->exec_running) /* let a running execution finish */
			*act = BG_HANDOFF;
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
		pthread_mutex_lock(&h->mu);
		sb = h->stopping ? NULL : next_work(h, &act);
		pthread_mutex_unlock(&h->mu);
		if (!sb)
			return;
		if (act == BG_LOST)
			stop_now(h, sb, "lost ownership: the sandbox moved to another instance or its lease ran out");
		else if (act == BG_HANDOFF)
			leave(h, sb, true, "handoff");
		else
			leave(h, sb, sb->checkpointable, "idle timeout");
	}
}

static void wait_ms(struct host *h, int ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += ms * 1000000L;
	ts.tv_sec += ts.tv_nsec / 1000000000L;
	ts.tv_nsec %= 1000000000L;
	pthread_cond_timedwait(&h->cond, &h->mu, &ts);
}

/* The watchdog: the owner stops executing when its lease runs out by its own
 * monotonic clock, whatever the volume does. It never touches the volume and
 * holds h->mu only to look at the clock and the registry. */
static void *watchdog_main(void *arg)
{
	struct host *h = arg;

	pthread_mutex_lock(&h->mu);
	while (!h->closed) {
		char cid[SANDBOX_CID_MAX + 1] = "", id[SANDBOX_ID_MAX + 1];
		for (struct sandbox *sb = h->sandboxes; sb && !cid[0]; sb = sb->next)
			if (sb->token && !sb->killed && (sb->fenced || mono_ms() >= sb->lease_until)) {
				sb->fenced = sb->killed = true;
				/* at once, no runsc call in the way; delete cleans up */
				if (sb->pidfd >= 0 && syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0) < 0)
					log_debug("host: sandbox '%s': pidfd kill: %m", sb->id);
				memcpy(cid, sb->cid, sizeof(cid));
				memcpy(id, sb->id, sizeof(id));
			}
		if (!cid[0]) {
			wait_ms(h, WATCHDOG_TICK_MS);
			continue;
		}
		pthread_mutex_unlock(&h->mu);
		log_warn("host: sandbox '%s': lease lost, killing container '%s'", id, cid);
		int r = runsc_delete(&h->runsc, cid);
		if (r < 0)
			log_error("host: sandbox '%s': runsc delete -force '%s' failed: %s", id, cid, strerror(-r));
		pthread_mutex_lock(&h->mu);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* Run fn every BG_TICK_MS until *until turns true (read under h->mu). */
static void tick_loop(struct host *h, const bool *until, void (*fn)(struct host *h))
{
	pthread_mutex_lock(&h->mu);
	while (!*until) {
		wait_ms(h, BG_TICK_MS);
		pthread_mutex_unlock(&h->mu);
		fn(h);
		pthread_mutex_lock(&h->mu);
	}
	pthread_mutex_unlock(&h->mu);
}

/* Renewal runs on a thread of its own so that a checkpoint, a handoff or a
 * stop on the work thread never delays it (a checkpoint may take longer than
 * the lease); it may block on the volume, never under h->mu. It ends only
 * once shutdown has saved the sandboxes. */
static void *renew_main(void *arg)
{
	struct host *h = arg;
	tick_loop(h, &h->closed, renew_all);
	pthread_mutex_lock(&h->mu);
	h->renewer_done = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

static void *bg_main(void *arg)
{
	struct host *h = arg;
	tick_loop(h, &h->stopping, bg_tick);
	pthread_mutex_lock(&h->mu);
	h->bg_done = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* Which create-if-absent the volume honours decides the lock method; with
 * none, checkpointing is refused now rather than at the first sandbox. */
static int probe_locks(struct host *h)
{
	ckpt_error perr = { 0 };

	h->locks.method = locks_probe(h->locks.fd, &perr);
	if (h->locks.method != LOCKS_NONE)
		return 0;
	if (asprintf(&h->no_checkpoint_why, "no safe lock method on the checkpoint volume '%s': %s", h->mount,
		     perr.msg) < 0)
		return -ENOMEM;
	log_error("host: checkpointing refused: %s", h->no_checkpoint_why);
	return 0;
}

/* etcd's watch saw another instance start waiting for sandbox id: hand it
 * over now rather than at the next look (the work thread wakes on cond). */
static void on_waiter(void *ctx, const char *id)
{
	struct host *h = ctx;
	struct sandbox *sb;

	pthread_mutex_lock(&h->mu);
	if ((sb = sandbox_find(h, id)) && sb->token) {
		sb->waiter_seen = true;
		pthread_cond_broadcast(&h->cond);
	}
	pthread_mutex_unlock(&h->mu);
}

static int open_etcd(struct host *h, const struct config *cfg, const char *bucket, ckpt_error *err)
{
	_cleanup_free_ char *prefix = NULL;

	if (asprintf(&prefix, "/ckptd/%s/", bucket) < 0)
		return -ENOMEM;
	struct etcd_http_conf conf = {
		.endpoints = cfg->etcd_endpoints,
		.n = cfg->n_etcd_endpoints,
		.ca_file = cfg->etcd_ca_file,
		.cert_file = cfg->etcd_cert_file,
		.key_file = cfg->etcd_key_file,
		.user = cfg->etcd_user,
		.password = cfg->etcd_password,
	};
	return locks_etcd_open(&h->locks, &conf, prefix, on_waiter, h, err);
}

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void unescape_mountinfo(char *s)
{
	char *o = s;
	for (; *s; s++, o++) {
		unsigned v;
		if (s[0] == '\\' && sscanf(s + 1, "%3o", &v) == 1 && strlen(s) >= 4)
			*o = (char)v, s += 3;
		else
			*o = *s;
	}
	*o = '\0';
}

/* The FUSE mount holding path lacks allow_other: runsc's sandbox, which reads
 * a checkpoint image back as another user, could not restore from it. Looked
 * up in /proc/self/mountinfo (the longest mount point above path). */
static bool fuse_without_allow_other(const char *path)
{
	_cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
	char real[PATH_MAX], line[4096], best_opts[1040] = "", best_type[64] = "";
	size_t best = 0;

	if (!f || !realpath(path, real))
		return false;
	while (fgets(line, sizeof(line), f)) {
		char mnt[PATH_MAX], type[64], opts[1024];
		const char *dash = strstr(line, " - ");
		if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 ||
		    sscanf(dash + 3, "%63s %*s %1023s", type, opts) != 2)
			continue;
		unescape_mountinfo(mnt);
		size_t n = strlen(mnt);
		bool above = !strcmp(mnt, "/") || (!strncmp(real, mnt, n) && (real[n] == '/' || real[n] == '\0'));
		if (above && n >= best) {
			best = n;
			snprintf(best_type, sizeof(best_type), "%s", type);
			snprintf(best_opts, sizeof(best_opts), ",%s,", opts);
		}
	}
	return !strncmp(best_type, "fuse", 4) && !strstr(best_opts, ",allow_other,");
}

static int check_volume_access(struct host *h)
{
	if (!fuse_without_allow_other(h->mount))
		return 0;
	if (asprintf(&h->volume_problem,
		     "the FUSE volume '%s' is mounted without allow_other: checkpoints would be written but every "
		     "restore would fail (runsc reads the image back as another user); remount it with -o allow_other",
		     h->mount) < 0)
		return -ENOMEM;
	log_error("host: %s", h->volume_problem);
	return 0;
}

static int open_checkpoint_volume(struct host *h, const struct config *cfg, ckpt_error *err)
{
	const char *bucket = cfg->checkpoint_bucket;
	const char *mount = cfg->checkpoint_mount;
	_cleanup_free_ char *locks = NULL;

	if (!bucket || !*bucket || !mount || !*mount)
		return 0; /* checkpointing off: create with enable_checkpoint fails */
	if (mount[0] != '/')
		return err_set(err, EINVAL, NULL, "SANDBOX_CHECKPOINT_MOUNT_PATH must be absolute");
	if (!(h->mount = strdup(mount)) || !(locks = path_join(mount, "locks")))
		return -ENOMEM;
	if (mkdir_p(locks, 0755) < 0 || (h->locks.fd = open(locks, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return err_set(err, errno, NULL, "checkpoint volume '%s': %s", locks, strerror(errno));
	if (check_volume_access(h) < 0)
		return -ENOMEM;
	/* with etcd, the volume holds only images and metadata */
	return cfg->lock_etcd ? open_etcd(h, cfg, bucket, err) : probe_locks(h);
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
	h->lock_margin = cfg->lock_margin_secs;
	h->default_idle = cfg->default_idle_timeout_secs;
	if ((r = runsc_version(h->runsc.path, h->runsc_version, sizeof(h->runsc_version), err)) < 0)
		return r;
	if ((r = runsc_cpu_features(&h->cpu_features, &h->n_cpu_features)) < 0)
		return err_set(err, -r, NULL, "/proc/cpuinfo: %s", strerror(-r));
	if ((r = instance_dirs(h, cfg, err)) < 0 || (r = open_checkpoint_volume(h, cfg, err)) < 0)
		return r;
	/* twice the time after which any lock is stale: no live owner's */
	(void)locks_sweep_aside(&h->locks, 2 * (h->lock_ttl + h->lock_margin), (int64_t)time(NULL));
	/* beside the runsc root, not in it: runsc owns what its root holds */
	_cleanup_free_ char *lock = path_join(h->runsc_root, "../reaper.lock");
	if (!lock)
		return -ENOMEM;
	if ((r = reaper_start(&h->runsc, lock, &h->reaper_fd)) < 0)
		return err_set(err, -r, NULL, "reaper of '%s': %s", lock, strerror(-r));
	return 0;
}

int host_open(const struct config *cfg, struct host **ret, ckpt_error *err)
{
	struct host *h = calloc(1, sizeof(*h));
	int r;

	if (!h)
		return err_set(err, ENOMEM, NULL, "out of memory");
	h->reaper_fd = -1;
	h->locks.fd = -1;
	h->locks.ops = &locks_volume_ops;
	pthread_mutex_init(&h->mu, NULL);
	pthread_mutex_init(&h->lock_io, NULL);
	pthread_cond_init(&h->cond, NULL);
	if ((r = host_setup(h, cfg, err)) < 0 || (r = -pthread_create(&h->bg, NULL, bg_main, h)) < 0 ||
	    !(h->bg_started = true) || (r = -pthread_create(&h->watchdog, NULL, watchdog_main, h)) < 0 ||
	    !(h->watchdog_started = true) || (r = -pthread_create(&h->renewer, NULL, renew_main, h)) < 0) {
		if (r == -ENOMEM && !err->msg[0])
			err_set(err, ENOMEM, NULL, "out of memory");
		host_close(h);
		return r;
	}
	h->renewer_started = true;
	log_info("host: instance '%s', runsc %s, checkpoints %s%s, locks by %s (ttl %llds + margin %llds)",
		 h->instance_id, h->runsc_version, h->mount ? "in " : "off", h->mount ? h->mount : "",
		 h->locks.etcd ? "etcd" : locks_method_name(h->locks.method), (long long)h->lock_ttl,
		 (long long)h->lock_margin);
	*ret = h;
	return 0;
}

bool host_checkpointing(const struct host *h)
{
	return h->mount && (h->locks.etcd || h->locks.method != LOCKS_NONE);
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
	return json_pack("{s:s, s:s, s:b, s:s?, s:s?, s:s?, s:s, s:s?, s:I, s:I, s:I}", "instance_id", h->instance_id,
			 "runsc_version", h->runsc_version, "checkpointing", host_checkpointing(h), "checkpoint_mount",
			 h->mount, "checkpointing_refused", h->no_checkpoint_why, "checkpoint_volume_problem",
			 h->volume_problem, "lock_backend", h->locks.ops->name, "lock_method",
			 h->locks.etcd ? NULL : locks_method_name(h->locks.method), "sandboxes", (json_int_t)n,
			 "lock_ttl_secs", (json_int_t)h->lock_ttl, "lock_margin_secs", (json_int_t)h->lock_margin);
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

/* Shutdown saves the sandboxes on a thread of its own: a frozen volume must
 * not hang SIGTERM. */
static void *shutdown_main(void *arg)
{
	struct host *h = arg;
	host_shutdown_sandboxes(h);
	pthread_mutex_lock(&h->mu);
	h->saved = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* Wait (under h->mu) until *flag, or until the registry has not shrunk for
 * SHUTDOWN_STALL_MS plus the lease: true when *flag turned true. */
static bool wait_progress(struct host *h, const bool *flag)
{
	int64_t stall_ms = SHUTDOWN_STALL_MS + (h->lock_ttl + h->lock_margin) * 1000, last = mono_ms();
	size_t left = SIZE_MAX;

	while (!*flag && mono_ms() - last < stall_ms) {
		size_t n = 0;
		for (struct sandbox *sb = h->sandboxes; sb; sb = sb->next)
			n++;
		if (n < left)
			left = n, last = mono_ms();
		wait_ms(h, 100);
	}
	return *flag;
}

static void log_abandoned(struct host *h)
{
	for (struct sandbox *sb = h->sandboxes; sb; sb = sb->next)
		log_warn("host: shutdown: sandbox '%s' abandoned (its volume or lock backend does not answer); "
			 "the reaper removes container '%s', its lock runs out after %llds",
			 sb->id, sb->cid, (long long)(h->lock_ttl + h->lock_margin));
}

void host_close(struct host *h)
{
	bool abandoned = false;
	pthread_t t;

	if (!h)
		return;
	if (h->bg_started) {
		pthread_mutex_lock(&h->mu);
		h->stopping = true;
		pthread_cond_broadcast(&h->cond);
		pthread_mutex_unlock(&h->mu);
		pthread_mutex_lock(&h->mu);
		abandoned = !wait_progress(h, &h->bg_done); /* a handoff may be stuck on the volume */
		if (abandoned)
			log_abandoned(h);
		pthread_mutex_unlock(&h->mu);
		if (abandoned)
			pthread_detach(h->bg);
		else
			pthread_join(h->bg, NULL);
		if (abandoned) {
			/* nothing more is saved: the busy sandbox is the stuck thread's */
		} else if (pthread_create(&t, NULL, shutdown_main, h) == 0) {
			pthread_mutex_lock(&h->mu);
			abandoned = !wait_progress(h, &h->saved); /* leases still renewed and watched */
			if (abandoned)
				log_abandoned(h);
			pthread_mutex_unlock(&h->mu);
			if (abandoned)
				pthread_detach(t);
			else
				pthread_join(t, NULL);
		} else {
			host_shutdown_sandboxes(h);
		}
	}
	pthread_mutex_lock(&h->mu);
	h->closed = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->mu);
	if (h->watchdog_started)
		pthread_join(h->watchdog, NULL);
	if (h->renewer_started) {
		pthread_mutex_lock(&h->mu);
		bool renewer_done = wait_progress(h, &h->renewer_done);
		pthread_mutex_unlock(&h->mu);
		if (renewer_done)
			pthread_join(h->renewer, NULL);
		else
			abandoned = true, pthread_detach(h->renewer),
			log_warn("host: shutdown: a lock renewal is stuck");
	}
	/* Sessions may still hold h: it stays allocated until exit; the reaper
	 * removes whatever is left when its pipe closes. */
	if (h->reaper_fd >= 0)
		close(TAKE_FD(h->reaper_fd));
	if (abandoned)
		return; /* threads stuck on the volume may still use the locks */
	if (h->locks.fd >= 0)
		close(TAKE_FD(h->locks.fd));
	locks_etcd_close(&h->locks);
}
