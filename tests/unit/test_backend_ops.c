/* Unit tests of the backends' tables: every required op is there, and an
 * optional ability is present or absent as a whole, so the engine can ask
 * for an ability, never for a backend's name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/backend.h"

/* The main table is total: the engine calls each op without asking. */
static void check_table(const struct backend_ops *b)
{
	assert_non_null(b->name);
	assert_non_null(b->probe);
	assert_non_null(b->open);
	assert_non_null(b->recover);
	assert_non_null(b->create);
	assert_non_null(b->restore);
	assert_non_null(b->reset);
	assert_non_null(b->remove);
	assert_non_null(b->health);
	assert_non_null(b->precopy);
	assert_non_null(b->maintain);
	assert_non_null(b->cleanup);
	assert_non_null(b->close);
	if (b->capture)
		assert_non_null(b->capture->capture);
	if (b->compare) {
		assert_non_null(b->compare->verify);
		assert_non_null(b->compare->diff);
	}
	if (b->forks) {
		assert_non_null(b->forks->mount);
		assert_non_null(b->forks->remove);
	}
	if (b->xfer) {
		assert_non_null(b->xfer->view_open);
		assert_non_null(b->xfer->view_close);
		assert_non_null(b->xfer->import);
	}
	if (b->release)
		assert_non_null(b->release->release);
}

static void test_tables_whole(void **state)
{
	(void)state;
	check_table(&backend_tar_ops);
	check_table(&backend_overlay_ops);
	/* both have every ability today */
	assert_non_null(backend_tar_ops.forks);
	assert_non_null(backend_overlay_ops.forks);
	assert_non_null(backend_tar_ops.release);
	assert_non_null(backend_overlay_ops.release);
}

static void test_export_identity(void **state)
{
	(void)state;
	/* layers over a base name it in an export; whole trees do not */
	assert_string_equal(backend_overlay_ops.xfer->base_kind, "overlay-base");
	assert_null(backend_tar_ops.xfer->base_kind);
	/* only the backend that unmounts a root on release asks for the checks */
	assert_true(backend_overlay_ops.release->unmounts);
	assert_false(backend_tar_ops.release->unmounts);
}

static void test_import_filter(void **state)
{
	(void)state;
	const struct backend_ops *all[] = { &backend_tar_ops, &backend_overlay_ops };
	for (size_t i = 0; i < ARRAY_SIZE(all); i++) {
		bool (*portable)(const char *) = all[i]->xfer->xattr_portable;
		assert_non_null(portable);
		assert_false(portable("trusted.overlay.redirect"));
		assert_false(portable("trusted.overlay.opaque"));
		assert_true(portable("user.ok"));
		assert_true(portable("trusted.owner"));
		assert_true(portable("security.capability"));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tables_whole),
		cmocka_unit_test(test_export_identity),
		cmocka_unit_test(test_import_filter),
	};
	return cmocka_run_group_tests_name("backend_ops", tests, NULL, NULL);
}
