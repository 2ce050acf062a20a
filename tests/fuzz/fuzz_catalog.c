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

/* A record that decodes encodes to JSON that decodes to the same record. */
static void round_trip(const uint8_t *data, size_t size)
{
	json_error_t jerr;
	const char *why = NULL;
	json_t *j = json_loadb((const char *)data, size, 0, &jerr);
	struct ckpt_record *r = j ? record_from_json(j, &why) : NULL;

	if (j && !r && !why)
		abort(); /* a refusal says why */
	if (r) {
		json_t *out = record_json(r, true);
		struct ckpt_record *again = record_from_json(out, &why);
		json_t *out2 = again ? record_json(again, true) : NULL;
		if (!again || !json_equal(out, out2) || !id_valid(r->id) || !r->name)
			abort();
		json_t *pub = record_json(r, false);
		json_decref(pub);
		json_decref(out2);
		json_decref(out);
		record_unref(again);
		record_unref(r);
	}
	json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct catalog *c = NULL;
	struct catalog_list list = { 0 };
	ckpt_error err = { 0 };

	round_trip(data, size);
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
	/* Only a whole record filed under its own id is listed. */
	if (r && (strcmp(r->id, ID) || !r->name))
		abort();
	record_unref(r);
	if (catalog_list(c, NULL, &list) < 0 || list.n != (listed ? 1 : 0) || catalog_count(c) != list.n)
		abort();
	catalog_list_free(&list);
	catalog_close(c);
	return 0;
}
