/* test_overlay.c: the overlay backend through its ops table with real mounts:
 * restore of deletes/renames/replaced dirs, adopt after restart and after a
 * "reboot", garbage collection, escaping, and a 500-generation chain. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "config.h"
#include "backend/overlay/overlay_mount.h"
#include "backend/overlay/overlay_probe.h"
#include "testlib.h"

static char dir[TESTLIB_DIR_LEN], root[96], state[96];
static char *roots[1];
static struct config cfg;
static struct backend_ctx ctx;

static int setup(void **st)
{
	(void)st;
	assert_int_equal(testlib_mkdir(dir, "overlay"), 0);
	snprintf(root, sizeof(root), "%s/root", dir);
	snprintf(state, sizeof(state), "%s/state", dir);
	mkdir(root, 0755);
	mkdir(state, 0700);
	config_defaults(&cfg);
	roots[0] = root;
	ctx = (struct backend_ctx){
		.flatten_depth = cfg.flatten_depth, .state_dir = state, .roots = roots, .n_roots = 1
	};
	ctx.state_fd = open(state, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return 0;
}

static int teardown(void **st)
{
	(void)st;
	close(ctx.state_fd);
	testlib_rmdir(dir);
	config_free(&cfg);
	return 0;
}

static void put(const char *rel, const char *data)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	FILE *f = fopen(p, "we");
	assert_non_null(f);
	fputs(data, f);
	fclose(f);
}

/* Up to len bytes of rel into buf; -1 when it cannot be opened. */
static ssize_t read_start(const char *rel, char *buf, size_t len)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	FILE *f = fopen(p, "re");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, len, f);
	fclose(f);
	return (ssize_t)n;
}

static bool has(const char *rel, const char *data)
{
	char buf[256];
	ssize_t n = read_start(rel, buf, sizeof(buf) - 1);
	if (n < 0)
		return false;
	buf[n] = 0;
	return !data || !strcmp(buf, data);
}

/* Whether rel begins with data. */
static bool has_start(const char *rel, const char *data)
{
	char buf[64];
	size_t len = strlen(data);
	assert_true(len <= sizeof(buf));
	return read_start(rel, buf, len) == (ssize_t)len && !memcmp(buf, data, len);
}

static const struct backend_ops *B = &backend_overlay_ops;

static void create(void *st, const char *id, json_t **data)
{
	ckpt_error err = { 0 };
	uint64_t size = 0;
	int r = B->create(st, id, data, &size, NULL, &err);
	if (r < 0)
		fail_msg("create: %s", err.msg);
}

static void restore(void *st, const char *id, json_t *data)
{
	ckpt_error err = { 0 };
	struct restore_details details = { 0 };
	int r = B->restore(st, id, data, &details, NULL, &err);
	restore_details_free(&details);
	if (r < 0)
		fail_msg("restore: %s", err.msg);
}

static void *open_backend(void)
{
	void *st = NULL;
	ckpt_error err = { 0 };
	if (B->open(&ctx, &st, &err) < 0)
		fail_msg("open: %s", err.msg);
	return st;
}

static void test_restore_changes(void **s)
{
	(void)s;
	char p[256];
	mkdir(strcat(strcpy(p, root), "/dir"), 0755);
	put("dir/inner", "in");
	put("lower", "L");
	put("moved", "M");
	ckpt_error err = { 0 };
	assert_int_equal(B->probe(&ctx, &err), 0);
	void *st = open_backend();
	json_t *d1 = NULL;
	put("upper", "U");
	create(st, "cp_000000000000000000000001", &d1);
	snprintf(p, sizeof(p), "%s/lower", root);
	assert_int_equal(unlink(p), 0);
	char q[256];
	snprintf(p, sizeof(p), "%s/moved", root);
	snprintf(q, sizeof(q), "%s/moved2", root);
	assert_int_equal(rename(p, q), 0);
	int fd = open(root, O_RDONLY | O_DIRECTORY);
	assert_int_equal(rm_rf_at(fd, "dir"), 0);
	close(fd);
	put("dir", "now a file");
	put("upper", "U2");
	restore(st, "cp_000000000000000000000001", d1);
	assert_true(has("lower", "L"));
	assert_true(has("moved", "M"));
	assert_false(has("moved2", NULL));
	assert_true(has("dir/inner", "in"));
	assert_true(has("upper", "U"));
	/* reset: back to the adopted contents */
	struct restore_details details = { 0 };
	assert_int_equal(B->reset(st, &details, &err), 0);
	restore_details_free(&details);
	assert_false(has("upper", NULL));
	assert_true(has("lower", "L"));
	B->close(st, false);
	json_decref(d1);
}

