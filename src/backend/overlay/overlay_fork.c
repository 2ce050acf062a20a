/* overlay_fork.c: forks of a checkpoint. A fork is one more overlay mount per
 * root over the checkpoint's layers (+ base) with an upper and work dir of
 * its own in r/<h>/f/<fork>/: mounting costs the same whatever the size. The
 * fork's chains count as users of their layers (o->forks, o->refs), so
 * neither GC nor deleting checkpoints removes them; flattening leaves the
 * fork's layers as they are (it only rewrites checkpoints' chains). */
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"

#include <sys/stat.h>

#include "lib/walk.h"
#include "lib/failpoint.h"

static bool ovl_fork_id_ok(const char *fid)
{
	size_t n = strlen(fid);
	if (n == 0 || n > 40)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((fid[i] >= 'a' && fid[i] <= 'z') || (fid[i] >= '0' && fid[i] <= '9') || fid[i] == '_'))
			return false;
	return true;
}

/* f/<fid>/{u,w}, the upper's root with the mode and owner of the view's root. */
static int ovl_fork_dirs(struct ovl_root *r, const struct ovl_chain *chain, const char *fid)
{
	char p[96];
	struct stat st;
	if (mkdirat(r->rdir_fd, "f", 0700) < 0 && errno != EEXIST)
		return -errno;
	snprintf(p, sizeof(p), "f/%s", fid);
	if (mkdirat(r->rdir_fd, p, 0700) < 0 && errno != EEXIST)
		return -errno;
	snprintf(p, sizeof(p), "f/%s/w", fid);
	if (mkdirat(r->rdir_fd, p, 0700) < 0 && errno != EEXIST)
		return -errno;
	snprintf(p, sizeof(p), "f/%s/u", fid);
	if (mkdirat(r->rdir_fd, p, 0755) < 0 && errno != EEXIST)
		return -errno;
	char top[32];
	if (chain->n)
		snprintf(top, sizeof(top), "l/%s", chain->v[0]);
	else
		snprintf(top, sizeof(top), "base");
	if (fstatat(r->rdir_fd, top, &st, 0) == 0 &&
	    (fchownat(r->rdir_fd, p, st.st_uid, st.st_gid, 0) < 0 ||
	     fchmodat(r->rdir_fd, p, st.st_mode & 07777, 0) < 0))
		return -errno;
	return 0;
}

static bool ovl_fork_mounted(struct ovl_root *r, const char *fid, const char *dir)
{
	struct overlay_mountinfo mi;
	_cleanup_free_ char *want = NULL;
	char rel[96];
	snprintf(rel, sizeof(rel), "f/%s/u", fid);
	want = path_join(r->rdir, rel);
	/* gVisor's mountinfo names no upperdir: an overlay at dir is taken as the fork's */
	bool ok = overlay_mountinfo_find(dir, &mi) == 0 && mi.found && !strcmp(mi.fstype, "overlay") && want &&
		(mi.upperdir ? !strcmp(mi.upperdir, want) : r->opts->kind == OVERLAY_GVISOR);
	overlay_mountinfo_clear(&mi);
	return ok;
}

