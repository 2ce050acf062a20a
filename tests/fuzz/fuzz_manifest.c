/* fuzz_manifest.c: a tar checkpoint's manifest (and its alias file) as restore
 * loads them: every path must come out valid, every hard link pointing back. */
#include <stdio.h>
#include "backend/tar/tar_manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int dir_fd = -1;
static char dir[] = "/dev/shm/ckptd-fuzz-manifest-XXXXXX"; /* tmpfs: see fuzz_catalog.c */

static void cleanup(void)
{
	rm_rf_at(AT_FDCWD, dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tar_manifest m;
	ckpt_error err = { 0 };

	if (dir_fd < 0) {
		if (!mkdtemp(dir) || (dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
			abort();
		atexit(cleanup);
	}
	int fd = openat(dir_fd, "manifest", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, data, size) != (ssize_t)size)
		abort();
	close(fd);
	if (tar_manifest_load(dir_fd, "manifest", &m, &err) < 0) {
		if (!err.msg[0])
			abort();
		return 0;
	}
	for (size_t i = 0; i < m.n; i++) {
		struct tar_mentry *e = &m.v[i];
		if (!tar_path_valid(e->path) || tar_manifest_find(&m, e->path) == NULL)
			abort();
		if (e->type == 'h' && (!e->link || !tar_path_valid(e->link)))
			abort();
		/* a data source is a checkpoint's name (it becomes a path below
		 * the tar state dir), and only a regular file has one */
		if (e->src && (e->type != 'f' || (!id_valid(e->src) && strcmp(e->src, "base"))))
			abort();
		(void)tar_manifest_parent(&m, e->path);
	}
	/* The alias file has its own format; a hostile one must only be ignored. */
	tar_manifest_alias_load(dir_fd, "manifest", &m);
	tar_manifest_free(&m);
	return 0;
}
