/* test_backend_tar.c: the tar backend through its ops table on temp dirs. */
#pragma GCC diagnostic ignored "-Wformat-truncation" /* test paths are short */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <archive.h>
#include <archive_entry.h>
#include <limits.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include "backend/backend.h"
#include "config.h"
#include "testlib.h"

struct fx {
	char base[TESTLIB_DIR_LEN];
	char state[PATH_MAX];
	char *roots[2];
	size_t n_roots;
	struct config cfg;
	struct backend_ctx ctx;
	void *st;
};

/* ---- tree helpers ---- */

static void put(const char *dir, const char *rel, const char *content, mode_t mode)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

static void mk(const char *dir, const char *rel, mode_t mode)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	assert_int_equal(mkdir(p, mode), 0);
	assert_int_equal(chmod(p, mode), 0);
}

static char *at(const char *dir, const char *rel)
{
	static char p[4][PATH_MAX];
	static int i;
	i = (i + 1) % 4;
	snprintf(p[i], sizeof(p[i]), "%s/%s", dir, rel);
	return p[i];
}

static void set_mtime(const char *path, time_t sec, long nsec)
{
	struct timespec ts[2] = { { sec, nsec }, { sec, nsec } };
	assert_int_equal(utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW), 0);
}

static void make_full_tree(const char *r)
{
	put(r, "f1", "hello world\n", 0644);
	put(r, "f2", "secret", 0600);
	assert_int_equal(chown(at(r, "f2"), 1234, 5678), 0);
	put(r, "exec", "#!/bin/sh\necho hi\n", 04755);
	put(r, "100% we ird\tna\nme", "odd name", 0640);
	mk(r, "d1", 0750);
	mk(r, "d1/nested", 0755);
	mk(r, "d1/nested/deep", 0711);
	put(r, "d1/nested/deep/file", "deep", 0444);
	mk(r, "empty", 0700);
	mk(r, "d2", 0755);
	put(r, "d2/inner", "inner", 0644);
	assert_int_equal(symlink("../f1", at(r, "d1/link")), 0);
	assert_int_equal(symlink("/etc/passwd", at(r, "abs")), 0);
	assert_int_equal(symlink("nowhere", at(r, "dangling")), 0);
	put(r, "hard1", "shared inode", 0640);
	assert_int_equal(link(at(r, "hard1"), at(r, "d1/hard2")), 0);
	assert_int_equal(link(at(r, "hard1"), at(r, "hard3")), 0);
	assert_int_equal(mkfifo(at(r, "fifo"), 0640), 0);
	assert_int_equal(mknod(at(r, "null"), S_IFCHR | 0666, makedev(1, 3)), 0);
	assert_int_equal(setxattr(at(r, "f1"), "user.test", "v1", 2, 0), 0);
	assert_int_equal(setxattr(at(r, "d1"), "user.dir", "dv", 2, 0), 0);
	assert_int_equal(setxattr(r, "user.rootx", "rv", 2, 0), 0);
	lsetxattr(at(r, "abs"), "trusted.sym", "sv", 2, 0);
	int fd = open(at(r, "sparse"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, "head", 4, 0), 4);
	assert_int_equal(pwrite(fd, "mid", 3, 4 << 20), 3);
	assert_int_equal(ftruncate(fd, 8 << 20), 0);
	close(fd);
	set_mtime(at(r, "f1"), 1000000000, 123456789);
	set_mtime(at(r, "d1/link"), 1000000001, 5);
	set_mtime(at(r, "d1/nested/deep"), 1000000002, 7);
	set_mtime(at(r, "d1"), 1000000003, 9);
	assert_int_equal(chmod(r, 0751), 0);
	set_mtime(r, 1000000004, 11);
}

/* ---- snapshot of a tree as sorted text lines ---- */

struct lines {
	char **v;
	size_t n;
};

static uint64_t fnv_file(int dirfd, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	char buf[65536];
	ssize_t n;
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	assert_true(fd >= 0);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		for (ssize_t i = 0; i < n; i++)
			h = (h ^ (unsigned char)buf[i]) * 0x100000001b3ULL;
	close(fd);
	return h;
}

static void xattr_text(const char *path, char *out, size_t len)
{
	char list[4096], val[256];
	ssize_t n = llistxattr(path, list, sizeof(list));
	out[0] = '\0';
	/* listxattr order is stable enough for one inode; sort by concatenating in order. */
	for (ssize_t off = 0; n > 0 && off < n; off += (ssize_t)strlen(list + off) + 1) {
		ssize_t v = lgetxattr(path, list + off, val, sizeof(val) - 1);
		val[v < 0 ? 0 : v] = '\0';
		size_t l = strlen(out);
		snprintf(out + l, len - l, "%s=%s;", list + off, val);
	}
}

static void snap_dir(struct lines *L, const char *top, const char *rel)
{
	char dpath[PATH_MAX];
	snprintf(dpath, sizeof(dpath), "%s%s%s", top, rel[0] ? "/" : "", rel);
	DIR *d = opendir(dpath);
	struct dirent *de;
	assert_non_null(d);
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		char relp[PATH_MAX], full[PATH_MAX], extra[PATH_MAX] = "", xa[4096];
		struct stat st;
		snprintf(relp, sizeof(relp), "%s%s%s", rel, rel[0] ? "/" : "", de->d_name);
		snprintf(full, sizeof(full), "%s/%s", top, relp);
		assert_int_equal(lstat(full, &st), 0);
		if (S_ISREG(st.st_mode))
			snprintf(extra, sizeof(extra), "h=%016llx blocks=%lld",
				 (unsigned long long)fnv_file(dirfd(d), de->d_name),
				 (long long)(st.st_size > (1 << 20) ? st.st_blocks < 4096 : 0));
		if (S_ISLNK(st.st_mode)) {
			ssize_t n = readlink(full, extra, sizeof(extra) - 1);
			extra[n < 0 ? 0 : n] = '\0';
		}
		xattr_text(full, xa, sizeof(xa));
		char *line;
		assert_true(asprintf(&line, "%s|%o|%u:%u|%lld|%lld.%09ld|n%lu|r%lu|%s|%s", relp, st.st_mode, st.st_uid,
				     st.st_gid, (long long)(S_ISREG(st.st_mode) ? st.st_size : 0),
				     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, (unsigned long)st.st_nlink,
				     (unsigned long)st.st_rdev, extra, xa) > 0);
		L->v = realloc(L->v, (L->n + 1) * sizeof(char *));
		L->v[L->n++] = line;
		if (S_ISDIR(st.st_mode))
			snap_dir(L, top, relp);
	}
	closedir(d);
}