static void test_adopt_restart_and_reboot(void **s)
{
	(void)s;
	put("orig", "o");
	void *st = open_backend();
	put("written", "w");
	json_t *d = NULL;
	create(st, "cp_000000000000000000000002", &d);
	put("after", "a");
	B->close(st, false);
	assert_true(has("after", "a")); /* still mounted */
	st = open_backend();            /* re-adopt without remounting */
	assert_true(has("after", "a"));
	put("more", "m");
	B->close(st, false);
	/* reboot: every mount gone, the upper stays on disk */
	testlib_detach_mounts(dir);
	assert_false(has("after", NULL));
	st = open_backend();
	assert_true(has("after", "a"));
	assert_true(has("more", "m"));
	assert_true(has("orig", "o"));
	const char *ids[] = { "cp_000000000000000000000002" };
	json_t *data[] = { d };
	ckpt_error err = { 0 };
	assert_int_equal(B->recover(st, ids, data, 1, &err), 0);
	restore(st, ids[0], d);
	assert_true(has("written", "w"));
	assert_false(has("after", NULL));
	B->close(st, true);
	assert_false(has("written", NULL)); /* unmounted on exit */
	json_decref(d);
}

static int count_layers(void)
{
	char p[256];
	int n = 0;
	snprintf(p, sizeof(p), "%s/overlay/r", state);
	DIR *d = opendir(p);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char l[1024];
		snprintf(l, sizeof(l), "%s/%s/l", p, de->d_name);
		DIR *ld = opendir(l);
		struct dirent *e;
		while (ld && (e = readdir(ld)))
			n += e->d_name[0] != '.';
		if (ld)
			closedir(ld);
	}
	if (d)
		closedir(d);
	return n;
}

static void test_remove_gc(void **s)
{
	(void)s;
	void *st = open_backend();
	json_t *d1 = NULL, *d2 = NULL;
	ckpt_error err = { 0 };
	put("a", "1");
	create(st, "cp_000000000000000000000003", &d1);
	put("a", "2");
	create(st, "cp_000000000000000000000004", &d2);
	assert_int_equal(count_layers(), 2);
	assert_int_equal(B->remove(st, "cp_000000000000000000000003", d1, &err), 0);
	B->maintain(st);
	assert_int_equal(count_layers(), 1);
	/* recover drops what no record names (a create that was never acknowledged) */
	const char *none[] = { NULL };
	assert_int_equal(B->recover(st, none, NULL, 0, &err), 0);
	assert_int_equal(count_layers(), 0);
	B->close(st, true);
	json_decref(d1);
	json_decref(d2);
}

static void test_escape(void **s)
{
	(void)s;
	char *e = overlay_mount_escape("a,b:c\\d");
	assert_string_equal(e, "a\\,b\\:c\\\\d");
	free(e);
}

/* 500 restore-then-create generations: flattening keeps the chain mountable. */
static void test_chain_500(void **s)
{
	(void)s;
	void *st = open_backend();
	json_t *prev = NULL;
	char id[32], prev_id[32] = "", name[32];
	int64_t t0 = mono_ms();
	for (int i = 0; i < 500; i++) {
		if (prev)
			restore(st, prev_id, prev);
		snprintf(name, sizeof(name), "g%03d", i);
		put(name, name);
		snprintf(id, sizeof(id), "cp_%024x", i + 100);
		json_t *d = NULL;
		create(st, id, &d);
		json_decref(prev);
		prev = d;
		strcpy(prev_id, id);
		B->maintain(st);
	}
	restore(st, prev_id, prev);
	for (int i = 0; i < 500; i += 37) {
		snprintf(name, sizeof(name), "g%03d", i);
		assert_true(has(name, name));
	}
	assert_true(has("g499", "g499"));
	print_message("500 generations in %lld ms\n", (long long)(mono_ms() - t0));
	B->close(st, true);
	json_decref(prev);
}

/* The fallback for kernels without "lowerdir+": one option string, with
 * short relative names from a child in the layer dir once absolute paths
 * would not fit a page. */
