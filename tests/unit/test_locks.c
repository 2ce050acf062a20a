/* test_locks.c: lock files: create, contention, waiter, renewal, takeover,
 * release, fencing tokens, the O_EXCL method and the volume probe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/stat.h>

#include "host/locks.h"
#include "lib/walk.h"
#include "testlib.h"

static char dir[TESTLIB_DIR_LEN];
static int dfd = -1;
static struct locks L0 = { .ops = &locks_volume_ops, .fd = -1, .method = LOCKS_LINK }, *L = &L0;
static uint64_t tok;

static int setup(void **state)
{
	(void)state;
	assert_int_equal(testlib_mkdir(dir, "locks"), 0);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	L0.fd = dfd;
	L0.method = LOCKS_LINK;
	return dfd < 0;
}

static int teardown(void **state)
{
	(void)state;
	close(dfd);
	testlib_rmdir(dir);
	return 0;
}

static int count_entries(void)
{
	int n = 0;
	DIR *d;
	assert_int_equal(walk_open(dfd, NULL, &d), 0);
	while (walk_next(d))
		n++;
	closedir(d);
	return n;
}

static void test_acquire_contend_release(void **state)
{
	(void)state;
	struct lock_info l;

	assert_int_equal(locks_read(L, "sb1", &l), -ENOENT);
	assert_int_equal(locks_acquire(L, "sb1", "A", 30, 1000, NULL, &tok), 0);
	assert_int_equal(locks_read(L, "sb1", &l), 0);
	assert_string_equal(l.owner, "A");
	assert_int_equal(l.timestamp, 1000);
	assert_string_equal(l.waiter, "");
	assert_int_equal(count_entries(), 2); /* the lock and its counter, no temp files */

	/* held and fresh: B is refused and told who holds it */
	memset(&l, 0, sizeof(l));
	assert_int_equal(locks_acquire(L, "sb1", "B", 30, 1010, &l, &tok), -EBUSY);
	assert_string_equal(l.owner, "A");
	/* re-acquire by the owner renews */
	assert_int_equal(locks_acquire(L, "sb1", "A", 30, 1020, NULL, &tok), 0);
	assert_int_equal(locks_read(L, "sb1", &l), 0);
	assert_int_equal(l.timestamp, 1020);

	/* release by a non-owner does nothing */
	assert_int_equal(locks_release(L, "sb1", "B", tok), 0);
	assert_int_equal(locks_read(L, "sb1", &l), 0);
	assert_int_equal(locks_release(L, "sb1", "A", tok), 0);
	assert_int_equal(locks_read(L, "sb1", &l), -ENOENT);
	assert_int_equal(locks_release(L, "sb1", "A", tok), 0);
	assert_int_equal(locks_acquire(L, "sb1", "B", 30, 1030, NULL, &tok), 0);
	assert_int_equal(locks_release(L, "sb1", "B", tok), 0);
	assert_int_equal(count_entries(), 1); /* the token counter outlives the lock */
}

static void test_waiter_and_renew(void **state)
{
	(void)state;
	struct lock_info l;
	char waiter[LOCKS_NAME_MAX] = "x";

	assert_int_equal(locks_add_waiter(L, "sb2", "B"), -ENOENT);
	assert_int_equal(locks_acquire(L, "sb2", "A", 30, 1000, NULL, &tok), 0);
	assert_int_equal(locks_renew(L, "sb2", "A", tok, 1005, waiter), 0);
	assert_string_equal(waiter, "");
	assert_int_equal(locks_add_waiter(L, "sb2", "B"), 0);
	assert_int_equal(locks_read(L, "sb2", &l), 0);
	assert_string_equal(l.owner, "A");
	assert_string_equal(l.waiter, "B");
	assert_int_equal(l.timestamp, 1005); /* a waiter does not renew */
	/* the owner sees the waiter at renewal, and keeps it in the file */
	assert_int_equal(locks_renew(L, "sb2", "A", tok, 1010, waiter), 0);
	assert_string_equal(waiter, "B");
	assert_int_equal(locks_read(L, "sb2", &l), 0);
	assert_string_equal(l.waiter, "B");
	assert_int_equal(l.timestamp, 1010);
	/* renewal by someone else is refused */
	assert_int_equal(locks_renew(L, "sb2", "B", tok, 1010, NULL), -ESTALE);
	/* handoff: owner releases, the waiter takes a fresh lock without waiter */
	assert_int_equal(locks_release(L, "sb2", "A", tok), 0);
	assert_int_equal(locks_renew(L, "sb2", "A", tok, 1011, NULL), -ESTALE);
	assert_int_equal(locks_acquire(L, "sb2", "B", 30, 1012, NULL, &tok), 0);
	assert_int_equal(locks_read(L, "sb2", &l), 0);
	assert_string_equal(l.owner, "B");
	assert_string_equal(l.waiter, "");
	assert_int_equal(locks_release(L, "sb2", "B", tok), 0);
}