static int cmpstr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *snapshot(const char *top)
{
	struct lines L = { 0 };
	struct stat st;
	char xa[4096];
	size_t len = 0;
	snap_dir(&L, top, "");
	qsort(L.v, L.n, sizeof(char *), cmpstr);
	assert_int_equal(stat(top, &st), 0);
	xattr_text(top, xa, sizeof(xa));
	char *out;
	assert_true(asprintf(&out, ".|%o|%u:%u|%lld.%09ld|%s\n", st.st_mode, st.st_uid, st.st_gid,
			     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, xa) > 0);
	len = strlen(out);
	for (size_t i = 0; i < L.n; i++) {
		char *grown = realloc(out, len + strlen(L.v[i]) + 2);
		assert_non_null(grown);
		out = grown;
		len += (size_t)sprintf(out + len, "%s\n", L.v[i]);
		free(L.v[i]);
	}
	free(L.v);
	return out;
}

/* Equal trees; on a difference print the differing lines, not two dumps. */
static void assert_same_tree(const char *a, const char *b)
{
	if (!strcmp(a, b))
		return;
	char *x = strdup(a), *y = strdup(b), *sx, *sy;
	char *lx = strtok_r(x, "\n", &sx), *ly = strtok_r(y, "\n", &sy);
	while (lx || ly) {
		if (!lx || !ly || strcmp(lx, ly))
			print_message("before: %s\nafter:  %s\n", lx ? lx : "(none)", ly ? ly : "(none)");
		lx = lx ? strtok_r(NULL, "\n", &sx) : NULL;
		ly = ly ? strtok_r(NULL, "\n", &sy) : NULL;
	}
	free(x);
	free(y);
	fail_msg("trees differ");
}

static ino_t ino_of(const char *path)
{
	struct stat st;
	assert_int_equal(lstat(path, &st), 0);
	return st.st_ino;
}

/* ---- fixture ---- */

/* Open; the first open takes the base in the background: wait for it, as
 * these tests change the roots right after (health says "preparing"). */
static void fx_open(struct fx *f)
{
	ckpt_error err = { 0 };
	int r = backend_tar_ops.open(&f->ctx, &f->st, &err);
	if (r < 0)
		fail_msg("open: %s", err.msg);
	for (int i = 0; i < 60000; i++) {
		struct backend_health h = { 0 };
		backend_tar_ops.health(f->st, &h);
		bool preparing = h.preparing;
		backend_health_free(&h);
		if (!preparing)
			return;
		usleep(1000);
	}
	fail_msg("the base was not taken within 60 s");
}

static int fx_setup_n(void **state, size_t n_roots)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_int_equal(testlib_mkdir(f->base, "tar"), 0);
	snprintf(f->state, sizeof(f->state), "%s/state", f->base);
	assert_int_equal(mkdir(f->state, 0700), 0);
	for (size_t i = 0; i < n_roots; i++) {
		assert_true(asprintf(&f->roots[i], "%s/root%zu", f->base, i) > 0);
		assert_int_equal(mkdir(f->roots[i], 0755), 0);
	}
	f->n_roots = n_roots;
	config_defaults(&f->cfg);
	f->ctx.tar_chain_max = f->cfg.tar_chain_max; /* the defaults engine_open would copy */
	f->ctx.state_dir = f->state;
	f->ctx.state_fd = open(f->state, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	f->ctx.roots = f->roots;
	f->ctx.n_roots = n_roots;
	*state = f;
	return 0;
}

static int fx_setup(void **state)
{
	return fx_setup_n(state, 1);
}
static int fx_setup2(void **state)
{
	return fx_setup_n(state, 2);
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;
	if (f->st)
		backend_tar_ops.close(f->st, false);
	close(f->ctx.state_fd);
	testlib_rmdir(f->base);
	for (size_t i = 0; i < f->n_roots; i++)
		free(f->roots[i]);
	free(f);
	return 0;
}

static void create_cp(struct fx *f, char *id, struct progress *p)
{
	ckpt_error err = { 0 };
	json_t *data = NULL;
	uint64_t size = 0;
	assert_int_equal(id_generate(id, 32), 0);
	int r = backend_tar_ops.create(f->st, id, &data, &size, p, &err);
	if (r < 0)
		fail_msg("create: %s", err.msg);
	assert_true(size > 0);
	json_decref(data);
}

static json_t *restore_cp(struct fx *f, const char *id)
{
	ckpt_error err = { 0 };
	struct progress p = { 0 };
	struct restore_details d = { 0 };
	int r = backend_tar_ops.restore(f->st, id, NULL, &d, &p, &err);
	if (r < 0)
		fail_msg("restore: %s", err.msg);
	assert_int_equal(atomic_load(&p.files_done), atomic_load(&p.files_total));
	assert_string_equal(d.counts_key, "tar");
	return json_pack("{s:{s:I, s:I, s:I, s:I}}", "tar", "rewritten", (json_int_t)d.rewritten, "removed",
			 (json_int_t)d.removed, "kept", (json_int_t)d.kept, "bytes", (json_int_t)d.bytes);
}

