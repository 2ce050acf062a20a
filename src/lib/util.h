/* util.h: cleanup helpers, the error struct, logging, small fs and time helpers.
 * Everything here is free of policy: callers decide what an error means. */
#pragma once
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <dirent.h>
#include <unistd.h>

#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static inline void freep(void *p)
{
	free(*(void **)p);
}
static inline void closep(int *fd)
{
	if (*fd >= 0) {
		int e = errno;
		close(*fd);
		errno = e;
	}
}
static inline void closedirp(DIR **d)
{
	if (*d)
		closedir(*d);
}
static inline void fclosep(FILE **f)
{
	if (*f)
		fclose(*f);
}
#define _cleanup_(f) __attribute__((cleanup(f)))
#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_closedir_ _cleanup_(closedirp)
#define _cleanup_fclose_ _cleanup_(fclosep)

/* Hand ownership on: the variable is reset so its cleanup does nothing. */
#define TAKE_PTR(p)                     \
	({                              \
		__typeof__(p) _t = (p); \
		(p) = NULL;             \
		_t;                     \
	})
#define TAKE_FD(fd)            \
	({                     \
		int _t = (fd); \
		(fd) = -1;     \
		_t;            \
	})

/* What went wrong, in terms a client can act on. Only the API and the engine
 * choose a kind: lower layers leave it unset, and the engine classifies what
 * comes back from them at its boundary (engine_err.c); a kind still unset
 * answers as internal. The HTTP layer maps kind to status in one table
 * (http_problem.c). */
enum ckpt_err_kind {
	ERR_UNSET = 0,
	ERR_INVALID,     /* the request is wrong */
	ERR_NOT_FOUND,   /* no such thing */
	ERR_CONFLICT,    /* not now, in this state */
	ERR_EXPIRED,     /* it was there, and is past its time */
	ERR_LIMIT,       /* a configured limit reached */
	ERR_NO_SPACE,    /* the disk, a quota or a byte budget is full */
	ERR_UNAVAILABLE, /* cannot serve now; try again */
	ERR_INTERNAL,    /* a failure of ckptd's own */
	ERR_UPSTREAM,    /* a server ckptd called (a registry) failed or refused */
};

/* An error travelling up: errnum (positive errno) says what failed and stays in
 * the message and the log; kind decides the answer; code is the stable machine
 * code clients match on (below the engine, a reason engine_err.c knows). */
typedef struct ckpt_error {
	int errnum;
	enum ckpt_err_kind kind;
	const char *code; /* static string or NULL */
	char msg[512];
} ckpt_error;

/* Fill err (may be NULL) with kind unset and return -errnum. What a layer
 * below the engine uses (tools/kinds.sh checks). */
int err_set(ckpt_error *err, int errnum, const char *code, const char *fmt, ...) _printf_(4, 5);
/* The same, with a kind chosen by the caller (API and engine only). */
int err_set_kind(ckpt_error *err, enum ckpt_err_kind kind, int errnum, const char *code, const char *fmt, ...)
	_printf_(5, 6);
/* Give an error already filled below a kind and code; returns r unchanged. */
int err_mark(ckpt_error *err, enum ckpt_err_kind kind, const char *code, int r);
/* Prefix context to an existing message: "context: old message". Returns -errnum. */
int err_prefix(ckpt_error *err, const char *fmt, ...) _printf_(2, 3);

/* Logging (log.c). Under journald each event is a journal entry with structured
 * fields; elsewhere a timestamped line on stderr. */
enum {
	LOG_ERR_ = 3,
	LOG_WARN_ = 4,
	LOG_NOTICE_ = 5,
	LOG_INFO_ = 6,
	LOG_DEBUG_ = 7
};
void log_init(bool verbose);
bool log_is_verbose(void);
void log_msg(int prio, const char *fmt, ...) _printf_(2, 3);
/* An event of an operation, with the journal fields OPERATION, CHECKPOINT_ID, UNIT
 * and DURATION_MS (each left out when NULL or < 0). */
struct log_fields {
	const char *operation, *checkpoint_id, *unit;
	int64_t duration_ms;
};
void log_event(int prio, const struct log_fields *f, const char *fmt, ...) _printf_(3, 4);
#define log_error(...) log_msg(LOG_ERR_, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN_, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE_, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO_, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG_, __VA_ARGS__)

