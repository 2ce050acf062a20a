/* sandbox.c: the registry of sandboxes on this instance and their lifecycle:
 * start, checkpoint to the shared volume, restore from it, stop. Paths on the
 * volume: {mount}/{id}/checkpoints/checkpoint_{ms}.img (runsc's image dir),
 * {mount}/{id}/checkpoints/latest, {mount}/{id}/metadata.json. */
#include "host/sandbox.h"
#include "host/locks.h"
#include "host/reaper.h"
#include "lib/failpoint.h"
#include "lib/walk.h"

#include <sys/stat.h>
#include <sys/vfs.h>

#define FUSE_SUPER_MAGIC 0x65735546

/* The sandbox's init: a Python REPL server on a unix socket inside the
 * sandbox. Globals live in this process, so they are part of the checkpointed
 * memory and survive a restore. Frames: 'O'|'E' + u32 length + bytes of
 * output, 'X' + u32 exit status at the end. */
static const char repl_server[] =
	"import os, socket, struct, sys, threading, traceback\n"
	"P = '/tmp/.ckptd-repl.sock'\n"
	"G = {'__name__': '__main__', '__builtins__': __builtins__}\n"
	"L = threading.Lock()\n"
	"def send(c, t, b):\n"
	"    with L: c.sendall(t + struct.pack('>I', len(b)) + b)\n"
	"class W:\n"
	"    def __init__(s, c, t): s.c, s.t = c, t\n"
	"    def write(s, d):\n"
	"        if d: send(s.c, s.t, d.encode('utf-8', 'replace'))\n"
	"        return len(d)\n"
	"    def flush(s): pass\n"
	"    def isatty(s): return False\n"
	"def relay(c, fd, t):\n"
	"    while True:\n"
	"        b = os.read(fd, 65536)\n"
	"        if not b: break\n"
	"        send(c, t, b)\n"
	"    os.close(fd)\n"
	"def run(c, code):\n"
	"    rc = 0\n"
	"    try: exec(compile(code, '<sandbox>', 'exec'), G)\n"
	"    except SystemExit as x: rc = x.code if isinstance(x.code, int) else (0 if x.code is None else 1)\n"
	"    except BaseException: traceback.print_exc(); rc = 1\n"
	"    return rc\n"
	"def serve(c):\n"
	"    f = c.makefile('rb')\n"
	"    code = f.read(struct.unpack('>I', f.read(4))[0]).decode('utf-8', 'replace')\n"
	"    saved, ts = [os.dup(1), os.dup(2)], []\n"
	"    for fd, t in ((1, b'O'), (2, b'E')):\n"
	"        r, w = os.pipe(); os.dup2(w, fd); os.close(w)\n"
	"        ts.append(threading.Thread(target=relay, args=(c, r, t))); ts[-1].start()\n"
	"    o, e = sys.stdout, sys.stderr\n"
	"    sys.stdout, sys.stderr = W(c, b'O'), W(c, b'E')\n"
	"    try: rc = run(c, code)\n"
	"    finally:\n"
	"        sys.stdout, sys.stderr = o, e\n"
	"        os.dup2(saved[0], 1); os.dup2(saved[1], 2); os.close(saved[0]); os.close(saved[1])\n"
	"    for t in ts: t.join()\n"
	"    send(c, b'X', struct.pack('>I', rc & 255))\n"
	"    c.close()\n"
	"try: os.unlink(P)\n"
	"except OSError: pass\n"
	"s = socket.socket(socket.AF_UNIX)\n"
	"s.bind(P); s.listen(4)\n"
	"while True:\n"
	"    c, _ = s.accept()\n"
	"    try: serve(c)\n"
	"    except Exception: traceback.print_exc()\n";

bool sandbox_id_valid(const char *id)
{
	size_t n = strlen(id);
	if (n == 0 || n > SANDBOX_ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || (c != '-' && c != '_')))
			return false;
	}
	return true;
}