static void test_legacy_many_layers(void **s)
{
	(void)s;
	char p[256], names[300][16];
	const char *lowers[301];
	snprintf(p, sizeof(p), "%s/lg", state);
	mkdir(p, 0700);
	int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	mkdirat(fd, "l", 0700);
	for (int i = 0; i < 300; i++) {
		snprintf(names[i], sizeof(names[i]), "l/%08x", i);
		mkdirat(fd, names[i], 0755);
		lowers[i] = names[i];
	}
	int f = openat(fd, "l/0000012b/bottom", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	close(f);
	mkdirat(fd, "u", 0755);
	mkdirat(fd, "w", 0700);
	lowers[300] = "u"; /* any dir as the last lower */
	mkdirat(fd, "u2", 0755);
	struct overlay_spec sp = {
		.target = root, .dir = p, .dir_fd = fd, .lowers = lowers, .n_lowers = 300, .upper = "u2", .work = "w"
	};
	ckpt_error err = { 0 };
	if (overlay_mount_legacy(&sp, &err) < 0)
		fail_msg("legacy mount: %s", err.msg);
	assert_true(has("bottom", NULL));
	assert_int_equal(umount2(root, 0), 0);
	close(fd);
}

/* As root on this kernel: redirect_dir=on, and the test tree is gone. */
static void test_probe_picks_kernel_redirect_dir(void **s)
{
	(void)s;
	struct overlay_opts o = { .kind = OVERLAY_GVISOR };
	ckpt_error err = { 0 };
	if (overlay_probe(state, &o, &err) < 0)
		fail_msg("probe: %s", err.msg);
	assert_int_equal(o.kind, OVERLAY_KERNEL);
	assert_true(o.redirect_dir);
	assert_false(o.userxattr);
	char p[128];
	snprintf(p, sizeof(p), "%s/overlay", state);
	DIR *d = opendir(p);
	assert_non_null(d);
	for (struct dirent *de; (de = readdir(d));)
		assert_true(strncmp(de->d_name, ".probe-", 7) != 0);
	closedir(d);
}

/* Why userxattr is never chosen: the kernel refuses redirect_dir=on with
 * it, and a directory of the lower then cannot be renamed. */
static void test_userxattr_renames_give_exdev(void **s)
{
	(void)s;
	char p[256], m[300], a[320], b[320];
	snprintf(p, sizeof(p), "%s/ux", state);
	mkdir(p, 0700);
	int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	mkdirat(fd, "l", 0755);
	mkdirat(fd, "l/d", 0755);
	mkdirat(fd, "u", 0755);
	mkdirat(fd, "w", 0700);
	const char *lowers[] = { "l" };
	struct overlay_opts ux = { .kind = OVERLAY_KERNEL, .userxattr = true };
	struct overlay_spec sp = { .opts = &ux,
				   .target = root,
				   .dir = p,
				   .dir_fd = fd,
				   .lowers = lowers,
				   .n_lowers = 1,
				   .upper = "u",
				   .work = "w" };
	ckpt_error err = { 0 };
	char both[1024];
	snprintf(both, sizeof(both), "lowerdir=%s/l,upperdir=%s/u,workdir=%s/w,userxattr,redirect_dir=on", p, p, p);
	assert_int_equal(mount("overlay", root, "overlay", 0, both), -1);
	assert_int_equal(errno, EINVAL);
	if (overlay_mount(&sp, &err) < 0)
		fail_msg("userxattr mount: %s", err.msg);
	snprintf(m, sizeof(m), "%s", root);
	snprintf(a, sizeof(a), "%s/d", m);
	snprintf(b, sizeof(b), "%s/e", m);
	assert_int_equal(rename(a, b), -1);
	assert_int_equal(errno, EXDEV);
	assert_int_equal(umount2(root, 0), 0);
	close(fd);
}

/* put from another process: the tracker takes its own process's writes
 * for ckptd's and does not hear them. */
static void put_apart(const char *rel, const char *data)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		put(rel, data);
		_exit(0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void rename_apart(const char *a, const char *b)
{
	char pa[256], pb[256];
	snprintf(pa, sizeof(pa), "%s/%s", root, a);
	snprintf(pb, sizeof(pb), "%s/%s", root, b);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(rename(pa, pb) < 0);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A create as the engine makes it: the first pass (units: one will be
 * frozen after it), then between (NULL: nothing), the capture, the rest. */
static json_t *create_passes(void *st, const char *id, bool units, void (*between)(void))
{
	ckpt_error err = { 0 };
	json_t *data = NULL;
	uint64_t size = 0;
	if (B->precopy(st, units, NULL, &err) < 0)
		fail_msg("precopy: %s", err.msg);
	if (between)
		between();
	if (B->capture->capture(st, NULL, &err) < 0 || B->create(st, id, &data, &size, NULL, &err) < 0)
		fail_msg("create: %s", err.msg);
	return data;
}

/* The layers of the checkpoint's one root: {roots: [{path, layers}]}. */
static size_t chain_len(json_t *data)
{
	return json_array_size(json_object_get(json_array_get(json_object_get(data, "roots"), 0), "layers"));
}

static size_t first_passes(void)
{
	char pat[200];
	glob_t g;
	snprintf(pat, sizeof(pat), "%s/overlay/r/*/l/.pre-*", state);
	size_t n = glob(pat, GLOB_PERIOD, NULL, &g) == 0 ? g.gl_pathc : 0;
	globfree(&g);
	return n;
}

static char *map_at; /* a file of the root mapped shared and writable, or NULL */
static size_t map_len;

/* Written through a mapping made now: no event says so. */
static void map_and_write(void)
{
	char p[160];
	snprintf(p, sizeof(p), "%s/m/mapped", root);
	int fd = open(p, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	map_len = 4096;
	map_at = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(map_at != MAP_FAILED);
	close(fd);
	memcpy(map_at, "written ", 8);
}

static void unmap(void)
{
	munmap(map_at, map_len);
	map_at = NULL;
}

/* Deltas made both ways: with a first pass when units will be frozen
 * (their mapping written between the passes is the frozen pass's /proc
 * scan's to find), and in one pass when none will (no l/.pre-* is made);
 * each checkpoint restores to what was written. */
static void test_delta_passes(void **s)
{
	(void)s;
	ctx.track_changes = TRACK_ALWAYS;
	ctx.track_check = true;
	char p[160];
	snprintf(p, sizeof(p), "%s/m", root);
	mkdir(p, 0755);
	put("m/mapped", "");
	snprintf(p, sizeof(p), "%s/m/mapped", root);
	assert_int_equal(truncate(p, 4096), 0);
	void *st = open_backend();
	json_t *full = create_passes(st, "full", true, NULL);
	put_apart("a.txt", "one");
	json_t *two = create_passes(st, "two", true, map_and_write);
	unmap();
	assert_int_equal(chain_len(two), chain_len(full) + 1); /* a delta over the full layer */
	put_apart("a.txt", "three");
	json_t *one = create_passes(st, "one", false, NULL);
	assert_int_equal(first_passes(), 0);
	assert_int_equal(chain_len(one), chain_len(two) + 1);
	map_and_write();
	memcpy(map_at, "again   ", 8);
	put_apart("a.txt", "four");
	json_t *again = create_passes(st, "again", false, NULL); /* mapped all along */
	unmap();
	assert_int_equal(chain_len(again), chain_len(one) + 1);
	/* a base directory renamed: no delta can say it (a redirect); the
	 * one pass gives way to a first pass, tracked, so deltas follow */
	rename_apart("m", "moved");
	json_t *moved = create_passes(st, "moved", false, NULL);
	assert_true(chain_len(moved) <= chain_len(again));
	put_apart("a.txt", "after");
	json_t *after = create_passes(st, "after", false, NULL);
	assert_int_equal(chain_len(after), chain_len(moved) + 1);
	json_decref(moved), json_decref(after);
	snprintf(p, sizeof(p), "%s/m/mapped", root);
	put_apart("a.txt", "five");
	restore(st, "two", two);
	assert_true(has("a.txt", "one"));
	assert_true(has_start("m/mapped", "written "));
	restore(st, "again", again);
	assert_true(has("a.txt", "four"));
	assert_true(has_start("m/mapped", "again   "));
	restore(st, "one", one);
	assert_true(has("a.txt", "three"));
	json_decref(full), json_decref(two), json_decref(one), json_decref(again);
	B->close(st, true);
	ctx.track_changes = TRACK_AUTO;
	ctx.track_check = false;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_escape),
		cmocka_unit_test_setup_teardown(test_probe_picks_kernel_redirect_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(test_userxattr_renames_give_exdev, setup, teardown),
		cmocka_unit_test_setup_teardown(test_restore_changes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_adopt_restart_and_reboot, setup, teardown),
		cmocka_unit_test_setup_teardown(test_remove_gc, setup, teardown),
		cmocka_unit_test_setup_teardown(test_legacy_many_layers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_500, setup, teardown),
		cmocka_unit_test_setup_teardown(test_delta_passes, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
