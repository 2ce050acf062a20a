/* runsc.c: run, exec, checkpoint, restore and delete gVisor containers by
 * spawning runsc with an argv (never a shell). */
#include "host/runsc.h"

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

extern char **environ;

#define MAX_ARGV 24

/* Top-level flags shared by every call; run and restore must match. */
static size_t base_argv(const struct runsc *r, const char **argv)
{
	size_t n = 0;
	argv[n++] = r->path;
	argv[n++] = "--root";
	argv[n++] = r->root;
	argv[n++] = "--overlay";
	argv[n++] = "--network=none";
	return n;
}

static int spawn(const char *const *argv, int in_fd, int out_fd, int err_fd, pid_t *ret)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, def;
	int r;

	/* ckptd blocks SIGTERM/SIGINT and ignores SIGPIPE; runsc gets defaults */
	sigemptyset(&none);
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	posix_spawnattr_init(&at);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &def);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
	posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
	posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
	r = posix_spawnp(ret, argv[0], &fa, &at, (char *const *)argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	return -r;
}

int runsc_wait(pid_t pid, int timeout_ms)
{
	int st, pfd = (int)syscall(SYS_pidfd_open, pid, 0);

	if (pfd >= 0) {
		struct pollfd p = { .fd = pfd, .events = POLLIN };
		int k;
		while ((k = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
			;
		close(pfd);
		if (k == 0) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -ETIMEDOUT;
		}
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The last non-empty line of a log, for error messages. */
static void log_tail(const char *log_path, char *buf, size_t len)
{
	_cleanup_free_ char *text = NULL;
	size_t n = 0;
	char *end, *start;

	buf[0] = '\0';
	if (read_file_at(AT_FDCWD, log_path, 1 << 20, &text, &n) < 0 || n == 0)
		return;
	end = text + n;
	while (end > text && (end[-1] == '\n' || end[-1] == ' '))
		*--end = '\0';
	start = memrchr(text, '\n', (size_t)(end - text));
	snprintf(buf, len, "%s", start ? start + 1 : text);
}

/* Run argv to completion with stdout/stderr appended to log_path. */
static int run_logged(const char *const *argv, const char *log_path, const char *what, ckpt_error *err)
{
	_cleanup_close_ int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
	_cleanup_close_ int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	char tail[240]; /* a short reason for the client; the whole story is in the log */
	pid_t pid;
	int r;

	if (in < 0 || log < 0)
		return err_set(err, errno, NULL, "%s: open '%s': %s", what, log_path, strerror(errno));
	if ((r = spawn(argv, in, log, log, &pid)) < 0)
		return err_set(err, -r, NULL, "%s: cannot start '%s': %s", what, argv[0], strerror(-r));
	r = runsc_wait(pid, RUNSC_TIMEOUT_MS);
	if (r == 0)
		return 0;
	if (r < 0)
		return err_set(err, -r, NULL, "%s: %s", what, strerror(-r));
	log_tail(log_path, tail, sizeof(tail));
	return err_set(err, EIO, NULL, "%s failed (exit %d): %s", what, r, tail[0] ? tail : "no output");
}

int runsc_version(const char *path, char *buf, size_t len, ckpt_error *err)
{
	char log[] = "/tmp/ckptd-runsc-version.XXXXXX";
	const char *argv[] = { path, "--version", NULL };
	_cleanup_free_ char *text = NULL;
	int fd = mkostemp(log, O_CLOEXEC), r;

	if (fd < 0)
		return err_set(err, errno, NULL, "runsc --version: %s", strerror(errno));
	close(fd);
	r = run_logged(argv, log, "runsc --version", err);
	if (r == 0)
		r = read_file_at(AT_FDCWD, log, 4096, &text, NULL);
	unlink(log);
	if (r < 0)
		return r;
	if (sscanf(text, "runsc version %127s", buf) != 1 || strlen(buf) >= len)
		return err_set(err, EINVAL, NULL, "runsc --version: unexpected output '%.80s'", text);
	return 0;
}

static json_t *bundle_mount(const char *dst, const char *type)
{
	return json_pack("{s:s, s:s, s:s}", "destination", dst, "type", type, "source", type);
}

static json_t *bundle_json(const char *rootfs, const char *const *init_argv)
{
	json_t *args = json_array(), *ns = json_array();
	for (size_t i = 0; init_argv[i]; i++)
		json_array_append_new(args, json_string(init_argv[i]));
	for (const char *const *t = (const char *const[]){ "pid", "network", "ipc", "uts", "mount", NULL }; *t; t++)
		json_array_append_new(ns, json_pack("{s:s}", "type", *t));
	return json_pack("{s:s, s:{s:b, s:{s:i, s:i}, s:o, s:[s, s, s], s:s}, s:{s:s, s:b}, s:s,"
			 " s:[o, o], s:{s:o}}",
			 "ociVersion", "1.0.2", "process", "terminal", 0, "user", "uid", 0, "gid", 0, "args", args,
			 "env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
			 "PYTHONUNBUFFERED=1", "cwd", "/", "root", "path", rootfs, "readonly", 0, "hostname", "sandbox",
			 "mounts", bundle_mount("/proc", "proc"), bundle_mount("/tmp", "tmpfs"), "linux", "namespaces",
			 ns);
}

int runsc_write_bundle(const char *bundle_dir, const char *rootfs, const char *const *init_argv, ckpt_error *err)
{
	json_auto_t *cfg = bundle_json(rootfs, init_argv);
	_cleanup_free_ char *text = cfg ? json_dumps(cfg, JSON_INDENT(1)) : NULL;
	_cleanup_close_ int dfd = -1;
	int r;

	if (!text)
		return err_set(err, ENOMEM, NULL, "bundle: out of memory");
	if ((r = mkdir_p(bundle_dir, 0700)) < 0)
		return err_set(err, -r, NULL, "bundle '%s': %s", bundle_dir, strerror(-r));
	dfd = open(bundle_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || (r = write_file_atomic(dfd, "config.json", text, strlen(text), 0600)) < 0)
		return err_set(err, dfd < 0 ? errno : -r, NULL, "bundle '%s': cannot write config.json", bundle_dir);
	return 0;
}

int runsc_run(const struct runsc *r, const char *bundle, const char *id, const char *log_path, ckpt_error *err)
{
	const char *argv[MAX_ARGV];
	size_t n = base_argv(r, argv);
	const char *tail[] = { "run", "-detach", "-bundle", bundle, id, NULL };
	memcpy(argv + n, tail, sizeof(tail));
	return run_logged(argv, log_path, "runsc run", err);
}

int runsc_checkpoint(const struct runsc *r, const char *id, const char *image_dir, const char *log_path,
		     ckpt_error *err)
{
	const char *argv[MAX_ARGV];
	_cleanup_free_ char *flag = NULL;
	size_t n = base_argv(r, argv);

	if (asprintf(&flag, "--image-path=%s", image_dir) < 0)
		return -ENOMEM;
	const char *tail[] = { "checkpoint", flag, id, NULL };
	memcpy(argv + n, tail, sizeof(tail));
	return run_logged(argv, log_path, "runsc checkpoint", err);
}

int runsc_restore(const struct runsc *r, const char *bundle, const char *image_dir, const char *id,
		  const char *log_path, ckpt_error *err)
{
	const char *argv[MAX_ARGV];
	_cleanup_free_ char *flag = NULL;
	size_t n = base_argv(r, argv);

	if (asprintf(&flag, "--image-path=%s", image_dir) < 0)
		return -ENOMEM;
	/* without -detach restore blocks until the container exits */
	const char *tail[] = { "restore", flag, "-detach", "-bundle", bundle, id, NULL };
	memcpy(argv + n, tail, sizeof(tail));
	return run_logged(argv, log_path, "runsc restore", err);
}

/* Run a query (`runsc state`, `runsc list`) and read its stdout. */
static int run_capture(const char *const *argv, char **ret_text)
{
	char out[] = "/tmp/ckptd-runsc-out.XXXXXX";
	int fd = mkostemp(out, O_CLOEXEC), rc;
	_cleanup_close_ int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	pid_t child;

	if (fd < 0)
		return -errno;
	rc = nul < 0 ? -errno : spawn(argv, nul, fd, nul, &child);
	close(fd);
	if (rc == 0)
		rc = runsc_wait(child, RUNSC_TIMEOUT_MS) == 0 ? read_file_at(AT_FDCWD, out, 1 << 20, ret_text, NULL)
							      : -EIO;
	unlink(out);
	return rc;
}

int runsc_sandbox_pidfd(const struct runsc *r, const char *id)
{
	const char *argv[MAX_ARGV];
	size_t n = base_argv(r, argv);
	const char *tail[] = { "state", id, NULL };
	_cleanup_free_ char *text = NULL;
	json_auto_t *st = NULL;
	json_int_t pid;
	int fd, rc;

	memcpy(argv + n, tail, sizeof(tail));
	if ((rc = run_capture(argv, &text)) < 0)
		return rc;
	st = json_loads(text, 0, NULL);
	pid = json_integer_value(json_object_get(st, "pid"));
	if (pid <= 0)
		return -ESRCH;
	fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
	return fd < 0 ? -errno : fd;
}

static int split_words(const char *s, char ***ret, size_t *ret_n);

int runsc_list(const struct runsc *r, char ***ret, size_t *ret_n)
{
	const char *argv[MAX_ARGV];
	size_t n = base_argv(r, argv);
	const char *tail[] = { "list", "-quiet", NULL };
	_cleanup_free_ char *text = NULL;
	int rc;

	memcpy(argv + n, tail, sizeof(tail));
	if ((rc = run_capture(argv, &text)) < 0)
		return rc;
	return split_words(text ? text : "", ret, ret_n);
}

/* Is argv (a /proc cmdline) a run or restore that we spawned under r->root,
 * for id (any id when NULL)? Our flags come first, as "--root" and the root
 * in two words; runsc's own sandbox and gofer processes use "--root=...".
 * runsc_path may be a wrapper (an interpreter runs it), so no fixed index. */
static bool creates(const struct runsc *r, const char *id, const char *const *argv, size_t argc)
{
	size_t i = 0;

	while (i + 1 < argc && (strcmp(argv[i], "--root") || strcmp(argv[i + 1], r->root)))
		i++;
	for (i += 2; i < argc; i++)
		if (!strcmp(argv[i], "run") || !strcmp(argv[i], "restore"))
			break;
	return i + 1 < argc && (!id || !strcmp(argv[argc - 1], id));
}

static bool proc_creates(const struct runsc *r, const char *id, int pid)
{
	char path[64], buf[8192];
	const char *argv[MAX_ARGV + 1];
	size_t argc = 0;
	ssize_t k;
	_cleanup_close_ int fd = -1;

	snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || (k = read(fd, buf, sizeof(buf) - 1)) <= 0)
		return false; /* gone, or a zombie: its cmdline is empty */
	buf[k] = '\0';
	for (char *p = buf; p < buf + k && argc < MAX_ARGV; p += strlen(p) + 1)
		argv[argc++] = p;
	return creates(r, id, argv, argc);
}

int runsc_creating(const struct runsc *r, const char *id, bool kill_them)
{
	_cleanup_closedir_ DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		int pid = atoi(de->d_name);
		if (pid <= 0 || pid == getpid() || !proc_creates(r, id, pid))
			continue;
		n++;
		if (kill_them)
			kill(pid, SIGKILL);
	}
	return n;
}

int runsc_delete(const struct runsc *r, const char *id)
{
	const char *argv[MAX_ARGV];
	size_t n = base_argv(r, argv);
	const char *tail[] = { "delete", "-force", id, NULL };
	_cleanup_close_ int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	pid_t pid;
	int rc;

	memcpy(argv + n, tail, sizeof(tail));
	if (nul < 0)
		return -errno;
	if ((rc = spawn(argv, nul, nul, nul, &pid)) < 0)
		return rc;
	rc = runsc_wait(pid, RUNSC_TIMEOUT_MS);
	return rc < 0 ? rc : rc == 0 ? 0 : -EIO;
}

static void close_pair(int p[2])
{
	if (p[0] >= 0)
		close(p[0]);
	if (p[1] >= 0)
		close(p[1]);
}

int runsc_exec(const struct runsc *r, const char *id, const char *const *argv_in, struct runsc_proc *ret,
	       ckpt_error *err)
{
	const char *argv[MAX_ARGV];
	int in[2] = { -1, -1 }, out[2] = { -1, -1 }, er[2] = { -1, -1 }, rc;
	size_t n = base_argv(r, argv);

	argv[n++] = "exec";
	argv[n++] = id;
	for (size_t i = 0; argv_in[i]; i++) {
		if (n + 2 > MAX_ARGV)
			return err_set(err, E2BIG, NULL, "exec: too many arguments");
		argv[n++] = argv_in[i];
	}
	argv[n] = NULL;
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(er, O_CLOEXEC) < 0) {
		rc = err_set(err, errno, NULL, "exec: pipe: %s", strerror(errno));
		goto fail;
	}
	if ((rc = spawn(argv, in[0], out[1], er[1], &ret->pid)) < 0) {
		err_set(err, -rc, NULL, "exec: cannot start '%s': %s", argv[0], strerror(-rc));
		goto fail;
	}
	close(in[0]), close(out[1]), close(er[1]);
	ret->in_fd = in[1], ret->out_fd = out[0], ret->err_fd = er[0];
	return 0;
fail:
	close_pair(in), close_pair(out), close_pair(er);
	return rc;
}