static void mutate(const char *r)
{
	char outside[PATH_MAX];
	put(r, "f1", "HELLO WORLD\n", 0644); /* same size, new content */
	assert_int_equal(removexattr(at(r, "f1"), "user.test"), 0);
	int fd = open(at(r, "d1/nested"), O_RDONLY | O_DIRECTORY);
	assert_int_equal(rm_rf_at(fd, "deep"), 0);
	close(fd);
	assert_int_equal(rmdir(at(r, "d1/nested")), 0);
	put(r, "newfile", "new", 0644);
	mk(r, "newdir", 0755);
	put(r, "newdir/x", "x", 0644);
	assert_int_equal(chmod(at(r, "f2"), 0777), 0);
	assert_int_equal(rmdir(at(r, "empty")), 0);
	put(r, "empty", "now a file", 0644); /* dir replaced by a file */
	assert_int_equal(unlink(at(r, "d1/link")), 0);
	assert_int_equal(symlink("/etc", at(r, "d1/link")), 0); /* symlink swap */
	assert_int_equal(unlink(at(r, "exec")), 0);
	assert_int_equal(symlink("/etc", at(r, "exec")), 0); /* file replaced by a symlink */
	assert_int_equal(unlink(at(r, "d1/hard2")), 0);
	put(r, "d1/hard2", "broken link", 0640); /* hardlink broken */
	assert_int_equal(unlink(at(r, "fifo")), 0);
	assert_int_equal(setxattr(at(r, "d1"), "user.new", "n", 1, 0), 0);
	assert_int_equal(lchown(at(r, "null"), 42, 42), 0);
	assert_int_equal(truncate(at(r, "sparse"), 10), 0);
	assert_int_equal(chmod(r, 0700), 0);
	assert_int_equal(setxattr(r, "user.extra", "e", 1, 0), 0);
	/* a symlinked parent pointing outside the root must not redirect writes */
	snprintf(outside, sizeof(outside), "%s/../outside", r);
	mkdir(outside, 0755);
	fd = open(at(r, "d2"), O_RDONLY | O_DIRECTORY);
	close(fd);
	assert_int_equal(unlink(at(r, "d2/inner")), 0);
	assert_int_equal(rmdir(at(r, "d2")), 0);
	assert_int_equal(symlink(outside, at(r, "d2")), 0);
}

static void test_roundtrip_full(void **state)
{
	struct fx *f = *state;
	char id[32], outside[PATH_MAX];
	struct progress p = { 0 };

	make_full_tree(f->roots[0]);
	fx_open(f);
	char *before = snapshot(f->roots[0]);
	create_cp(f, id, &p);
	assert_true(atomic_load(&p.files_total) >= 20);
	assert_int_equal(atomic_load(&p.files_done), atomic_load(&p.files_total));
	assert_true(atomic_load(&p.bytes_done) >= atomic_load(&p.bytes_total));
	char *same = snapshot(f->roots[0]);
	assert_same_tree(before, same); /* create changes nothing */
	ino_t keep = ino_of(at(f->roots[0], "f2"));
	ino_t keep2 = ino_of(at(f->roots[0], "100% we ird\tna\nme"));
	mutate(f->roots[0]);
	json_decref(restore_cp(f, id));
	char *after = snapshot(f->roots[0]);
	assert_same_tree(before, after);
	assert_int_equal(ino_of(at(f->roots[0], "100% we ird\tna\nme")), keep2);
	(void)keep; /* f2 was chmod'ed: rewritten, its inode may change */
	snprintf(outside, sizeof(outside), "%s/outside/inner", f->base);
	assert_int_equal(access(outside, F_OK), -1);
	/* hardlinks are hardlinks again */
	assert_int_equal(ino_of(at(f->roots[0], "hard1")), ino_of(at(f->roots[0], "d1/hard2")));
	/* a second restore with nothing changed rewrites nothing but stays equal */
	json_t *extra = restore_cp(f, id);
	free(after);
	after = snapshot(f->roots[0]);
	assert_same_tree(before, after);
	json_decref(extra);
	free(before);
	free(same);
	free(after);
}

static void test_multi_root(void **state)
{
	struct fx *f = *state;
	char id[32];

	make_full_tree(f->roots[0]);
	put(f->roots[1], "only-in-1", "one", 0600);
	mk(f->roots[1], "sub", 0755);
	fx_open(f);
	char *b0 = snapshot(f->roots[0]), *b1 = snapshot(f->roots[1]);
	create_cp(f, id, NULL);
	mutate(f->roots[0]);
	put(f->roots[1], "only-in-1", "changed!", 0600);
	put(f->roots[1], "sub/new", "n", 0600);
	json_decref(restore_cp(f, id));
	char *a0 = snapshot(f->roots[0]), *a1 = snapshot(f->roots[1]);
	assert_same_tree(b0, a0);
	assert_same_tree(b1, a1);
	free(b0), free(b1), free(a0), free(a1);
}