static void test_takeover_after_ttl(void **state)
{
	(void)state;
	struct lock_info l;

	uint64_t ta;

	assert_int_equal(locks_acquire(L, "sb3", "A", 30, 1000, NULL, &ta), 0);
	assert_int_equal(locks_add_waiter(L, "sb3", "B"), 0);
	assert_int_equal(locks_acquire(L, "sb3", "B", 30, 1030, NULL, &tok), -EBUSY);
	assert_false(locks_expired(&(struct lock_info){ .timestamp = 1000 }, 30, 1030));
	assert_true(locks_expired(&(struct lock_info){ .timestamp = 1000 }, 30, 1031));
	assert_int_equal(locks_acquire(L, "sb3", "B", 30, 1031, NULL, &tok), 0);
	assert_int_equal(locks_read(L, "sb3", &l), 0);
	assert_string_equal(l.owner, "B");
	assert_int_equal(l.timestamp, 1031);
	/* the old owner has lost it */
	assert_int_equal(locks_renew(L, "sb3", "A", ta, 1032, NULL), -ESTALE);
	assert_int_equal(locks_release(L, "sb3", "A", ta), 0);
	assert_int_equal(locks_read(L, "sb3", &l), 0);
	assert_string_equal(l.owner, "B");
	assert_int_equal(locks_release(L, "sb3", "B", tok), 0);
	assert_int_equal(count_entries(), 1); /* the token counter outlives the lock */
}

static void test_garbage_lock(void **state)
{
	(void)state;
	struct lock_info l;
	int fd = openat(dfd, "sb4.lock", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "{not json", 9), 9);
	close(fd);
	assert_int_equal(locks_read(L, "sb4", &l), -EBADMSG);
	/* an unreadable lock counts as stale and is replaced */
	assert_int_equal(locks_acquire(L, "sb4", "A", 30, 1000, NULL, &tok), 0);
	assert_int_equal(locks_read(L, "sb4", &l), 0);
	assert_string_equal(l.owner, "A");
	assert_int_equal(locks_release(L, "sb4", "A", tok), 0);
	assert_int_equal(count_entries(), 1); /* the token counter outlives the lock */
}

/* Each generation gets a bigger token, across release and takeover alike. */
static void test_tokens_grow(void **state)
{
	(void)state;
	struct lock_info l;
	uint64_t t1, t2, t3;

	assert_int_equal(locks_acquire(L, "sb5", "A", 30, 1000, NULL, &t1), 0);
	assert_int_equal(locks_read(L, "sb5", &l), 0);
	assert_int_equal(l.token, t1);
	assert_int_equal(locks_release(L, "sb5", "A", t1), 0);
	assert_int_equal(locks_acquire(L, "sb5", "B", 30, 1001, NULL, &t2), 0);
	assert_true(t2 > t1);
	/* B dies; C takes the stale lock over even if the counter file is lost */
	assert_int_equal(unlinkat(dfd, "sb5.gen", 0), 0);
	assert_int_equal(locks_acquire(L, "sb5", "C", 30, 1100, NULL, &t3), 0);
	assert_true(t3 > t2);
	assert_int_equal(locks_renew(L, "sb5", "B", t2, 1101, NULL), -ESTALE);
	assert_int_equal(locks_renew(L, "sb5", "C", t3, 1101, NULL), 0);
	assert_int_equal(locks_release(L, "sb5", "C", t3), 0);
}

/* The fence: a holder whose generation was replaced cannot write `latest`,
 * not even when the new holder has the same name (a restarted instance). */
