/* oci_trim.c: <state>/oci keeps what a checkpoint needs, and its size
 * counts toward max_state_bytes with the checkpoints'.
 *
 * Needed: a push's key while the checkpoints its name holds are kept (base
 * keys always), and the blob it names; a push's config while its checkpoint
 * is kept; a pulled checkpoint's manifest, config and layers (where a push
 * left them: a pull keeps none), and the tree kept below its image's last
 * layer. The rest goes, with the temp files a killed push or pull left. It
 * runs at start and from the sweeper after a delete, push or pull, never
 * while a push or pull runs (oci_lock), under the operation lock (a pull
 * links from the trees under it). Bytes count a tree's files only where
 * the tree alone holds them: the others are a checkpoint's, counted in its
 * size. */
#include <sys/stat.h>

#include "engine/engine_internal.h"
#include "engine/oci_cache.h"
#include "lib/failpoint.h"
#include "lib/walk.h"

#define CONFIG_PEEK (64u << 10) /* a push's config is smaller: larger blobs are no config */

struct trim {
	struct engine *e;
	json_t *ids;   /* every checkpoint id */
	json_t *blobs; /* needed blobs, by hex */
	json_t *trees; /* needed trees, by key */
	uint64_t bytes;
	unsigned removed;
};

static void trim_need_blob(struct trim *t, const char *digest)
{
	if (digest && strlen(digest) == 71 && !strncmp(digest, "sha256:", 7))
		json_object_set_new(t->blobs, digest + 7, json_true());
}

/* A pulled checkpoint's manifest, what it names, and its kept tree. */
static void trim_need_pull(struct trim *t, const struct ckpt_record *rec)
{
	const struct ckpt_pull_of *of = rec->extra.pull_of;
	const char *d = of ? of->digest : NULL;
	json_t *l;
	char path[200], key[65];
	_cleanup_free_ char *text = NULL;
	size_t len, i;
	if (!d || strlen(d) != 71 || strncmp(d, "sha256:", 7))
		return;
	trim_need_blob(t, d);
	oci_cache_blob_name(d, path, sizeof(path));
	if (read_file_at(t->e->state_fd, path, 4u << 20, &text, &len) < 0)
		return;
	json_auto_t *m = json_loadb(text, len, 0, NULL);
	json_t *layers = json_object_get(m, "layers");
	trim_need_blob(t, json_string_value(json_object_get(json_object_get(m, "config"), "digest")));
	json_array_foreach (layers, i, l)
		trim_need_blob(t, json_string_value(json_object_get(l, "digest")));
	if (json_array_size(layers) >= 2 && of->roots) {
		oci_cache_tree_key(of->roots, of->n_roots, json_object_get(m, "annotations"), layers,
				   json_array_size(layers) - 1, key);
		json_object_set_new(t->trees, key, json_true());
	}
}

/* Keys whose checkpoints are all kept, and their blobs; the rest go. */
static void trim_keys(struct trim *t)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	char name[NAME_MAX + 1], path[300], *save = NULL;
	if (walk_open(t->e->state_fd, KEYS_DIR, &d) < 0)
		return;
	write_file_atomic_sweep(dirfd(d));
	while ((de = walk_next(d))) {
		bool kept = true;
		snprintf(name, sizeof(name), "%s", de->d_name);
		for (char *tok = strtok_r(name, "-", &save); tok; tok = strtok_r(NULL, "-", &save))
			kept &= !id_valid(tok) || json_object_get(t->ids, tok);
		struct oci_blob b;
		snprintf(path, sizeof(path), "%s/%s", KEYS_DIR, de->d_name);
		if (kept && oci_cache_key_read(t->e, de->d_name, &b) == 0)
			trim_need_blob(t, b.digest);
		else if (FAILPOINT_AROUND("oci.trim.key.unlink", unlinkat(t->e->state_fd, path, 0)) == 0)
			t->removed++;
	}
}

