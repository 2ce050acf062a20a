/* overlay_look.c: the look at every directory's own metadata that a delta's
 * frozen pass ends with (overlay_delta_dir_meta copies what it finds). A
 * directory's mtime can move with no event: ext4 refusing a rename that
 * overlayfs makes with RENAME_WHITEOUT resets the entry and moves the
 * parent's times (docs/overlay-create.md). So every directory of the upper
 * is stat'ed each create: 1,001 at 100k files, 1.7-2.5 ms on a 2-vCPU VM
 * whose caches went cold between creates. When no unit is frozen that look
 * begins with the first pass, on a thread beside it (lib/beside.h); the
 * caller takes what the thread has not reached when it gets there. */
#include "backend/overlay/overlay_internal.h"
#include "lib/beside.h"

#include <stdatomic.h>
#include <sys/stat.h>

/* What a look at one directory found: ok, a directory there. */
struct ovl_look_res {
	bool ok;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	struct timespec mtim;
};

static void dl_look_at(int up, const char *path, struct ovl_look_res *x)
{
	struct stat s;
	/* gone: its parent's event made the parent dirty */
	x->ok = fstatat(up, *path ? path : ".", &s, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(s.st_mode);
	if (x->ok)
		x->mode = s.st_mode, x->uid = s.st_uid, x->gid = s.st_gid, x->mtim = s.st_mtim;
}

static void dl_look_take(struct ovl_dmeta *m, const struct ovl_look_res *x)
{
	m->changed = x->ok &&
		(x->mode != m->mode || x->uid != m->uid || x->gid != m->gid || x->mtim.tv_sec != m->mtim.tv_sec ||
		 x->mtim.tv_nsec != m->mtim.tv_nsec);
	if (m->changed)
		m->now.mode = x->mode, m->now.uid = x->uid, m->now.gid = x->gid, m->now.mtim = x->mtim;
}

/* A look at the first n directories begun apart (overlay_delta_dir_look_start),
 * with its own array of their paths, its own fd of the upper and its
 * results apart: the list may grow (and move) meanwhile. Entries are only
 * ever added, and their strings freed only with the list, which ends the
 * look first. */
struct ovl_look {
	struct beside th;
	int up;
	size_t n;
	const char **paths; /* the list's own: its strings outlive the look */
	struct ovl_look_res *res;
	atomic_size_t next; /* the next directory to look at, by either side */
	int64_t us;
};

/* Fewer directories are looked at where the frozen pass stands: a thread
 * costs about what a look at this many saves. */
#define OVL_LOOK_APART 256

/* Look at the directories no one took yet. */
static void dl_look_share(struct ovl_look *k)
{
	for (size_t i; (i = atomic_fetch_add(&k->next, 1)) < k->n;)
		dl_look_at(k->up, k->paths[i], &k->res[i]);
}

static void *dl_look_thread(void *arg)
{
	struct ovl_look *k = arg;
	int64_t t0 = mono_us();
	dl_look_share(k);
	k->us = mono_us() - t0;
	return NULL;
}

static void dl_look_free(struct ovl_look *k)
{
	if (!k)
		return;
	beside_join(&k->th);
	if (k->up >= 0)
		close(k->up);
	free(k->paths);
	free(k->res);
	free(k);
}

static struct ovl_look *dl_look_new(int up, const struct ovl_delta_dirs *dirs)
{
	struct ovl_look *k = calloc(1, sizeof(*k));
	if (!k)
		return NULL;
	k->n = dirs->n;
	k->up = fcntl(up, F_DUPFD_CLOEXEC, 3);
	k->paths = malloc(k->n * sizeof(*k->paths));
	k->res = malloc(k->n * sizeof(*k->res));
	if (k->up < 0 || !k->paths || !k->res) {
		dl_look_free(k);
		return NULL;
	}
	for (size_t i = 0; i < k->n; i++)
		k->paths[i] = dirs->v[i].path;
	return k;
}

void overlay_delta_dir_look_drop(struct ovl_delta_dirs *dirs)
{
	dl_look_free(TAKE_PTR(dirs->look));
}

void overlay_delta_dir_look_start(int up, struct ovl_delta_dirs *dirs)
{
	overlay_delta_dir_look_drop(dirs);
	if (dirs->n < OVL_LOOK_APART)
		return;
	struct ovl_look *k = dl_look_new(up, dirs);
	if (k && beside_spawn(&k->th, dl_look_thread, k))
		dirs->look = k;
	else /* no thread, or out of memory: overlay_delta_dir_look looks at all */
		dl_look_free(k);
}

void overlay_delta_dir_look(int up, struct ovl_delta_dirs *dirs)
{
	struct ovl_look *k = TAKE_PTR(dirs->look);
	size_t i = 0;
	dirs->look_us = 0;
	dirs->look_apart = k != NULL;
	if (k) {
		/* what the thread has not reached yet; the caller times this and
		 * the wait (overlay_delta_pass.c) */
		dl_look_share(k);
		beside_join(&k->th);
		dirs->look_us = k->us;
		for (; i < k->n && i < dirs->n; i++)
			dl_look_take(&dirs->v[i], &k->res[i]);
		dl_look_free(k);
	}
	for (; i < dirs->n; i++) { /* added since it began, or all */
		struct ovl_look_res x;
		dl_look_at(up, dirs->v[i].path, &x);
		dl_look_take(&dirs->v[i], &x);
	}
	dirs->looked = true;
}
