/* test_overlay_rebase.c: folding 16 deltas into the next (overlay_rebase.c):
 * the deltas' directories merged with what the tracker names since the last
 * create (pathindex_dirty_dedup), each directory once, sorted, dirty for
 * either reason: names joined only where both name every change, a
 * directory made again no longer known. The fold through real layers is test_overlay_delta.py's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/overlay/overlay_internal.h"

/* A dirty directory: path, flags "dkKn" (deep, known, kept, named) and
 * its names, NULL-ended. */
static struct pathindex_dirty dirty(const char *path, const char *flags, const char *const *names)
{
	struct pathindex_dirty d = { .path = strdup(path),
				     .deep = strchr(flags, 'd') != NULL,
				     .known = strchr(flags, 'k') != NULL,
				     .kept = strchr(flags, 'K') != NULL,
				     .named = strchr(flags, 'n') != NULL };
	while (names && names[d.n_names])
		d.n_names++;
	d.names = d.n_names ? calloc(d.n_names, sizeof(*d.names)) : NULL;
	for (size_t i = 0; i < d.n_names; i++)
		d.names[i] = strdup(names[i]);
	return d;
}

static void assert_names(const struct pathindex_dirty *d, const char *const *want)
{
	size_t n = 0;
	while (want && want[n])
		n++;
	assert_int_equal(d->n_names, n);
	for (size_t i = 0; i < n; i++)
		assert_string_equal(d->names[i], want[i]);
}

static void test_merge(void **s)
{
	(void)s;
	struct ovl_root r = { 0 };
	r.n_rebase = 4;
	r.rebase = calloc(r.n_rebase, sizeof(*r.rebase));
	r.rebase[0] = dirty("", "Kn", (const char *[]){ "d0", "d1", NULL });
	r.rebase[1] = dirty("d0", "Kn", (const char *[]){ "x", "y", NULL });
	r.rebase[2] = dirty("d2", "", NULL);                             /* a name left it */
	r.rebase[3] = dirty("n", "dkKn", (const char *[]){ "f", NULL }); /* made since the full layer */
	size_t n = 5;
	struct pathindex_dirty *v = calloc(n, sizeof(*v));
	v[0] = dirty("d0", "Kn", (const char *[]){ "a", "x", NULL });
	v[1] = dirty("d1", "n", (const char *[]){ "gone", NULL }); /* a name left it now */
	v[2] = dirty("d2", "Kn", (const char *[]){ "new", NULL });
	v[3] = dirty("n", "dKn", NULL); /* made again since */
	v[4] = dirty("z", "Kn", (const char *[]){ "q", NULL });
	assert_int_equal(overlay_rebase_merge(&r, &v, &n), 0);
	assert_null(r.rebase);
	assert_int_equal(r.n_rebase, 0);
	assert_int_equal(n, 6);
	const char *paths[] = { "", "d0", "d1", "d2", "n", "z" };
	for (size_t i = 0; i < n; i++)
		assert_string_equal(v[i].path, paths[i]);
	assert_names(&v[0], (const char *[]){ "d0", "d1", NULL });
	assert_true(v[1].kept && v[1].named); /* both name every change: the names joined */
	assert_names(&v[1], (const char *[]){ "a", "x", "y", NULL });
	assert_false(v[2].kept);               /* only the tracker's: as it was */
	assert_false(v[3].kept || v[3].named); /* the fold's reads every name: so does the merge */
	assert_true(v[4].deep);
	assert_false(v[4].known); /* made again: its directories are new to the list */
	assert_names(&v[5], (const char *[]){ "q", NULL });
	pathindex_dirty_free(v, n);
}

static void test_merge_nothing_named_now(void **s)
{
	(void)s;
	struct ovl_root r = { 0 };
	r.n_rebase = 1;
	r.rebase = calloc(1, sizeof(*r.rebase));
	r.rebase[0] = dirty("d", "dkKn", (const char *[]){ "b", NULL });
	size_t n = 0;
	struct pathindex_dirty *v = NULL;
	assert_int_equal(overlay_rebase_merge(&r, &v, &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(v[0].path, "d");
	assert_true(v[0].deep && v[0].known && v[0].kept);
	assert_false(v[0].named); /* copied whole: no names to compare */
	assert_names(&v[0], (const char *[]){ NULL });
	pathindex_dirty_free(v, n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_merge),
		cmocka_unit_test(test_merge_nothing_named_now),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