static void test_incremental(void **state)
{
	struct fx *f = *state;
	char id[32], name[64];

	mk(f->roots[0], "many", 0755);
	for (int i = 0; i < 300; i++) {
		snprintf(name, sizeof(name), "many/f%03d", i);
		put(f->roots[0], name, "some content that is not tiny at all", 0644);
	}
	fx_open(f);
	char *before = snapshot(f->roots[0]);
	create_cp(f, id, NULL);
	ino_t untouched = ino_of(at(f->roots[0], "many/f100"));
	put(f->roots[0], "many/f001", "changed", 0644);
	put(f->roots[0], "many/f002", "changed", 0644);
	assert_int_equal(unlink(at(f->roots[0], "many/f003")), 0);
	put(f->roots[0], "many/extra", "added", 0644);
	json_t *extra = restore_cp(f, id);
	json_t *t = json_object_get(extra, "tar");
	assert_non_null(t);
	/* three files plus their directory's metadata; one file removed */
	assert_int_equal(json_integer_value(json_object_get(t, "rewritten")), 4);
	assert_int_equal(json_integer_value(json_object_get(t, "removed")), 1);
	assert_int_equal(ino_of(at(f->roots[0], "many/f100")), untouched);
	char *after = snapshot(f->roots[0]);
	assert_same_tree(before, after);
	json_decref(extra);
	/* the files that restore wrote count as unchanged next time */
	put(f->roots[0], "many/f010", "changed again", 0644);
	extra = restore_cp(f, id);
	t = json_object_get(extra, "tar");
	assert_int_equal(json_integer_value(json_object_get(t, "rewritten")), 2);
	free(after);
	after = snapshot(f->roots[0]);
	assert_same_tree(before, after);
	json_decref(extra);
	/* an incremental create's progress totals (counted beside it) end as
	 * what it archived, the parent's files that are still there included */
	for (int i = 200; i < 210; i++) {
		snprintf(name, sizeof(name), "many/f%03d", i);
		assert_int_equal(unlink(at(f->roots[0], name)), 0);
	}
	struct progress p = { 0 };
	char id2[32];
	create_cp(f, id2, &p);
	assert_int_equal(atomic_load(&p.files_done), atomic_load(&p.files_total));
	assert_int_equal(atomic_load(&p.bytes_done), atomic_load(&p.bytes_total));
	assert_int_equal(atomic_load(&p.bytes_total), 290 * strlen("some content that is not tiny at all"));
	free(before);
	free(after);
}

static void test_reset_to_base(void **state)
{
	struct fx *f = *state;
	ckpt_error err = { 0 };
	char id[32];

	make_full_tree(f->roots[0]);
	char *before = snapshot(f->roots[0]);
	fx_open(f); /* adopts the root: records the base */
	put(f->roots[0], "later", "x", 0644);
	create_cp(f, id, NULL);
	mutate(f->roots[0]);
	struct restore_details details = { 0 };
	assert_int_equal(backend_tar_ops.reset(f->st, &details, &err), 0);
	assert_string_equal(details.counts_key, "tar");
	char *after = snapshot(f->roots[0]);
	assert_same_tree(before, after);
	/* a restart keeps the base it recorded first */
	backend_tar_ops.close(f->st, false);
	f->st = NULL;
	fx_open(f);
	assert_int_equal(backend_tar_ops.reset(f->st, NULL, &err), 0);
	free(after);
	after = snapshot(f->roots[0]);
	assert_same_tree(before, after);
	free(before);
	free(after);
}

static void test_interrupted_restore_finished_at_open(void **state)
{
	struct fx *f = *state;
	char id[32], intent[128];

	make_full_tree(f->roots[0]);
	fx_open(f);
	char *before = snapshot(f->roots[0]);
	create_cp(f, id, NULL);
	backend_tar_ops.close(f->st, false);
	f->st = NULL;
	mutate(f->roots[0]);
	/* as if the daemon died right after writing its intent */
	int n = snprintf(intent, sizeof(intent), "{\"id\":\"%s\"}", id);
	int tfd = openat(f->ctx.state_fd, "tar", O_RDONLY | O_DIRECTORY);
	assert_int_equal(write_file_atomic(tfd, "restoring.json", intent, (size_t)n, 0600), 0);
	fx_open(f);
	char *after = snapshot(f->roots[0]);
	assert_same_tree(before, after);
	assert_int_equal(faccessat(tfd, "restoring.json", F_OK, 0), -1);
	close(tfd);
	free(before);
	free(after);
}

static void test_recover_removes_strays(void **state)
{
	struct fx *f = *state;
	ckpt_error err = { 0 };
	char keep[32], drop[32];

	put(f->roots[0], "a", "a", 0644);
	fx_open(f);
	create_cp(f, keep, NULL);
	create_cp(f, drop, NULL);
	int tfd = openat(f->ctx.state_fd, "tar", O_RDONLY | O_DIRECTORY);
	assert_int_equal(mkdirat(tfd, ".tmp-cp_000000000000000000000000", 0700), 0);
	const char *ids[] = { keep };
	json_t *data[] = { NULL };
	assert_int_equal(backend_tar_ops.recover(f->st, ids, data, 1, &err), 0);
	assert_int_equal(faccessat(tfd, keep, F_OK, 0), 0);
	assert_int_equal(faccessat(tfd, "base", F_OK, 0), 0);
	assert_int_equal(faccessat(tfd, drop, F_OK, 0), -1);
	assert_int_equal(faccessat(tfd, ".tmp-cp_000000000000000000000000", F_OK, 0), -1);
	assert_int_equal(backend_tar_ops.remove(f->st, keep, NULL, &err), 0);
	assert_int_equal(faccessat(tfd, keep, F_OK, 0), -1);
	close(tfd);
}

/* Append a line to the checkpoint's manifest. */
static void manifest_append(struct fx *f, const char *id, const char *line)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/tar/%s/r0.manifest", f->state, id);
	FILE *m = fopen(p, "a");
	assert_non_null(m);
	fputs(line, m);
	fclose(m);
}

static void test_malicious_manifest_rejected(void **state)
{
	struct fx *f = *state;
	ckpt_error err = { 0 };
	char id[32];

	put(f->roots[0], "a", "a", 0644);
	fx_open(f);
	create_cp(f, id, NULL);
	manifest_append(f, id, "f\t644\t0\t0\t1\t1.0\t1.0\t1\t1\tnone\t../evil\t-\t-\t-\t-\n");
	put(f->roots[0], "b", "b", 0644);
	assert_int_equal(backend_tar_ops.restore(f->st, id, NULL, NULL, NULL, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "unsafe path"));
	assert_int_equal(access(at(f->roots[0], "b"), F_OK), 0); /* nothing touched */
}