/* A small blob that is a push's config, of a checkpoint still kept. */
static bool trim_config_kept(struct trim *t, int dfd, const char *name, const struct stat *st)
{
	_cleanup_free_ char *text = NULL;
	size_t len;
	if (st->st_size > CONFIG_PEEK || read_file_at(dfd, name, CONFIG_PEEK, &text, &len) < 0)
		return false;
	json_auto_t *j = json_loadb(text, len, 0, NULL);
	json_t *labels = json_object_get(json_object_get(j, "config"), "Labels");
	const char *id = json_string_value(json_object_get(labels, "io.ckptd.checkpoint_id"));
	return id && json_object_get(t->ids, id);
}

static void trim_blobs(struct trim *t)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	struct stat st;
	char path[300];
	if (walk_open(t->e->state_fd, BLOBS_DIR, &d) < 0)
		return;
	write_file_atomic_sweep(dirfd(d));
	while ((de = walk_next(d))) {
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (json_object_get(t->blobs, de->d_name) || trim_config_kept(t, dirfd(d), de->d_name, &st)) {
			t->bytes += (uint64_t)st.st_blocks * 512;
			continue;
		}
		if (FAILPOINT_AROUND("oci.trim.blob.unlink", unlinkat(dirfd(d), de->d_name, 0)) == 0)
			t->removed++;
		snprintf(path, sizeof(path), "%s/%s", MOUNT_DIR, de->d_name);
		unlinkat(t->e->state_fd, path, 0);
	}
}

static int trim_tree_one(void *ctx, struct walk_entry *e)
{
	struct trim *t = ctx;
	if (S_ISDIR(e->st.st_mode) || e->st.st_nlink == 1)
		t->bytes += (uint64_t)e->st.st_blocks * 512;
	return 0;
}

/* The bytes below dfd that no checkpoint shares; what cannot be read is
 * left out of the count. */
static void trim_tree_bytes(struct trim *t, int dfd)
{
	struct walk_opts o = { .flags = WALK_STAT, .pre = trim_tree_one, .fail = walk_fail_ignore, .ctx = t };
	walk_tree(dfd, NULL, &o);
}

static void trim_trees(struct trim *t)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	if (walk_open(t->e->state_fd, TREES_DIR, &d) < 0)
		return;
	while ((de = walk_next(d))) {
		_cleanup_close_ int fd = -1;
		if (!json_object_get(t->trees, de->d_name))
			t->removed += rm_rf_at(dirfd(d), de->d_name) == 0;
		else if ((fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) >= 0)
			trim_tree_bytes(t, fd);
	}
}

/* What mounts/ and keys/ hold themselves. */
static void trim_small(struct trim *t, const char *dir)
{
	_cleanup_closedir_ DIR *d = NULL;
	struct dirent *de;
	struct stat st;
	if (walk_open(t->e->state_fd, dir, &d) < 0)
		return;
	write_file_atomic_sweep(dirfd(d));
	while ((de = walk_next(d)))
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
			t->bytes += (uint64_t)st.st_blocks * 512;
}

void oci_trim(struct engine *e)
{
	struct catalog_list all = { 0 };
	if (pthread_rwlock_trywrlock(&e->oci_lock) != 0)
		return; /* a push or pull runs: it asks for a trim when it ends */
	struct trim t = { .e = e, .ids = json_object(), .blobs = json_object(), .trees = json_object() };
	pthread_mutex_lock(&e->op_lock);
	if (t.ids && t.blobs && t.trees && catalog_list(e->catalog, NULL, &all) == 0) {
		for (size_t i = 0; i < all.n; i++) {
			json_object_set_new(t.ids, all.v[i]->id, json_true());
			trim_need_pull(&t, all.v[i]);
		}
		trim_keys(&t);
		trim_blobs(&t);
		trim_trees(&t);
		trim_small(&t, KEYS_DIR);
		trim_small(&t, MOUNT_DIR);
		atomic_store(&e->oci_bytes, t.bytes);
		if (t.removed) /* what tests wait for */
			log_info("registry cache: removed %u entries no checkpoint needs; %llu bytes kept", t.removed,
				 (unsigned long long)t.bytes);
	}
	pthread_mutex_unlock(&e->op_lock);
	pthread_rwlock_unlock(&e->oci_lock);
	catalog_list_free(&all);
	json_decref(t.ids);
	json_decref(t.blobs);
	json_decref(t.trees);
}
