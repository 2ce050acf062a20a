/* treecopy_measure.c: the files and bytes a copy of a tree would write (the
 * progress totals), counting only the files a previous index does not match. */
#include "backend/overlay/treecopy.h"
#include "lib/walk.h"

#include <limits.h>
#include <sys/stat.h>

struct tc_measure {
	const struct pathindex *ix;
	uint64_t files, bytes;
};

static int tc_measure_entry(void *ctx, struct walk_entry *e)
{
	struct tc_measure *m = ctx;
	m->files++; /* every entry below the top, as tc_progress counts */
	if (S_ISREG(e->st.st_mode) && !pathindex_match(m->ix, e->path, &e->st))
		m->bytes += (uint64_t)e->st.st_size;
	return 0;
}

/* An entry gone since listed is not counted; any other failure is the
 * measure's. */
static int tc_measure_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	return e->step == WALK_AT_STAT && err == -ENOENT ? 0 : err;
}

int treecopy_measure(int src_fd, const struct pathindex *prev_ix, uint64_t *ret_files, uint64_t *ret_bytes)
{
	struct tc_measure m = { .ix = prev_ix };
	struct walk_opts o = { .flags = WALK_STAT,
			       .path_max = PATH_MAX - 1,
			       .pre = tc_measure_entry,
			       .fail = tc_measure_fail,
			       .ctx = &m };
	int r = walk_tree(src_fd, NULL, &o);
	*ret_files = m.files, *ret_bytes = m.bytes;
	return r;
}
