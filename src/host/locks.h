/* locks.h: sandbox locks, through an ops table: lock files on the shared
 * volume (locks.c, below) or keys in etcd (locks_etcd.c, locks_etcd.h).
 *
 * Volume: lock files {mount}/locks/{id}.lock
 * holding {"owner", "timestamp" (unix s), "token", "waiter"?}. Shared volumes
 * such as GCS FUSE have no file locks, so a lock is created with an atomic
 * create-if-absent (link() of a complete temp file, or O_CREAT|O_EXCL where
 * the volume has no link()), replaced with rename(), and carries its own
 * expiry: a lock not renewed for ttl seconds may be taken over.
 *
 * Fencing: each lock generation carries a token, a counter that only grows
 * ({id}.gen keeps the highest one issued, so it survives a release). A
 * holder checks its token before each write that publishes state and before
 * acknowledging it; a holder whose lock was taken over fails that check.
 * Ids must be validated by the caller. */
#pragma once
#include <stdint.h>
#include "lib/util.h"

#define LOCKS_NAME_MAX 128

enum locks_method {
	LOCKS_NONE, /* no safe create-if-absent on this volume */
	LOCKS_LINK, /* link() of a complete temp file */
	LOCKS_EXCL, /* O_CREAT|O_EXCL, then one write */
};

struct locks;
struct lock_info;

/* One lock backend. Same contracts as the locks_* functions below. */
struct locks_ops {
	const char *name; /* "volume", "etcd" */
	int (*read)(const struct locks *L, const char *id, struct lock_info *ret);
	int (*acquire)(const struct locks *L, const char *id, const char *me, int64_t ttl, int64_t now,
		       struct lock_info *cur, uint64_t *ret_token);
	int (*renew)(const struct locks *L, const char *id, const char *me, uint64_t token, int64_t now,
		     char ret_waiter[LOCKS_NAME_MAX]);
	int (*check)(const struct locks *L, const char *id, const char *me, uint64_t token);
	int (*add_waiter)(const struct locks *L, const char *id, const char *me);
	int (*release)(const struct locks *L, const char *id, const char *me, uint64_t token);
	int (*wait)(const struct locks *L, const char *id, int timeout_ms);
};

extern const struct locks_ops locks_volume_ops;

struct locks_etcd;

struct locks {
	const struct locks_ops *ops;
	int fd; /* the locks directory on the volume */
	enum locks_method method;
	struct locks_etcd *etcd; /* with the etcd ops */
};

struct lock_info {
	char owner[LOCKS_NAME_MAX];
	int64_t timestamp;
	uint64_t token;
	char waiter[LOCKS_NAME_MAX]; /* "" = none */
};

/* Find out which primitives the volume under dirfd honours (link, O_EXCL,
 * rename over an existing file) and pick a method; LOCKS_NONE with a reason
 * in err when none is safe. Leaves no files behind. */
enum locks_method locks_probe(int dirfd, ckpt_error *err);
const char *locks_method_name(enum locks_method m);

/* Remove the lock files a remover moved aside (".ID.stale.HEX") and was
 * killed before it removed or put back: only those last written over
 * older_than seconds before now, which no owner renews any more. Volume
 * locks only; the number removed, or -errno. */
int locks_sweep_aside(const struct locks *L, int64_t older_than, int64_t now);
/* -ENOENT when there is no lock; -EBADMSG when it does not parse. */
int locks_read(const struct locks *L, const char *id, struct lock_info *ret);
/* Take the lock for me: 0 when it is mine now (new, already mine, or taken
 * over because it was older than ttl, which the caller gives with its safety
 * margin added), with its token in *ret_token; -EBUSY when another owner
 * holds it (cur, if not NULL, gets its content). */
int locks_acquire(const struct locks *L, const char *id, const char *me, int64_t ttl, int64_t now,
		  struct lock_info *cur, uint64_t *ret_token);
/* Refresh my timestamp, keeping token and waiter. *ret_waiter gets the
 * waiter ("" if none) when not NULL. -ESTALE when the lock is no longer
 * mine (another owner, or another token). */
int locks_renew(const struct locks *L, const char *id, const char *me, uint64_t token, int64_t now,
		char ret_waiter[LOCKS_NAME_MAX]);
/* The fence: 0 when the lock still names me with this token and no newer
 * token was issued; -ESTALE otherwise. */
int locks_check(const struct locks *L, const char *id, const char *me, uint64_t token);
/* Write name in dfd atomically (temp file, fsync, rename) only if the fence
 * holds just before; -ESTALE (nothing written) when it does not. */
int locks_write_fenced(const struct locks *L, const char *id, const char *me, uint64_t token, int dfd, const char *name,
		       const char *text, size_t len);
/* Register me as the waiter of a lock held by someone else: 0 registered (or
 * already), -ENOENT when there is no lock any more. */
int locks_add_waiter(const struct locks *L, const char *id, const char *me);
/* Remove the lock if it is mine in this generation (token); 0 also when it
 * is gone already or is another's (left alone). */
int locks_release(const struct locks *L, const char *id, const char *me, uint64_t token);
/* Block up to timeout_ms for a change of id's lock (etcd: a watch event,
 * e.g. its release); returns at once where nothing can be watched. */
int locks_wait(const struct locks *L, const char *id, int timeout_ms);
/* True when the lock's timestamp is older than ttl at now. */
bool locks_expired(const struct lock_info *l, int64_t ttl, int64_t now);
