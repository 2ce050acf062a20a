/* locks.c: lock files for the handoff of sandboxes between instances.
 * No flock: the shared volume may be a FUSE bucket. link() of a complete
 * temp file gives atomic create-if-not-exists, rename() atomic replacement,
 * and the owner re-reads after taking a lock. */
#include "host/locks.h"

#include <jansson.h>
#include <sys/stat.h>

#define LOCK_MAX_BYTES 4096

static int lock_name(const char *id, char *buf, size_t len)
{
	if ((size_t)snprintf(buf, len, "%s.lock", id) >= len)
		return -ENAMETOOLONG;
	return 0;
}

static int copy_str(char dst[LOCKS_NAME_MAX], json_t *v)
{
	const char *s = json_string_value(v);
	if (!s || strlen(s) >= LOCKS_NAME_MAX)
		return -EBADMSG;
	strcpy(dst, s);
	return 0;
}

static int parse_lock(const char *text, struct lock_info *ret)
{
	json_auto_t *o = json_loads(text, 0, NULL);
	json_t *w;
	int r = -EBADMSG;

	memset(ret, 0, sizeof(*ret));
	if (o && json_is_integer(json_object_get(o, "timestamp")) &&
	    copy_str(ret->owner, json_object_get(o, "owner")) == 0) {
		ret->timestamp = json_integer_value(json_object_get(o, "timestamp"));
		w = json_object_get(o, "waiter");
		r = (w && !json_is_null(w)) ? copy_str(ret->waiter, w) : 0;
	}
	return r;
}

static int read_named(int dirfd, const char *name, struct lock_info *ret)
{
	_cleanup_free_ char *text = NULL;
	int r = read_file_at(dirfd, name, LOCK_MAX_BYTES, &text, NULL);
	return r < 0 ? r : parse_lock(text, ret);
}

int locks_read(int dirfd, const char *id, struct lock_info *ret)
{
	char name[256];
	int r = lock_name(id, name, sizeof(name));
	return r < 0 ? r : read_named(dirfd, name, ret);
}

bool locks_expired(const struct lock_info *l, int64_t ttl, int64_t now)
{
	return now - l->timestamp > ttl;
}

static char *lock_text(const char *owner, int64_t ts, const char *waiter)
{
	json_auto_t *o = json_pack("{s:s, s:I}", "owner", owner, "timestamp", (json_int_t)ts);
	if (!o)
		return NULL;
	if (waiter && *waiter)
		json_object_set_new(o, "waiter", json_string(waiter));
	return json_dumps(o, JSON_COMPACT);
}

/* A complete temp file beside the lock; its name goes to tmp. */
static int write_temp(int dirfd, const char *id, const char *text, char *tmp, size_t len)
{
	char rnd[17];
	int r;

	if ((r = random_hex(rnd, 8)) < 0)
		return r;
	if ((size_t)snprintf(tmp, len, ".%s.lock.%s", id, rnd) >= len)
		return -ENAMETOOLONG;
	_cleanup_close_ int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return -errno;
	size_t n = strlen(text);
	if (write(fd, text, n) != (ssize_t)n || fsync(fd) < 0) {
		r = errno ? -errno : -EIO;
		unlinkat(dirfd, tmp, 0);
		return r;
	}
	return 0;
}

/* Publish text as the lock: link (exclusive) or rename (replace). */
static int publish(int dirfd, const char *id, const char *text, bool exclusive)
{
	char tmp[300], name[256];
	int r;

	if ((r = lock_name(id, name, sizeof(name))) < 0 || (r = write_temp(dirfd, id, text, tmp, sizeof(tmp))) < 0)
		return r;
	if (exclusive)
		r = linkat(dirfd, tmp, dirfd, name, 0) < 0 ? -errno : 0;
	else
		r = renameat(dirfd, tmp, dirfd, name) < 0 ? -errno : 0;
	if (exclusive || r < 0)
		unlinkat(dirfd, tmp, 0);
	if (r == 0)
		fsync_dirfd(dirfd);
	return r;
}

static int publish_lock(int dirfd, const char *id, const char *owner, int64_t ts, const char *waiter, bool exclusive)
{
	_cleanup_free_ char *text = lock_text(owner, ts, waiter);
	return text ? publish(dirfd, id, text, exclusive) : -ENOMEM;
}