/* Replace the archive with one whose first entry climbs out of the root. */
static void test_malicious_archive_rejected(void **state)
{
	struct fx *f = *state;
	ckpt_error err = { 0 };
	char id[32], p[PATH_MAX], evil[PATH_MAX];

	char first[32];
	put(f->roots[0], "a", "a", 0644);
	fx_open(f);
	create_cp(f, first, NULL);
	put(f->roots[0], "b", "b", 0644); /* in id's own archive, not the base's */
	create_cp(f, id, NULL);
	assert_int_equal(unlink(at(f->roots[0], "b")), 0);
	snprintf(p, sizeof(p), "%s/tar/%s/r0.tar.zst", f->state, id);
	struct archive *a = archive_write_new();
	archive_write_set_format_pax(a);
	archive_write_add_filter_zstd(a);
	assert_int_equal(archive_write_open_filename(a, p), ARCHIVE_OK);
	struct archive_entry *e = archive_entry_new();
	archive_entry_set_pathname(e, "../evil");
	archive_entry_set_filetype(e, AE_IFREG);
	archive_entry_set_perm(e, 0644);
	archive_entry_set_size(e, 4);
	assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
	archive_write_data(a, "evil", 4);
	archive_entry_free(e);
	archive_write_close(a);
	archive_write_free(a);
	assert_int_equal(unlink(at(f->roots[0], "a")), 0);
	assert_int_equal(backend_tar_ops.restore(f->st, id, NULL, NULL, NULL, &err), -EBADMSG);
	snprintf(evil, sizeof(evil), "%s/evil", f->base);
	assert_int_equal(access(evil, F_OK), -1);
}

