/* treecopy_measure.c: the files and bytes a copy of a tree would write (the
 * progress totals), counting only the files a previous index does not match. */
#include "backend/overlay/treecopy.h"
#include "lib/walk.h"

#include <limits.h>
#include <sys/stat.h>

struct tc_measure {
	const struct pathindex *ix;
	char path[PATH_MAX];
	size_t len;
	uint64_t files, bytes;
};

static int tc_measure_dir(struct tc_measure *m, int dfd);

static int tc_measure_entry(void *ctx, int dfd, const char *name)
{
	struct tc_measure *m = ctx;
	struct stat st;
	size_t n = strlen(name), saved = m->len;
	if (m->len + n + 2 >= sizeof(m->path))
		return -ENAMETOOLONG;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (m->len)
		m->path[m->len++] = '/';
	memcpy(m->path + m->len, name, n + 1);
	m->len += n;
	int r = 0;
	m->files++; /* every entry below the top, as tc_progress counts */
	if (S_ISDIR(st.st_mode)) {
		_cleanup_close_ int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		r = sub < 0 ? -errno : tc_measure_dir(m, sub);
	} else if (S_ISREG(st.st_mode) && !pathindex_match(m->ix, m->path, &st)) {
		m->bytes += (uint64_t)st.st_size;
	}
	m->len = saved;
	m->path[saved] = 0;
	return r;
}

static int tc_measure_dir(struct tc_measure *m, int dfd)
{
	return walk_each(dfd, NULL, tc_measure_entry, m);
}

int treecopy_measure(int src_fd, const struct pathindex *prev_ix, uint64_t *ret_files, uint64_t *ret_bytes)
{
	struct tc_measure *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->ix = prev_ix;
	int r = tc_measure_dir(m, src_fd);
	*ret_files = m->files, *ret_bytes = m->bytes;
	free(m);
	return r;
}
