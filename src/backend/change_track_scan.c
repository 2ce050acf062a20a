/* change_track_scan.c: the /proc half of change tracking. A write through
 * a shared mapping makes no event: the file is still mapped or open when the
 * scan reads its process, or its last close was reported (CLOSE_WRITE). The
 * scan names those files' directories, and the mapped files as suspects;
 * it may run on a thread of its own (chg_track_scan_start), touching
 * nothing of the tracker but what it was given. */
#include "backend/change_track_internal.h"
#include "lib/beside.h"
#include "lib/procscan.h"
#include "lib/util.h"

#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

/* What one /proc scan found, apart from the tracker: the scan may run on a
 * thread of its own (chg_track_scan_start) while the caller reads the upper,
 * and touches nothing else. */
struct chg_scan {
	char *root;
	size_t root_len;
	dev_t dev;
	bool plain;             /* a plain directory: files outside it are not its */
	bool want_dirs;         /* a collect's: in-use files' directories; else mapped ones only */
	bool once, once_known;  /* dev_mounted_once(dev), read at the first fd that asks */
	struct chg_dirty_set s; /* the directories of the files in use or mapped */
	char **sus;             /* files mapped shared (suspects), relative */
	size_t n_sus, cap_sus;
	ino_t *ino; /* plain: files outside it mapped shared and writable */
	size_t n_ino;
	const char *why;
	int r;
	int64_t us;
	struct beside th; /* the thread it runs on, if any */
};

void chg_scan_free(struct chg_scan *sc)
{
	if (!sc)
		return;
	pathindex_dirty_free(sc->s.v, sc->s.n);
	for (size_t i = 0; i < sc->n_sus; i++)
		free(sc->sus[i]);
	free(sc->sus);
	free(sc->ino);
	free(sc->root);
	free(sc);
}