/* Move a stale lock aside so exactly one taker removes it; a lock that turns
 * out to be fresh (renewed or retaken meanwhile) is put back. */
static int remove_stale(int dirfd, const char *id, const struct lock_info *seen)
{
	char name[256], aside[300], rnd[17];
	struct lock_info now_l;
	int r;

	if ((r = lock_name(id, name, sizeof(name))) < 0 || (r = random_hex(rnd, 8)) < 0)
		return r;
	snprintf(aside, sizeof(aside), ".%s.stale.%s", id, rnd);
	if (renameat(dirfd, name, dirfd, aside) < 0)
		return errno == ENOENT ? 0 : -errno;
	r = read_named(dirfd, aside, &now_l);
	if (r == 0 && (now_l.timestamp != seen->timestamp || strcmp(now_l.owner, seen->owner))) {
		/* if someone took the name meanwhile, theirs stands */
		if (linkat(dirfd, aside, dirfd, name, 0) < 0 && errno != EEXIST)
			log_debug("lock '%s': cannot put back: %m", id);
		r = -EBUSY;
	}
	unlinkat(dirfd, aside, 0);
	return r == -EBADMSG ? 0 : r;
}

/* After taking a lock, read it back: on volumes that decide exclusivity late
 * another instance may have won. */
static int confirm(int dirfd, const char *id, const char *me, struct lock_info *cur)
{
	struct lock_info l;
	int r = locks_read(dirfd, id, &l);
	if (r < 0)
		return r == -ENOENT ? -EBUSY : r;
	if (strcmp(l.owner, me)) {
		if (cur)
			*cur = l;
		return -EBUSY;
	}
	return 0;
}

int locks_acquire(int dirfd, const char *id, const char *me, int64_t ttl, int64_t now, struct lock_info *cur)
{
	struct lock_info l;
	int r;

	for (int attempt = 0; attempt < 3; attempt++) {
		r = publish_lock(dirfd, id, me, now, NULL, true);
		if (r == 0)
			return confirm(dirfd, id, me, cur);
		if (r != -EEXIST)
			return r;
		r = locks_read(dirfd, id, &l);
		if (r == -ENOENT)
			continue; /* released meanwhile */
		if (r == 0 && !strcmp(l.owner, me))
			return locks_renew(dirfd, id, me, now, NULL);
		if (r == 0 && !locks_expired(&l, ttl, now)) {
			if (cur)
				*cur = l;
			return -EBUSY;
		}
		/* stale (or unreadable garbage): take it over */
		if (r == -EBADMSG)
			memset(&l, 0, sizeof(l));
		else if (r < 0)
			return r;
		if ((r = remove_stale(dirfd, id, &l)) < 0)
			return r;
	}
	return -EBUSY;
}

int locks_renew(int dirfd, const char *id, const char *me, int64_t now, char ret_waiter[LOCKS_NAME_MAX])
{
	struct lock_info l;
	int r = locks_read(dirfd, id, &l);

	if (r == -ENOENT || (r == 0 && strcmp(l.owner, me)))
		return -ESTALE;
	if (r < 0)
		return r;
	if ((r = publish_lock(dirfd, id, me, now, l.waiter, false)) < 0)
		return r;
	if (ret_waiter)
		strcpy(ret_waiter, l.waiter);
	return 0;
}

int locks_add_waiter(int dirfd, const char *id, const char *me)
{
	struct lock_info l;
	int r = locks_read(dirfd, id, &l);

	if (r < 0)
		return r;
	if (!strcmp(l.waiter, me) || !strcmp(l.owner, me))
		return 0;
	return publish_lock(dirfd, id, l.owner, l.timestamp, me, false);
}

int locks_release(int dirfd, const char *id, const char *me)
{
	struct lock_info l;
	char name[256];
	int r = locks_read(dirfd, id, &l);

	if (r == -ENOENT)
		return 0;
	if (r == 0 && strcmp(l.owner, me))
		return 0; /* not ours any more: leave the new owner's lock alone */
	if ((r = lock_name(id, name, sizeof(name))) < 0)
		return r;
	if (unlinkat(dirfd, name, 0) < 0 && errno != ENOENT)
		return -errno;
	fsync_dirfd(dirfd);
	return 0;
}
