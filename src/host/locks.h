/* locks.h: sandbox lock files on the shared volume, {mount}/locks/{id}.lock
 * holding {"owner", "timestamp" (unix s), "waiter"?}. Shared volumes such as
 * GCS FUSE have no file locks, so a lock is created with link() (create if
 * not exists), replaced with rename(), and carries its own expiry: a lock not
 * renewed for ttl seconds may be taken over. All calls take the locks
 * directory fd; ids must be validated by the caller. */
#pragma once
#include <stdint.h>
#include "lib/util.h"

#define LOCKS_NAME_MAX 128

struct lock_info {
	char owner[LOCKS_NAME_MAX];
	int64_t timestamp;
	char waiter[LOCKS_NAME_MAX]; /* "" = none */
};

/* -ENOENT when there is no lock; -EBADMSG when it does not parse. */
int locks_read(int dirfd, const char *id, struct lock_info *ret);
/* Take the lock for me: 0 when it is mine now (new, already mine, or taken
 * over because it was older than ttl); -EBUSY when another owner holds it
 * (cur, if not NULL, gets its content). */
int locks_acquire(int dirfd, const char *id, const char *me, int64_t ttl, int64_t now, struct lock_info *cur);
/* Refresh my timestamp, keeping the waiter. *ret_waiter gets the waiter ("" if
 * none) when not NULL. -ESTALE when the lock is no longer mine. */
int locks_renew(int dirfd, const char *id, const char *me, int64_t now, char ret_waiter[LOCKS_NAME_MAX]);
/* Register me as the waiter of a lock held by someone else: 0 registered (or
 * already), -ENOENT when there is no lock any more. */
int locks_add_waiter(int dirfd, const char *id, const char *me);
/* Remove the lock if it is mine; 0 also when it is gone already. */
int locks_release(int dirfd, const char *id, const char *me);
/* True when the lock's timestamp is older than ttl at now. */
bool locks_expired(const struct lock_info *l, int64_t ttl, int64_t now);