static void test_enospc_leaves_no_trace(void **state)
{
	struct fx *f = *state;
	ckpt_error err = { 0 };
	char id[32], buf[65536];

	/* a 2 MiB tmpfs as the state dir; random data does not compress */
	close(f->ctx.state_fd);
	assert_int_equal(mount("tmpfs", f->state, "tmpfs", 0, "size=2m"), 0);
	f->ctx.state_fd = open(f->state, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fx_open(f);
	int fd = open(at(f->roots[0], "big"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	int rnd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	for (int i = 0; i < 64; i++) {
		assert_int_equal(read(rnd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
		assert_int_equal(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	}
	close(fd);
	close(rnd);
	assert_int_equal(id_generate(id, sizeof(id)), 0);
	assert_int_equal(backend_tar_ops.create(f->st, id, NULL, NULL, NULL, &err), -ENOSPC);
	/* the backend reports the errno; the engine makes it insufficient_storage */
	assert_int_equal(err.errnum, ENOSPC);
	assert_int_equal(err.kind, ERR_UNSET);
	int tfd = openat(f->ctx.state_fd, "tar", O_RDONLY | O_DIRECTORY);
	DIR *d = fdopendir(tfd);
	struct dirent *de;
	while ((de = readdir(d)))
		assert_true(!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, "base") ||
			    !strcmp(de->d_name, "head") || !strcmp(de->d_name, "running"));
	closedir(d);
	backend_tar_ops.close(f->st, false);
	f->st = NULL;
}

/* ctimes tick with a coarse clock: a change right after create (or restore)
 * must still be seen as a change. */
static void test_change_right_after_create(void **state)
{
	struct fx *f = *state;
	char id[32], buf[8];

	fx_open(f);
	for (int i = 0; i < 20; i++) {
		put(f->roots[0], "x", "AAAA", 0644);
		create_cp(f, id, NULL);
		put(f->roots[0], "x", "BBBB", 0644);
		json_decref(restore_cp(f, id));
		put(f->roots[0], "x", "CCCC", 0644);
		json_decref(restore_cp(f, id));
		int fd = open(at(f->roots[0], "x"), O_RDONLY | O_CLOEXEC);
		assert_int_equal(read(fd, buf, 4), 4);
		close(fd);
		assert_memory_equal(buf, "AAAA", 4);
	}
}

/* How many entries the checkpoint's own archive holds, and how many lines
 * of its manifest name another checkpoint's archive as their data's home. */
static void chain_counts(struct fx *f, const char *id, int *own, int *elsewhere)
{
	char p[PATH_MAX], line[8192];
	snprintf(p, sizeof(p), "%s/tar/%s/r0.manifest", f->state, id);
	FILE *m = fopen(p, "r");
	assert_non_null(m);
	*own = *elsewhere = 0;
	while (fgets(line, sizeof(line), m)) {
		char *tab = strrchr(line, '\t'); /* the offset's column; the source's before it */
		if (tab)
			*tab = '\0';
		tab = strrchr(line, '\t');
		if (line[0] == 'f' && tab && strcmp(tab, "\t-"))
			(*elsewhere)++;
	}
	fclose(m);
	snprintf(p, sizeof(p), "%s/tar/%s/r0.tar.zst", f->state, id);
	struct archive *a = archive_read_new();
	struct archive_entry *ae;
	archive_read_support_format_tar(a);
	archive_read_support_filter_zstd(a);
	assert_int_equal(archive_read_open_filename(a, p, 1 << 16), ARCHIVE_OK);
	while (archive_read_next_header(a, &ae) == ARCHIVE_OK)
		if (archive_entry_filetype(ae) == AE_IFREG)
			(*own)++;
	archive_read_free(a);
}

/* Incremental chains: a create archives only changed files, a restore reads
 * the chain, a deleted parent's data is kept while a child reads it and
 * removed once none does. */
static void test_chain(void **state)
{
	struct fx *f = *state;
	ckpt_error err = { 0 };
	char a[32], b[32], c[32], name[32], p[PATH_MAX];
	int own, elsewhere;

	for (int i = 0; i < 20; i++) {
		snprintf(name, sizeof(name), "f%02d", i);
		put(f->roots[0], name, name, 0644);
	}
	fx_open(f);
	create_cp(f, a, NULL); /* against the base: nothing changed */
	chain_counts(f, a, &own, &elsewhere);
	assert_int_equal(own, 0);
	assert_int_equal(elsewhere, 20);
	put(f->roots[0], "f03", "changed 3", 0644);
	put(f->roots[0], "new", "new", 0644);
	create_cp(f, b, NULL);
	chain_counts(f, b, &own, &elsewhere);
	assert_int_equal(own, 2); /* f03 and new */
	assert_int_equal(elsewhere, 19);
	char *at_b = snapshot(f->roots[0]);
	put(f->roots[0], "f07", "changed 7!", 0644);
	assert_int_equal(unlink(at(f->roots[0], "new")), 0);
	create_cp(f, c, NULL);
	char *at_c = snapshot(f->roots[0]);
	/* restore b: f07 comes from the base's archive, new from b's own */
	json_decref(restore_cp(f, b));
	char *now = snapshot(f->roots[0]);
	assert_same_tree(at_b, now);
	free(now);
	/* delete a and b: c reads the base and b, so b's data is kept aside */
	assert_int_equal(backend_tar_ops.remove(f->st, a, NULL, &err), 0);
	assert_int_equal(backend_tar_ops.remove(f->st, b, NULL, &err), 0);
	snprintf(p, sizeof(p), "%s/tar/%s", f->state, b);
	assert_int_equal(access(p, F_OK), -1);
	snprintf(p, sizeof(p), "%s/tar/.keep/%s/r0.tar.zst", f->state, b);
	assert_int_equal(access(p, F_OK), 0);
	snprintf(p, sizeof(p), "%s/tar/.keep/%s", f->state, a);
	assert_int_equal(access(p, F_OK), -1); /* nothing read a's (empty) archive */
	/* b's delete again, as the next start finishes a delete a kill -9
	 * interrupted after the move: it succeeds and keeps what c reads */
	assert_int_equal(backend_tar_ops.remove(f->st, b, NULL, &err), 0);
	snprintf(p, sizeof(p), "%s/tar/.keep/%s/r0.tar.zst", f->state, b);
	assert_int_equal(access(p, F_OK), 0);
	for (int i = 0; i < 20; i++) {
		snprintf(name, sizeof(name), "f%02d", i);
		put(f->roots[0], name, "scrambled", 0600);
	}
	json_t *st = restore_cp(f, c);
	now = snapshot(f->roots[0]);
	assert_same_tree(at_c, now);
	free(now);
	json_decref(st);
	/* c gone: nothing reads b's data any more */
	assert_int_equal(backend_tar_ops.remove(f->st, c, NULL, &err), 0);
	snprintf(p, sizeof(p), "%s/tar/.keep/%s", f->state, b);
	assert_int_equal(access(p, F_OK), -1);
	free(at_b);
	free(at_c);
}

/* The chain's length as meta.json records it. */
static json_int_t depth_of(struct fx *f, const char *id)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/tar/%s/meta.json", f->state, id);
	json_t *m = json_load_file(p, 0, NULL);
	assert_non_null(m);
	json_int_t d = json_integer_value(json_object_get(m, "depth"));
	json_decref(m);
	return d;
}

/* Chains longer than tar_chain_max are compacted by cleanup into full
 * archives that stand alone: restorable with every older checkpoint gone. */
static void test_compaction(void **state)
{
	struct fx *f = *state;
	ckpt_error err = { 0 };
	char id[5][32], name[32];
	char *trees[5];
	int own, elsewhere;

	f->ctx.tar_chain_max = 2;
	for (int i = 0; i < 10; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		put(f->roots[0], name, name, 0644);
	}
	fx_open(f);
	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		put(f->roots[0], name, "changed", 0640);
		create_cp(f, id[i], NULL);
		trees[i] = snapshot(f->roots[0]);
	}
	assert_int_equal(depth_of(f, id[4]), 5);
	int rounds = 0;
	while (backend_tar_ops.cleanup(f->st) > 0)
		rounds++;
	assert_int_equal(rounds, 3); /* depths 3, 4, 5 */
	for (int i = 2; i < 5; i++) {
		assert_int_equal(depth_of(f, id[i]), 0);
		chain_counts(f, id[i], &own, &elsewhere);
		assert_int_equal(own, 10);
		assert_int_equal(elsewhere, 0);
	}
	/* the compacted ones need nothing older: delete everything before */
	for (int i = 0; i < 3; i++)
		assert_int_equal(backend_tar_ops.remove(f->st, id[i], NULL, &err), 0);
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/tar/.keep/%s", f->state, id[0]);
	assert_int_equal(access(p, F_OK), -1);
	for (int i = 3; i < 5; i++) {
		put(f->roots[0], "f9", "scrambled", 0600);
		json_decref(restore_cp(f, id[i]));
		char *now = snapshot(f->roots[0]);
		assert_same_tree(trees[i], now);
		free(now);
	}
	for (int i = 0; i < 5; i++)
		free(trees[i]);
}

/* A whole file as a string (malloc'd). */
static char *text_read(const char *path)
{
	char *text = NULL;
	size_t len = 0;
	FILE *m = fopen(path, "r");
	assert_non_null(m);
	assert_true(getdelim(&text, &len, '\0', m) > 0);
	fclose(m);
	return text;
}

static void text_write(const char *path, const char *text)
{
	FILE *m = fopen(path, "w");
	assert_non_null(m);
	fputs(text, m);
	fclose(m);
}

static void pwrite_at(const char *dir, const char *rel, const char *data, off_t off)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, data, strlen(data), off), (ssize_t)strlen(data));
	close(fd);
}

/* Compaction copies files with holes as they were: a file left sparse
 * across the chain (taken from the oldest archive) and one grown by writes
 * past its end (an in-place write: new data at an offset, a hole before). */
