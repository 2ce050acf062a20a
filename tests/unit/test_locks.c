/* test_locks.c: lock files: create, contention, waiter, renewal, takeover, release. */
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

static int setup(void **state)
{
	(void)state;
	assert_int_equal(testlib_mkdir(dir, "locks"), 0);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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

	assert_int_equal(locks_read(dfd, "sb1", &l), -ENOENT);
	assert_int_equal(locks_acquire(dfd, "sb1", "A", 30, 1000, NULL), 0);
	assert_int_equal(locks_read(dfd, "sb1", &l), 0);
	assert_string_equal(l.owner, "A");
	assert_int_equal(l.timestamp, 1000);
	assert_string_equal(l.waiter, "");
	assert_int_equal(count_entries(), 1); /* no temp files left */

	/* held and fresh: B is refused and told who holds it */
	memset(&l, 0, sizeof(l));
	assert_int_equal(locks_acquire(dfd, "sb1", "B", 30, 1010, &l), -EBUSY);
	assert_string_equal(l.owner, "A");
	/* re-acquire by the owner renews */
	assert_int_equal(locks_acquire(dfd, "sb1", "A", 30, 1020, NULL), 0);
	assert_int_equal(locks_read(dfd, "sb1", &l), 0);
	assert_int_equal(l.timestamp, 1020);

	/* release by a non-owner does nothing */
	assert_int_equal(locks_release(dfd, "sb1", "B"), 0);
	assert_int_equal(locks_read(dfd, "sb1", &l), 0);
	assert_int_equal(locks_release(dfd, "sb1", "A"), 0);
	assert_int_equal(locks_read(dfd, "sb1", &l), -ENOENT);
	assert_int_equal(locks_release(dfd, "sb1", "A"), 0);
	assert_int_equal(locks_acquire(dfd, "sb1", "B", 30, 1030, NULL), 0);
	assert_int_equal(locks_release(dfd, "sb1", "B"), 0);
	assert_int_equal(count_entries(), 0);
}

static void test_waiter_and_renew(void **state)
{
	(void)state;
	struct lock_info l;
	char waiter[LOCKS_NAME_MAX] = "x";

	assert_int_equal(locks_add_waiter(dfd, "sb2", "B"), -ENOENT);
	assert_int_equal(locks_acquire(dfd, "sb2", "A", 30, 1000, NULL), 0);
	assert_int_equal(locks_renew(dfd, "sb2", "A", 1005, waiter), 0);
	assert_string_equal(waiter, "");
	assert_int_equal(locks_add_waiter(dfd, "sb2", "B"), 0);
	assert_int_equal(locks_read(dfd, "sb2", &l), 0);
	assert_string_equal(l.owner, "A");
	assert_string_equal(l.waiter, "B");
	assert_int_equal(l.timestamp, 1005); /* a waiter does not renew */
	/* the owner sees the waiter at renewal, and keeps it in the file */
	assert_int_equal(locks_renew(dfd, "sb2", "A", 1010, waiter), 0);
	assert_string_equal(waiter, "B");
	assert_int_equal(locks_read(dfd, "sb2", &l), 0);
	assert_string_equal(l.waiter, "B");
	assert_int_equal(l.timestamp, 1010);
	/* renewal by someone else is refused */
	assert_int_equal(locks_renew(dfd, "sb2", "B", 1010, NULL), -ESTALE);
	/* handoff: owner releases, the waiter takes a fresh lock without waiter */
	assert_int_equal(locks_release(dfd, "sb2", "A"), 0);
	assert_int_equal(locks_renew(dfd, "sb2", "A", 1011, NULL), -ESTALE);
	assert_int_equal(locks_acquire(dfd, "sb2", "B", 30, 1012, NULL), 0);
	assert_int_equal(locks_read(dfd, "sb2", &l), 0);
	assert_string_equal(l.owner, "B");
	assert_string_equal(l.waiter, "");
	assert_int_equal(locks_release(dfd, "sb2", "B"), 0);
}

static void test_takeover_after_ttl(void **state)
{
	(void)state;
	struct lock_info l;

	assert_int_equal(locks_acquire(dfd, "sb3", "A", 30, 1000, NULL), 0);
	assert_int_equal(locks_add_waiter(dfd, "sb3", "B"), 0);
	assert_int_equal(locks_acquire(dfd, "sb3", "B", 30, 1030, NULL), -EBUSY);
	assert_false(locks_expired(&(struct lock_info){ .timestamp = 1000 }, 30, 1030));
	assert_true(locks_expired(&(struct lock_info){ .timestamp = 1000 }, 30, 1031));
	assert_int_equal(locks_acquire(dfd, "sb3", "B", 30, 1031, NULL), 0);
	assert_int_equal(locks_read(dfd, "sb3", &l), 0);
	assert_string_equal(l.owner, "B");
	assert_int_equal(l.timestamp, 1031);
	/* the old owner has lost it */
	assert_int_equal(locks_renew(dfd, "sb3", "A", 1032, NULL), -ESTALE);
	assert_int_equal(locks_release(dfd, "sb3", "A"), 0);
	assert_int_equal(locks_read(dfd, "sb3", &l), 0);
	assert_string_equal(l.owner, "B");
	assert_int_equal(locks_release(dfd, "sb3", "B"), 0);
	assert_int_equal(count_entries(), 0);
}

static void test_garbage_lock(void **state)
{
	(void)state;
	struct lock_info l;
	int fd = openat(dfd, "sb4.lock", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "{not json", 9), 9);
	close(fd);
	assert_int_equal(locks_read(dfd, "sb4", &l), -EBADMSG);
	/* an unreadable lock counts as stale and is replaced */
	assert_int_equal(locks_acquire(dfd, "sb4", "A", 30, 1000, NULL), 0);
	assert_int_equal(locks_read(dfd, "sb4", &l), 0);
	assert_string_equal(l.owner, "A");
	assert_int_equal(locks_release(dfd, "sb4", "A"), 0);
	assert_int_equal(count_entries(), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_acquire_contend_release, setup, teardown),
		cmocka_unit_test_setup_teardown(test_waiter_and_renew, setup, teardown),
		cmocka_unit_test_setup_teardown(test_takeover_after_ttl, setup, teardown),
		cmocka_unit_test_setup_teardown(test_garbage_lock, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
