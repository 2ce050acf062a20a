/* treecopy.c: walk a source dir and recreate it in a destination dir.
 * Order per inode: create, data, chown, chmod, xattrs, then times;
 * directory times after their children. This file holds the walks (copy,
 * update in place, update of listed dirs); one inode's data and metadata
 * are treecopy_data.c's, the size of a copy to come treecopy_measure.c's. */
#include "backend/overlay/treecopy.h"
#include "backend/overlay/treecopy_internal.h"
#include "lib/devino.h"
#include "lib/walk.h"
#include "lib/xattr.h"
#include "backend/backend.h"

#include <limits.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#define OPAQUE_XATTR "trusted.overlay.opaque"

struct tc {
	const struct treecopy_opts *o;
	struct treecopy_stats *st;
	ckpt_error *err;
	int dst_root;
	struct devino_map links; /* (dev, ino) -> first relpath copied */
	char path[PATH_MAX];     /* relpath of the current entry */
	size_t len;
	bool shallow; /* update_dirs: a dir over a dir is left to its own turn */
	bool partial; /* update_dirs: other names of a file may be where it does not look */
};

static int tc_fail(struct tc *t, int r, const char *what)
{
	return err_set(t->err, -r, NULL, "%s '%s': %s", what, t->len ? t->path : ".", strerror(-r));
}

static int tc_push(struct tc *t, const char *name, size_t *saved)
{
	size_t n = strlen(name);
	*saved = t->len;
	if (t->len + n + 2 >= sizeof(t->path))
		return -ENAMETOOLONG;
	if (t->len)
		t->path[t->len++] = '/';
	memcpy(t->path + t->len, name, n + 1);
	t->len += n;
	return 0;
}

/* The current entry is now path (a walk's, shorter than t->path). */
static void tc_at(struct tc *t, const char *path, size_t len)
{
	memmove(t->path, path, len + 1);
	t->len = len;
}

static void tc_progress(struct tc *t, uint64_t bytes)
{
	t->st->files++;
	if (t->o->progress) {
		atomic_fetch_add(&t->o->progress->files_done, 1);
		atomic_fetch_add(&t->o->progress->bytes_done, bytes);
	}
}

/* The current entry, a regular file, into new_ix: untrusted when a suspect. */
static int tc_index_put(struct tc *t, const struct stat *st)
{
	if (!t->o->new_ix)
		return 0;
	return pathindex_has(t->o->suspects, t->path) ? pathindex_put_untrusted(t->o->new_ix, t->path, st)
						      : pathindex_put(t->o->new_ix, t->path, st);
}

/* A hard link instead of a copy: inside this copy, from an immutable source,
 * or from the previous layer. 1 when linked, 0 when a copy is needed. A
 * file of several names linked from the previous layer is where its other
 * names link to: a name that must be copied (say, moved with its directory)
 * and one still unchanged stay one inode. */
static int treecopy_try_link(struct tc *t, int sfd, int dfd, const char *name, const struct stat *st)
{
	const char *first = st->st_nlink > 1 ? devino_get(&t->links, st->st_dev, st->st_ino) : NULL;
	int r = -1;
	if (first)
		r = linkat(t->dst_root, first, dfd, name, 0);
	else if (t->o->link_sources && !S_ISDIR(st->st_mode))
		r = linkat(sfd, name, dfd, name, 0);
	else if (S_ISREG(st->st_mode) && t->o->prev_fd >= 0 && pathindex_match(t->o->prev_ix, t->path, st) &&
		 !pathindex_has(t->o->suspects, t->path) &&
		 (!t->o->xattrs_keep_ctime || treecopy_same_xattrs(sfd, name, t->o->prev_fd, t->path))) {
		r = linkat(t->o->prev_fd, t->path, dfd, name, 0);
		if (r == 0 && st->st_nlink > 1 && devino_put(&t->links, st->st_dev, st->st_ino, t->path) < 0)
			return -ENOMEM;
	}
	if (r < 0)
		return 0; /* EMLINK, a vanished previous layer...: copy instead */
	t->st->linked++;
	return 1;
}

