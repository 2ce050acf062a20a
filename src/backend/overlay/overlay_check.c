/* overlay_check.c: the check of change tracking that track_check turns on
 * (ckptd.json(5); the integration tests set it). A tracked create copies
 * only what the tracker names; this check walks the whole tree afterwards
 * and compares, entry by entry, what the new layer shows with what the
 * upper (or the mounted root) shows: type, mode, owner, mtime, size, the
 * data of files up to 1 MiB, link targets, xattrs (overlayfs's own
 * trusted.overlay.* left out: the upper keeps marks a layer need not; a
 * user's, escaped as trusted.overlay.overlay.*, compared).
 *
 * It reads and never writes: no layer, index or timing rule differs from a
 * create without it, so the tests run the path that ships. A writer that is
 * not frozen may change the tree after the tracked pass read it; such a
 * difference is excused only where the tracker saw a change after its
 * collect (chg_track_changed_at). Any other fails the create with EIO. */
#include "backend/overlay/overlay_internal.h"
#include "lib/walk.h"
#include "lib/xattr.h"

#include <sys/stat.h>

#define OC_DATA_MAX (1 << 20)

struct oc {
	struct chg_track *trk;
	char path[PATH_MAX]; /* the entry being looked at, relative */
	const char *why;     /* what differs there */
	uint64_t excused;    /* differences a later change explains */
	char *buf;           /* xattr lists and values: 4 buffers of 64 KiB */
};

