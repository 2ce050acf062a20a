/* overlay_release.c: stop managing a root and leave at its path a plain
 * directory holding what the mount showed. The merged view is copied into
 * <parent>/.<name>.ckpt-release (the root's own filesystem), made durable,
 * then r/<h>/release.json records the copy's inode, the mount goes and one
 * RENAME_EXCHANGE puts the copy at the root's path. The old base (now at the
 * temp name) and r/<h> (live.json, layers) are then deleted.
 *
 * A kill at any point: open finds release.json and looks at the path. Our
 * overlay still mounted, or a directory that is not the copy: the release is
 * undone (temp removed, root mounted as live.json says). The copy at the
 * path: the release is finished, and the root adopted afresh.
 *
 * When checkpoints use layers of the root (the intent says "layers"), r/<h>
 * stays with its layers and loses only its live state: the next start
 * adopts the root afresh. Checkpoints are layers over the base, which
 * release replaces: when some checkpoint's chain lies on it, the intent also
 * names a base layer (l/B..., overlay_internal.h) and the old base becomes
 * that layer instead of being deleted: renamed into the layer store (copied
 * when on another mount). Then release.json becomes rebase.json, which puts
 * the base layer under every chain that lay on the base: at once, or at the
 * next start once the chains are loaded. */
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"

#include <dirent.h>
#include <libgen.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include "lib/failpoint.h"

#define REL_INTENT "release.json"
#define REL_REBASE "rebase.json"

struct rel_paths {
	char *parent, *name, *tmp; /* tmp: ".<name>.ckpt-release", in parent */
	int pfd;
};

static void rel_paths_free(struct rel_paths *p)
{
	free(p->parent);
	free(p->name);
	free(p->tmp);
	if (p->pfd >= 0)
		close(p->pfd);
}