static void test_stale_token_cannot_write(void **state)
{
	(void)state;
	_cleanup_free_ char *text = NULL;
	uint64_t old, cur;

	assert_int_equal(locks_acquire(L, "sb6", "A", 30, 1000, NULL, &old), 0);
	assert_int_equal(locks_write_fenced(L, "sb6", "A", old, dfd, "latest", "img1", 4), 0);
	/* A's lease lapses (no renewal for ttl); B takes over */
	assert_int_equal(locks_acquire(L, "sb6", "B", 30, 1031, NULL, &cur), 0);
	assert_int_equal(locks_check(L, "sb6", "A", old), -ESTALE);
	assert_int_equal(locks_write_fenced(L, "sb6", "A", old, dfd, "latest", "img-stale", 9), -ESTALE);
	assert_int_equal(read_file_at(dfd, "latest", 64, &text, NULL), 0);
	assert_string_equal(text, "img1");
	assert_int_equal(locks_write_fenced(L, "sb6", "B", cur, dfd, "latest", "img2", 4), 0);
	/* A's renewal, blocked on the volume, lands late over B's lock: the older
	 * token does not win; B's fence holds and B's next renewal puts its lock back */
	_cleanup_free_ char *late = NULL;
	assert_true(asprintf(&late, "{\"owner\":\"A\",\"timestamp\":1030,\"token\":%llu}", (unsigned long long)old) >
		    0);
	int fd = openat(dfd, "sb6.lock", O_WRONLY | O_TRUNC | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, late, strlen(late)), (ssize_t)strlen(late));
	close(fd);
	assert_int_equal(locks_check(L, "sb6", "A", old), -ESTALE);
	assert_int_equal(locks_check(L, "sb6", "B", cur), 0);
	/* and A, giving up, does not remove the lock its late write named it in:
	 * a newer generation was issued, so it is B's */
	assert_int_equal(locks_release(L, "sb6", "A", old), 0);
	assert_int_equal(locks_check(L, "sb6", "B", cur), 0);
	assert_int_equal(locks_renew(L, "sb6", "B", cur, 1033, NULL), 0);
	struct lock_info l;
	assert_int_equal(locks_read(L, "sb6", &l), 0);
	assert_string_equal(l.owner, "B");
	assert_int_equal(l.token, cur);
	/* B hands back to A: A's new generation writes, its old token still cannot */
	assert_int_equal(locks_release(L, "sb6", "B", cur), 0);
	assert_int_equal(locks_acquire(L, "sb6", "A", 30, 1040, NULL, &cur), 0);
	assert_true(cur > old);
	assert_int_equal(locks_write_fenced(L, "sb6", "A", old, dfd, "latest", "img-stale", 9), -ESTALE);
	assert_int_equal(locks_write_fenced(L, "sb6", "A", cur, dfd, "latest", "img3", 4), 0);
	/* a restarted A with its old token leaves its new generation alone */
	assert_int_equal(locks_release(L, "sb6", "A", old), 0);
	assert_int_equal(locks_check(L, "sb6", "A", cur), 0);
	assert_int_equal(locks_release(L, "sb6", "A", cur), 0);
	/* released: nobody's token writes */
	assert_int_equal(locks_write_fenced(L, "sb6", "A", cur, dfd, "latest", "img-stale", 9), -ESTALE);
	unlinkat(dfd, "latest", 0);
}

/* O_CREAT|O_EXCL locks (no link()): same contention rules. */
static void test_excl_method(void **state)
{
	(void)state;
	struct locks ex = { .ops = &locks_volume_ops, .fd = dfd, .method = LOCKS_EXCL };
	struct lock_info l;
	uint64_t t;
	int fd;

	assert_int_equal(locks_acquire(&ex, "sb7", "A", 30, 1000, NULL, &t), 0);
	assert_int_equal(locks_acquire(&ex, "sb7", "B", 30, 1010, &l, &t), -EBUSY);
	assert_string_equal(l.owner, "A");
	assert_int_equal(locks_release(&ex, "sb7", "A", t), 0);
	/* an empty lock just created by someone else counts as held, not stale */
	fd = openat(dfd, "sb7.lock", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(locks_acquire(&ex, "sb7", "B", 30, now_ms() / 1000, NULL, &t), -EBUSY);
	assert_int_equal(locks_acquire(&ex, "sb7", "B", 30, now_ms() / 1000 + 31, NULL, &t), 0);
	assert_int_equal(locks_release(&ex, "sb7", "B", t), 0);
}

static void test_probe(void **state)
{
	(void)state;
	ckpt_error err = { 0 };

	/* a local file system honours everything: link wins */
	assert_int_equal(locks_probe(dfd, &err), LOCKS_LINK);
	assert_int_equal(count_entries(), 0);
	assert_string_equal(locks_method_name(LOCKS_EXCL), "excl");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_acquire_contend_release, setup, teardown),
		cmocka_unit_test_setup_teardown(test_waiter_and_renew, setup, teardown),
		cmocka_unit_test_setup_teardown(test_takeover_after_ttl, setup, teardown),
		cmocka_unit_test_setup_teardown(test_garbage_lock, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tokens_grow, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stale_token_cannot_write, setup, teardown),
		cmocka_unit_test_setup_teardown(test_excl_method, setup, teardown),
		cmocka_unit_test_setup_teardown(test_probe, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