static int scan_suspect(struct chg_scan *sc, const char *rel)
{
	if (sc->n_sus == sc->cap_sus) {
		size_t cap = sc->cap_sus ? 2 * sc->cap_sus : 16;
		char **v = realloc(sc->sus, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		sc->sus = v, sc->cap_sus = cap;
	}
	if (!(sc->sus[sc->n_sus] = strdup(rel)))
		return -ENOMEM;
	sc->n_sus++;
	return 0;
}

/* A file of the root that a process has open or mapped: its directory is
 * compared (a write through a mapping makes no event). */
/* The root's device, or a file whose path below the root names it: gVisor's
 * root overlay (runsc do) gives its files another st_dev than its
 * directories, so the root's own would be taken for another filesystem's. */
static bool in_use_dev(const struct chg_scan *u, const struct procscan_ref *ref)
{
	struct stat st;
	if (ref->dev == u->dev)
		return true;
	return procscan_path_under(ref->path, u->root) && lstat(ref->path, &st) == 0 && st.st_dev == ref->dev &&
		st.st_ino == ref->ino;
}

/* Whether dev is mounted once in this mount namespace (at the root): then a
 * process of this namespace reads a file of it under the root's path only. */
static bool dev_mounted_once(dev_t dev)
{
	char want[32], *line = NULL;
	size_t cap = 0, n = 0;
	snprintf(want, sizeof(want), " %u:%u ", major(dev), minor(dev));
	_cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
	while (f && n < 2 && getline(&line, &cap, f) > 0) {
		char *sp = strchr(line, ' '); /* the mount id, the parent's, then maj:min */
		sp = sp ? strchr(sp + 1, ' ') : NULL;
		n += sp && !strncmp(sp, want, strlen(want));
	}
	free(line);
	return f && n == 1;
}

/* An fd whose target need not be stat'ed: a path outside the root that
 * cannot name a root file, read by a process of this mount namespace (a
 * plain directory: any path outside it; an overlay: when its device is
 * mounted nowhere else). Most fds of a busy machine are such. */
static bool in_use_skip_fd(struct chg_scan *u, const struct procscan_ref *ref)
{
	if (procscan_path_under(ref->path, u->root))
		return false;
	if (u->plain)
		return true;
	if (!u->once_known) {
		u->once = dev_mounted_once(u->dev);
		u->once_known = true;
	}
	return u->once && procscan_ref_same_mntns(ref); /* the namespace read only when it matters */
}

static int in_use_ref(void *ctx, const struct procscan_ref *ref_in)
{
	struct chg_scan *u = ctx;
	struct procscan_ref lazy;
	const struct procscan_ref *ref = ref_in;
	if (ref->kind == PROCSCAN_FD && !ref->has_id && !ref->deleted && u->want_dirs) {
		if (in_use_skip_fd(u, ref))
			return PROCSCAN_CONTINUE;
		lazy = *ref;
		if (procscan_ref_stat(&lazy) < 0)
			return PROCSCAN_CONTINUE; /* gone since */
		ref = &lazy;
	}
	bool sw = ref->kind == PROCSCAN_MAP && ref->shared_write;
	if ((ref->kind != PROCSCAN_FD && ref->kind != PROCSCAN_MAP) || !ref->has_id || ref->deleted ||
	    (!u->want_dirs && !sw) || !in_use_dev(u, ref))
		return PROCSCAN_CONTINUE;
	if (!procscan_path_under(ref->path, u->root) && u->plain) {
		if (!sw || !u->want_dirs)
			return PROCSCAN_CONTINUE; /* another file of that filesystem */
		ino_t *v = realloc(u->ino, (u->n_ino + 1) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		v[u->n_ino++] = ref->ino;
		u->ino = v;
		return PROCSCAN_CONTINUE;
	}
	if (!procscan_path_under(ref->path, u->root)) {
		u->why = "a file of the root is in use under another path (a mount namespace or chroot)";
		return -EAGAIN;
	}
	const char *rel = ref->path + u->root_len;
	rel += *rel == '/';
	const char *slash = strrchr(rel, '/');
	if (sw && scan_suspect(u, rel) < 0)
		return -ENOMEM;
	const char *leaf = slash ? slash + 1 : rel;
	if (u->want_dirs &&
	    (*leaf ? chg_dirty_add_name(&u->s, rel, slash ? (size_t)(slash - rel) : 0, leaf)
		   : chg_dirty_add(&u->s, rel, 0, false)) < 0)
		return -ENOMEM;
	return PROCSCAN_CONTINUE;
}

static size_t root_len(const char *root_path)
{
	size_t n = strlen(root_path);
	while (n > 1 && root_path[n - 1] == '/')
		n--;
	return n;
}

struct chg_scan *chg_scan_new(const char *root_path, dev_t root_dev, bool plain, bool want_dirs)
{
	struct chg_scan *sc = calloc(1, sizeof(*sc));
	if (sc && !(sc->root = strdup(root_path))) {
		free(sc);
		return NULL;
	}
	if (sc)
		sc->root_len = root_len(root_path), sc->dev = root_dev, sc->plain = plain, sc->want_dirs = want_dirs;
	return sc;
}

void chg_scan_run(struct chg_scan *sc)
{
	int64_t t0 = mono_us();
	/* a collect's: of the mappings, the shared ones (a private mapping
	 * never writes its file); a read-only shared one is kept: its process
	 * may have written through it before an mprotect took the write away,
	 * and that dirty page gave no event. chg_scan_mapped's: the mappings
	 * alone, and the writable ones of those. */
	unsigned flags = sc->want_dirs ? PROCSCAN_MNTNS | PROCSCAN_NO_DIRS | PROCSCAN_SHARED_MAPS
				       : PROCSCAN_STAT | PROCSCAN_MAPS_ONLY | PROCSCAN_SHARED_MAPS;
	sc->r = procscan_each("/proc", 0, flags, in_use_ref, sc);
	if (sc->r < 0 && !sc->why)
		sc->why = "scanning /proc failed";
	sc->us = mono_us() - t0;
}

static void *scan_thread(void *arg)
{
	chg_scan_run(arg);
	return NULL;
}

/* The scan's suspects into *sus. */
static int scan_suspects_into(const struct chg_scan *sc, struct pathindex **sus)
{
	for (size_t i = 0; i < sc->n_sus; i++)
		if (chg_suspect_add(sus, sc->sus[i]) < 0)
			return -ENOMEM;
	return 0;
}

int chg_scan_mapped(const char *root_path, dev_t root_dev, bool plain_dir, struct pathindex **sus, const char **why)
{
	struct chg_scan *sc = chg_scan_new(root_path, root_dev, plain_dir, false);
	if (!sc)
		return *why = "out of memory", -ENOMEM;
	chg_scan_run(sc);
	int r = sc->r < 0 ? sc->r : scan_suspects_into(sc, sus);
	if (r < 0)
		*why = sc->why ? sc->why : "out of memory";
	chg_scan_free(sc);
	return r < 0 ? r : 0;
}

/* The end of a scan started apart: waited for, and taken from t. */
struct chg_scan *chg_scan_join(struct chg_track *t)
{
	struct chg_scan *sc = TAKE_PTR(t->scan);
	if (sc)
		beside_join(&sc->th);
	return sc;
}

/* On a thread beside the caller (lib/beside.h), which goes on with its own
 * reads meanwhile. */
void chg_scan_spawn(struct chg_scan *sc)
{
	if (!beside_spawn(&sc->th, scan_thread, sc)) /* no thread to be had: the scan runs here */
		chg_scan_run(sc);
}

/* What collect adds from a scan that ended: its directories into s, its
 * suspects into t's, the inodes outside a plain root. */
int chg_scan_merge(struct chg_track *t, struct chg_scan *sc, struct chg_dirty_set *s, const char **why)
{
	t->scan_us = sc->us;
	if (sc->r < 0)
		return *why = sc->why, -EAGAIN;
	if (s->n + sc->s.n > s->cap) {
		size_t cap = s->n + sc->s.n + 32;
		struct pathindex_dirty *v = realloc(s->v, cap * sizeof(*v));
		if (!v)
			return *why = "out of memory", -EAGAIN;
		s->v = v, s->cap = cap;
	}
	if (sc->s.n)
		memcpy(s->v + s->n, sc->s.v, sc->s.n * sizeof(*s->v));
	s->n += sc->s.n;
	sc->s.n = 0; /* taken: scan_free frees the array alone */
	pathindex_free(t->mapped);
	t->mapped = NULL;
	if (scan_suspects_into(sc, &t->suspects) < 0 || scan_suspects_into(sc, &t->mapped) < 0)
		return *why = "out of memory", -EAGAIN;
	ino_t *v = sc->n_ino ? realloc(t->outside_inos, (t->n_outside_inos + sc->n_ino) * sizeof(*v)) : NULL;
	if (sc->n_ino && !v)
		return *why = "out of memory", -EAGAIN;
	if (sc->n_ino) {
		memcpy(v + t->n_outside_inos, sc->ino, sc->n_ino * sizeof(*v));
		t->outside_inos = v;
		t->n_outside_inos += sc->n_ino;
	}
	return 0;
}
