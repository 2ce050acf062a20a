/* fuzz_catalog.c: a catalog record file as ckptd reads it at start: the input
 * is written as <state>/catalog/<id>.json and the catalog opened over it. */
#include <jansson.h>
#include <stdio.h>
#include <sys/stat.h>
#include "engine/catalog.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ID "cp_0123456789abcdef01234567"

static int state_fd = -1, cat_fd = -1;
/* tmpfs: ext4 flushes a truncated-and-rewritten file at close (auto_da_alloc). */
static char dir[] = "/dev/shm/ckptd-fuzz-catalog-XXXXXX";

static void cleanup(void)
{
	rm_rf_at(AT_FDCWD, dir);
}

static void setup(void)
{
	if (!mkdtemp(dir))
		abort();
	atexit(cleanup);
	state_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (state_fd < 0 || mkdirat(state_fd, "catalog", 0700) < 0)
		abort();
	cat_fd = openat(state_fd, "catalog", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cat_fd < 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct catalog *c = NULL;
	ckpt_error err = { 0 };

	if (state_fd < 0)
		setup();
	int fd = openat(cat_fd, ID ".json", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, data, size) != (ssize_t)size)
		abort();
	close(fd);
	if (catalog_open(state_fd, &c, &err) < 0)
		abort(); /* a bad record is left out, never fatal */
	const struct ckpt_record *r = catalog_get(c, ID);
	bool listed = r != NULL;
	if (r) {
		/* Only a whole record of this id is listed, with a known status. */
		if (strcmp(r->id, ID) || !r->name || r->status >= CKPT_STATUS_N)
			abort();
		json_t *pub = record_json(r, false);
		if (!pub || !json_is_string(json_object_get(pub, "name")))
			abort();
		json_decref(pub);
		record_unref(r);
	}
	struct catalog_list list;
	if (catalog_list(c, NULL, &list) < 0 || list.n != (listed ? 1u : 0u))
		abort();
	catalog_list_free(&list);
	catalog_close(c);
	return 0;
}