struct sandbox *sandbox_find(struct host *h, const char *id)
{
	for (struct sandbox *sb = h->sandboxes; sb; sb = sb->next)
		if (!strcmp(sb->id, id))
			return sb;
	return NULL;
}

struct sandbox *sandbox_add(struct host *h, const char *id)
{
	struct sandbox *sb = calloc(1, sizeof(*sb));
	if (!sb)
		return NULL;
	snprintf(sb->id, sizeof(sb->id), "%s", id);
	snprintf(sb->cid, sizeof(sb->cid), "%s.%s", id, h->cid_tag);
	sb->pidfd = -1;
	sb->state = SB_STARTING;
	sb->idle_timeout_s = h->default_idle;
	sb->created_at_ms = now_ms();
	sb->detached_mono_ms = mono_ms();
	sb->next = h->sandboxes;
	h->sandboxes = sb;
	return sb;
}

void sandbox_remove(struct host *h, struct sandbox *sb)
{
	for (struct sandbox **p = &h->sandboxes; *p; p = &(*p)->next)
		if (*p == sb) {
			*p = sb->next;
			if (sb->client)
				sb->client->sb = NULL;
			if (sb->pidfd >= 0)
				close(sb->pidfd);
			free(sb);
			return;
		}
}

static char *sandbox_path(const char *dir, const char *id, const char *suffix)
{
	char *p = NULL;
	return asprintf(&p, "%s/%s%s", dir, id, suffix) < 0 ? NULL : p;
}

static int prepare_bundle(struct host *h, const char *id, char **ret_bundle, char **ret_log, ckpt_error *err)
{
	const char *argv[] = { "/usr/bin/python3", "-u", "-c", repl_server, NULL };
	_cleanup_free_ char *bundle = sandbox_path(h->bundles_dir, id, "");
	_cleanup_free_ char *log = sandbox_path(h->logs_dir, id, ".log");
	int r;

	if (!bundle || !log)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if ((r = runsc_write_bundle(bundle, h->rootfs, argv, err)) < 0)
		return r;
	*ret_bundle = TAKE_PTR(bundle);
	*ret_log = TAKE_PTR(log);
	return 0;
}

/* Keep a handle on the sandbox process for the watchdog's instant kill. */
static void note_pidfd(struct host *h, struct sandbox *sb)
{
	int fd = runsc_sandbox_pidfd(&h->runsc, sb->cid);

	pthread_mutex_lock(&h->mu);
	if (sb->pidfd >= 0)
		close(sb->pidfd);
	sb->pidfd = fd < 0 ? -1 : fd;
	pthread_mutex_unlock(&h->mu);
}

int sandbox_start(struct host *h, struct sandbox *sb, ckpt_error *err)
{
	_cleanup_free_ char *bundle = NULL, *log = NULL;
	int r;

	if ((r = prepare_bundle(h, sb->id, &bundle, &log, err)) < 0)
		return r;
	reaper_note(h->reaper_fd, '+', sb->cid);
	r = runsc_run(&h->runsc, bundle, sb->cid, log, err);
	if (r == 0)
		note_pidfd(h, sb);
	if (r < 0) {
		runsc_delete(&h->runsc, sb->cid);
		reaper_note(h->reaper_fd, '-', sb->cid);
	}
	return r;
}

void sandbox_stop(struct host *h, struct sandbox *sb)
{
	_cleanup_free_ char *bundle = sandbox_path(h->bundles_dir, sb->id, "");
	runsc_delete(&h->runsc, sb->cid);
	reaper_note(h->reaper_fd, '-', sb->cid);
	if (bundle) {
		_cleanup_free_ char *cfg = path_join(bundle, "config.json");
		if (cfg)
			unlink(cfg);
		rmdir(bundle);
	}
	sandbox_unlock(h, sb);
}