static void test_compaction_sparse(void **state)
{
	struct fx *f = *state;
	char id[4][32];
	char *trees[4];
	char p[PATH_MAX];

	f->ctx.tar_chain_max = 1;
	pwrite_at(f->roots[0], "sparse", "head", 0);
	pwrite_at(f->roots[0], "sparse", "middle", 1 << 20);
	snprintf(p, sizeof(p), "%s/sparse", f->roots[0]);
	assert_int_equal(truncate(p, 3 << 20), 0); /* ends in a hole */
	put(f->roots[0], "grow", "start", 0644);
	fx_open(f);
	for (int i = 0; i < 4; i++) {
		char data[32];
		snprintf(data, sizeof(data), "write %d", i);
		pwrite_at(f->roots[0], "grow", data, (off_t)(i + 1) * 40000);
		create_cp(f, id[i], NULL);
		trees[i] = snapshot(f->roots[0]);
	}
	while (backend_tar_ops.cleanup(f->st) > 0)
		;
	for (int i = 1; i < 4; i++)
		assert_int_equal(depth_of(f, id[i]), 0);
	for (int i = 0; i < 4; i++) {
		pwrite_at(f->roots[0], "grow", "scrambled", 1000);
		pwrite_at(f->roots[0], "sparse", "scrambled", 2 << 20);
		json_decref(restore_cp(f, id[i]));
		char *now = snapshot(f->roots[0]);
		assert_same_tree(trees[i], now);
		free(now);
		free(trees[i]);
	}
}

/* A compaction whose copy would not hash to what the manifest recorded is
 * refused and not tried again; the chain stays as it was, restorable. */
static void test_compaction_checks_digests(void **state)
{
	struct fx *f = *state;
	char id[3][32], p[PATH_MAX];

	f->ctx.tar_chain_max = 1;
	put(f->roots[0], "kept", "same all along", 0644);
	fx_open(f);
	for (int i = 0; i < 3; i++) {
		char data[32];
		snprintf(data, sizeof(data), "version %d", i);
		put(f->roots[0], "changing", data, 0644);
		create_cp(f, id[i], NULL);
	}
	char *at2 = snapshot(f->roots[0]);
	/* id[2]'s line for "kept" names a digest its data does not have */
	snprintf(p, sizeof(p), "%s/tar/%s/r0.manifest", f->state, id[2]);
	char *text = text_read(p);
	char *line = strstr(text, "\tkept\t");
	assert_non_null(line);
	char *sha = strchr(line + 6, '\t') + 1; /* after the link column */
	sha[0] = sha[0] == '0' ? '1' : '0';
	text_write(p, text);
	free(text);
	int rounds = 0;
	while (backend_tar_ops.cleanup(f->st) > 0)
		rounds++;
	assert_int_equal(rounds, 1); /* id[1] (depth 2) only */
	assert_int_equal(depth_of(f, id[1]), 0);
	assert_int_equal(depth_of(f, id[2]), 3);
	assert_int_equal(backend_tar_ops.cleanup(f->st), 0); /* not tried again */
	put(f->roots[0], "changing", "scrambled", 0644);
	json_decref(restore_cp(f, id[2]));
	char *now = snapshot(f->roots[0]);
	assert_same_tree(at2, now);
	free(now);
	free(at2);
}

/* The last restore's entries read where they begin, as health shows it. */
static uint64_t last_entered(struct fx *f)
{
	struct backend_health h = { 0 };
	backend_tar_ops.health(f->st, &h);
	uint64_t v = h.tar.entered;
	assert_true(h.has_tar);
	backend_health_free(&h);
	return v;
}

/* Change file rel, restore id, and find the tree want again. */
static void scramble_restore(struct fx *f, const char *rel, const char *id, const char *want)
{
	put(f->roots[0], rel, "scrambled", 0644);
	json_decref(restore_cp(f, id));
	char *now = snapshot(f->roots[0]);
	assert_same_tree(want, now);
	free(now);
}

/* A restore that rewrites a few files of a large archive reads them where
 * the manifest says they begin (the archive's frames), from the checkpoint's
 * own archive and from an older one; without the frames file, or with one
 * that does not match its archive, it reads the archives from the start. */
static void test_restore_enters_archives(void **state)
{
	struct fx *f = *state;
	char a[32], b[32], name[64], p[PATH_MAX], q[PATH_MAX];
	char *big = malloc(200000);

	assert_non_null(big);
	for (int i = 0; i < 40; i++) { /* 8 MB that zstd cannot shrink: 8 frames */
		for (int k = 0; k < 200000; k++)
			big[k] = (char)(rand() >> 3);
		snprintf(name, sizeof(name), "f%02d", i);
		snprintf(p, sizeof(p), "%s/%s", f->roots[0], name);
		FILE *o = fopen(p, "w");
		assert_non_null(o);
		assert_int_equal(fwrite(big, 1, 200000, o), 200000);
		fclose(o);
	}
	free(big);
	fx_open(f);
	create_cp(f, a, NULL);
	char *at_a = snapshot(f->roots[0]);
	put(f->roots[0], "f39", "changed after a", 0644); /* b's own archive has it */
	create_cp(f, b, NULL);
	char *at_b = snapshot(f->roots[0]);
	/* f05 and f33 come from the base's archive (a and b took them from
	 * there), f39 from b's own */
	put(f->roots[0], "f05", "scrambled", 0644);
	put(f->roots[0], "f33", "scrambled", 0644);
	put(f->roots[0], "f39", "scrambled", 0644);
	json_decref(restore_cp(f, b));
	char *now = snapshot(f->roots[0]);
	assert_same_tree(at_b, now);
	free(now);
	assert_int_equal(last_entered(f), 3);
	/* an offset that names another entry: read from the start instead */
	snprintf(p, sizeof(p), "%s/tar/%s/r0.manifest", f->state, b);
	char *text = text_read(p);
	char *line = strstr(text, "\tf33\t");
	assert_non_null(line);
	char *eol = strchr(line, '\n'), *tab = eol;
	while (tab[-1] != '\t')
		tab--;
	char *edited;
	assert_true(asprintf(&edited, "%.*s0%s", (int)(tab - text), text, eol) > 0); /* offset 0: the first entry */
	text_write(p, edited);
	free(edited);
	free(text);
	scramble_restore(f, "f33", b, at_b);
	/* without the frames of the archive holding the data (the base's: a
	 * took every file from there): read from the start, the same tree */
	snprintf(p, sizeof(p), "%s/tar/base/r0.tar.zst.frames", f->state);
	snprintf(q, sizeof(q), "%s.saved", p);
	assert_int_equal(rename(p, q), 0);
	scramble_restore(f, "f33", a, at_a);
	assert_int_equal(last_entered(f), 0);
	/* frames that do not match the archive (cut short): the same */
	assert_int_equal(truncate(q, 16 + 8 * 3), 0);
	assert_int_equal(rename(q, p), 0);
	scramble_restore(f, "f05", a, at_a);
	assert_int_equal(last_entered(f), 0);
	free(at_a);
	free(at_b);
}