static int treecopy_regular(struct tc *t, int sfd, int dfd, const char *name, const struct stat *st)
{
	uint64_t copied = 0;
	_cleanup_close_ int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOATIME);
	if (in < 0 && errno == EPERM)
		in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (in < 0)
		return tc_fail(t, -errno, "open");
	_cleanup_close_ int out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0)
		return tc_fail(t, -errno, "create");
	int r = treecopy_file_data(in, out, st->st_size, &copied);
	if (r == 0)
		r = treecopy_copy_meta(sfd, dfd, name, in, out, st);
	if (r < 0)
		return tc_fail(t, r, "copy");
	t->st->bytes_copied += copied;
	tc_progress(t, st->st_size);
	return 0;
}

static int treecopy_special(struct tc *t, int sfd, int dfd, const char *name, const struct stat *st)
{
	int r = 0;
	if (S_ISLNK(st->st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlinkat(sfd, name, target, sizeof(target) - 1);
		if (n < 0)
			return tc_fail(t, -errno, "readlink");
		target[n] = 0;
		if (symlinkat(target, dfd, name) < 0)
			r = -errno;
	} else if (mknodat(dfd, name, st->st_mode & (S_IFMT | 07777), st->st_rdev) < 0) {
		r = -errno;
	}
	if (r == 0)
		r = treecopy_copy_meta(sfd, dfd, name, -1, -1, st);
	if (r < 0)
		return tc_fail(t, r, "create");
	tc_progress(t, 0);
	return 0;
}

static int treecopy_dir_contents(struct tc *t, int sfd, int dfd);
static int treecopy_update_dir(struct tc *t, int sfd, int dfd);

/* A directory made (unless it exists) and opened in dfd, made opaque when
 * it replaced a non-directory: lower layers stay hidden. Its fd, or < 0. */
static int treecopy_mkdir(struct tc *t, int dfd, const char *name, bool exists, bool make_opaque)
{
	if (!exists && mkdirat(dfd, name, 0700) < 0)
		return tc_fail(t, -errno, "mkdir");
	int d = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (d < 0)
		return tc_fail(t, -errno, "open dir");
	if (make_opaque && fsetxattr(d, OPAQUE_XATTR, "y", 1, 0) < 0) {
		int r = tc_fail(t, -errno, "set opaque");
		close(d);
		return r;
	}
	return d;
}

/* update: dst's dir is an earlier copy, brought up to date (treecopy_update). */
static int treecopy_dir(struct tc *t, int sfd, int dfd, const char *name, const struct stat *st, bool exists,
			bool make_opaque, bool update)
{
	_cleanup_close_ int d = treecopy_mkdir(t, dfd, name, exists, make_opaque);
	if (d < 0)
		return d;
	_cleanup_close_ int s = openat(sfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (s < 0)
		return tc_fail(t, -errno, "open dir");
	int r = update ? treecopy_update_dir(t, s, d) : treecopy_dir_contents(t, s, d);
	if (r < 0)
		return r;
	r = update ? treecopy_update_meta(s, d, st) : treecopy_copy_meta(sfd, dfd, name, s, d, st);
	if (r < 0)
		return tc_fail(t, r, "dir metadata");
	tc_progress(t, 0);
	return 0;
}

static bool treecopy_opaque(int sfd, const char *name)
{
	char v[4];
	struct xattr_ref x;
	xattr_ref_init(&x, -1, sfd, name);
	ssize_t n = xattr_get(&x, OPAQUE_XATTR, v, sizeof(v));
	return n == 1 && v[0] == 'y';
}

/* Merge rules (what overlayfs would show): a whiteout or non-dir replaces;
 * an opaque dir replaces; a plain dir merges into a dir and, replacing a
 * non-dir, becomes opaque so lower layers stay hidden. */
static int treecopy_merge_prepare(struct tc *t, int sfd, int dfd, const char *name, const struct stat *st, bool *exists,
				  bool *make_opaque)
{
	struct stat dst;
	*exists = *make_opaque = false;
	if (fstatat(dfd, name, &dst, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : tc_fail(t, -errno, "stat");
	if (S_ISDIR(st->st_mode) && S_ISDIR(dst.st_mode) && !treecopy_opaque(sfd, name)) {
		*exists = true;
		return 0;
	}
	*make_opaque = S_ISDIR(st->st_mode) && !S_ISDIR(dst.st_mode);
	int r = rm_rf_at(dfd, name);
	return r < 0 ? tc_fail(t, r, "replace") : 0;
}

void treecopy_dirs_free(struct treecopy_dirs *d)
{
	for (size_t i = 0; d && i < d->n; i++)
		free(d->v[i]);
	if (d)
		free(d->v), *d = (struct treecopy_dirs){ 0 };
}

static int treecopy_dirs_add(struct treecopy_dirs *d, const char *rel)
{
	if (d->n == d->cap) {
		char **v = realloc(d->v, (d->cap = d->cap ? 2 * d->cap : 64) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		d->v = v;
	}
	return (d->v[d->n] = strdup(rel)) ? (d->n++, 0) : -ENOMEM;
}

/* One entry of src (its stat st) into dfd. A directory is copied whole;
 * or, for a walk (e), made and opened in e->data for its entries, its
 * metadata left to the walk's post. */
static int treecopy_entry_st(struct tc *t, int sfd, int dfd, const char *name, const struct stat *st_,
			     struct walk_entry *e)
{
	const struct stat st = *st_;
	bool exists = false, make_opaque = false;
	int r;

	if (t->partial && !S_ISDIR(st.st_mode) && st.st_nlink > 1 && !treecopy_is_whiteout(&st))
		return -EAGAIN; /* its other names may be in directories not compared */
	if (t->o->mode == TREECOPY_MERGE) {
		r = treecopy_merge_prepare(t, sfd, dfd, name, &st, &exists, &make_opaque);
		if (r < 0)
			return r;
	}
	if (S_ISDIR(st.st_mode) && t->o->dirs && t->o->mode == TREECOPY_NEW && !t->partial &&
	    (r = treecopy_dirs_add(t->o->dirs, t->path)) < 0)
		return tc_fail(t, r, "directory list");
	if (S_ISDIR(st.st_mode) && !e)
		return treecopy_dir(t, sfd, dfd, name, &st, exists, make_opaque, false);
	if (S_ISDIR(st.st_mode)) {
		int d = treecopy_mkdir(t, dfd, name, exists, make_opaque);
		e->data = d;
		return d < 0 ? d : 0;
	}
	if (S_ISREG(st.st_mode) && (r = tc_index_put(t, &st)) < 0)
		return tc_fail(t, r, "index");
	r = treecopy_try_link(t, sfd, dfd, name, &st);
	if (r < 0)
		return tc_fail(t, r, "link");
	if (r > 0) {
		tc_progress(t, 0);
		return 0;
	}
	r = S_ISREG(st.st_mode) ? treecopy_regular(t, sfd, dfd, name, &st) : treecopy_special(t, sfd, dfd, name, &st);
	if (r == 0 && st.st_nlink > 1 && !t->o->link_sources)
		r = devino_put(&t->links, st.st_dev, st.st_ino, t->path);
	return r < 0 ? r : 0;
}

static int treecopy_entry(struct tc *t, int sfd, int dfd, const char *name)
{
	struct stat st;
	if (fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : tc_fail(t, -errno, "stat");
	return treecopy_entry_st(t, sfd, dfd, name, &st, NULL);
}

struct tc_walk {
	struct tc *t;
	bool failed; /* a hook answered an error: the walk's own are told here */
};

/* Each entry into its directory's copy (the parent's data). */
static int treecopy_copy_pre(void *ctx, struct walk_entry *e)
{
	struct tc_walk *w = ctx;
	tc_at(w->t, e->path, e->path_len);
	int r = treecopy_entry_st(w->t, e->dirfd, (int)e->parent->data, e->name, &e->st, e);
	w->failed |= r < 0;
	return r;
}

/* A directory's metadata after its children, as treecopy_dir sets it. */
static int treecopy_copy_post(void *ctx, struct walk_entry *e)
{
	struct tc_walk *w = ctx;
	int d = (int)e->data, r = e->err;
	tc_at(w->t, e->path, e->path_len);
	if (r == 0 && (r = treecopy_copy_meta(e->dirfd, (int)e->parent->data, e->name, e->fd, d, &e->st)) < 0)
		r = tc_fail(w->t, r, "dir metadata");
	else if (r == 0)
		tc_progress(w->t, 0);
	close(d);
	w->failed |= r < 0;
	return r;
}

/* What a walk was doing at a failure, by walk_step, for tc_fail. */
static const char *const tc_walk_step[] = {
	[WALK_AT_PATH] = "path",     [WALK_AT_STAT] = "stat",    [WALK_AT_DEPTH] = "directory depth",
	[WALK_AT_OPEN] = "open dir", [WALK_AT_READ] = "readdir",
};

/* An entry gone since listed is skipped, as treecopy_entry skips it;
 * anything else fails the copy. */
static int treecopy_copy_fail(void *ctx, const struct walk_entry *e, int err)
{
	struct tc_walk *w = ctx;
	if (e->step == WALK_AT_STAT && err == -ENOENT)
		return 0;
	tc_at(w->t, e->path, strlen(e->path)); /* at WALK_AT_PATH: the parent's */
	w->failed = true;
	return tc_fail(w->t, err, tc_walk_step[e->step]);
}

/* The entries of src directory sfd into dfd, whose path is t->path. */
static int treecopy_dir_contents(struct tc *t, int sfd, int dfd)
{
	size_t len = t->len;
	struct tc_walk w = { .t = t };
	struct walk_opts o = { .flags = WALK_STAT,
			       .path_max = sizeof(t->path) - 1,
			       .prefix = t->path,
			       .data = dfd,
			       .pre = treecopy_copy_pre,
			       .post = treecopy_copy_post,
			       .fail = treecopy_copy_fail,
			       .ctx = &w };
	int r = walk_tree(sfd, NULL, &o);
	t->len = len; /* the walk's paths all start with it */
	t->path[len] = '\0';
	return r < 0 && !w.failed ? tc_fail(t, r, "open dir") : r;
}

int treecopy_copy(int src_fd, int dst_fd, const struct treecopy_opts *o, struct treecopy_stats *stats, ckpt_error *err)
{
	struct treecopy_stats dummy = { 0 };
	struct tc t = { .o = o, .st = stats ? stats : &dummy, .err = err, .dst_root = dst_fd };
	struct stat st;

	if (fstat(src_fd, &st) < 0)
		return err_set(err, errno, NULL, "stat source: %m");
	if (o->dirs && o->mode == TREECOPY_NEW && treecopy_dirs_add(o->dirs, "") < 0)
		return err_set(err, ENOMEM, NULL, "directory list: out of memory");
	int r = treecopy_dir_contents(&t, src_fd, dst_fd);
	if (r == 0) {
		r = treecopy_copy_meta(src_fd, dst_fd, ".", src_fd, dst_fd, &st);
		if (r < 0)
			tc_fail(&t, r, "root metadata");
	}
	devino_free(&t.links);
	return r;
}

/* Update mode (the frozen pass): dst is a copy of src made earlier, whose
 * index then was prev_ix. Its files may be links into older, immutable
 * layers: an inode of dst changes only when it has one name, i.e. this
 * copy made it (treecopy_refresh); else only names change. */
struct tc_name {
	char *name;
	unsigned char type; /* d_type */
	bool seen;
};
struct tc_names {
	struct tc_name *v;
	size_t n;
};

static int tc_names_cmp(const void *a, const void *b)
{
	return strcmp(((const struct tc_name *)a)->name, ((const struct tc_name *)b)->name);
}

static void tc_names_free(struct tc_names *ns)
{
	for (size_t i = 0; i < ns->n; i++)
		free(ns->v[i].name);
	free(ns->v);
}

static int tc_names_read(int dfd, struct tc_names *ns)
{
	_cleanup_closedir_ DIR *d = NULL;
	int q = walk_open(dfd, NULL, &d);
	if (q < 0)
		return q;
	size_t cap = 0;
	struct dirent *de;
	while ((de = walk_next(d))) {
		if (ns->n == cap) {
			struct tc_name *v = realloc(ns->v, (cap = cap ? 2 * cap : 16) * sizeof(*v));
			if (!v)
				return -ENOMEM;
			ns->v = v;
		}
		if (!(ns->v[ns->n].name = strdup(de->d_name)))
			return -ENOMEM;
		ns->v[ns->n].type = de->d_type;
		ns->v[ns->n++].seen = false;
	}
	if (errno)
		return -errno;
	if (ns->n)
		qsort(ns->v, ns->n, sizeof(*ns->v), tc_names_cmp);
	return 0;
}

/* Mark name as still in src; its entry in dst, or NULL. */
static struct tc_name *tc_names_mark(struct tc_names *ns, const char *name)
{
	struct tc_name key = { .name = (char *)name };
	struct tc_name *p = ns->n ? bsearch(&key, ns->v, ns->n, sizeof(*ns->v), tc_names_cmp) : NULL;
	if (p)
		p->seen = true;
	return p;
}

/* update: a regular file of one name that changed, whose copy in dst is
 * this copy's own (one name: not a link into an older layer, nor another
 * name of a file) and has no holes: that copy is rewritten in place where
 * it differs, owner, mode, xattrs and times made src's. 1 when done, 0
 * when the caller copies it anew. */
static int treecopy_refresh(struct tc *t, int sfd, int dfd, const char *name, const struct stat *st)
{
	struct stat is, os;
	if (!S_ISREG(st->st_mode) || st->st_nlink != 1 || st->st_size == 0)
		return 0;
	_cleanup_close_ int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOATIME);
	if (in < 0 && errno == EPERM)
		in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (in < 0 || fstat(in, &is) < 0 || is.st_dev != st->st_dev || is.st_ino != st->st_ino ||
	    lseek(in, 0, SEEK_HOLE) < st->st_size)
		return 0; /* replaced meanwhile, or sparse: a fresh copy keeps the holes */
	_cleanup_close_ int out = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (out < 0 || fstat(out, &os) < 0 || !S_ISREG(os.st_mode) || os.st_nlink != 1)
		return 0;
	uint64_t written = 0;
	/* a copy that was right (a suspect compared) is not counted replaced */
	bool meta_same = os.st_size == st->st_size && os.st_mode == st->st_mode && os.st_uid == st->st_uid &&
		os.st_gid == st->st_gid && os.st_mtim.tv_sec == st->st_mtim.tv_sec &&
		os.st_mtim.tv_nsec == st->st_mtim.tv_nsec;
	int r = treecopy_refresh_data(in, out, st->st_size, true, &written);
	if (r == 0)
		r = treecopy_update_meta(in, out, st);
	if (r == 0)
		r = tc_index_put(t, st);
	if (r < 0)
		return tc_fail(t, r, "refresh");
	t->st->bytes_copied += written;
	if (written || !meta_same) {
		t->st->replaced++;
		t->st->refreshed++;
	}
	tc_progress(t, st->st_size);
	return 1;
}

/* A regular file whose inode, size and ctime match prev_ix keeps its copy
 * (a fresh copy would link it), unless another name of it came first; a dir
 * over a dir is updated; anything else is removed and copied anew. */
static int treecopy_update_entry(struct tc *t, int sfd, int dfd, const char *name, struct tc_names *ns)
{
	struct stat st, ds;
	if (fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : tc_fail(t, -errno, "stat");
	const struct tc_name *e = tc_names_mark(ns, name);
	bool have = e != NULL;
	mode_t dtype = have ? DTTOIF(e->type) : 0; /* d_type spares a stat */
	if (have && e->type == DT_UNKNOWN) {
		if (fstatat(dfd, name, &ds, AT_SYMLINK_NOFOLLOW) < 0)
			return tc_fail(t, -errno, "stat copy");
		dtype = ds.st_mode & S_IFMT;
	}
	if (have && S_ISDIR(st.st_mode) && S_ISDIR(dtype)) {
		if (!t->shallow)
			return treecopy_dir(t, sfd, dfd, name, &st, true, false, true);
		tc_progress(t, 0); /* compared in its own turn if it changed */
		return 0;
	}
	/* another name of this file came first (a fresh copy links to it) */
	bool linked = st.st_nlink > 1 && devino_get(&t->links, st.st_dev, st.st_ino);
	/* a suspect, or a file recorded untrusted, keeps its copy when its
	 * metadata is unchanged and its data compares equal */
	bool match = have && !linked && S_ISREG(st.st_mode) && S_ISREG(dtype) &&
		pathindex_match(t->o->prev_ix, t->path, &st) &&
		(!t->o->xattrs_keep_ctime || treecopy_same_xattrs(sfd, name, dfd, name));
	bool untrusted = have && !linked && S_ISREG(st.st_mode) && S_ISREG(dtype) && !match &&
		pathindex_match_untrusted(t->o->prev_ix, t->path, &st);
	if ((match && !pathindex_has(t->o->suspects, t->path)) ||
	    ((match || untrusted) && treecopy_same_data(sfd, dfd, name, &st))) {
		int r = tc_index_put(t, &st);
		if (r == 0 && st.st_nlink > 1)
			r = devino_put(&t->links, st.st_dev, st.st_ino, t->path);
		if (r < 0)
			return tc_fail(t, r, "index");
		t->st->linked++;
		tc_progress(t, 0);
		return 0;
	}
	/* whiteouts share one inode (overlayfs links them): any copy will do */
	if (t->partial && !S_ISDIR(st.st_mode) && st.st_nlink > 1 && !treecopy_is_whiteout(&st))
		return -EAGAIN; /* its other names may be in directories not compared */
	if (have && !linked && S_ISREG(dtype)) {
		int r = treecopy_refresh(t, sfd, dfd, name, &st);
		if (r != 0)
			return r < 0 ? r : 0;
	}
	/* linking a second name of a kept file anew, or making an identical
	 * special file again, changes nothing */
	if (!linked &&
	    !(have && !S_ISREG(st.st_mode) && dtype == (st.st_mode & S_IFMT) &&
	      treecopy_special_same(sfd, dfd, name, &st)))
		t->st->replaced++;
	int r = have ? rm_rf_at(dfd, name) : 0;
	return r < 0 ? tc_fail(t, r, "replace") : treecopy_entry(t, sfd, dfd, name);
}

/* dst's names src no longer has go after src's are done. The update's own
 * recursion (through treecopy_update_entry and treecopy_dir), not
 * walk_merge's: walk_merge stats every name in each tree and sorts both
 * listings, where this pass, run while the services are frozen, stats only
 * src and takes dst's types from d_type. Paths stay below PATH_MAX
 * (tc_push), which bounds its depth. */
static int treecopy_update_dir(struct tc *t, int sfd, int dfd)
{
	struct tc_names ns = { 0 };
	_cleanup_closedir_ DIR *d = NULL;
	int r = tc_names_read(dfd, &ns);
	if (r < 0 || (r = walk_open(sfd, NULL, &d)) < 0) {
		tc_names_free(&ns);
		return tc_fail(t, r, "list dir");
	}
	struct dirent *de;
	while (r == 0 && (de = walk_next(d))) {
		size_t saved;
		r = tc_push(t, de->d_name, &saved);
		if (r == 0)
			r = treecopy_update_entry(t, sfd, dfd, de->d_name, &ns);
		else
			tc_fail(t, r, "path");
		t->len = saved;
		t->path[saved] = 0;
	}
	if (r == 0 && errno)
		r = tc_fail(t, -errno, "readdir");
	for (size_t i = 0; r == 0 && i < ns.n; i++) {
		if (ns.v[i].seen)
			continue;
		t->st->replaced++;
		if ((r = rm_rf_at(dfd, ns.v[i].name)) < 0)
			tc_fail(t, r, "remove");
	}
	tc_names_free(&ns);
	return r;
}

int treecopy_update(int src_fd, int dst_fd, const struct treecopy_opts *o, struct treecopy_stats *stats,
		    ckpt_error *err)
{
	struct treecopy_opts uo = *o;
	uo.mode = TREECOPY_NEW;
	uo.prev_fd = -1; /* what changed is copied, never linked from older layers */
	uo.link_sources = false;
	struct treecopy_stats dummy = { 0 };
	struct tc t = { .o = &uo, .st = stats ? stats : &dummy, .err = err, .dst_root = dst_fd };
	struct stat st;

	if (fstat(src_fd, &st) < 0)
		return err_set(err, errno, NULL, "stat source: %m");
	int r = treecopy_update_dir(&t, src_fd, dst_fd);
	if (r == 0 && (r = treecopy_update_meta(src_fd, dst_fd, &st)) < 0)
		tc_fail(&t, r, "root metadata");
	devino_free(&t.links);
	return r;
}

/* One dirty directory: dir (relative to src_fd and dst_fd) updated as
 * treecopy_update would, its subdirectories only when deep. */
static int treecopy_update_one(struct tc *t, int src_fd, int dst_fd, const struct pathindex_dirty *dirty)
{
	const char *p = dirty->path[0] ? dirty->path : ".";
	_cleanup_close_ int s = openat(src_fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (s < 0)
		return errno == ENOENT || errno == ENOTDIR
			? 0
			: tc_fail(t, -errno, "open dir"); /* gone: its parent tells */
	_cleanup_close_ int d = openat(dst_fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (d < 0)
		return errno == ENOENT || errno == ENOTDIR ? -EAGAIN : tc_fail(t, -errno, "open copy");
	struct stat st;
	if (fstat(s, &st) < 0)
		return tc_fail(t, -errno, "stat dir");
	size_t n = strlen(dirty->path);
	if (n >= sizeof(t->path))
		return tc_fail(t, -ENAMETOOLONG, "path");
	memcpy(t->path, dirty->path, n + 1);
	t->len = n;
	t->shallow = !dirty->deep;
	int r = treecopy_update_dir(t, s, d);
	if (r == 0 && (r = treecopy_update_meta(s, d, &st)) < 0)
		tc_fail(t, r, "dir metadata");
	return r;
}

struct tc_dm {
	struct tc *t;
	bool failed; /* a hook said so: else a failed walk could not open the root */
};

static bool treecopy_dirs_meta_same(const struct stat *ss, const struct stat *ds)
{
	return ss->st_mode == ds->st_mode && ss->st_uid == ds->st_uid && ss->st_gid == ds->st_gid &&
		ss->st_mtim.tv_sec == ds->st_mtim.tv_sec && ss->st_mtim.tv_nsec == ds->st_mtim.tv_nsec;
}

static int treecopy_dirs_meta_set(struct tc *t, int s, int d, const struct stat *ss)
{
	struct stat ds;
	if (fstat(d, &ds) < 0)
		return tc_fail(t, -errno, "stat dir");
	if (treecopy_dirs_meta_same(ss, &ds))
		return 0;
	t->st->replaced++;
	int r = treecopy_update_meta(s, d, ss);
	return r < 0 ? tc_fail(t, r, "dir metadata") : 0;
}

/* Each directory's twin in dst rides in its data. */
static int treecopy_dirs_meta_pre(void *ctx, struct walk_entry *e)
{
	struct tc_dm *m = ctx;
	tc_at(m->t, e->path, e->path_len);
	int d = openat((int)e->parent->data, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	e->data = d;
	m->failed |= d < 0;
	return d < 0 ? -EAGAIN : 0;
}

/* Children first: setting a child's metadata must not move what its
 * parent's comparison sees. */
static int treecopy_dirs_meta_post(void *ctx, struct walk_entry *e)
{
	struct tc_dm *m = ctx;
	tc_at(m->t, e->path, e->path_len);
	int r = e->err ? e->err : treecopy_dirs_meta_set(m->t, e->fd, (int)e->data, &e->st);
	close((int)e->data);
	m->failed |= r < 0;
	return r;
}

/* A directory gone from src (ENOENT) or replaced (ENOTDIR) since listed is
 * left to the next walk. Any other failure (EMFILE, EIO, past the depth
 * bound) fails the update: the directories below it would keep stale
 * metadata in the layer, a change lost. */
static int treecopy_dirs_meta_fail(void *ctx, const struct walk_entry *e, int err)
{
	struct tc_dm *m = ctx;
	if (err == -ENOENT || err == -ENOTDIR)
		return 0;
	tc_at(m->t, e->path, e->path_len);
	m->failed = true;
	return tc_fail(m->t, err, tc_walk_step[e->step]);
}

/* Every directory's own metadata, where it differs: overlayfs can touch an
 * upper directory's mtime without an event (seen: a rename refused with
 * ENOTEMPTY changed its parent's). A walk of directories only: no file is
 * stat'ed. A directory of src missing from dst is one no event explained. */
static int treecopy_dirs_meta(struct tc *t, int s, int d)
{
	struct stat ss;
	struct tc_dm m = { .t = t };
	struct walk_opts o = { .flags = WALK_DIRS | WALK_STAT,
			       .data = d,
			       .pre = treecopy_dirs_meta_pre,
			       .post = treecopy_dirs_meta_post,
			       .fail = treecopy_dirs_meta_fail,
			       .ctx = &m };
	t->len = 0; /* the root: not the last directory treecopy_update_one named */
	t->path[0] = '\0';
	if (fstat(s, &ss) < 0)
		return tc_fail(t, -errno, "stat dir");
	int r = walk_tree(s, NULL, &o);
	tc_at(t, "", 0); /* the root again: the hooks named each directory */
	if (r < 0)
		return m.failed ? r : tc_fail(t, r, "open dir");
	return treecopy_dirs_meta_set(t, s, d, &ss);
}

/* treecopy_dirs_meta for the directories listed, by path, deepest first;
 * no directory is read. A listed one gone from src is fine (its parent's
 * event made that parent dirty); one src has and dst lacks is unexplained. */
static int treecopy_dirs_meta_listed(struct tc *t, int src_fd, int dst_fd, const struct treecopy_dirs *dirs)
{
	for (size_t i = dirs->n; i-- > 0;) {
		const char *p = dirs->v[i][0] ? dirs->v[i] : ".";
		struct stat ss, ds;
		size_t n = strlen(dirs->v[i]);
		if (n >= sizeof(t->path))
			return tc_fail(t, -ENAMETOOLONG, "path");
		tc_at(t, dirs->v[i], n); /* what tc_fail names */
		if (fstatat(src_fd, p, &ss, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT || errno == ENOTDIR)
				continue;
			return tc_fail(t, -errno, "stat dir");
		}
		if (!S_ISDIR(ss.st_mode))
			continue; /* replaced: its parent's event made that parent dirty */
		if (fstatat(dst_fd, p, &ds, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(ds.st_mode))
			return -EAGAIN;
		if (ss.st_mode == ds.st_mode && ss.st_uid == ds.st_uid && ss.st_gid == ds.st_gid &&
		    ss.st_mtim.tv_sec == ds.st_mtim.tv_sec && ss.st_mtim.tv_nsec == ds.st_mtim.tv_nsec)
			continue;
		_cleanup_close_ int s = openat(src_fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		_cleanup_close_ int d = openat(dst_fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (s < 0 || d < 0 || fstat(s, &ss) < 0)
			return -EAGAIN; /* changed under us: the full walk decides */
		t->st->replaced++;
		int r = treecopy_update_meta(s, d, &ss);
		if (r < 0)
			return tc_fail(t, r, "dir metadata");
	}
	return 0;
}

int treecopy_update_dirs(int src_fd, int dst_fd, const struct pathindex_dirty *dirty, size_t n,
			 const struct treecopy_opts *o, struct treecopy_stats *stats, ckpt_error *err)
{
	struct treecopy_opts uo = *o;
	uo.mode = TREECOPY_NEW;
	uo.prev_fd = -1;
	uo.link_sources = false;
	struct treecopy_stats dummy = { 0 };
	struct tc t = { .o = &uo, .st = stats ? stats : &dummy, .err = err, .dst_root = dst_fd, .partial = true };
	int r = 0;
	for (size_t i = 0; r == 0 && i < n; i++)
		r = treecopy_update_one(&t, src_fd, dst_fd, &dirty[i]);
	if (r == 0)
		r = o->dirs ? treecopy_dirs_meta_listed(&t, src_fd, dst_fd, o->dirs)
			    : treecopy_dirs_meta(&t, src_fd, dst_fd);
	devino_free(&t.links);
	return r;
}