/* Time. */
int64_t now_ms(void);  /* CLOCK_REALTIME, ms */
int64_t mono_ms(void); /* CLOCK_MONOTONIC, ms */
int64_t mono_us(void); /* CLOCK_MONOTONIC, µs */
/* RFC 3339 UTC with milliseconds: "2026-11-22T10:00:00.123Z"; buf >= 32. */
char *fmt_rfc3339_ms(int64_t ms, char *buf, size_t len);

/* Validation of things that may become path components. */
bool id_valid(const char *s);   /* checkpoint id: "cp_" + 24 lowercase hex */
bool name_valid(const char *s); /* 1..128 printable UTF-8 characters, no control chars */
/* Strictly valid UTF-8, as jansson takes it: no overlongs, surrogates, > U+10FFFF. */
bool utf8_valid(const char *s, size_t len);
/* A fresh, time-sortable checkpoint id. buf >= 32. */
int id_generate(char *buf, size_t len);
/* Random lowercase hex string of n bytes (2n chars) into buf (>= 2n+1). */
int random_hex(char *buf, size_t nbytes);

/* Crash-safe file replacement relative to a directory fd:
 * write name.tmp.XXXX, fsync, rename over name, fsync the directory. */
int write_file_atomic(int dirfd, const char *name, const void *data, size_t len, mode_t mode);
/* write_file_atomic in two steps, for a caller whose own barrier between
 * them (a syncfs of dirfd's file system) stands for the temp file's fsync.
 * stage writes the temp file, unsynced, and puts its name in tmp; commit
 * renames it over name and fsyncs the directory. Each removes the temp
 * file on failure; a caller that gives up between them unlinks it. */
#define WRITE_FILE_TMP_MAX 512
int write_file_stage(int dirfd, const char *name, const void *data, size_t len, mode_t mode,
		     char tmp[static WRITE_FILE_TMP_MAX]);
int write_file_commit(int dirfd, const char *tmp, const char *name);
/* The same without either fsync: the old or the new file after a crash,
 * or an empty one. Only for caches and hints whose readers take that, and
 * whose writer makes them durable later (a syncfs). */
int write_file_replace(int dirfd, const char *name, const void *data, size_t len, mode_t mode);
/* Remove the temp files write_file_atomic leaves in dirfd when killed midway
 * (".<name>.tmp.<8 hex>"); for a component's start, before anyone writes. */
int write_file_atomic_sweep(int dirfd);
/* All of buf at off (EINTR retried); a write of 0 bytes is -ENOSPC. */
int pwrite_all(int fd, const void *buf, size_t len, off_t off);
int read_file_at(int dirfd, const char *name, size_t max, char **ret, size_t *ret_len);
int fsync_dirfd(int dirfd);
int fsync_path(const char *path);
/* mkdir -p of an absolute path (mode 0700 for created parts); the parent of
 * every directory it makes is fsynced, so that a power cut cannot lose it. */
int mkdir_p(const char *path, mode_t mode);
/* mkdirat, then (when it made the directory) fsync of dirfd; an existing
 * directory is 0. */
int mkdirat_durable(int dirfd, const char *name, mode_t mode);
/* Remove name below dirfd recursively, not following symlinks, not crossing mounts. */
int rm_rf_at(int dirfd, const char *name);
/* Up from the directory dirfd through "..", dirfd itself first: fn(ctx, st,
 * below) with each one's stat and the device of the step it was reached
 * from (its own at the first; ".." from a directory a mount hides lands on
 * the mount), until fn answers >= 0: that answer. -1 when "/" (which ".."
 * does not leave) came first; -2 when a step failed or max steps were
 * taken. dirfd stays open. */
int dir_walk_up(int dirfd, int max, int (*fn)(void *ctx, const struct stat *st, dev_t below), void *ctx);
/* Join a and b with one '/'. Returns malloc'd string or NULL. */
char *path_join(const char *a, const char *b);
/* Sum of st_blocks*512 of a tree (not following symlinks); hardlinked inodes once. */
int tree_disk_usage(int dirfd, const char *name, uint64_t *ret);

/* Constant-time comparison of two strings (length leaks, content does not). */
bool secure_streq(const char *a, const char *b);
