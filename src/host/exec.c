/* exec.c: one execution in a sandbox: `runsc exec` of bash, or of a small
 * Python client that hands the code to the REPL server (the sandbox's init)
 * so globals persist; stdout and stderr stream back as events as produced. */
#include "host/exec.h"

#include <poll.h>

static const char repl_client[] = "import socket, struct, sys, time\n"
				  "code = sys.stdin.buffer.read()\n"
				  "s = socket.socket(socket.AF_UNIX)\n"
				  "for i in range(400):\n"
				  "    try: s.connect('/tmp/.ckptd-repl.sock'); break\n"
				  "    except OSError: time.sleep(0.025)\n"
				  "else: sys.exit('ckptd: the sandbox REPL does not answer')\n"
				  "s.sendall(struct.pack('>I', len(code)) + code)\n"
				  "f = s.makefile('rb')\n"
				  "while True:\n"
				  "    h = f.read(5)\n"
				  "    if len(h) < 5: sys.exit('ckptd: the sandbox REPL went away')\n"
				  "    d = f.read(struct.unpack('>I', h[1:])[0])\n"
				  "    if h[:1] == b'X': sys.exit(struct.unpack('>I', d)[0])\n"
				  "    o = sys.stdout.buffer if h[:1] == b'O' else sys.stderr.buffer\n"
				  "    o.write(d); o.flush()\n";

/* Code comes on stdin, so its size is not bound by the argv limits; the
 * code's own stdin is /dev/null. */
static const char bash_wrapper[] = "eval \"$(cat)\" </dev/null";

struct exec_job {
	struct host *h;
	struct sandbox *sb;
	struct exec_sink sink;
	struct runsc_proc p;
	char *code;
	size_t code_len;
};

/* Length of buf's longest prefix of whole UTF-8 sequences, or of invalid
 * bytes that can never complete; an incomplete tail is left for later. */
static size_t utf8_complete(const unsigned char *b, size_t n)
{
	size_t i = n, back = 0;
	while (i > 0 && back < 4 && (b[i - 1] & 0xC0) == 0x80)
		i--, back++;
	if (i == 0)
		return n;
	unsigned char c = b[i - 1];
	size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
	return (c >= 0xC0 && back + 1 < need) ? i - 1 : n;
}

struct stream {
	int fd;
	const char *name;
	char buf[65536 + 4];
	size_t carry;
};

/* Read once from a ready stream and send whole characters; 0 at EOF. */
static int pump(const struct exec_sink *sink, struct stream *st)
{
	ssize_t k = read(st->fd, st->buf + st->carry, sizeof(st->buf) - 4 - st->carry);
	if (k < 0)
		return errno == EINTR ? 1 : -errno;
	size_t have = st->carry + (size_t)k;
	size_t whole = k == 0 ? have : utf8_complete((unsigned char *)st->buf, have);
	if (whole)
		sink->output(sink->arg, st->name, st->buf, whole);
	memmove(st->buf, st->buf + whole, have - whole);
	st->carry = have - whole;
	return k > 0;
}

static void pump_all(struct exec_job *j)
{
	struct stream *st = calloc(2, sizeof(*st));
	struct pollfd pfd[2];
	int open_n = 2;

	if (!st)
		return;
	st[0].fd = j->p.out_fd, st[0].name = "stdout";
	st[1].fd = j->p.err_fd, st[1].name = "stderr";
	while (open_n > 0) {
		for (int i = 0; i < 2; i++)
			pfd[i] = (struct pollfd){ .fd = st[i].fd, .events = POLLIN };
		if (poll(pfd, 2, -1) < 0 && errno != EINTR)
			break;
		for (int i = 0; i < 2; i++) {
			if (st[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			if (pump(&j->sink, &st[i]) <= 0) {
				close(st[i].fd);
				st[i].fd = -1;
				open_n--;
			}
		}
	}
	free(st);
}

static void write_code(struct exec_job *j)
{
	const char *p = j->code;
	size_t left = j->code_len;
	while (left) {
		ssize_t k = write(j->p.in_fd, p, left);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		p += k, left -= (size_t)k;
	}
	close(j->p.in_fd);
}

static void *exec_main(void *arg)
{
	struct exec_job *j = arg;
	int status;

	write_code(j);
	pump_all(j);
	status = runsc_wait(j->p.pid, 24 * 3600 * 1000);
	pthread_mutex_lock(&j->h->mu);
	j->sb->exec_running = false;
	pthread_cond_broadcast(&j->h->cond);
	pthread_mutex_unlock(&j->h->mu);
	j->sink.done(j->sink.arg, status);
	free(j->code);
	free(j);
	return NULL;
}

int exec_start(struct host *h, struct sandbox *sb, const char *language, const char *code, const struct exec_sink *sink,
	       ckpt_error *err)
{
	const char *py[] = { "/usr/bin/python3", "-c", repl_client, NULL };
	const char *sh[] = { "/bin/bash", "-c", bash_wrapper, NULL };
	struct exec_job *j;
	pthread_t t;
	int r;

	if (strcmp(language, "python") && strcmp(language, "bash"))
		return err_set(err, EINVAL, NULL, "unsupported language '%s' (python or bash)", language);
	if (!(j = calloc(1, sizeof(*j))) || !(j->code = strdup(code))) {
		free(j);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	j->h = h, j->sb = sb, j->sink = *sink, j->code_len = strlen(code);
	if ((r = runsc_exec(&h->runsc, sb->cid, strcmp(language, "python") ? sh : py, &j->p, err)) < 0)
		goto fail;
	if ((r = -pthread_create(&t, NULL, exec_main, j)) < 0) {
		close(j->p.in_fd), close(j->p.out_fd), close(j->p.err_fd);
		runsc_wait(j->p.pid, 1);
		err_set(err, -r, NULL, "exec thread: %s", strerror(-r));
		goto fail;
	}
	pthread_detach(t);
	return 0;
fail:
	free(j->code);
	free(j);
	return r;
}