/* The sweeper drains the trackers between creates (cleanup): what it read
 * still counts for the next create, which track_check checks against
 * the whole tree; every checkpoint then restores to what it captured. */
static void test_tracked_create_after_drains(void **state)
{
	struct fx *f = *state;
	char id[3][32], name[64];
	char *trees[3];

	f->ctx.track_check = true; /* read by the creates of this state */
	for (int d = 0; d < 4; d++) {
		snprintf(name, sizeof(name), "d%d", d);
		mk(f->roots[0], name, 0755);
		for (int i = 0; i < 5; i++) {
			snprintf(name, sizeof(name), "d%d/f%d", d, i);
			put(f->roots[0], name, name, 0644);
		}
	}
	fx_open(f);
	for (int k = 0; k < 3; k++) {
		snprintf(name, sizeof(name), "d%d/f1", k);
		put(f->roots[0], name, "changed before a drain", 0644);
		while (backend_tar_ops.cleanup(f->st) > 0)
			;
		snprintf(name, sizeof(name), "d%d/new", k + 1);
		put(f->roots[0], name, "made after it", 0644);
		create_cp(f, id[k], NULL);
		trees[k] = snapshot(f->roots[0]);
	}
	for (int k = 0; k < 3; k++) {
		put(f->roots[0], "d3/f4", "scrambled", 0644);
		json_decref(restore_cp(f, id[k]));
		char *now = snapshot(f->roots[0]);
		assert_same_tree(trees[k], now);
		free(now);
		free(trees[k]);
	}
}

/* The checkpoint directories (cp_*) in the tar state dir, precopies included. */
static int count_ids(struct fx *f)
{
	int tfd = openat(f->ctx.state_fd, "tar", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = tfd >= 0 ? fdopendir(tfd) : NULL;
	struct dirent *de;
	int ids = 0;
	assert_non_null(d);
	while ((de = readdir(d)))
		ids += !strncmp(de->d_name, "cp_", 3);
	closedir(d);
	return ids;
}

/* precopy before the freeze: the create then archives only what changed
 * after it, and takes the rest from the precopy, which is kept for that. */
static void test_precopy(void **state)
{
	struct fx *f = *state;
	ckpt_error err = { 0 };
	char a[32], b[32];
	int own, elsewhere;

	for (int i = 0; i < 10; i++) {
		char name[32];
		snprintf(name, sizeof(name), "f%d", i);
		put(f->roots[0], name, name, 0644);
	}
	fx_open(f);
	create_cp(f, a, NULL);
	put(f->roots[0], "f1", "before the precopy", 0644);
	put(f->roots[0], "f2", "before the precopy", 0644);
	/* no unit frozen around the create: the backend makes no first pass */
	assert_int_equal(backend_tar_ops.precopy(f->st, false, NULL, &err), 0);
	assert_int_equal(count_ids(f), 1);
	assert_int_equal(backend_tar_ops.precopy(f->st, true, NULL, &err), 0);
	assert_int_equal(count_ids(f), 2);
	put(f->roots[0], "f3", "during the freeze", 0644);
	create_cp(f, b, NULL);
	char *at_b = snapshot(f->roots[0]);
	chain_counts(f, b, &own, &elsewhere);
	assert_int_equal(own, 1); /* f3 only */
	assert_int_equal(elsewhere, 9);
	/* the precopy has no record: its data is kept aside while b reads it */
	int tfd = openat(f->ctx.state_fd, "tar", O_RDONLY | O_DIRECTORY);
	DIR *d = fdopendir(dup(tfd));
	struct dirent *de;
	int ids = 0;
	while ((de = readdir(d)))
		ids += !strncmp(de->d_name, "cp_", 3);
	closedir(d);
	assert_int_equal(ids, 2); /* a and b */
	for (int i = 0; i < 10; i++) {
		char name[32];
		snprintf(name, sizeof(name), "f%d", i);
		put(f->roots[0], name, "x", 0600);
	}
	json_decref(restore_cp(f, b));
	char *now = snapshot(f->roots[0]);
	assert_same_tree(at_b, now);
	free(now);
	free(at_b);
	close(tfd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_roundtrip_full, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_multi_root, fx_setup2, fx_teardown),
		cmocka_unit_test_setup_teardown(test_incremental, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_chain, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_compaction, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_compaction_sparse, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_tracked_create_after_drains, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_restore_enters_archives, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_compaction_checks_digests, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_precopy, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_reset_to_base, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_interrupted_restore_finished_at_open, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_recover_removes_strays, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_malicious_manifest_rejected, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_malicious_archive_rejected, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_enospc_leaves_no_trace, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_change_right_after_create, fx_setup, fx_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