int sandbox_lock(struct host *h, struct sandbox *sb, struct lock_info *cur)
{
	int64_t t0 = mono_ms(), now_s = now_ms() / 1000;
	uint64_t token = 0;
	int r = locks_acquire(&h->locks, sb->id, h->instance_id, h->lock_ttl + h->lock_margin, now_s, cur, &token);

	if (r < 0)
		return r;
	pthread_mutex_lock(&h->mu);
	sb->token = token;
	sb->lease_until = t0 + h->lock_ttl * 1000;
	sb->renewed_at = now_s;
	sb->fenced = false;
	pthread_mutex_unlock(&h->mu);
	return 0;
}

void sandbox_unlock(struct host *h, struct sandbox *sb)
{
	uint64_t token;

	pthread_mutex_lock(&h->lock_io); /* a renewal in flight must not recreate it */
	pthread_mutex_lock(&h->mu);
	token = sb->token;
	sb->token = 0;
	pthread_mutex_unlock(&h->mu);
	if (token)
		locks_release(&h->locks, sb->id, h->instance_id, token);
	pthread_mutex_unlock(&h->lock_io);
}

int sandbox_fence(struct host *h, struct sandbox *sb, ckpt_error *err)
{
	uint64_t token;
	bool alive;
	int r;

	pthread_mutex_lock(&h->mu);
	token = sb->token;
	alive = token && !sb->fenced && mono_ms() < sb->lease_until;
	pthread_mutex_unlock(&h->mu);
	if (!alive)
		return err_set(err, ESTALE, NULL, "lost ownership: the lease of sandbox '%s' ran out", sb->id);
	if ((r = locks_check(&h->locks, sb->id, h->instance_id, token)) < 0)
		return err_set(err, ESTALE, NULL, "lost ownership: the lock of sandbox '%s' %s", sb->id,
			       r == -ESTALE ? "was taken over" : "cannot be read");
	return 0;
}

/* Write name in dfd only while the fence holds; a stale token writes nothing. */
static int write_fenced(struct host *h, struct sandbox *sb, int dfd, const char *name, const char *text,
			ckpt_error *err)
{
	int r;

	if ((r = sandbox_fence(h, sb, err)) < 0)
		return r;
	r = locks_write_fenced(&h->locks, sb->id, h->instance_id, sb->token, dfd, name, text, strlen(text));
	if (r == -ESTALE)
		return err_set(err, ESTALE, NULL, "lost ownership: the lock of sandbox '%s' was taken over", sb->id);
	return r < 0 ? err_set(err, -r, NULL, "%s: %s", name, strerror(-r)) : 0;
}

static int open_sandbox_dir(struct host *h, const char *id, const char *sub, bool create)
{
	_cleanup_free_ char *p = NULL;
	if (asprintf(&p, "%s/%s%s%s", h->mount, id, sub ? "/" : "", sub ? sub : "") < 0)
		return -ENOMEM;
	if (create && mkdir_p(p, 0755) < 0)
		return -errno;
	int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static json_t *strv_json(char **v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_string(v[i]));
	return a;
}

int sandbox_write_metadata(struct host *h, struct sandbox *sb, const char *latest, ckpt_error *err)
{
	char created[40], now[40];
	_cleanup_close_ int dfd = open_sandbox_dir(h, sb->id, NULL, true);
	json_auto_t *m = NULL;
	_cleanup_free_ char *text = NULL;

	if (dfd < 0)
		return err_set(err, -dfd, NULL, "sandbox dir on the volume: %s", strerror(-dfd));
	write_file_atomic_sweep(dfd); /* a killed owner's; we hold the sandbox's lock */
	m = json_pack("{s:s, s:I, s:b, s:s, s:o, s:s, s:s, s:s, s:s}", "sandbox_id", sb->id, "idle_timeout",
		      (json_int_t)sb->idle_timeout_s, "enable_checkpoint", 1, "runsc_version", h->runsc_version,
		      "cpu_features", strv_json(h->cpu_features, h->n_cpu_features), "created_at",
		      fmt_rfc3339_ms(sb->created_at_ms, created, sizeof(created)), "updated_at",
		      fmt_rfc3339_ms(now_ms(), now, sizeof(now)), "instance_id", h->instance_id, "latest", latest);
	if (m)
		json_object_set_new(m, "token", json_integer((json_int_t)sb->token));
	text = m ? json_dumps(m, JSON_INDENT(2)) : NULL;
	if (!text)
		return err_set(err, ENOMEM, NULL, "metadata: out of memory");
	return FAILPOINT_AROUND("host.metadata.write", write_fenced(h, sb, dfd, "metadata.json", text, err));
}