static void ovl_fork_drop_dirs(struct ovl_root *r, const char *fid)
{
	char p[96];
	snprintf(p, sizeof(p), "f/%s", fid);
	FAILPOINT_AROUND("overlay.fork.upper.remove", rm_rf_at(r->rdir_fd, p));
	_cleanup_close_ int f = openat(r->rdir_fd, "f", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (f >= 0)
		fsync_dirfd(f);
}

#define OVL_FORKS_DIR "fk"

static int ovl_fork_dir_fd(struct ovl *o)
{
	if (mkdirat(o->odir_fd, OVL_FORKS_DIR, 0700) < 0 && errno != EEXIST)
		return -errno;
	int fd = openat(o->odir_fd, OVL_FORKS_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* fk/<fid>.json: the fork's chains, durable before the fork is mounted, so
 * the GC that runs when the backend recovers (before the engine knows its
 * forks) keeps the fork's layers and upper. */
static int ovl_fork_chain_write(struct ovl *o, const char *fid, const struct ovl_chains *chains)
{
	char name[64];
	_cleanup_close_ int fd = ovl_fork_dir_fd(o);
	_cleanup_free_ char *s = overlay_json_chains_dump(chains);
	if (fd < 0)
		return fd;
	if (!s)
		return -ENOMEM;
	snprintf(name, sizeof(name), "%s.json", fid);
	return FAILPOINT_AROUND("overlay.fork.chain.write", write_file_atomic(fd, name, s, strlen(s), 0600));
}

static void ovl_fork_chain_drop(struct ovl *o, const char *fid)
{
	char name[64];
	_cleanup_close_ int fd = ovl_fork_dir_fd(o);
	snprintf(name, sizeof(name), "%s.json", fid);
	if (fd >= 0 && FAILPOINT_AROUND("overlay.fork.chain.unlink", unlinkat(fd, name, 0)) == 0)
		fsync_dirfd(fd);
}

void overlay_fork_load(struct ovl *o)
{
	_cleanup_close_ int fd = ovl_fork_dir_fd(o);
	DIR *d;
	if (fd < 0 || walk_open(fd, NULL, &d) < 0)
		return;
	write_file_atomic_sweep(fd);
	struct dirent *de;
	while ((de = walk_next(d))) {
		size_t n = strlen(de->d_name);
		char fid[64];
		_cleanup_free_ char *s = NULL;
		if (n <= 5 || n >= sizeof(fid) || strcmp(de->d_name + n - 5, ".json"))
			continue;
		snprintf(fid, sizeof(fid), "%.*s", (int)(n - 5), de->d_name);
		struct ovl_chains c = { 0 };
		if (ovl_fork_id_ok(fid) && read_file_at(fd, de->d_name, 1 << 20, &s, NULL) == 0 &&
		    overlay_json_chains_parse(s, &c) == 0 && overlay_chain_map_put(&o->forks, fid, &c) < 0)
			log_warn("overlay: out of memory loading fork %s", fid);
		overlay_chains_free(&c);
	}
	closedir(d);
}

static int ovl_fork_register(struct ovl *o, const char *fid, const struct ovl_chains *chains)
{
	struct ovl_chains copy = { 0 };
	if (overlay_chain_map_get(&o->forks, fid))
		return 0;
	int q = overlay_chains_copy(&copy, chains);
	if (q == 0 && (q = overlay_chain_map_put(&o->forks, fid, &copy)) == 0)
		overlay_refs_add_all(&o->refs, chains, +1);
	overlay_chains_free(&copy);
	return q;
}

/* The chains a fork mounts: those it recorded (fdata), else checkpoint id's. */
static int ovl_fork_chains(struct ovl *o, const char *id, json_t *data, json_t *fdata, struct ovl_chains *out)
{
	int q = fdata ? overlay_json_fork_data_read(fdata, out) : overlay_layers_chain_get(o, id, data, out);
	return q == -ENOMEM ? q : q < 0 ? -ENOENT : 0;
}

int overlay_fork_mount(void *st, const char *id, json_t *data, const char *fid, const char *const *dirs, json_t **fdata,
		       ckpt_error *err)
{
	struct ovl *o = st;
	_cleanup_(overlay_chains_free) struct ovl_chains chains = { 0 };
	static const struct ovl_chain none = { 0 };
	size_t done = 0;

	if (!ovl_fork_id_ok(fid))
		return err_set(err, EINVAL, NULL, "invalid fork id '%s'", fid);
	int q = ovl_fork_chains(o, id, data, *fdata, &chains);
	if (q == -ENOMEM)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (q < 0)
		return err_set(err, ENOENT, NULL, "no layer chain recorded for %s", id ? id : fid);
	if (*fdata) /* a recorded fork keeps its layers and upper even if it cannot be mounted */
		q = ovl_fork_register(o, fid, &chains);
	else if ((q = ovl_fork_chain_write(o, fid, &chains)) < 0)
		return err_set(err, -q, NULL, "record the fork's layers: %s", strerror(-q));
	if (q < 0)
		return err_set(err, -q, NULL, "out of memory");
	for (; q == 0 && done < o->n_roots; done++) {
		struct ovl_root *r = &o->roots[done];
		const struct ovl_chain *chain = overlay_chains_get(&chains, r->h);
		chain = chain ? chain : &none;
		char up[96], wk[96];
		if (*fdata && ovl_fork_mounted(r, fid, dirs[done]))
			continue;
		if ((q = ovl_fork_dirs(r, chain, fid)) < 0) {
			err_set(err, -q, NULL, "create the fork's upper dir: %s", strerror(-q));
			break;
		}
		snprintf(up, sizeof(up), "f/%s/u", fid);
		snprintf(wk, sizeof(wk), "f/%s/w", fid);
		if ((q = FAILPOINT_AROUND("overlay.fork.mount",
					  overlay_mount_layers(r, chain, dirs[done], up, wk, err))) < 0)
			err_prefix(err, "mount fork at '%s'", dirs[done]);
	}
	if (q < 0) {
		if (!*fdata) /* a new fork leaves nothing behind */
			ovl_fork_chain_drop(o, fid);
		if (!*fdata)
			for (size_t i = 0; i < done; i++) {
				ckpt_error e2 = { 0 };
				if (i + 1 < done)
					overlay_umount(dirs[i], NULL, &e2);
				ovl_fork_drop_dirs(&o->roots[i], fid);
			}
		return q;
	}
	if ((q = ovl_fork_register(o, fid, &chains)) < 0 || (!*fdata && !(*fdata = overlay_json_fork_data(&chains))))
		return err_set(err, q < 0 ? -q : ENOMEM, NULL, "out of memory");
	return 0;
}

int overlay_fork_remove(void *st, const char *fid, json_t *fdata, const char *const *dirs, ckpt_error *err)
{
	struct ovl *o = st;
	if (!ovl_fork_id_ok(fid))
		return err_set(err, EINVAL, NULL, "invalid fork id '%s'", fid);
	for (size_t i = 0; i < o->n_roots; i++) {
		struct ovl_root *r = &o->roots[i];
		if (ovl_fork_mounted(r, fid, dirs[i]) &&
		    FAILPOINT_AROUND("overlay.fork.umount", overlay_umount(dirs[i], NULL, err)) < 0)
			return err_prefix(err, "unmount fork at '%s'", dirs[i]);
		ovl_fork_drop_dirs(r, fid);
	}
	(void)fdata; /* a fork not registered counts in no reference */
	const struct ovl_chains *chains = overlay_chain_map_get(&o->forks, fid);
	if (chains) {
		overlay_refs_add_all(&o->refs, chains, -1);
		overlay_chain_map_del(&o->forks, fid);
	}
	ovl_fork_chain_drop(o, fid);
	o->dirty_gc = true;
	return 0;
}