void runsc_strv_free(char **v)
{
	for (size_t i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

static int split_words(const char *s, char ***ret, size_t *ret_n)
{
	size_t n = 0, cap = 128;
	char **v = calloc(cap + 1, sizeof(char *));

	while (v && *s) {
		size_t w = strcspn(s, " \t\n");
		if (w) {
			if (n == cap) {
				char **nv = realloc(v, (2 * cap + 1) * sizeof(char *));
				if (!nv)
					break;
				v = nv, cap *= 2;
			}
			if (!(v[n++] = strndup(s, w)))
				break;
			v[n] = NULL;
		}
		s += w + (s[w] != '\0');
	}
	if (!v || *s)
		return runsc_strv_free(v), -ENOMEM;
	*ret = v;
	*ret_n = n;
	return 0;
}

int runsc_cpu_features(char ***ret, size_t *ret_n)
{
	_cleanup_fclose_ FILE *f = fopen("/proc/cpuinfo", "re");
	_cleanup_free_ char *line = NULL;
	size_t cap = 0;

	if (!f)
		return -errno;
	while (getline(&line, &cap, f) > 0) {
		char *colon = strchr(line, ':');
		if (strncmp(line, "flags", 5) || !colon)
			continue;
		return split_words(colon + 1, ret, ret_n);
	}
	return split_words("", ret, ret_n);
}
