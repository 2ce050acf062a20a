/* locks.c: lock files for the handoff of sandboxes between instances.
 * No flock: the shared volume may be a FUSE bucket. link() of a complete
 * temp file (or O_CREAT|O_EXCL where there is no link()) gives atomic
 * create-if-not-exists, rename() atomic replacement, and the owner re-reads
 * after taking a lock. Fencing tokens grow through {id}.gen. */
#include "host/locks.h"

#include <jansson.h>
#include <sys/stat.h>

#include "lib/failpoint.h"
#include "lib/walk.h"

static int vol_renew(const struct locks *L, const char *id, const char *me, uint64_t token, int64_t now,
		     char ret_waiter[LOCKS_NAME_MAX]);

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
	json_t *w, *t;
	int r = -EBADMSG;

	memset(ret, 0, sizeof(*ret));
	if (o && json_is_integer(json_object_get(o, "timestamp")) &&
	    copy_str(ret->owner, json_object_get(o, "owner")) == 0) {
		ret->timestamp = json_integer_value(json_object_get(o, "timestamp"));
		t = json_object_get(o, "token");
		ret->token = json_is_integer(t) && json_integer_value(t) > 0 ? (uint64_t)json_integer_value(t) : 0;
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

static int vol_read(const struct locks *L, const char *id, struct lock_info *ret)
{
	char name[256];
	int r = lock_name(id, name, sizeof(name));
	return r < 0 ? r : read_named(L->fd, name, ret);
}

bool locks_expired(const struct lock_info *l, int64_t ttl, int64_t now)
{
	return now - l->timestamp > ttl;
}

static char *lock_text(const char *owner, int64_t ts, uint64_t token, const char *waiter)
{
	json_auto_t *o =
		json_pack("{s:s, s:I, s:I}", "owner", owner, "timestamp", (json_int_t)ts, "token", (json_int_t)token);
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

/* Create name with text only if it does not exist, in one write. Readers may
 * see it empty for a moment: acquire treats a young unreadable lock as held. */
static int create_excl(int dirfd, const char *name, const char *text)
{
	size_t n = strlen(text);
	int r = 0;
	_cleanup_close_ int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);

	if (fd < 0)
		return -errno;
	if (write(fd, text, n) != (ssize_t)n || fsync(fd) < 0) {
		r = errno ? -errno : -EIO;
		unlinkat(dirfd, name, 0);
	}
	return r;
}

/* Publish text as the lock: create if absent (exclusive) or replace. */
static int publish(const struct locks *L, const char *id, const char *text, bool exclusive)
{
	char tmp[300], name[256];
	int dirfd = L->fd, r;

	if ((r = lock_name(id, name, sizeof(name))) < 0)
		return r;
	if (exclusive && L->method == LOCKS_EXCL) {
		if ((r = create_excl(dirfd, name, text)) == 0)
			fsync_dirfd(dirfd);
		return r;
	}
	if (exclusive && L->method != LOCKS_LINK)
		return -ENOTSUP;
	if ((r = write_temp(dirfd, id, text, tmp, sizeof(tmp))) < 0)
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

static int publish_lock(const struct locks *L, const char *id, const struct lock_info *l, bool exclusive)
{
	_cleanup_free_ char *text = lock_text(l->owner, l->timestamp, l->token, l->waiter);
	return text ? publish(L, id, text, exclusive) : -ENOMEM;
}

/* The highest token issued for id; 0 when none was. */
static uint64_t gen_read(const struct locks *L, const char *id)
{
	char name[256];
	_cleanup_free_ char *text = NULL;
	unsigned long long v = 0;

	snprintf(name, sizeof(name), "%s.gen", id);
	if (read_file_at(L->fd, name, 64, &text, NULL) < 0 || sscanf(text, "%llu", &v) != 1)
		return 0;
	return (uint64_t)v;
}

static int gen_write(const struct locks *L, const char *id, uint64_t token)
{
	char name[256], text[32];
	int n = snprintf(text, sizeof(text), "%llu\n", (unsigned long long)token);

	snprintf(name, sizeof(name), "%s.gen", id);
	return write_file_atomic(L->fd, name, text, (size_t)n, 0644);
}

/* Move id's lock aside and remove it, but only if it is still the one meant:
 * the same generation as seen (and, with same_stamp, not renewed since).
 * Moving it first makes exactly one remover win; a lock that turns out to be
 * another (renewed, retaken, or rewritten meanwhile) is put back. -EBUSY when
 * it was put back, 0 when removed or gone. */
static int remove_if_same(int dirfd, const char *id, const struct lock_info *seen, bool same_stamp)
{
	char name[256], aside[300], rnd[17];
	struct lock_info now_l;
	int r;

	if ((r = lock_name(id, name, sizeof(name))) < 0 || (r = random_hex(rnd, 8)) < 0)
		return r;
	snprintf(aside, sizeof(aside), ".%s.stale.%s", id, rnd);
	if (FAILPOINT_AROUND("host.lock.aside.rename", renameat(dirfd, name, dirfd, aside)) < 0)
		return errno == ENOENT ? 0 : -errno;
	r = read_named(dirfd, aside, &now_l);
	if (r == 0 &&
	    (now_l.token != seen->token || strcmp(now_l.owner, seen->owner) ||
	     (same_stamp && now_l.timestamp != seen->timestamp))) {
		/* if someone took the name meanwhile, theirs stands */
		if (linkat(dirfd, aside, dirfd, name, 0) < 0 && errno != EEXIST)
			log_debug("lock '%s': cannot put back: %m", id);
		r = -EBUSY;
	}
	(void)FAILPOINT_AROUND("host.lock.aside.unlink", unlinkat(dirfd, aside, 0));
	return r == -EBADMSG ? 0 : r;
}

/* ".ID.stale.HEX": a lock moved aside by remove_if_same. */
static bool is_aside(const char *name)
{
	const char *s = name[0] == '.' ? strstr(name + 1, ".stale.") : NULL;
	if (!s || s == name + 1)
		return false;
	s += strlen(".stale.");
	return strlen(s) == 16 && strspn(s, "0123456789abcdef") == 16;
}

struct aside_sweep {
	int64_t before; /* last written before this: stale by any ttl */
	int removed;
};

static int sweep_one(void *ctx, int dirfd, const char *name)
{
	struct aside_sweep *a = ctx;
	struct stat st;
	if (!is_aside(name) || fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
	    (int64_t)st.st_mtime >= a->before)
		return 0;
	if (unlinkat(dirfd, name, 0) == 0)
		a->removed++;
	return 0;
}

int locks_sweep_aside(const struct locks *L, int64_t older_than, int64_t now)
{
	struct aside_sweep a = { now - older_than, 0 };
	if (L->ops != &locks_volume_ops || L->fd < 0)
		return 0;
	int r = walk_each(L->fd, NULL, sweep_one, &a);
	if (a.removed)
		log_info("locks: removed %d lock file(s) a killed remover left aside", a.removed);
	return r < 0 ? r : a.removed;
}

/* A stale lock, removed by exactly one taker. */
static int remove_stale(int dirfd, const char *id, const struct lock_info *seen)
{
	return remove_if_same(dirfd, id, seen, true);
}

/* After taking a lock, read it back: on volumes that decide exclusivity late
 * another instance may have won. */
static int confirm(const struct locks *L, const char *id, const char *me, uint64_t token, struct lock_info *cur)
{
	struct lock_info l;
	int r = vol_read(L, id, &l);
	if (r < 0)
		return r == -ENOENT ? -EBUSY : r;
	if (strcmp(l.owner, me) || l.token != token) {
		if (cur)
			*cur = l;
		return -EBUSY;
	}
	/* the counter only grows: a lost update here is caught by the next
	 * taker, which also counts from the token of the lock it replaces */
	if (gen_read(L, id) < token && (r = FAILPOINT_AROUND("host.lock.gen.write", gen_write(L, id, token))) < 0)
		return r;
	return 0;
}

/* A lock that does not parse: stale, unless it may be one being created
 * right now by O_CREAT|O_EXCL (empty until its one write lands). */
static bool garbage_is_young(const struct locks *L, const char *id, int64_t ttl, int64_t now)
{
	char name[256];
	struct stat st;

	if (L->method != LOCKS_EXCL || lock_name(id, name, sizeof(name)) < 0 ||
	    fstatat(L->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return false;
	return now - (int64_t)st.st_mtime <= ttl;
}

static int vol_acquire(const struct locks *L, const char *id, const char *me, int64_t ttl, int64_t now,
		       struct lock_info *cur, uint64_t *ret_token)
{
	struct lock_info l, mine = { .timestamp = now };
	uint64_t floor = 0;
	int r;

	snprintf(mine.owner, sizeof(mine.owner), "%s", me);
	for (int attempt = 0; attempt < 3; attempt++) {
		uint64_t g = gen_read(L, id);
		mine.token = (g > floor ? g : floor) + 1;
		r = FAILPOINT_AROUND("host.lock.take", publish_lock(L, id, &mine, true));
		if (r == 0) {
			if ((r = confirm(L, id, me, mine.token, cur)) == 0)
				*ret_token = mine.token;
			return r;
		}
		if (r != -EEXIST)
			return r;
		r = vol_read(L, id, &l);
		if (r == -ENOENT)
			continue; /* released meanwhile */
		if (r == 0 && !strcmp(l.owner, me)) {
			if ((r = vol_renew(L, id, me, l.token, now, NULL)) == 0)
				*ret_token = l.token;
			return r;
		}
		if ((r == 0 && !locks_expired(&l, ttl, now)) || (r == -EBADMSG && garbage_is_young(L, id, ttl, now))) {
			if (cur)
				*cur = r == 0 ? l : (struct lock_info){ .timestamp = now };
			return -EBUSY;
		}
		/* stale (or unreadable garbage): take it over */
		if (r == -EBADMSG)
			memset(&l, 0, sizeof(l));
		else if (r < 0)
			return r;
		floor = l.token > floor ? l.token : floor;
		if ((r = remove_stale(L->fd, id, &l)) < 0)
			return r;
	}
	return -EBUSY;
}

/* A lock naming an older generation than ours, while no newer one was
 * issued: the late write of a former owner (its renewal blocked on the volume
 * and landed after we took over). Tokens decide: the lock is still ours. */
static bool clobbered_by_older(const struct locks *L, const char *id, const struct lock_info *l, uint64_t token)
{
	return l->token < token && gen_read(L, id) <= token;
}

/* Read a lock we hold. A lock file can vanish for a moment while a rename
 * replaces it: libfuse's high-level (path) API, which sshfs and fusepy use,
 * renames a target that is still open to .fuse_hiddenNNN first and only then
 * does the rename asked for (fuse_lib_rename: hide_node when is_open and no
 * hard_remove), so between the two the name is missing. A taker's rename
 * aside needs our lease over anyway (see the watchdog). So a missing lock is
 * read again a few times before it counts as gone. */
static int read_held(const struct locks *L, const char *id, struct lock_info *ret)
{
	int r = vol_read(L, id, ret);
	for (int i = 0; i < 3 && r == -ENOENT; i++) {
		usleep(30 * 1000);
		r = vol_read(L, id, ret);
	}
	return r;
}

static int vol_renew(const struct locks *L, const char *id, const char *me, uint64_t token, int64_t now,
		     char ret_waiter[LOCKS_NAME_MAX])
{
	struct lock_info l;
	int r = read_held(L, id, &l);

	if (r == 0 && strcmp(l.owner, me) && clobbered_by_older(L, id, &l, token)) {
		snprintf(l.owner, sizeof(l.owner), "%s", me); /* put ours back */
		l.token = token;
	}
	if (r == -ENOENT || (r == 0 && (strcmp(l.owner, me) || l.token != token)))
		return -ESTALE;
	if (r < 0)
		return r;
	l.timestamp = now;
	if ((r = FAILPOINT_AROUND("host.lock.renew", publish_lock(L, id, &l, false))) < 0)
		return r;
	if (ret_waiter)
		strcpy(ret_waiter, l.waiter);
	return 0;
}

static int vol_check(const struct locks *L, const char *id, const char *me, uint64_t token)
{
	struct lock_info l;
	int r = read_held(L, id, &l);

	if (r == 0 && strcmp(l.owner, me) && clobbered_by_older(L, id, &l, token))
		return 0;
	if (r == -ENOENT || (r == 0 && (strcmp(l.owner, me) || l.token != token)))
		return -ESTALE;
	if (r < 0)
		return r;
	return gen_read(L, id) > token ? -ESTALE : 0;
}

static int vol_add_waiter(const struct locks *L, const char *id, const char *me)
{
	struct lock_info l;
	int r = vol_read(L, id, &l);

	if (r < 0)
		return r;
	if (!strcmp(l.waiter, me) || !strcmp(l.owner, me))
		return 0;
	snprintf(l.waiter, sizeof(l.waiter), "%s", me);
	return FAILPOINT_AROUND("host.lock.waiter", publish_lock(L, id, &l, false));
}

static int vol_release(const struct locks *L, const char *id, const char *me, uint64_t token)
{
	struct lock_info l;
	int r = vol_read(L, id, &l);

	/* Only our generation: a lock naming us with an older token, or any
	 * token once a newer one was issued, is the late write of a renewal
	 * of ours that was blocked on the volume while another instance took
	 * over. Removing it would take the new owner's lock away. */
	if (r == -ENOENT || (r == 0 && (strcmp(l.owner, me) || l.token != token)) || gen_read(L, id) > token)
		return 0;
	if (r < 0)
		return r;
	/* moved aside, checked again, put back if it changed meanwhile */
	r = remove_if_same(L->fd, id, &l, false);
	if (r == -EBUSY)
		return 0; /* not ours any more: put back for its owner */
	if (r == 0)
		fsync_dirfd(L->fd);
	return r;
}

const char *locks_method_name(enum locks_method m)
{
	return m == LOCKS_LINK ? "link" : m == LOCKS_EXCL ? "excl" : "none";
}

/* Does the volume refuse a second exclusive create? 1 yes, 0 no, <0 error. */
static int probe_excl(int dirfd, const char *a)
{
	int fd = openat(dirfd, a, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return -errno;
	close(fd);
	fd = openat(dirfd, a, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd >= 0)
		close(fd);
	return fd < 0 && errno == EEXIST;
}

static int probe_link(int dirfd, const char *a, const char *b)
{
	if (linkat(dirfd, a, dirfd, b, 0) < 0)
		return -errno;
	return linkat(dirfd, a, dirfd, b, 0) < 0 && errno == EEXIST;
}

/* rename over an existing file replaces it, content included */
static int probe_rename(int dirfd, const char *a, const char *c)
{
	_cleanup_free_ char *text = NULL;
	int r;

	if ((r = write_file_atomic(dirfd, c, "old", 3, 0644)) < 0 ||
	    (r = write_file_atomic(dirfd, a, "new", 3, 0644)) < 0)
		return r;
	if (renameat(dirfd, a, dirfd, c) < 0)
		return -errno;
	return read_file_at(dirfd, c, 16, &text, NULL) == 0 && !strcmp(text, "new");
}

enum locks_method locks_probe(int dirfd, ckpt_error *err)
{
	char rnd[9], a[64], b[64], c[64];
	int excl, link_ok, ren;

	if (random_hex(rnd, 4) < 0)
		return err_set(err, EIO, NULL, "lock probe: no randomness"), LOCKS_NONE;
	snprintf(a, sizeof(a), ".probe.%s.a", rnd);
	snprintf(b, sizeof(b), ".probe.%s.b", rnd);
	snprintf(c, sizeof(c), ".probe.%s.c", rnd);
	excl = probe_excl(dirfd, a);
	link_ok = excl >= 0 ? probe_link(dirfd, a, b) : -EIO;
	unlinkat(dirfd, a, 0), unlinkat(dirfd, b, 0);
	ren = probe_rename(dirfd, a, c);
	unlinkat(dirfd, a, 0), unlinkat(dirfd, c, 0);
	if (ren <= 0) {
		err_set(err, ren < 0 ? -ren : EOPNOTSUPP, NULL,
			"the volume does not replace a file by rename() (%s): lock updates would not be atomic",
			ren < 0 ? strerror(-ren) : "old content kept");
		return LOCKS_NONE;
	}
	if (link_ok > 0)
		return LOCKS_LINK;
	if (excl > 0)
		return LOCKS_EXCL;
	err_set(err, EOPNOTSUPP, NULL,
		"the volume has neither link() (%s) nor an O_EXCL create that refuses a second one",
		link_ok < 0 ? strerror(-link_ok) : "a second link succeeded");
	return LOCKS_NONE;
}

static int vol_wait(const struct locks *L, const char *id, int timeout_ms)
{
	(void)L, (void)id, (void)timeout_ms;
	return 0; /* nothing to watch on a volume: the caller polls */
}

const struct locks_ops locks_volume_ops = {
	.name = "volume",
	.read = vol_read,
	.acquire = vol_acquire,
	.renew = vol_renew,
	.check = vol_check,
	.add_waiter = vol_add_waiter,
	.release = vol_release,
	.wait = vol_wait,
};

/* The dispatch: the backend's table, volume unless etcd was configured. */
int locks_read(const struct locks *L, const char *id, struct lock_info *ret)
{
	return L->ops->read(L, id, ret);
}

int locks_acquire(const struct locks *L, const char *id, const char *me, int64_t ttl, int64_t now,
		  struct lock_info *cur, uint64_t *ret_token)
{
	return L->ops->acquire(L, id, me, ttl, now, cur, ret_token);
}

int locks_renew(const struct locks *L, const char *id, const char *me, uint64_t token, int64_t now,
		char ret_waiter[LOCKS_NAME_MAX])
{
	return L->ops->renew(L, id, me, token, now, ret_waiter);
}

int locks_check(const struct locks *L, const char *id, const char *me, uint64_t token)
{
	return L->ops->check(L, id, me, token);
}

int locks_write_fenced(const struct locks *L, const char *id, const char *me, uint64_t token, int dfd, const char *name,
		       const char *text, size_t len)
{
	int r = L->ops->check(L, id, me, token);
	return r < 0 ? r : write_file_atomic(dfd, name, text, len, 0644);
}

int locks_add_waiter(const struct locks *L, const char *id, const char *me)
{
	return L->ops->add_waiter(L, id, me);
}

int locks_release(const struct locks *L, const char *id, const char *me, uint64_t token)
{
	return L->ops->release(L, id, me, token);
}

int locks_wait(const struct locks *L, const char *id, int timeout_ms)
{
	return L->ops->wait(L, id, timeout_ms);
}
