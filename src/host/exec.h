/* exec.h: one execution in a sandbox. Its output and its end go to a sink
 * the caller provides, so exec.c knows nothing of sessions or events. */
#pragma once
#include "host/sandbox.h"

struct exec_sink {
	/* stream is "stdout" or "stderr"; buf holds whole UTF-8 characters */
	void (*output)(void *arg, const char *stream, const char *buf, size_t len);
	/* the end: exit status (0..255, 128+signal, or <0); the sink is done */
	void (*done)(void *arg, int status);
	void *arg;
};

/* Start code in the sandbox on a thread of its own. Called with
 * sb->exec_running set (under h->mu); the thread clears it before calling
 * sink->done. On failure nothing is called and the caller clears it. */
int exec_start(struct host *h, struct sandbox *sb, const char *language, const char *code, const struct exec_sink *sink,
	       ckpt_error *err);
