/* Unit tests of the shared helpers in src/lib: hash, (dev, ino) map, string
 * set, directory walker, /proc scanner, xattrs through /proc. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/mman.h>
#include <grp.h>
#include <pthread.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>

#include "lib/devino.h"
#include "lib/hash.h"
#include "lib/procscan.h"
#include "lib/strset.h"
#include "lib/util.h"
#include "lib/walk.h"
#include "lib/xattr.h"
#include "testlib.h"

/* Published FNV-1a vectors: the values reach disk, so they must not change. */
static void test_hash_vectors(void **state)
{
	(void)state;
	assert_int_equal(hash_fnv32(HASH_FNV32_INIT, "", 0), 0x811c9dc5u);
	assert_int_equal(hash_fnv32(HASH_FNV32_INIT, "a", 1), 0xe40c292cu);
	assert_int_equal(hash_fnv32(HASH_FNV32_INIT, "foobar", 6), 0xbf9cf968u);
	assert_true(hash_str("a") == 0xaf63dc4c8601ec8cULL);
	assert_true(hash_str("foobar") == 0x85944171f73967e8ULL);
	/* Continuing a hash equals hashing the concatenation. */
	assert_true(hash_fnv64(hash_fnv64(HASH_FNV64_INIT, "foo", 3), "bar", 3) == hash_str("foobar"));
}

/* Enough inodes to grow the table several times; same ino on two devs differs. */
static void test_devino_map(void **state)
{
	(void)state;
	struct devino_map m = { 0 };
	char p[32];
	assert_null(devino_get(&m, 1, 1));
	for (int i = 0; i < 1000; i++) {
		snprintf(p, sizeof(p), "f%d", i);
		assert_int_equal(devino_put(&m, (dev_t)(i % 3), (ino_t)i, p), 0);
	}
	assert_int_equal(devino_put(&m, 1, 1, "later"), 0); /* the first path stays */
	assert_string_equal(devino_get(&m, 1, 1), "f1");
	assert_string_equal(devino_get(&m, 2, 998), "f998");
	assert_null(devino_get(&m, 0, 1));
	assert_int_equal(m.n, 1000);
	devino_free(&m);
	assert_null(devino_get(&m, 1, 1));
}

/* Keys stay in the order added, deletions included; values are copies;
 * the table grows and finds every key again. */
static void test_strset(void **state)
{
	(void)state;
	struct strset s = { 0 };
	const char *v, **sorted;
	char key[32];
	size_t i = 0;
	assert_false(strset_has(&s, "a"));
	assert_null(strset_next(&s, &i, NULL));
	assert_int_equal(strset_add(&s, "b"), 1);
	assert_int_equal(strset_add(&s, "b"), 0);
	assert_int_equal(strset_put(&s, "a", "1"), 0);
	assert_int_equal(strset_put(&s, "c", "3"), 0);
	assert_int_equal(strset_put(&s, "a", "one"), 0); /* replaced, in place */
	assert_null(strset_get(&s, "b"));
	assert_string_equal(strset_get(&s, "a"), "one");
	assert_int_equal(strset_count(&s), 3);
	assert_true(strset_del(&s, "b"));
	assert_false(strset_del(&s, "b"));
	assert_false(strset_has(&s, "b"));
	i = 0;
	assert_string_equal(strset_next(&s, &i, &v), "a");
	assert_string_equal(v, "one");
	assert_true(strset_del(&s, "a")); /* while iterating */
	assert_string_equal(strset_next(&s, &i, &v), "c");
	assert_string_equal(v, "3");
	assert_null(strset_next(&s, &i, NULL));
	assert_int_equal(strset_add(&s, "a"), 1); /* again, now last */
	for (int n = 0; n < 5000; n++) {
		snprintf(key, sizeof(key), "k%d", n);
		assert_int_equal(strset_add(&s, key), 1);
		if (n % 3 == 0)
			assert_true(strset_del(&s, key));
	}
	assert_int_equal(strset_count(&s), 2 + 5000 - 1667);
	for (int n = 0; n < 5000; n++) {
		snprintf(key, sizeof(key), "k%d", n);
		assert_int_equal(strset_has(&s, key), n % 3 != 0);
	}
	i = 0;
	assert_string_equal(strset_next(&s, &i, NULL), "c");
	assert_string_equal(strset_next(&s, &i, NULL), "a");
	assert_string_equal(strset_next(&s, &i, NULL), "k1");
	assert_int_equal(strset_sorted(&s, &sorted), 0);
	for (size_t j = 1; j < strset_count(&s); j++)
		assert_true(strcmp(sorted[j - 1], sorted[j]) < 0);
	assert_string_equal(sorted[0], "a");
	free(sorted);
	strset_free(&s);
	assert_int_equal(strset_count(&s), 0);
	assert_false(strset_has(&s, "a"));
}