/* fsync what runsc wrote before `latest` points at it. */
static void sync_image(const char *image_dir)
{
	_cleanup_free_ char *img = path_join(image_dir, "checkpoint.img");
	if (img)
		fsync_path(img);
	fsync_path(image_dir);
}

static long long image_ms(const char *name)
{
	unsigned long long ms;
	char tail;
	if (sscanf(name, "checkpoint_%llu.im%c", &ms, &tail) != 2 || tail != 'g' || strchr(name, '/'))
		return -1;
	return (long long)ms;
}

/* Keep the newest image and the one before it; older ones only use space. */
static void prune_images(int cfd, long long newest)
{
	_cleanup_closedir_ DIR *d = NULL;
	long long second = -1;
	struct dirent *de;

	if (walk_open(cfd, NULL, &d) < 0)
		return;
	while ((de = walk_next(d)))
		if (image_ms(de->d_name) < newest && image_ms(de->d_name) > second)
			second = image_ms(de->d_name);
	rewinddir(d);
	while ((de = walk_next(d))) {
		long long ms = image_ms(de->d_name);
		if (ms >= 0 && ms < second)
			(void)FAILPOINT_AROUND("host.image.prune", rm_rf_at(cfd, de->d_name));
	}
}

/* `latest.{token}`: each lock generation publishes under its own token, and
 * readers take the highest. A write of an owner that lost its lock, still
 * blocked on the volume when the next owner took over, lands under the old
 * token and never becomes the latest. */
static int latest_write(struct host *h, struct sandbox *sb, int cfd, const char *image, ckpt_error *err)
{
	char name[48];
	snprintf(name, sizeof(name), "latest.%llu", (unsigned long long)sb->token);
	return FAILPOINT_AROUND("host.latest.token.write", write_fenced(h, sb, cfd, name, image, err));
}

/* The plain `latest` of the volume's layout, for readers that know no
 * tokens. Only a hint: ckptd itself reads the highest latest.{token}, so a
 * late write here of an owner that lost its lock misleads no restore. */
static int latest_hint_write(struct host *h, struct sandbox *sb, int cfd, const char *image, ckpt_error *err)
{
	return FAILPOINT_AROUND("host.latest.write", write_fenced(h, sb, cfd, "latest", image, err));
}

/* The highest token with a latest.{token} file (0: only a plain `latest`
 * from before tokens, or nothing); the two highest are kept. */
static uint64_t latest_token(int cfd, bool prune)
{
	_cleanup_closedir_ DIR *d = NULL;
	unsigned long long v, top = 0, second = 0;
	struct dirent *de;
	char tail;

	if (walk_open(cfd, NULL, &d) < 0)
		return 0;
	while ((de = walk_next(d)))
		if (sscanf(de->d_name, "latest.%llu%c", &v, &tail) == 1 && v > second)
			second = v > top ? top : v, top = v > top ? v : top;
	rewinddir(d);
	while (prune && (de = walk_next(d)))
		if (sscanf(de->d_name, "latest.%llu%c", &v, &tail) == 1 && v < second)
			(void)FAILPOINT_AROUND("host.latest.prune", unlinkat(cfd, de->d_name, 0));
	return top;
}

