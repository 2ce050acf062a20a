/* Unit tests of the look at every directory's own metadata that a delta's
 * frozen pass ends with (overlay_delta.c), begun apart on a thread when no
 * unit is frozen (overlay_delta_dir_look_start), and of the threads it runs
 * on (lib/beside.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/overlay/overlay_internal.h"
#include "lib/beside.h"
#include "testlib.h"

#define N_DIRS 300 /* over OVL_LOOK_APART: the look runs on a thread */

struct fixture {
	char dir[TESTLIB_DIR_LEN];
	int fd;
	struct ovl_delta_dirs dirs;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	char name[32];
	if (!f || testlib_mkdir(f->dir, "look") < 0)
		return -1;
	f->fd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	for (int i = 0; i < N_DIRS; i++) {
		snprintf(name, sizeof(name), "d%03d", i);
		if (mkdirat(f->fd, name, 0755) < 0)
			return -1;
	}
	/* what the last full layer said: here, the directories as they are */
	if (f->fd < 0 || overlay_delta_dirs_read(f->fd, &f->dirs) < 0 || f->dirs.n != N_DIRS + 1)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	overlay_delta_dirs_free(&f->dirs);
	close(f->fd);
	testlib_rmdir(f->dir);
	free(f);
	return 0;
}

static struct ovl_dmeta *dmeta(struct ovl_delta_dirs *d, const char *path)
{
	for (size_t i = 0; i < d->n; i++)
		if (!strcmp(d->v[i].path, path))
			return &d->v[i];
	fail_msg("%s is not listed", path);
	return NULL;
}

static size_t n_changed(const struct ovl_delta_dirs *d)
{
	size_t n = 0;
	for (size_t i = 0; i < d->n; i++)
		n += d->v[i].changed;
	return n;
}

/* A mode and an mtime changed before the look began are found by its
 * thread; a directory listed after it began (the first pass found it) is
 * looked at by the caller: its own change is found too. */
static void test_look_begun_apart_finds_changes(void **state)
{
	struct fixture *f = *state;
	struct timespec ts[2] = { { 0, UTIME_OMIT }, { 1000000, 0 } };
	struct stat st;
	assert_int_equal(fchmodat(f->fd, "d007", 0700, 0), 0);
	assert_int_equal(utimensat(f->fd, "d123", ts, 0), 0);
	assert_int_equal(mkdirat(f->fd, "late", 0755), 0); /* the top's mtime moves */
	assert_int_equal(fstatat(f->fd, "late", &st, 0), 0);
	overlay_delta_dir_look_start(f->fd, &f->dirs);
	assert_non_null(f->dirs.look); /* on a thread: 301 directories */

	assert_int_equal(overlay_delta_dirs_add(&f->dirs, "late", &st), 0);
	for (int i = 0; i < 600; i++) { /* grown past its capacity meanwhile: the look keeps its own list */
		char name[32];
		snprintf(name, sizeof(name), "x%03d", i);
		assert_int_equal(overlay_delta_dirs_add(&f->dirs, name, &st), 0);
	}
	assert_int_equal(fchmodat(f->fd, "late", 0711, 0), 0);

	overlay_delta_dir_look(f->fd, &f->dirs);
	assert_null(f->dirs.look);
	assert_true(f->dirs.looked);
	/* begun on its thread (which may find every directory taken by the
	 * caller when it gets a CPU late, and time 0 us: seen with make check
	 * beside) */
	assert_true(f->dirs.look_apart);
	assert_true(dmeta(&f->dirs, "d007")->changed);
	assert_int_equal(dmeta(&f->dirs, "d007")->now.mode & 07777, 0700);
	assert_true(dmeta(&f->dirs, "d123")->changed);
	assert_int_equal(dmeta(&f->dirs, "d123")->now.mtim.tv_sec, 1000000);
	assert_true(dmeta(&f->dirs, "late")->changed);
	assert_int_equal(dmeta(&f->dirs, "late")->now.mode & 07777, 0711);
	assert_true(dmeta(&f->dirs, "")->changed);
	/* the x* are not there: gone, so not changed (their parent's event says) */
	assert_int_equal(n_changed(&f->dirs), 4);
	assert_false(dmeta(&f->dirs, "d008")->changed);
}

/* With no look begun, the look is the caller's, all of it; a look begun
 * and begun again drops the first; freeing the list waits for one still
 * running (ASan and valgrind see the rest). */
static void test_look_here_and_dropped(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(fchmodat(f->fd, "d200", 0750, 0), 0);
	overlay_delta_dir_look(f->fd, &f->dirs);
	assert_int_equal(f->dirs.look_us, 0);
	assert_int_equal(n_changed(&f->dirs), 1);
	assert_true(dmeta(&f->dirs, "d200")->changed);

	overlay_delta_dir_look_start(f->fd, &f->dirs);
	overlay_delta_dir_look_start(f->fd, &f->dirs);
	assert_non_null(f->dirs.look);
	overlay_delta_dirs_free(&f->dirs);
	assert_null(f->dirs.look);
	assert_int_equal(f->dirs.n, 0);
}

/* Fewer directories than a thread pays for: none is started, and the
 * frozen pass's look is the caller's. */
static void test_look_of_few_stays_here(void **state)
{
	(void)state;
	struct ovl_delta_dirs d = { 0 };
	struct stat st;
	assert_int_equal(stat("/", &st), 0);
	assert_int_equal(overlay_delta_dirs_add(&d, "", &st), 0);
	int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	overlay_delta_dir_look_start(fd, &d);
	assert_null(d.look);
	overlay_delta_dir_look(fd, &d);
	assert_false(d.v[0].changed);
	close(fd);
	overlay_delta_dirs_free(&d);
}

struct work {
	pthread_t self;
	int cpu;
	int spawn_cpu;
	int done;
};

static void *work_fn(void *arg)
{
	struct work *w = arg;
	w->self = pthread_self();
	w->cpu = sched_getcpu();
	usleep(20000);
	w->done = 1;
	return NULL;
}

/* beside: the work is done when join returns; the thread is kept and
 * used again; two at once get two threads; with more than one CPU the
 * work starts on another CPU than the caller's at the hand-off. */
static void test_beside_threads(void **state)
{
	(void)state;
	struct beside a = { 0 }, b = { 0 };
	struct work wa = { 0 }, wb = { 0 };
	wa.spawn_cpu = sched_getcpu();
	assert_true(beside_spawn(&a, work_fn, &wa));
	bool hinted = a.hinted;
	beside_join(&a);
	assert_int_equal(wa.done, 1);
	if (hinted)
		assert_int_not_equal(wa.cpu, wa.spawn_cpu);
	else
		print_message("one CPU here (or no affinity): the other-CPU hint is not checked\n");
	pthread_t first = wa.self;

	memset(&wa, 0, sizeof(wa));
	assert_true(beside_spawn(&a, work_fn, &wa));
	assert_true(beside_spawn(&b, work_fn, &wb));
	beside_join(&b);
	beside_join(&a);
	assert_int_equal(wa.done + wb.done, 2);
	assert_true(pthread_equal(wa.self, first) || pthread_equal(wb.self, first)); /* kept */
	assert_false(pthread_equal(wa.self, wb.self));
	beside_join(&a); /* nothing to wait for */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_look_begun_apart_finds_changes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_look_here_and_dropped, setup, teardown),
		cmocka_unit_test(test_look_of_few_stays_here),
		cmocka_unit_test(test_beside_threads),
	};
	return cmocka_run_group_tests_name("overlay_look", tests, NULL, NULL);
}