static int rel_paths(const struct ovl_root *r, struct rel_paths *p)
{
	*p = (struct rel_paths){ .pfd = -1 };
	_cleanup_free_ char *a = strdup(r->path), *b = strdup(r->path);
	if (!a || !b)
		return -ENOMEM;
	p->parent = strdup(dirname(a));
	p->name = strdup(basename(b));
	if (!p->parent || !p->name || asprintf(&p->tmp, ".%s.ckpt-release", p->name) < 0)
		return -ENOMEM;
	p->pfd = open(p->parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return p->pfd < 0 ? -errno : 0;
}

/* The old base at the temp name becomes layer l/<keep> with its record:
 * renamed, or copied when on another mount. Each step is skipped when done. */
static int rel_keep_base(struct ovl_root *r, struct rel_paths *p, const char *keep, ckpt_error *err)
{
	char tmp[32];
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (l < 0)
		return err_set(err, errno, NULL, "open the layer store of '%s': %m", r->path);
	snprintf(tmp, sizeof(tmp), ".tmp-%s", keep);
	if (faccessat(l, keep, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		if (FAILPOINT_AROUND("overlay.release.base.rename", renameat(p->pfd, p->tmp, l, keep)) == 0) {
			if (FAILPOINT_AROUND("overlay.release.base.fsync",
					     fsync_dirfd(l) < 0 || fsync_dirfd(p->pfd) < 0))
				return err_set(err, errno, NULL, "sync the layer store: %m");
		} else if (errno == EXDEV) {
			struct stat st;
			_cleanup_close_ int src =
				openat(p->pfd, p->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			rm_rf_at(l, tmp);
			if (src < 0 || fstat(src, &st) < 0 || mkdirat(l, tmp, 0700) < 0)
				return err_set(err, errno, NULL, "copy the old base of '%s': %m", r->path);
			_cleanup_close_ int dst = openat(l, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			struct treecopy_opts opts = { .mode = TREECOPY_NEW, .prev_fd = -1 };
			struct treecopy_stats stats = { 0 };
			int q = dst < 0 ? err_set(err, errno, NULL, "open '%s': %m", tmp)
					: treecopy_copy(src, dst, &opts, &stats, err);
			if (q == 0 && (q = treecopy_copy_meta(src, dst, NULL, src, dst, &st)) < 0)
				err_set(err, -q, NULL, "copy the attributes of the old base: %s", strerror(-q));
			if ((q = overlay_layer_publish(r, l, dst, tmp, keep, q, err)) < 0)
				return q;
		} else if (errno != ENOENT) {
			return err_set(err, errno, NULL, "move the old base of '%s' into the layer store: %m", r->path);
		} else {
			return err_set(err, ENOENT, NULL, "the old base of '%s' is gone", r->path);
		}
	}
	char rec[32];
	snprintf(rec, sizeof(rec), "rec/%s", keep);
	if (faccessat(r->rdir_fd, rec, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		_cleanup_close_ int fd = openat(l, keep, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		int q = fd < 0 ? -errno : overlay_record_write(r, fd, keep, false);
		if (q < 0)
			return err_set(err, -q, NULL, "record the old base of '%s': %s", r->path, strerror(-q));
	}
	rm_rf_at(p->pfd, p->tmp); /* what a copy left */
	fsync_dirfd(p->pfd);
	return 0;
}

/* The root's state goes: the base bind first (else deleting r/<h> would
 * descend into it). Keeping the old base (keep, a base layer's name): it
 * becomes that layer, the live state goes and the intent becomes the
 * rebase. Else r/<h> is renamed away in one step (live.json and the intent
 * with it) and deleted, then the old base at the temp name. */
static int rel_finish(struct ovl *o, struct ovl_root *r, struct rel_paths *p, bool layers, const char *keep,
		      ckpt_error *err)
{
	_cleanup_free_ char *base = path_join(r->rdir, "base");
	char gone[64];
	if (base)
		overlay_umount_detach(base);
	if (layers) { /* checkpoints use r's layers: r/<h> stays, its live state goes */
		int q = keep && *keep ? rel_keep_base(r, p, keep, err) : 0;
		if (q < 0)
			return q;
		if (!(keep && *keep)) {
			rm_rf_at(p->pfd, p->tmp);
			fsync_dirfd(p->pfd);
		}
		if ((FAILPOINT_AROUND("overlay.release.live.unlink", unlinkat(r->rdir_fd, "live.json", 0)) < 0 &&
		     errno != ENOENT) ||
		    (unlinkat(r->rdir_fd, "idx/index", 0) < 0 && errno != ENOENT) || fsync_dirfd(r->rdir_fd) < 0)
			return err_set(err, errno, NULL, "remove the live state of '%s': %m", r->path);
		if (keep && *keep)
			q = FAILPOINT_AROUND("overlay.release.rebase.rename",
					     renameat(r->rdir_fd, REL_INTENT, r->rdir_fd, REL_REBASE));
		else
			q = FAILPOINT_AROUND("overlay.release.intent.unlink", unlinkat(r->rdir_fd, REL_INTENT, 0));
		if ((q < 0 && errno != ENOENT) || fsync_dirfd(r->rdir_fd) < 0)
			return err_set(err, errno, NULL, "finish the release of '%s': %m", r->path);
		return 0;
	}
	snprintf(gone, sizeof(gone), "r/.released-%s", r->h);
	rm_rf_at(o->odir_fd, gone);
	char from[32];
	snprintf(from, sizeof(from), "r/%s", r->h);
	if (FAILPOINT_AROUND("overlay.release.state.rename", renameat(o->odir_fd, from, o->odir_fd, gone)) < 0 &&
	    errno != ENOENT)
		return -errno;
	int q = FAILPOINT_AROUND("overlay.release.state.fsync", fsync_dirfd(o->odir_fd));
	FAILPOINT_AROUND("overlay.release.state.remove", rm_rf_at(o->odir_fd, gone));
	rm_rf_at(p->pfd, p->tmp);
	fsync_dirfd(p->pfd);
	return q < 0 ? err_set(err, -q, NULL, "remove the state of '%s': %s", r->path, strerror(-q)) : 0;
}

/* Whether some checkpoint's chain has layers of r (*layers), and whether
 * one lies on r's base dir (*base). Forks are refused before. */
static void rel_needs(struct ovl *o, struct ovl_root *r, bool *layers, bool *base)
{
	*layers = *base = false;
	for (size_t i = 0; i < o->chains.n; i++) {
		const struct ovl_chain *x = overlay_chains_get(&o->chains.v[i].cs, r->h);
		*layers |= x != NULL;
		*base |= x && overlay_chain_on_base(x);
	}
}

/* release.json (or rebase.json) as written; what it lacks takes the
 * defaults overlay_json_release_parse says. */
static int rel_intent_load(struct ovl_root *r, const char *name, struct ovl_release_intent *ri)
{
	_cleanup_free_ char *s = NULL;
	int q = read_file_at(r->rdir_fd, name, 4096, &s, NULL);
	if (q < 0)
		return q;
	overlay_json_release_parse(s, ri);
	return 0;
}

static int rel_intent_save(struct ovl_root *r, const struct ovl_release_intent *ri)
{
	_cleanup_free_ char *s = overlay_json_release_dump(ri);
	if (!s)
		return -ENOMEM;
	return FAILPOINT_AROUND("overlay.release.intent.write",
				write_file_atomic(r->rdir_fd, REL_INTENT, s, strlen(s), 0600));
}

/* Checkpoint id's chains with keep under r's chain; saved. */
static int rel_rebase_one(struct ovl *o, struct ovl_root *r, const char *id, const char *keep)
{
	struct ovl_chain x = { 0 };
	int q = overlay_chain_copy(&x, overlay_chains_get(overlay_chain_map_get(&o->chains, id), r->h));
	if (q == 0)
		q = overlay_chain_push(&x, keep);
	if (q == 0)
		q = overlay_layers_chain_set_root(o, id, r->h, &x);
	overlay_chain_free(&x);
	return q;
}

int overlay_release_rebase(struct ovl *o, struct ovl_root *r)
{
	struct ovl_release_intent ri;
	int q = rel_intent_load(r, REL_REBASE, &ri);
	if (q < 0)
		return q == -ENOENT ? 0 : q;
	const char *keep = ri.base;
	if (!keep[0])
		return -EBADMSG;
	for (size_t i = 0; i < o->chains.n; i++) {
		const struct ovl_chain *x = overlay_chains_get(&o->chains.v[i].cs, r->h);
		if (!x || !overlay_chain_on_base(x))
			continue;
		char id[sizeof(o->chains.v[i].id)];
		memcpy(id, o->chains.v[i].id, sizeof(id)); /* the save replaces the entry's chains */
		if ((q = rel_rebase_one(o, r, id, keep)) < 0)
			return q;
	}
	if (FAILPOINT_AROUND("overlay.release.rebase.unlink",
			     unlinkat(r->rdir_fd, REL_REBASE, 0) < 0 || fsync_dirfd(r->rdir_fd) < 0))
		return -errno;
	log_info("overlay: the checkpoints of '%s' from before its release lie on its old base, kept as layer %s",
		 r->path, keep);
	return 0;
}

static void rel_undo(struct ovl_root *r, struct rel_paths *p)
{
	rm_rf_at(p->pfd, p->tmp);
	unlinkat(r->rdir_fd, REL_INTENT, 0);
	fsync_dirfd(r->rdir_fd);
}

static int rel_copy(struct ovl_root *r, struct rel_paths *p, ino_t *ret_ino, ckpt_error *err)
{
	struct stat st;
	_cleanup_close_ int src = open(r->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (src < 0 || fstat(src, &st) < 0)
		return err_set(err, errno, NULL, "open '%s': %m", r->path);
	rm_rf_at(p->pfd, p->tmp);
	if (mkdirat(p->pfd, p->tmp, 0700) < 0)
		return err_set(err, errno, NULL, "create '%s/%s': %m", p->parent, p->tmp);
	_cleanup_close_ int dst = openat(p->pfd, p->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dst < 0)
		return err_set(err, errno, NULL, "open '%s/%s': %m", p->parent, p->tmp);
	struct treecopy_opts opts = { .mode = TREECOPY_NEW, .prev_fd = -1 };
	struct treecopy_stats stats = { 0 };
	int q = treecopy_copy(src, dst, &opts, &stats, err);
	if (q == 0 && (q = treecopy_copy_meta(src, dst, NULL, src, dst, &st)) < 0)
		err_set(err, -q, NULL, "copy the attributes of '%s': %s", r->path, strerror(-q));
	if (q == 0 && FAILPOINT_AROUND("overlay.release.copy.sync", syncfs(dst) < 0 || fsync_dirfd(p->pfd) < 0))
		q = err_set(err, errno, NULL, "sync '%s': %m", p->parent);
	if (q == 0 && fstat(dst, &st) < 0)
		q = err_set(err, errno, NULL, "stat the copy: %m");
	*ret_ino = st.st_ino;
	return q;
}

int overlay_release(void *st, size_t i, ckpt_error *err)
{
	struct ovl *o = st;
	struct ovl_root *r = &o->roots[i];
	struct rel_paths p;
	struct restore_details busy = { 0 };
	ino_t ino = 0;
	char keep[OVL_NAME_LEN + 1] = "";

	if (o->forks.n)
		return err_set(err, EBUSY, "forks_exist",
			       "forks use the layers of '%s': delete them first (GET /v1/forks)", r->path);
	int q = rel_paths(r, &p);
	if (q < 0) {
		rel_paths_free(&p);
		return err_set(err, -q, NULL, "open the parent of '%s': %s", r->path, strerror(-q));
	}
	/* Open files would keep writing to the old mount: refuse, name them. */
	if (overlay_busy_processes(r->path, &busy) == 0 && busy.n_busy) {
		q = err_set(err, EBUSY, "root_busy",
			    "process %ld (%s) still uses '%s' and belongs to no managed unit: stop it first",
			    busy.busy[0].pid, busy.busy[0].command, r->path);
		goto out;
	}
	bool layers, need_base;
	rel_needs(o, r, &layers, &need_base);
	if (need_base) {
		_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (l < 0 || (q = overlay_layers_new_base_name(l, keep)) < 0) {
			q = err_set(err, l < 0 ? errno : -q, NULL, "name a layer for the base of '%s'", r->path);
			goto out;
		}
	}
	if ((q = rel_copy(r, &p, &ino, err)) < 0) {
		rel_undo(r, &p);
		goto out;
	}
	struct ovl_release_intent ri = { .ino = ino, .layers = layers };
	memcpy(ri.base, keep, sizeof(ri.base));
	if ((q = rel_intent_save(r, &ri)) < 0) {
		err_set(err, -q, NULL, "record the release of '%s': %s", r->path, strerror(-q));
		rel_undo(r, &p);
		goto out;
	}
	if (FAILPOINT_AROUND("overlay.release.umount", umount2(r->path, UMOUNT_NOFOLLOW)) < 0) {
		q = err_set(err, errno, NULL, "unmount '%s': %m", r->path); /* EBUSY: the engine says root_busy */
		rel_undo(r, &p);
		goto out;
	}
	if (FAILPOINT_AROUND("overlay.release.exchange", renameat2(p.pfd, p.tmp, p.pfd, p.name, RENAME_EXCHANGE)) < 0 ||
	    FAILPOINT_AROUND("overlay.release.exchange.fsync", fsync_dirfd(p.pfd)) < 0) {
		q = err_set(err, errno, NULL, "put the released copy at '%s': %m", r->path);
		/* undone by remounting what live.json says */
		ckpt_error e2 = { 0 };
		char up[32], wk[32];
		snprintf(up, sizeof(up), "u/%s", r->upper);
		snprintf(wk, sizeof(wk), "w/%s", r->upper);
		if (overlay_mount_layers(r, &r->mounted, r->path, up, wk, &e2) == 0)
			rel_undo(r, &p);
		goto out;
	}
	r->released = true; /* the path holds the released copy, whatever follows */
	overlay_delta_reset(r);
	/* From here on a failure says "released, but": the engine counts it released. */
	if ((q = rel_finish(o, r, &p, layers, keep, err)) < 0) {
		err_prefix(err, "'%s' is released, but the next start has to finish it", r->path);
		if (err)
			err->code = "release_incomplete"; /* the engine counts the root released */
		goto out;
	}
	if (keep[0] && (q = overlay_release_rebase(o, r)) < 0) {
		err_set(err, -q, "release_incomplete",
			"'%s' is released, but its checkpoints are moved onto the old base only at the next start: %s",
			r->path, strerror(-q));
	}
out:
	restore_details_free(&busy);
	rel_paths_free(&p);
	return q;
}

/* At open, before anything else of r: finish or undo a release a kill
 * interrupted. 1: finished (adopt r afresh), 0: nothing or undone. */
int overlay_release_recover(struct ovl *o, struct ovl_root *r)
{
	struct ovl_release_intent ri;
	if (rel_intent_load(r, REL_INTENT, &ri) < 0)
		return 0;
	ino_t ino = (ino_t)ri.ino;
	const char *keep = ri.base[0] ? ri.base : NULL; /* none, or not ours */
	bool layers = ri.layers;                        /* unsure: keep them */
	struct rel_paths p;
	struct overlay_mountinfo mi = { 0 };
	struct stat st;
	int q = rel_paths(r, &p);
	if (q == 0)
		q = overlay_mountinfo_find(r->path, &mi);
	bool exchanged = q == 0 && !mi.found && stat(r->path, &st) == 0 && ino && st.st_ino == ino;
	overlay_mountinfo_clear(&mi);
	if (q < 0) {
		rel_paths_free(&p);
		return 0;
	}
	if (exchanged) {
		ckpt_error e = { 0 };
		if ((q = rel_finish(o, r, &p, layers, keep, &e)) < 0)
			log_warn("release of '%s' not finished at start: %s", r->path, e.msg);
		else
			log_notice(
				"release of '%s' finished at start (it was interrupted after the copy took its place)",
				r->path);
	} else {
		rel_undo(r, &p);
		log_notice("release of '%s' undone at start (it was interrupted before the copy took its place)",
			   r->path);
	}
	rel_paths_free(&p);
	return exchanged && q == 0 ? 1 : 0;
}

/* A temp copy a kill left before its intent was written. */
void overlay_release_sweep(struct ovl_root *r)
{
	struct rel_paths p;
	if (faccessat(r->rdir_fd, REL_INTENT, F_OK, 0) == 0)
		return;
	if (rel_paths(r, &p) == 0)
		rm_rf_at(p.pfd, p.tmp);
	rel_paths_free(&p);
}

/* r/.released-<h> that a kill left after a finished release renamed it. */
void overlay_release_sweep_gone(struct ovl *o)
{
	int fd = openat(o->odir_fd, "r", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, ".released-", 10))
			rm_rf_at(dirfd(d), de->d_name);
	closedir(d);
}