static char dir[TESTLIB_DIR_LEN];

static int setup(void **state)
{
	(void)state;
	return testlib_mkdir(dir, "lib");
}

static int teardown(void **state)
{
	(void)state;
	testlib_rmdir(dir);
	return 0;
}

/* The same inode through (dirfd, name), through its fd, and as dirfd itself;
 * a symlink's name reaches the link, never its target. */
static void test_xattr_ref(void **state)
{
	(void)state;
	_cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_close_ int fd = openat(dfd, "f", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	struct xattr_ref byname, byfd, self, link;
	char v[16];

	assert_true(dfd >= 0 && fd >= 0);
	assert_int_equal(symlinkat("f", dfd, "l"), 0);
	xattr_ref_init(&byname, -1, dfd, "f");
	xattr_ref_init(&byfd, fd, dfd, "f");
	xattr_ref_init(&self, -1, dfd, NULL);
	xattr_ref_init(&link, -1, dfd, "l");
	assert_int_equal(xattr_set(&byname, "trusted.ckptd", "one", 3), 0);
	assert_int_equal(xattr_get(&byfd, "trusted.ckptd", v, sizeof(v)), 3);
	assert_memory_equal(v, "one", 3);
	assert_int_equal(xattr_set(&self, "trusted.ckptd", "dir", 3), 0);
	assert_int_equal(fgetxattr(dfd, "trusted.ckptd", v, sizeof(v)), 3);
	assert_memory_equal(v, "dir", 3);
	assert_int_equal(xattr_get(&link, "trusted.ckptd", v, sizeof(v)), -1);
	assert_int_equal(errno, ENODATA);
	assert_int_equal(xattr_set(&link, "trusted.ckptd", "lnk", 3), 0);
	assert_int_equal(xattr_get(&byname, "trusted.ckptd", v, sizeof(v)), 3);
	assert_memory_equal(v, "one", 3);
	assert_int_equal(xattr_list(&link, v, sizeof(v)), (ssize_t)sizeof("trusted.ckptd"));
}

static int count_entry(void *ctx, int dfd, const char *name)
{
	(void)dfd;
	int *n = ctx;
	if (!strcmp(name, "stop"))
		return -ECANCELED;
	(*n)++;
	return 0;
}

/* "." and ".." never show; a symlink is not followed; listing a dir by its
 * fd leaves that fd's own offset alone; fn's error stops the walk. */
static void test_walk(void **state)
{
	(void)state;
	_cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	int n = 0;

	assert_int_equal(mkdirat(dfd, "sub", 0700), 0);
	assert_int_equal(mkdirat(dfd, "sub/a", 0700), 0);
	assert_int_equal(symlinkat("sub", dfd, "link"), 0);
	int q = walk_open(dfd, "link", &d);
	assert_true(q == -ELOOP || q == -ENOTDIR); /* O_DIRECTORY may answer first */
	assert_int_equal(walk_open(dfd, "missing", &d), -ENOENT);
	assert_int_equal(walk_open(dfd, NULL, &d), 0);
	while ((de = walk_next(d)))
		n++;
	assert_int_equal(errno, 0);
	assert_int_equal(n, 2);
	_cleanup_closedir_ DIR *again = fdopendir(dfd);
	n = 0;
	while ((de = walk_next(again)))
		n++;
	assert_int_equal(n, 2); /* not at the end: walk_open read another description */
	dfd = -1;               /* owned by again now */
	n = 0;
	assert_int_equal(walk_each(dirfd(again), "sub", count_entry, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(mkdirat(dirfd(again), "sub/stop", 0700), 0);
	assert_int_equal(walk_each(dirfd(again), "sub", count_entry, &n), -ECANCELED);
	q = walk_each(dirfd(again), "link", count_entry, &n);
	assert_true(q == -ELOOP || q == -ENOTDIR);
}

/* A child working in cwd until the write end of hold closes; back once its
 * cwd reads cwd. */
static pid_t child_in(const char *cwd, int hold[2])
{
	char link[64], buf[256];
	pid_t pid = fork();
	if (pid == 0) {
		char c;
		if (chdir(cwd) < 0)
			_exit(1);
		close(hold[1]);
		(void)!read(hold[0], &c, 1);
		_exit(0);
	}
	snprintf(link, sizeof(link), "/proc/%d/cwd", (int)pid);
	for (int i = 0; i < 200; i++) {
		ssize_t n = readlink(link, buf, sizeof(buf) - 1);
		if (n > 0 && (buf[n] = 0, !strcmp(buf, cwd)))
			break;
		usleep(10000);
	}
	return pid;
}

/* <dir>/a (its inode in *st) and <dir>/a/<below> made. */
static void make_a(char a[160], char deep[200], const char *below, struct stat *st)
{
	snprintf(a, 160, "%s/a", dir);
	snprintf(deep, 200, "%s/a/%s", dir, below);
	assert_int_equal(mkdir_p(deep, 0700), 0);
	assert_int_equal(stat(a, st), 0);
}

/* By identity: a child whose cwd is below a directory that was renamed away
 * is found through the directory's (dev, ino), and a target that only reads
 * the same path but is another inode does not match it. */
static void test_procscan_users_by_identity(void **state)
{
	(void)state;
	char a[160], deep[200], moved[160];
	struct stat sa, other;
	make_a(a, deep, "b/c", &sa);
	snprintf(moved, sizeof(moved), "%s/moved", dir);
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	pid_t child = child_in(deep, pfd);
	close(pfd[0]);
	assert_int_equal(rename(a, moved), 0);
	assert_int_equal(mkdir(a, 0700), 0); /* same path, another inode */
	assert_int_equal(stat(a, &other), 0);
	struct procscan_target t = { .path = "/nonexistent", .dev = sa.st_dev, .ino = sa.st_ino, .tag = 7 };
	struct procscan_user *u = NULL;
	size_t n = 0, found = 0;
	assert_int_equal(procscan_users("/proc", &t, 1, getpid(), &u, &n), 0);
	for (size_t i = 0; i < n; i++)
		found += u[i].pid == child && u[i].tag == 7;
	free(u);
	assert_int_equal(found, 1);
	t = (struct procscan_target){ .path = a, .dev = other.st_dev, .ino = other.st_ino };
	assert_int_equal(procscan_users("/proc", &t, 1, getpid(), &u, &n), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_not_equal(u[i].pid, child);
	free(u);
	close(pfd[1]);
	assert_int_equal(waitpid(child, NULL, 0), child);
}

/* A mount over a directory a child works in: its cwd reads the same path as
 * the mount, yet it is found on the hidden directory (by the device of the
 * step below the top), and a child started inside the mount on the mount. */
static void test_procscan_users_hidden_under_mount(void **state)
{
	(void)state;
	char a[160], deep[200];
	struct stat hid, live;
	make_a(a, deep, "b", &hid);
	pid_t kids[2];
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	for (int k = 0; k < 2; k++) {
		if (k == 1) {
			assert_int_equal(mount("tmpfs", a, "tmpfs", 0, "size=1m"), 0);
			assert_int_equal(mkdir(deep, 0700), 0);
		}
		kids[k] = child_in(deep, pfd);
	}
	close(pfd[0]);
	assert_int_equal(stat(a, &live), 0);
	assert_true(live.st_dev != hid.st_dev);
	struct procscan_target t[] = { { .path = a, .dev = live.st_dev, .ino = live.st_ino, .tag = 0 },
				       { .path = a, .dev = hid.st_dev, .ino = hid.st_ino, .tag = 1 } };
	struct procscan_user *u = NULL;
	size_t n = 0;
	int tag[2] = { -1, -1 };
	assert_int_equal(procscan_users("/proc", t, 2, getpid(), &u, &n), 0);
	for (size_t i = 0; i < n; i++)
		for (int k = 0; k < 2; k++)
			if (u[i].pid == kids[k])
				tag[k] = u[i].tag;
	free(u);
	close(pfd[1]);
	for (int k = 0; k < 2; k++)
		assert_int_equal(waitpid(kids[k], NULL, 0), kids[k]);
	assert_int_equal(umount2(a, MNT_DETACH), 0);
	assert_int_equal(tag[0], 1); /* on the hidden directory */
	assert_int_equal(tag[1], 0); /* in the mount */
}

struct seen {
	const char *want; /* path to look for */
	struct stat st;   /* its inode */
	bool fd, map, fd_deleted, id_ok;
};

static int seen_ref(void *ctx, const struct procscan_ref *ref)
{
	struct seen *s = ctx;
	if (ref->pid != getpid() || strcmp(ref->path, s->want))
		return PROCSCAN_CONTINUE;
	if (ref->kind == PROCSCAN_FD) {
		s->fd = true;
		s->fd_deleted = ref->deleted;
	}
	s->map |= ref->kind == PROCSCAN_MAP;
	s->id_ok = ref->has_id && ref->dev == s->st.st_dev && ref->ino == s->st.st_ino;
	return s->id_ok ? PROCSCAN_CONTINUE : PROCSCAN_NEXT_PID;
}

/* Mappings say whether they are shared and writable: a rw-s mapping of one
 * file is, a read-only shared one and a private writable one of others are
 * not; a file mapped both ways is given again for its writable run; with
 * PROCSCAN_MAPS_ONLY no fd is given. */
struct mapped_seen {
	char path[3][128];
	int maps[3], sw[3], fds;
};

static int mapped_ref(void *ctx, const struct procscan_ref *ref)
{
	struct mapped_seen *m = ctx;
	if (ref->pid != getpid())
		return PROCSCAN_CONTINUE;
	for (int i = 0; i < 3; i++) {
		if (strcmp(ref->path, m->path[i]))
			continue;
		if (ref->kind == PROCSCAN_FD)
			m->fds++;
		if (ref->kind == PROCSCAN_MAP)
			m->maps[i]++, m->sw[i] += ref->shared_write;
	}
	return PROCSCAN_CONTINUE;
}

static void test_procscan_shared_write(void **state)
{
	(void)state;
	struct mapped_seen m = { 0 };
	int fd[3];
	void *v[3];
	for (int i = 0; i < 3; i++) {
		snprintf(m.path[i], sizeof(m.path[i]), "%s/m%d", dir, i);
		fd[i] = open(m.path[i], O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		assert_true(fd[i] >= 0);
		assert_int_equal(ftruncate(fd[i], 3 * 4096), 0);
	}
	/* m0: one run of two lines, read-only then writable */
	v[0] = mmap(NULL, 2 * 4096, PROT_READ, MAP_SHARED, fd[0], 0);
	v[1] = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd[1], 0);
	v[2] = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd[2], 0);
	for (int i = 0; i < 3; i++)
		assert_true(v[i] != MAP_FAILED);
	assert_int_equal(mprotect((char *)v[0] + 4096, 4096, PROT_READ | PROT_WRITE), 0);
	assert_int_equal(procscan_each("/proc", 0, PROCSCAN_STAT | PROCSCAN_MAPS_ONLY, mapped_ref, &m), 0);
	assert_int_equal(m.fds, 0);
	assert_true(m.sw[0] >= 1);
	assert_int_equal(m.sw[1], 0);
	assert_int_equal(m.sw[2], 0);
	assert_true(m.maps[1] >= 1 && m.maps[2] >= 1);
	m = (struct mapped_seen){ 0 };
	for (int i = 0; i < 3; i++)
		snprintf(m.path[i], sizeof(m.path[i]), "%s/m%d", dir, i);
	assert_int_equal(procscan_each("/proc", 0, PROCSCAN_STAT, mapped_ref, &m), 0);
	assert_int_equal(m.fds, 3);
	/* only the shared mappings, asked of the kernel (PROCMAP_QUERY): m0's
	 * read-only run, then its writable run again; m1 read-only shared (it
	 * may have been written before an mprotect); never the private m2 */
	m = (struct mapped_seen){ 0 };
	for (int i = 0; i < 3; i++)
		snprintf(m.path[i], sizeof(m.path[i]), "%s/m%d", dir, i);
	assert_int_equal(
		procscan_each("/proc", 0, PROCSCAN_STAT | PROCSCAN_MAPS_ONLY | PROCSCAN_SHARED_MAPS, mapped_ref, &m),
		0);
	assert_int_equal(m.sw[0], 1);
	assert_int_equal(m.maps[0], 2);
	assert_int_equal(m.maps[1], 1);
	assert_int_equal(m.sw[1], 0);
	assert_int_equal(m.maps[2] + m.fds, 0);
	munmap(v[0], 2 * 4096);
	for (int i = 0; i < 3; i++) {
		if (i)
			munmap(v[i], 4096);
		close(fd[i]);
	}
}

/* A process whose first thread has exited (pthread_exit) while another
 * runs: its own maps, fds, cwd and root read empty, so a scan reads another
 * thread's. The holder maps one file shared (its fd closed) and keeps
 * another open; a collect's scan (PROCSCAN_NO_DIRS) and a whole one
 * (PROCSCAN_STAT) give both. */
struct leader_seen {
	pid_t pid;
	char mapped[128], held[128];
	int maps, fds, cwd;
};

static int leader_ref(void *ctx, const struct procscan_ref *ref)
{
	struct leader_seen *l = ctx;
	if (ref->pid != l->pid)
		return PROCSCAN_CONTINUE;
	l->maps += ref->kind == PROCSCAN_MAP && !strcmp(ref->path, l->mapped) && ref->shared_write;
	l->fds += ref->kind == PROCSCAN_FD && !strcmp(ref->path, l->held);
	l->cwd += ref->kind == PROCSCAN_CWD;
	return PROCSCAN_CONTINUE;
}

static void *leader_holder(void *arg)
{
	char c;
	while (read(*(int *)arg, &c, 1) != 0) /* until the test closes its end */
		;
	return NULL;
}

static void test_procscan_reads_another_thread_when_the_first_exited(void **state)
{
	(void)state;
	struct leader_seen l = { 0 };
	int p[2];
	snprintf(l.mapped, sizeof(l.mapped), "%s/mapped", dir);
	snprintf(l.held, sizeof(l.held), "%s/held", dir);
	assert_int_equal(pipe(p), 0);
	l.pid = fork();
	assert_true(l.pid >= 0);
	if (l.pid == 0) {
		close(p[1]);
		int fd = open(l.mapped, O_RDWR | O_CREAT, 0600);
		if (fd < 0 || ftruncate(fd, 4096) < 0 ||
		    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED ||
		    open(l.held, O_WRONLY | O_CREAT, 0600) < 0)
			_exit(1);
		close(fd);
		pthread_t t;
		if (pthread_create(&t, NULL, leader_holder, &p[0]))
			_exit(1);
		pthread_exit(NULL);
	}
	close(p[0]);
	char exe[64], buf[8];
	snprintf(exe, sizeof(exe), "/proc/%d/exe", (int)l.pid);
	for (int i = 0; i < 500 && (readlink(exe, buf, sizeof(buf)) >= 0 || errno != ENOENT); i++)
		usleep(10000);
	assert_true(readlink(exe, buf, sizeof(buf)) < 0 && errno == ENOENT); /* the first thread is gone */
	assert_int_equal(
		procscan_each("/proc", 0, PROCSCAN_MNTNS | PROCSCAN_NO_DIRS | PROCSCAN_SHARED_MAPS, leader_ref, &l), 0);
	assert_int_equal(l.maps, 1);
	assert_int_equal(l.fds, 1);
	assert_int_equal(l.cwd, 0);
	l.maps = l.fds = 0;
	assert_int_equal(procscan_each("/proc", 0, PROCSCAN_STAT, leader_ref, &l), 0);
	assert_int_equal(l.maps, 1);
	assert_int_equal(l.fds, 1);
	assert_int_equal(l.cwd, 1);
	close(p[1]);
	assert_int_equal(waitpid(l.pid, NULL, 0), l.pid);
}

/* A process the scanner may not read (another user's) gives nothing and
 * costs no listing of its fds; one it may read still gives its fds and its
 * mappings, its maps being opened before its fds. Scanned as nobody: the
 * holder, nobody too, holds one file open and another mapped shared; this
 * (root) process holds a third open. */
struct refused_seen {
	const char *held, *mapped, *root_held;
	int held_fd, mapped_map, root_fd;
};

static int refused_ref(void *ctx, const struct procscan_ref *ref)
{
	struct refused_seen *r = ctx;
	r->held_fd += ref->kind == PROCSCAN_FD && !strcmp(ref->path, r->held);
	r->mapped_map += ref->kind == PROCSCAN_MAP && !strcmp(ref->path, r->mapped);
	r->root_fd += ref->kind == PROCSCAN_FD && !strcmp(ref->path, r->root_held);
	return PROCSCAN_CONTINUE;
}

static void as_nobody(void)
{
	if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0 || prctl(PR_SET_DUMPABLE, 1) < 0)
		_exit(2);
}

static void test_procscan_skips_what_it_may_not_read(void **state)
{
	(void)state;
	char held[300], mapped[300], root_held[300];
	snprintf(held, sizeof(held), "%s/held", dir);
	snprintf(mapped, sizeof(mapped), "%s/mapped", dir);
	snprintf(root_held, sizeof(root_held), "%s/root-held", dir);
	int rfd = open(root_held, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	assert_true(rfd >= 0);
	assert_int_equal(chmod(dir, 0755), 0);
	for (const char *f = held, *const *p = (const char *const[]){ held, mapped, NULL }; (f = *p); p++) {
		int fd = open(f, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, 4096), 0);
		assert_int_equal(fchown(fd, 65534, 65534), 0);
		close(fd);
	}
	int go[2], ready[2];
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(ready), 0);
	pid_t holder = fork();
	assert_true(holder >= 0);
	if (holder == 0) {
		close(go[1]); /* its end is the parent's: EOF says go */
		close(rfd);
		as_nobody();
		int a = open(held, O_RDWR | O_CLOEXEC), b = open(mapped, O_RDWR | O_CLOEXEC);
		void *m = b >= 0 ? mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, b, 0) : MAP_FAILED;
		if (a < 0 || m == MAP_FAILED)
			_exit(3);
		close(b);
		char c = 1;
		if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) < 0)
			_exit(4);
		_exit(0);
	}
	char c;
	assert_int_equal(read(ready[0], &c, 1), 1);
	pid_t scanner = fork();
	assert_true(scanner >= 0);
	if (scanner == 0) {
		close(rfd); /* the parent's alone, which the scan may not read */
		as_nobody();
		struct refused_seen r = { .held = held, .mapped = mapped, .root_held = root_held };
		unsigned flags = PROCSCAN_MNTNS | PROCSCAN_NO_DIRS | PROCSCAN_SHARED_MAPS;
		if (procscan_each("/proc", 0, flags, refused_ref, &r) < 0)
			_exit(5);
		_exit(r.held_fd == 1 && r.mapped_map == 1 && r.root_fd == 0 ? 0 : 6);
	}
	int st;
	assert_int_equal(waitpid(scanner, &st, 0), scanner);
	close(go[1]);
	assert_int_equal(waitpid(holder, NULL, 0), holder);
	close(rfd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* Where the kernel has no maps ioctl (older kernels, gVisor), the text is
 * read: a proc of regular files stands for it (the ioctl gives ENOTTY). */
static void test_procscan_shared_write_text(void **state)
{
	(void)state;
	char p[512];
	struct mapped_seen m = { 0 };
	snprintf(m.path[0], sizeof(m.path[0]), "/x/shared");
	snprintf(m.path[1], sizeof(m.path[1]), "/x/private");
	snprintf(m.path[2], sizeof(m.path[2]), "/x/read only");
	snprintf(p, sizeof(p), "%s/fakeproc/%d", dir, (int)getpid());
	assert_int_equal(mkdir_p(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/fakeproc/%d/maps", dir, (int)getpid());
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs("7f0000000000-7f0000001000 rw-s 00000000 fd:01 12   /x/shared\n"
	      "7f0000001000-7f0000002000 rw-p 00000000 fd:01 13   /x/private\n"
	      "7f0000002000-7f0000003000 r--s 00000000 fd:01 14   /x/read only\n",
	      f);
	fclose(f);
	snprintf(p, sizeof(p), "%s/fakeproc", dir);
	assert_int_equal(procscan_each(p, 0, PROCSCAN_MAPS_ONLY | PROCSCAN_SHARED_MAPS, mapped_ref, &m), 0);
	assert_int_equal(m.sw[0], 1);
	assert_int_equal(m.maps[1], 0);
	assert_int_equal(m.maps[2], 1);
	assert_int_equal(m.sw[2], 0);
	m.sw[0] = m.maps[0] = m.maps[2] = 0;
	assert_int_equal(procscan_each(p, 0, PROCSCAN_MAPS_ONLY, mapped_ref, &m), 0);
	assert_int_equal(m.sw[0], 1);
	assert_int_equal(m.maps[1] + m.maps[2], 2);
}

/* PROCSCAN_MNTNS: this process shares its own mount namespace; no cwd or
 * root with PROCSCAN_NO_DIRS; an fd comes unstat'ed and procscan_ref_stat
 * gives it the file's id; a mapping has its id from its maps line. */
struct lazy_seen {
	char path[128];
	struct stat st;
	int dirs, fds, fd_ok, maps, map_ok, ns_ok;
};

static int lazy_ref(void *ctx, const struct procscan_ref *ref)
{
	struct lazy_seen *s = ctx;
	if (ref->pid != getpid())
		return PROCSCAN_CONTINUE;
	s->ns_ok += procscan_ref_same_mntns(ref);
	s->dirs += ref->kind == PROCSCAN_CWD || ref->kind == PROCSCAN_ROOT;
	if (strcmp(ref->path, s->path))
		return PROCSCAN_CONTINUE;
	struct procscan_ref r = *ref;
	if (ref->kind == PROCSCAN_FD) {
		s->fds++;
		s->fd_ok += !ref->has_id && procscan_ref_stat(&r) == 0 && r.has_id && r.dev == s->st.st_dev &&
			r.ino == s->st.st_ino;
	}
	if (ref->kind == PROCSCAN_MAP) {
		s->maps++;
		s->map_ok += ref->has_id && ref->dev == s->st.st_dev && ref->ino == s->st.st_ino;
	}
	return PROCSCAN_CONTINUE;
}

static void test_procscan_lazy_stat(void **state)
{
	(void)state;
	struct lazy_seen s = { 0 };
	snprintf(s.path, sizeof(s.path), "%s/lazy", dir);
	int fd = open(s.path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 4096), 0);
	assert_int_equal(fstat(fd, &s.st), 0);
	void *v = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(v != MAP_FAILED);
	assert_int_equal(procscan_each("/proc", 0, PROCSCAN_MNTNS | PROCSCAN_NO_DIRS, lazy_ref, &s), 0);
	assert_true(s.ns_ok > 0);
	assert_int_equal(s.dirs, 0);
	assert_int_equal(s.fds, 1);
	assert_int_equal(s.fd_ok, 1);
	assert_true(s.maps >= 1);
	assert_int_equal(s.map_ok, s.maps);
	munmap(v, 4096);
	close(fd);
}

/* The real /proc: an open and mapped file is seen by path and by (dev, ino),
 * and still by both once deleted, without the kernel's " (deleted)". */
static void test_procscan_real(void **state)
{
	(void)state;
	char p[128];
	snprintf(p, sizeof(p), "%s/held", dir);
	_cleanup_close_ int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 4096), 0);
	void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	struct seen s = { .want = p };
	assert_int_equal(fstat(fd, &s.st), 0);
	assert_int_equal(procscan_each("/proc", 0, PROCSCAN_STAT, seen_ref, &s), 0);
	assert_true(s.fd && s.map && s.id_ok);
	assert_false(s.fd_deleted);
	assert_int_equal(unlink(p), 0);
	s = (struct seen){ .want = p, .st = s.st };
	assert_int_equal(procscan_each("/proc", 0, PROCSCAN_STAT, seen_ref, &s), 0);
	assert_true(s.fd && s.map && s.id_ok && s.fd_deleted);
	char *roots[] = { dir };
	pid_t *pids = NULL;
	size_t n = 0;
	assert_int_equal(procscan_pids_under("/proc", roots, 1, 0, &pids, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(pids[0], getpid());
	free(pids);
	assert_int_equal(procscan_pids_under("/proc", roots, 1, getpid(), &pids, &n), 0);
	assert_int_equal(n, 0);
	free(pids);
	munmap(m, 4096);
	char comm[64], self[17] = "";
	procscan_comm("/proc", getpid(), comm, sizeof(comm));
	assert_int_equal(prctl(PR_GET_NAME, self), 0); /* "test_lib", or valgrind's */
	assert_string_equal(comm, self);
}

static void test_path_under(void **state)
{
	(void)state;
	assert_true(procscan_path_under("/srv/app", "/srv/app"));
	assert_true(procscan_path_under("/srv/app/x", "/srv/app//"));
	assert_false(procscan_path_under("/srv/apple", "/srv/app"));
	assert_false(procscan_path_under("/srv", "/srv/app"));
	assert_true(procscan_path_under("/anything", "/"));
	assert_false(procscan_path_under("socket:[1]", "/"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hash_vectors),
		cmocka_unit_test(test_devino_map),
		cmocka_unit_test(test_strset),
		cmocka_unit_test_setup_teardown(test_xattr_ref, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk, setup, teardown),
		cmocka_unit_test_setup_teardown(test_procscan_real, setup, teardown),
		cmocka_unit_test_setup_teardown(test_procscan_shared_write, setup, teardown),
		cmocka_unit_test_setup_teardown(test_procscan_shared_write_text, setup, teardown),
		cmocka_unit_test_setup_teardown(test_procscan_skips_what_it_may_not_read, setup, teardown),
		cmocka_unit_test_setup_teardown(test_procscan_reads_another_thread_when_the_first_exited, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_procscan_lazy_stat, setup, teardown),
		cmocka_unit_test_setup_teardown(test_procscan_users_by_identity, setup, teardown),
		cmocka_unit_test_setup_teardown(test_procscan_users_hidden_under_mount, setup, teardown),
		cmocka_unit_test(test_path_under),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
