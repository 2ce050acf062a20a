/* probe-fanotify: what fanotify reports about writes made through an overlay
 * mount, when the mark is on the filesystem that holds the upper dir. The
 * facts it prints decide how ckptd could track an upper's changes instead of
 * walking it (docs/limits.md, issue 11 item 4). Not part of ckptd.
 *
 *   cc -O2 -Wall -o probe-fanotify tools/probe-fanotify.c && ./probe-fanotify [DIR]
 *
 * DIR (default /tmp) must be on a filesystem with file handles (ext4, xfs,
 * btrfs). Needs root. Prints one line per step: what was done through the
 * mount, then the events read for it (event mask and upper-relative path). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static char upper[PATH_MAX];
static int fan = -1, upper_fd = -1;

static void die(const char *what)
{
	fprintf(stderr, "probe-fanotify: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void mask_str(unsigned long long m, char *buf, size_t n)
{
	static const struct {
		unsigned long long bit;
		const char *name;
	} names[] = {
		{ FAN_MODIFY, "MODIFY" },	  { FAN_ATTRIB, "ATTRIB" },	  { FAN_CLOSE_WRITE, "CLOSE_WRITE" },
		{ FAN_CREATE, "CREATE" },	  { FAN_DELETE, "DELETE" },	  { FAN_MOVED_FROM, "MOVED_FROM" },
		{ FAN_MOVED_TO, "MOVED_TO" },	  { FAN_ONDIR, "ONDIR" },	  { FAN_Q_OVERFLOW, "OVERFLOW" },
		{ FAN_DELETE_SELF, "DELETE_SELF" }, { FAN_MOVE_SELF, "MOVE_SELF" },
	};
	buf[0] = 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (m & names[i].bit)
			snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? "|" : "", names[i].name);
}

/* Print the queued events; a directory handle is resolved to its path, shown
 * relative to the upper (or as "(outside) PATH": the work dir, other files). */
static void drain(const char *step)
{
	char buf[8192], mask[128], link[64], path[PATH_MAX];
	int seen = 0;

	printf("%s\n", step);
	for (;;) {
		ssize_t len = read(fan, buf, sizeof(buf));
		if (len < 0 && errno == EAGAIN)
			break;
		if (len < 0)
			die("read fanotify");
		for (struct fanotify_event_metadata *m = (void *)buf; FAN_EVENT_OK(m, len); m = FAN_EVENT_NEXT(m, len)) {
			struct fanotify_event_info_fid *fid = (void *)(m + 1);
			mask_str(m->mask, mask, sizeof(mask));
			seen++;
			if ((char *)fid >= (char *)m + m->event_len) {
				printf("    %s (no info)\n", mask);
				continue;
			}
			struct file_handle *fh = (void *)fid->handle;
			const char *name = fid->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID_NAME
						   ? (const char *)fh->f_handle + fh->handle_bytes
						   : "";
			int d = open_by_handle_at(upper_fd, fh, O_PATH);
			ssize_t n = -1;
			if (d >= 0) {
				snprintf(link, sizeof(link), "/proc/self/fd/%d", d);
				n = readlink(link, path, sizeof(path) - 1);
				close(d);
			}
			if (n < 0) {
				printf("    %-22s (unresolved dir) %s\n", mask, name);
				continue;
			}
			path[n] = 0;
			size_t ul = strlen(upper);
			if (!strncmp(path, upper, ul) && (path[ul] == 0 || path[ul] == '/'))
				printf("    %-22s upper:%s%s%s\n", mask, path + ul, path[ul] ? "/" : "/", name);
			else
				printf("    %-22s (outside) %s/%s\n", mask, path, name);
		}
	}
	if (!seen)
		printf("    (no event)\n");
}

static void put(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, text, strlen(text)) < 0 || close(fd) < 0)
		die(path);
}

