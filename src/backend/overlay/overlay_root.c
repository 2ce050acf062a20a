/* overlay_root.c: the live state of a managed root: which chain and upper P
 * is (to be) mounted with, kept in r/<h>/live.json, mounting a chain of
 * layers (and a read-only view of one), and naming layers. It calls nothing
 * else in the backend but overlay_mount.c: the ops (backend_overlay.c), the
 * layer store (overlay_layers.c), forks, diffs and deltas all call it. */
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"

#include <sys/mount.h>
#include "lib/failpoint.h"

static int overlay_layers_name(int dirfd, char name[OVL_NAME_LEN + 1], bool base)
{
	for (int i = 0; i < 100; i++) {
		if (random_hex(name, OVL_NAME_LEN / 2) < 0)
			return -EIO;
		if (base)
			name[0] = 'B';
		if (faccessat(dirfd, name, F_OK, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT)
			return 0;
	}
	return -EEXIST;
}

int overlay_layers_new_name(int dirfd, char name[OVL_NAME_LEN + 1])
{
	return overlay_layers_name(dirfd, name, false);
}

int overlay_layers_new_base_name(int dirfd, char name[OVL_NAME_LEN + 1])
{
	return overlay_layers_name(dirfd, name, true);
}

int overlay_live_set(struct ovl_root *r, const struct ovl_chain *chain, const struct ovl_chain *mounted)
{
	struct ovl_chain c = { 0 }, m = { 0 };
	if (overlay_chain_extend(&c, chain) < 0 || overlay_chain_extend(&m, mounted) < 0) {
		overlay_chain_free(&c);
		overlay_chain_free(&m);
		return -ENOMEM;
	}
	overlay_chain_free(&r->chain);
	overlay_chain_free(&r->mounted);
	r->chain = c;
	r->mounted = m;
	return 0;
}

int overlay_live_save(struct ovl_root *r)
{
	_cleanup_free_ char *s = overlay_json_live_dump(r);
	if (!s)
		return -ENOMEM;
	return FAILPOINT_AROUND("overlay.live.write", write_file_atomic(r->rdir_fd, "live.json", s, strlen(s), 0600));
}

int overlay_live_load(struct ovl_root *r)
{
	_cleanup_free_ char *s = NULL;
	struct ovl_live live = { 0 };
	int q = read_file_at(r->rdir_fd, "live.json", 1 << 20, &s, NULL);
	if (q == 0)
		q = overlay_json_live_parse(s, &live);
	if (q == 0) {
		memcpy(r->upper, live.upper, sizeof(r->upper));
		overlay_chain_free(&r->chain);
		overlay_chain_free(&r->mounted);
		r->chain = live.chain;
		r->mounted = live.mounted;
		return 0;
	}
	overlay_chain_free(&live.chain);
	overlay_chain_free(&live.mounted);
	return q;
}

bool overlay_chain_on_base(const struct ovl_chain *chain)
{
	return chain->n == 0 || !overlay_layer_is_base(chain->v[chain->n - 1]);
}

/* Mount chain (+ base, unless the chain ends with a base layer) at target
 * with upper/work dirs up and wk (relative to the root's state dir). */
int overlay_mount_layers(struct ovl_root *r, const struct ovl_chain *chain, const char *target, const char *up,
			 const char *wk, ckpt_error *err)
{
	size_t n = chain->n;
	char(*names)[32] = calloc(n + 1, sizeof(*names)); /* "l/" and a name, or .tmp-<name> */
	const char **lowers = calloc(n + 1, sizeof(*lowers));
	int q;

	if (!names || !lowers) {
		free(names);
		free(lowers);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "l/%s", chain->v[i]);
		lowers[i] = names[i];
	}
	lowers[n] = "base"; /* unless the chain ends with a base layer */
	struct overlay_spec s = { .opts = r->opts,
				  .target = target,
				  .dir = r->rdir,
				  .dir_fd = r->rdir_fd,
				  .lowers = lowers,
				  .n_lowers = n + overlay_chain_on_base(chain),
				  .upper = up,
				  .work = wk };
	q = overlay_mount(&s, err);
	free(names);
	free(lowers);
	return q;
}

/* A chain's view of root r (a diff's, a delta's check): base itself when
 * the chain is empty, else the chain mounted on dv/<name>/m and detached at
 * once (the fd keeps it). */
int overlay_chain_view(struct ovl_root *r, const struct ovl_chain *chain, char name[OVL_NAME_LEN + 1], ckpt_error *err)
{
	name[0] = 0;
	if (chain->n == 0) {
		int fd = openat(r->rdir_fd, "base", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		return fd < 0 ? err_set(err, errno, NULL, "open base of '%s': %m", r->path) : fd;
	}
	char p[64], up[64], wk[64];
	if (mkdirat(r->rdir_fd, "dv", 0700) < 0 && errno != EEXIST)
		return err_set(err, errno, NULL, "create diff view dir: %m");
	_cleanup_close_ int dv = openat(r->rdir_fd, "dv", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dv < 0 || overlay_layers_new_name(dv, name) < 0)
		return err_set(err, EIO, NULL, "name a diff view");
	snprintf(p, sizeof(p), "dv/%s", name);
	snprintf(up, sizeof(up), "dv/%s/u", name);
	snprintf(wk, sizeof(wk), "dv/%s/w", name);
	if (mkdirat(r->rdir_fd, p, 0700) < 0 || mkdirat(r->rdir_fd, up, 0700) < 0 || mkdirat(r->rdir_fd, wk, 0700) < 0)
		return err_set(err, errno, NULL, "create diff view: %m");
	snprintf(p, sizeof(p), "dv/%s/m", name);
	_cleanup_free_ char *target = path_join(r->rdir, p);
	if (!target || mkdirat(r->rdir_fd, p, 0700) < 0)
		return err_set(err, errno ? errno : ENOMEM, NULL, "create diff view: %m");
	int q = overlay_mount_layers(r, chain, target, up, wk, err);
	if (q < 0)
		return q;
	int fd = open(target, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		q = err_set(err, errno, NULL, "open diff view: %m");
	umount2(target, MNT_DETACH);
	return fd < 0 ? q : fd;
}

void overlay_chain_view_drop(struct ovl_root *r, const char *name)
{
	char p[64];
	if (!name[0])
		return;
	snprintf(p, sizeof(p), "dv/%s", name);
	rm_rf_at(r->rdir_fd, p);
}
