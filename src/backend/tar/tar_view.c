/* tar_view.c: what reads a tar checkpoint without changing the roots:
 * export views, forks, diffs and verify. */
#include "backend/tar/tar_internal.h"

/* A view is an extraction of the checkpoint (or base) into tmp/r<N>: restore
 * into an empty directory writes every entry. */
int tar_view_open(void *st, const char *id, json_t *data, const char *tmp, char ***ret_dirs, ckpt_error *err)
{
	struct tar_state *s = st;
	const char *name = id ? id : BASE;
	char **dirs = calloc(s->n_roots + 1, sizeof(*dirs));
	bool zstd = false;
	int r = dirs ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
	(void)data;

	_cleanup_close_ int cfd = openat(s->tar_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (r == 0 && cfd < 0)
		r = err_set(err, errno, NULL, "checkpoint data '%s' is missing: %m", name);
	if (r == 0)
		r = tar_meta_read(s, cfd, name, &zstd, err);
	for (size_t i = 0; r == 0 && i < s->n_roots; i++) {
		struct tar_restore_opts o = { .skip_dev = s->state_dev,
					      .skip_ino = s->state_ino,
					      .store_fd = s->tar_fd };
		struct tar_restore_stats one;
		char arch[32], man[32];
		if (asprintf(&dirs[i], "%s/r%zu", tmp, i) < 0) {
			dirs[i] = NULL;
			r = err_set(err, ENOMEM, NULL, "out of memory");
			break;
		}
		if (mkdir(dirs[i], 0700) < 0) {
			r = err_set(err, errno, NULL, "cannot create '%s': %m", dirs[i]);
			break;
		}
		_cleanup_close_ int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		tar_meta_names(i, zstd, arch, man);
		r = fd < 0 ? err_set(err, errno, NULL, "cannot open '%s': %m", dirs[i])
			   : tar_restore_root(fd, cfd, arch, man, &o, &one, err);
	}
	if (r < 0) {
		for (size_t i = 0; dirs && i < s->n_roots; i++)
			free(dirs[i]);
		free(dirs);
		return r;
	}
	*ret_dirs = dirs;
	return 0;
}

void tar_view_close(void *st, char **dirs)
{
	struct tar_state *s = st;
	for (size_t i = 0; dirs && i < s->n_roots; i++)
		free(dirs[i]);
	free(dirs);
}

/* The checkpoints the parent pointers of meta.json lead through, oldest
 * first, ending with id: a checkpoint's archive adds to its parent's. */
json_t *tar_lineage(void *st, const char *id, json_t *data)
{
	struct tar_state *s = st;
	json_t *out = json_array();
	char name[64];
	(void)data;
	snprintf(name, sizeof(name), "%s", id);
	for (int depth = 0; out && depth < 1000 && id_valid(name); depth++) {
		_cleanup_close_ int fd = openat(s->tar_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		_cleanup_(tar_meta_free) struct tar_meta meta = { 0 };
		if (fd < 0 || tar_meta_load(fd, &meta) < 0)
			break;
		json_array_insert_new(out, 0, json_string(name));
		snprintf(name, sizeof(name), "%s", meta.parent);
	}
	return out;
}

int tar_verify(void *st, const char *id, json_t *data, struct verify_diffs *diffs, size_t max, ckpt_error *err)
{
	struct tar_state *s = st;
	const char *name = id ? id : BASE;
	char arch[32], man[32];
	bool zstd;
	(void)data;

	if (id && !id_valid(id))
		return err_set(err, EINVAL, NULL, "invalid checkpoint id '%s'", id);
	_cleanup_close_ int cfd = openat(s->tar_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cfd < 0)
		return err_set(err, errno, NULL, "checkpoint data '%s' is missing: %m", name);
	_cleanup_(rootexcl_free) struct rootexcl excl = { 0 };
	int r = tar_meta_read(s, cfd, name, &zstd, err);
	if (r >= 0)
		r = tar_excl_build(s, &excl, err);
	for (size_t i = 0; r >= 0 && i < s->n_roots; i++) {
		struct tar_verify_opts o = { .root_path = s->roots[i],
					     .skip_dev = s->state_dev,
					     .skip_ino = s->state_ino,
					     .excl = &excl,
					     .max_diffs = max };
		_cleanup_close_ int fd = tar_meta_open_root(s, i, err);
		if (fd < 0)
			return fd;
		tar_meta_names(i, zstd, arch, man);
		if ((r = tar_verify_root(fd, cfd, man, &o, diffs, err)) < 0)
			err_prefix(err, "root '%s'", s->roots[i]);
	}
	if (r >= 0 && diffs->n > 0)
		tar_meta_unfinished(s, name, "verify found differences");
	return r;
}

/* A fork is a full extraction of the checkpoint into each empty dir. */
int tar_fork_mount(void *st, const char *id, json_t *data, const char *fid, const char *const *dirs, json_t **fdata,
		   ckpt_error *err)
{
	struct tar_state *s = st;
	bool zstd;
	char arch[32], man[32];
	(void)data;
	(void)fid;
	if (*fdata) /* extracted once, nothing to mount again */
		return 0;
	_cleanup_close_ int cfd = tar_meta_open_ckpt(s, id, &zstd, err);
	if (cfd < 0)
		return cfd;
	for (size_t i = 0; i < s->n_roots; i++) {
		struct tar_restore_opts o = { .skip_dev = s->state_dev,
					      .skip_ino = s->state_ino,
					      .trust_nothing = true,
					      .no_alias = true,
					      .store_fd = s->tar_fd };
		struct tar_restore_stats one;
		_cleanup_close_ int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return err_set(err, errno, NULL, "open '%s': %m", dirs[i]);
		tar_meta_names(i, zstd, arch, man);
		if (tar_restore_root(fd, cfd, arch, man, &o, &one, err) < 0 || syncfs(fd) < 0)
			return err_prefix(err, "extract into '%s'", dirs[i]);
	}
	*fdata = json_pack("{s:b}", "extracted", true);
	return 0;
}

int tar_fork_remove(void *st, const char *fid, json_t *fdata, const char *const *dirs, ckpt_error *err)
{
	struct tar_state *s = st;
	(void)fid;
	(void)fdata;
	for (size_t i = 0; i < s->n_roots; i++) {
		_cleanup_close_ int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		DIR *d;
		if (fd < 0 || walk_open(fd, NULL, &d) < 0)
			continue; /* already gone */
		struct dirent *de;
		int r = 0;
		while ((de = walk_next(d)))
			if (rm_rf_at(dirfd(d), de->d_name) < 0)
				r = -errno;
		closedir(d);
		if (r < 0)
			return err_set(err, -r, NULL, "empty '%s': %s", dirs[i], strerror(-r));
	}
	return 0;
}

int tar_diff(void *st, const char *id, json_t *data, const char *id2, json_t *data2, struct bdiff_list *out,
	     ckpt_error *err)
{
	struct tar_state *s = st;
	bool zstd, zstd2;
	char arch[32], man[32];
	(void)data;
	(void)data2;
	_cleanup_close_ int cfd = tar_meta_open_ckpt(s, id, &zstd, err);
	if (cfd < 0)
		return cfd;
	_cleanup_close_ int cfd2 = id2 ? tar_meta_open_ckpt(s, id2, &zstd2, err) : -1;
	if (id2 && cfd2 < 0)
		return cfd2;
	_cleanup_(rootexcl_free) struct rootexcl excl = { 0 };
	if (!id2 && tar_excl_build(s, &excl, err) < 0)
		return -EIO;
	for (size_t i = 0; i < s->n_roots; i++) {
		_cleanup_close_ int fd = id2 ? -1 : tar_meta_open_root(s, i, err);
		if (!id2 && fd < 0)
			return fd;
		tar_meta_names(i, zstd, arch, man);
		if (tar_diff_root(s->roots[i], cfd, man, cfd2, man, fd, s->state_dev, s->state_ino, &excl, out, err) <
		    0)
			return -EIO;
	}
	bdiff_sort(out);
	return 0;
}