static bool overlay_check_same_data(int a, int b, const char *name)
{
	_cleanup_close_ int fa = openat(a, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_close_ int fb = openat(b, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	static __thread char ba[65536], bb[65536];
	if (fa < 0 || fb < 0)
		return false;
	for (;;) {
		ssize_t na = read(fa, ba, sizeof(ba)), nb = read(fb, bb, sizeof(bb));
		if (na != nb || na < 0)
			return false;
		if (na == 0)
			return true;
		if (memcmp(ba, bb, (size_t)na))
			return false;
	}
}

static bool overlay_check_own_key(const char *k)
{
	return ovl_own_xattr(k);
}

/* The keys of list l (n bytes) other than overlayfs's own. */
static size_t overlay_check_keys(const char *l, ssize_t n)
{
	size_t k = 0;
	for (const char *p = l; n > 0 && p < l + n; p += strlen(p) + 1)
		k += !overlay_check_own_key(p);
	return k;
}

static bool overlay_check_same_xattrs(struct oc *c, int a, int b, const char *name)
{
	char *la = c->buf, *lb = la + XATTR_LIST_BUF, *va = lb + XATTR_LIST_BUF, *vb = va + XATTR_VALUE_BUF;
	struct xattr_ref xa, xb;
	xattr_ref_init(&xa, -1, a, name);
	xattr_ref_init(&xb, -1, b, name);
	ssize_t na = xattr_list(&xa, la, XATTR_LIST_BUF), nb = xattr_list(&xb, lb, XATTR_LIST_BUF);
	if (na < 0 || nb < 0) /* no xattrs on either side (ENOTSUP) is the same */
		return na < 0 && nb < 0;
	if (overlay_check_keys(la, na) != overlay_check_keys(lb, nb))
		return false;
	for (const char *k = la; k < la + na; k += strlen(k) + 1) {
		if (overlay_check_own_key(k))
			continue;
		ssize_t ka = xattr_get(&xa, k, va, XATTR_VALUE_BUF), kb = xattr_get(&xb, k, vb, XATTR_VALUE_BUF);
		if (ka != kb || ka < 0 || memcmp(va, vb, (size_t)ka))
			return false;
	}
	return true;
}

static bool overlay_check_same_link(int a, int b, const char *name)
{
	char la[PATH_MAX], lb[PATH_MAX];
	ssize_t ka = readlinkat(a, name, la, sizeof(la)), kb = readlinkat(b, name, lb, sizeof(lb));
	return ka == kb && ka >= 0 && !memcmp(la, lb, (size_t)ka);
}

/* What differs between name in a (the layer's side, stat sa, NULL where it
 * lacks the name) and in b (the live side, sb), or NULL. */
static const char *overlay_check_entry(int a, int b, const char *name, const struct stat *sa, const struct stat *sb)
{
	if (!sa || !sb)
		return !sa ? "missing from the checkpoint" : "not in the root";
	if (sa->st_mode != sb->st_mode)
		return "mode or type";
	if (sa->st_uid != sb->st_uid || sa->st_gid != sb->st_gid)
		return "owner";
	if (sa->st_mtim.tv_sec != sb->st_mtim.tv_sec || sa->st_mtim.tv_nsec != sb->st_mtim.tv_nsec)
		return "mtime";
	if (!S_ISDIR(sa->st_mode) && sa->st_size != sb->st_size)
		return "size";
	if ((S_ISCHR(sa->st_mode) || S_ISBLK(sa->st_mode)) && sa->st_rdev != sb->st_rdev)
		return "device number";
	if (S_ISREG(sa->st_mode) && sa->st_size <= OC_DATA_MAX && !overlay_check_same_data(a, b, name))
		return "data";
	if (S_ISLNK(sa->st_mode) && !overlay_check_same_link(a, b, name))
		return "link target";
	return NULL;
}

/* A difference at path: excused when a later change explains it, else
 * the answer (WALK_STOP) with c->path and c->why. */
static int overlay_check_differs(struct oc *c, const char *path, const char *why)
{
	if (chg_track_changed_at(c->trk, path)) {
		log_info("create: track check: '%s' differs (%s) after a later change there", path, why);
		c->excused++;
		return WALK_SKIP;
	}
	snprintf(c->path, sizeof(c->path), "%s", path);
	c->why = why;
	return WALK_STOP;
}

/* One name of the union (tree 0 the layer's side, 1 the live side): the
 * walk goes below a directory only where both sides are the same. */
static int overlay_check_pre(void *ctx, struct walk_merge_entry *e)
{
	struct oc *c = ctx;
	const struct walk_merge_side *a = &e->side[0], *b = &e->side[1];
	const char *why =
		overlay_check_entry(a->dirfd, b->dirfd, e->name, a->held ? &a->st : NULL, b->held ? &b->st : NULL);
	if (!why && !overlay_check_same_xattrs(c, a->dirfd, b->dirfd, e->name))
		why = "xattrs";
	return why ? overlay_check_differs(c, e->path, why) : 0;
}

/* An entry gone since listed is missing on that side; a directory gone
 * differs, unless a later change explains it. Any other failure (a stat's
 * EIO, out of fds, a read error, a path too long) ends the check with its
 * errno: it says nothing about tracking, and taken as missing it would be
 * excused, or left uncompared where both sides fail. */
static int overlay_check_fail(void *ctx, const struct walk_merge_entry *e, int err)
{
	struct oc *c = ctx;
	if (err != -ENOENT && err != -ENOTDIR)
		return err;
	if (e->step == WALK_AT_STAT)
		return 0; /* gone since listed: missing on that side */
	if (e->step != WALK_AT_OPEN)
		return err;
	if (chg_track_changed_at(c->trk, e->path))
		return WALK_SKIP; /* neither side is compared below it */
	snprintf(c->path, sizeof(c->path), "%s", e->path);
	c->why = "cannot open the directory";
	return WALK_STOP;
}

/* Compare trees a (the checkpoint's) and b (live); what the create answers. */
static int overlay_check_trees(struct ovl_root *r, int a, int b, const char *what, ckpt_error *err)
{
	_cleanup_free_ char *buf = malloc(2 * (XATTR_LIST_BUF + XATTR_VALUE_BUF));
	struct oc c = { .trk = &r->trk, .buf = buf };
	int roots[2] = { a, b };
	struct walk_merge_opts o = {
		.path_max = PATH_MAX, .pre = overlay_check_pre, .fail = overlay_check_fail, .ctx = &c
	};
	int d = buf ? walk_merge(roots, 2, &o) : -ENOMEM;
	if (d < 0)
		return err_set(err, -d, NULL, "track check of '%s': %s", r->path, strerror(-d));
	if (d > 0)
		return err_set(err, EIO, NULL, "change tracking missed a change: the %s of '%s' differs at '%s' (%s)",
			       what, r->path, c.path, c.why);
	log_debug("create: track check of '%s': the %s matches (%llu differences a later change explains)", r->path,
		  what, (unsigned long long)c.excused);
	return 0;
}

int overlay_check_layer(struct ovl_root *r, int up, int dst, ckpt_error *err)
{
	return overlay_check_trees(r, dst, up, "layer", err);
}

int overlay_check_delta(struct ovl_root *r, const char *tmp, ckpt_error *err)
{
	char name[OVL_NAME_LEN + 1];
	_cleanup_(overlay_chain_free) struct ovl_chain chain = { 0 };
	if (overlay_chain_push(&chain, tmp) < 0 || overlay_chain_extend(&chain, &r->stack) < 0 ||
	    overlay_chain_extend(&chain, &r->chain) < 0)
		return err_set(err, ENOMEM, NULL, "track check: out of memory");
	int vfd = overlay_chain_view(r, &chain, name, err);
	_cleanup_close_ int live = open(r->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int q = vfd < 0    ? vfd
		: live < 0 ? err_set(err, errno, NULL, "track check: open '%s': %m", r->path)
			   : overlay_check_trees(r, vfd, live, "delta layer", err);
	if (vfd >= 0)
		close(vfd);
	overlay_chain_view_drop(r, name); /* as the view left it, made or not */
	return q;
}