int main(int argc, char **argv)
{
	char top[PATH_MAX / 2], p[PATH_MAX + 64], opts[4 * PATH_MAX];
	snprintf(top, sizeof(top), "%s/probe-fanotify.XXXXXX", argc > 1 ? argv[1] : "/tmp");
	if (!mkdtemp(top))
		die("mkdtemp");
	const char *sub[] = { "lower", "upper", "work", "merged", "lower/dir", "lower/dir/sub" };
	for (size_t i = 0; i < sizeof(sub) / sizeof(sub[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", top, sub[i]);
		if (mkdir(p, 0755) < 0)
			die(p);
	}
	snprintf(p, sizeof(p), "%s/lower/base.txt", top);
	put(p, "base\n");
	snprintf(p, sizeof(p), "%s/lower/dir/sub/deep.txt", top);
	put(p, "deep\n");
	snprintf(upper, sizeof(upper), "%s/upper", top);
	snprintf(opts, sizeof(opts), "lowerdir=%s/lower,upperdir=%s,workdir=%s/work,redirect_dir=on", top, upper, top);
	snprintf(p, sizeof(p), "%s/merged", top);
	if (mount("overlay", p, "overlay", 0, opts) < 0)
		die("mount overlay");

	fan = fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_DFID_NAME, O_RDONLY);
	if (fan < 0)
		die("fanotify_init(FAN_REPORT_DFID_NAME)");
	upper_fd = open(upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	unsigned long long ev = FAN_MODIFY | FAN_ATTRIB | FAN_CLOSE_WRITE | FAN_CREATE | FAN_DELETE |
				FAN_MOVED_FROM | FAN_MOVED_TO | FAN_ONDIR;
	if (upper_fd < 0 || fanotify_mark(fan, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, ev, AT_FDCWD, upper) < 0)
		die("fanotify_mark(FAN_MARK_FILESYSTEM) on the upper's filesystem");
	snprintf(p, sizeof(p), "%s/merged", top);
	int m = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (m < 0)
		die("open merged");
	if (fanotify_mark(fan, FAN_MARK_ADD | FAN_MARK_MOUNT, FAN_MODIFY, m, NULL) < 0)
		printf("a mount mark on the overlay itself: %s (so the mark must be on the upper's filesystem)\n",
		       strerror(errno));
	drain("0. setup (events of mkdir/mount before the mark are not reported)");

	int fd = openat(m, "new.txt", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, "new\n", 4) != 4)
		die("new.txt");
	drain("1. create and write new.txt through the mount, still open");
	close(fd);
	drain("2. close new.txt");

	fd = openat(m, "base.txt", O_WRONLY | O_APPEND | O_CLOEXEC);
	if (fd < 0 || write(fd, "more\n", 5) != 5)
		die("base.txt");
	close(fd);
	drain("3. append to base.txt (a lower file: copy-up, then write)");

	fd = openat(m, "new.txt", O_RDWR | O_CLOEXEC);
	char *map = fd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		die("mmap new.txt");
	drain("4. open new.txt O_RDWR and mmap it MAP_SHARED");
	memcpy(map, "MAP\n", 4);
	msync(map, 4096, MS_SYNC);
	drain("5. write through the shared mapping (and msync)");
	close(fd);
	drain("6. close the fd, the mapping still holds the file");
	memcpy(map, "MAQ\n", 4);
	munmap(map, 4096);
	drain("7. write through the mapping again, then munmap (the last reference)");

	if (fchmodat(m, "base.txt", 0600, 0) < 0)
		die("chmod");
	drain("8. chmod base.txt");
	if (unlinkat(m, "dir/sub/deep.txt", 0) < 0)
		die("unlink deep.txt");
	drain("9. unlink dir/sub/deep.txt (a lower file: a whiteout in the upper)");
	if (renameat(m, "dir", m, "dir2") < 0)
		printf("rename dir: %s\n", strerror(errno));
	drain("10. rename dir to dir2 (a lower dir: redirect_dir=on)");
	if (linkat(m, "new.txt", m, "link.txt", 0) < 0)
		die("link");
	fd = openat(m, "link.txt", O_WRONLY | O_APPEND | O_CLOEXEC);
	if (fd < 0 || write(fd, "via link\n", 9) != 9)
		die("write link.txt");
	close(fd);
	drain("11. hard link new.txt as link.txt, then write through link.txt");

	close(m);
	snprintf(p, sizeof(p), "%s/merged", top);
	umount2(p, MNT_DETACH);
	printf("left in %s (remove it with rm -rf)\n", top);
	return 0;
}