int sandbox_checkpoint(struct host *h, struct sandbox *sb, ckpt_error *err)
{
	char name[64];
	long long ms = (long long)now_ms();
	_cleanup_free_ char *image = NULL, *log = sandbox_path(h->logs_dir, sb->id, ".log");
	_cleanup_close_ int cfd = open_sandbox_dir(h, sb->id, "checkpoints", true);
	int r;

	if (cfd < 0)
		return err_set(err, -cfd, NULL, "checkpoint dir on the volume: %s", strerror(-cfd));
	write_file_atomic_sweep(cfd); /* a killed owner's; we hold the sandbox's lock */
	snprintf(name, sizeof(name), "checkpoint_%lld.img", ms);
	if (!log || asprintf(&image, "%s/%s/checkpoints/%s", h->mount, sb->id, name) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if ((r = runsc_checkpoint(&h->runsc, sb->cid, image, log, err)) < 0)
		return sandbox_fence(h, sb, err) < 0 ? -ESTALE : r; /* killed by the watchdog: say why */
	FAILPOINT("host.image.sync.before");
	sync_image(image);
	FAILPOINT("host.image.sync.after");
	if ((r = latest_write(h, sb, cfd, name, err)) < 0 || (r = sandbox_write_metadata(h, sb, name, err)) < 0 ||
	    (r = latest_hint_write(h, sb, cfd, name, err)) < 0)
		return r;
	/* acknowledge only what was published under a lease we still hold */
	if ((r = sandbox_fence(h, sb, err)) < 0)
		return r;
	/* hand over first: runsc checkpoint has stopped the sandbox already, and
	 * `runsc delete` takes a second or two the next owner need not wait */
	sandbox_unlock(h, sb);
	sandbox_stop(h, sb);
	latest_token(cfd, true);
	prune_images(cfd, ms);
	return 0;
}

/* The image dir named by the newest `latest`; -ENOENT when there is none.
 * ret_name, if not NULL, gets the image's name. */
static int latest_image(struct host *h, const char *id, char **ret, char **ret_name)
{
	_cleanup_close_ int cfd = open_sandbox_dir(h, id, "checkpoints", false);
	_cleanup_free_ char *name = NULL;
	struct stat st;
	int r;

	if (cfd < 0)
		return cfd == -ENOTDIR ? -ENOENT : cfd;
	char lname[48] = "latest";
	uint64_t top = latest_token(cfd, false);
	if (top)
		snprintf(lname, sizeof(lname), "latest.%llu", (unsigned long long)top);
	if ((r = read_file_at(cfd, lname, 256, &name, NULL)) < 0)
		return r;
	name[strcspn(name, "\n")] = '\0';
	if (image_ms(name) < 0)
		return -EBADMSG;
	if (fstatat(cfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (asprintf(ret, "%s/%s/checkpoints/%s", h->mount, id, name) < 0)
		return -ENOMEM;
	if (ret_name)
		*ret_name = TAKE_PTR(name);
	return 0;
}

bool sandbox_has_checkpoint(struct host *h, const char *id)
{
	_cleanup_free_ char *image = NULL;
	return h->mount && latest_image(h, id, &image, NULL) == 0;
}

static bool has_feature(struct host *h, const char *f)
{
	for (size_t i = 0; i < h->n_cpu_features; i++)
		if (!strcmp(h->cpu_features[i], f))
			return true;
	return false;
}

/* The checks runsc would fail late or obscurely: same runsc version, and every
 * CPU feature the checkpointing host had. */
static int check_compat(struct host *h, json_t *meta, ckpt_error *err)
{
	const char *ver = json_string_value(json_object_get(meta, "runsc_version"));
	json_t *feats = json_object_get(meta, "cpu_features"), *f;
	char missing[400] = "";
	size_t i, n = 0, used = 0;

	if (!ver || strcmp(ver, h->runsc_version))
		return err_set(err, EPROTO, NULL, "checkpoint was made with runsc %s but this host has runsc %s",
			       ver ? ver : "(unknown)", h->runsc_version);
	json_array_foreach (feats, i, f) {
		const char *s = json_string_value(f);
		if (!s || has_feature(h, s))
			continue;
		if (used < sizeof(missing))
			used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%s", n ? ", " : "", s);
		n++;
	}
	if (n)
		return err_set(err, EPROTO, NULL,
			       "incompatible CPU: %zu feature(s) of the checkpointing host missing here: %s", n,
			       missing);
	return 0;
}

static int read_metadata(struct host *h, const char *id, json_t **ret, ckpt_error *err)
{
	_cleanup_close_ int dfd = open_sandbox_dir(h, id, NULL, false);
	_cleanup_free_ char *text = NULL;
	int r;

	if (dfd < 0 || (r = read_file_at(dfd, "metadata.json", 1 << 20, &text, NULL)) < 0)
		return err_set(err, EBADMSG, NULL, "metadata.json of sandbox '%s' is missing", id);
	if (!(*ret = json_loads(text, 0, NULL)) || !json_is_object(*ret))
		return err_set(err, EBADMSG, NULL, "metadata.json of sandbox '%s' does not parse", id);
	return 0;
}

/* runsc's sandbox reads the image as another user: a FUSE volume mounted
 * without allow_other lets checkpoints (written by runsc itself) succeed and
 * makes every restore fail with "permission denied". Say so. */
static void hint_volume_access(struct host *h, ckpt_error *err)
{
	struct statfs fs;

	if (!err || !strcasestr(err->msg, "permission denied") || statfs(h->mount, &fs) < 0 ||
	    fs.f_type != FUSE_SUPER_MAGIC)
		return;
	err_prefix(err,
		   "runsc cannot read the checkpoint on the FUSE volume '%s'; it is likely mounted without "
		   "allow_other (mount it with -o allow_other)",
		   h->mount);
}

int sandbox_restore(struct host *h, struct sandbox *sb, ckpt_error *err)
{
	_cleanup_free_ char *image = NULL, *name = NULL, *bundle = NULL, *log = NULL;
	_cleanup_close_ int cfd = -1;
	json_auto_t *meta = NULL;
	int r = latest_image(h, sb->id, &image, &name);

	if (r == -ENOENT)
		return err_set(err, ENOENT, NULL, "no checkpoint of sandbox '%s'", sb->id);
	if (r < 0)
		return err_set(err, -r, NULL, "latest checkpoint of '%s': %s", sb->id, strerror(-r));
	if ((r = read_metadata(h, sb->id, &meta, err)) < 0 || (r = check_compat(h, meta, err)) < 0)
		return r;
	if (json_is_integer(json_object_get(meta, "idle_timeout")))
		sb->idle_timeout_s = json_integer_value(json_object_get(meta, "idle_timeout"));
	if ((r = prepare_bundle(h, sb->id, &bundle, &log, err)) < 0)
		return r;
	/* adopt the image under our token first: a late write of the previous
	 * owner lands under its older token and stays behind this one */
	if ((cfd = open_sandbox_dir(h, sb->id, "checkpoints", false)) < 0)
		return err_set(err, -cfd, NULL, "checkpoint dir on the volume: %s", strerror(-cfd));
	if ((r = FAILPOINT_AROUND("host.restore.latest.write", latest_write(h, sb, cfd, name, err))) < 0)
		return r;
	runsc_delete(&h->runsc, sb->cid); /* a leftover of ours would block the id */
	reaper_note(h->reaper_fd, '+', sb->cid);
	if ((r = runsc_restore(&h->runsc, bundle, image, sb->cid, log, err)) < 0) {
		hint_volume_access(h, err);
		runsc_delete(&h->runsc, sb->cid);
		reaper_note(h->reaper_fd, '-', sb->cid);
	}
	if (r == 0)
		note_pidfd(h, sb);
	return r;
}
