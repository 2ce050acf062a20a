/* overlay_verify.c: layer records, and the comparison "verify" makes after a
 * restore. A layer is immutable; its record (rec/<layer>, written when the
 * layer is published) lists each entry's type, mode, owner, size and mtime.
 * Verify then checks, per root: the mount at P is ours with the upper just
 * made, that upper is still empty, and every layer of the checkpoint's chain
 * still matches its record, so a write on a layer directory behind ckptd's
 * back shows. Inode ctimes cannot stand in: linking a file into a newer layer
 * or removing an older layer changes them. The base is not recorded. */
#include "backend/overlay/overlay_internal.h"
#include "lib/strset.h"
#include "lib/walk.h"

#include <sys/stat.h>

#define REC_MAGIC "ckptd-layer-record 1\n"
#define REC_MAX (1u << 30)

struct rec_walk {
	FILE *out;                  /* writing: the record */
	struct strset *map;         /* verifying: escaped path -> fields, removed when seen */
	struct verify_diffs *diffs; /* verifying */
	const char *root_path;
	size_t max;
};

/* Every byte outside printable ASCII, '%' and space as %XX: lines stay
 * lines and keys stay valid UTF-8 whatever the file names hold. */
static void rec_escape(const char *s, char *out, size_t size)
{
	size_t n = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p && n + 4 < size; p++)
		n += (size_t)snprintf(out + n, size - n, *p <= ' ' || *p >= 0x7f || *p == '%' ? "%%%02X" : "%c", *p);
	out[n] = '\0';
}

static void rec_fields(const struct stat *st, char *out, size_t size)
{
	snprintf(out, size, "%o %u %u %llu %lld.%09ld", (unsigned)st->st_mode, (unsigned)st->st_uid,
		 (unsigned)st->st_gid, S_ISREG(st->st_mode) ? (unsigned long long)st->st_size : 0ULL,
		 (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
}

static void rec_differ(struct rec_walk *w, const char *rel, const char *reason)
{
	if (w->diffs->n >= w->max)
		return;
	_cleanup_free_ char *p = rel ? path_join(w->root_path, rel) : strdup(w->root_path);
	if (p || rel)
		verify_diffs_add(w->diffs, p ? p : rel, reason);
}

/* Which field of two field strings differs first. */
static const char *rec_reason(const char *want, const char *got)
{
	static const char *const names[] = { "type", "owner", "owner", "size", "mtime" };
	unsigned mw, mg;
	if (sscanf(want, "%o", &mw) == 1 && sscanf(got, "%o", &mg) == 1 && mw != mg)
		return (mw & S_IFMT) != (mg & S_IFMT) ? "type" : "mode";
	const char *a = strchr(want, ' '), *b = strchr(got, ' ');
	for (size_t i = 1; i < ARRAY_SIZE(names); i++) {
		if (!a || !b)
			break;
		a++, b++; /* the i-th field of each */
		size_t la = strcspn(a, " "), lb = strcspn(b, " ");
		if (la != lb || memcmp(a, b, la))
			return names[i];
		a = strchr(a, ' '), b = strchr(b, ' ');
	}
	return "mtime";
}

static void rec_entry(struct rec_walk *w, const char *rel, const struct stat *st)
{
	char key[3 * 4096 + 1], f[128];
	rec_escape(rel, key, sizeof(key));
	rec_fields(st, f, sizeof(f));
	if (w->out) {
		fprintf(w->out, "%s %s\n", f, key);
		return;
	}
	const char *want = strset_get(w->map, key);
	if (!want)
		rec_differ(w, rel, "unexpected");
	else if (strcmp(want, f))
		rec_differ(w, rel, rec_reason(want, f));
	strset_del(w->map, key);
}

static int rec_walk_pre(void *ctx, struct walk_entry *e)
{
	rec_entry(ctx, e->path, &e->st);
	return 0;
}

/* Any failure fails the walk, a read error too: a record written from a
 * listing read in part would make every later verify of the layer report
 * the entries left out, and a verify that read in part would report them
 * as missing from the layer. Neither says what is so. */
static int rec_walk_fail(void *ctx, const struct walk_entry *e, int err)
{
	(void)ctx;
	(void)e;
	return err;
}

static int rec_walk_dir(struct rec_walk *w, int dfd)
{
	struct walk_opts o = { .flags = WALK_STAT, .pre = rec_walk_pre, .fail = rec_walk_fail, .ctx = w };
	return walk_tree(dfd, NULL, &o);
}

int overlay_record_write(struct ovl_root *r, int layer_fd, const char *name, bool synced_after)
{
	_cleanup_free_ char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	_cleanup_close_ int lfd = openat(layer_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct rec_walk w = { .out = f };

	if (!f)
		return -ENOMEM;
	fputs(REC_MAGIC, f);
	int q = lfd < 0 ? -errno : rec_walk_dir(&w, lfd);
	if (fclose(f) != 0 && q == 0)
		q = -ENOMEM;
	_cleanup_close_ int rfd = openat(r->rdir_fd, "rec", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	/* synced_after: a syncfs of the layer's file system follows before
	 * anything durable names the layer. overlay_layer_publish and
	 * overlay_layers_merge make it themselves; a create's new layer gets
	 * it from overlay_layer_publish_new or, when the catalog shares that
	 * file system, from the record's write (catalog_write), before the
	 * record's rename. rec/ and l/ are both in the root's state dir, one
	 * file system, so that syncfs makes the record durable too. A
	 * release's old base record has no such sync: it is written
	 * atomically. */
	if (q == 0)
		q = rfd < 0            ? -errno
			: synced_after ? write_file_replace(rfd, name, text, len, 0600)
				       : write_file_atomic(rfd, name, text, len, 0600);
	return q;
}

/* rec/<name> into map as escaped path -> fields: 1, or 0 when there is
 * none, or -ENOMEM. */
static int rec_load(struct ovl_root *r, const char *name, struct strset *map)
{
	_cleanup_free_ char *text = NULL;
	_cleanup_close_ int rfd = openat(r->rdir_fd, "rec", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char *save = NULL;

	if (rfd < 0 || read_file_at(rfd, name, REC_MAX, &text, NULL) < 0 || strncmp(text, REC_MAGIC, strlen(REC_MAGIC)))
		return 0;
	for (char *l = strtok_r(text + strlen(REC_MAGIC), "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		char *sp = strrchr(l, ' ');
		if (!sp)
			continue;
		*sp = '\0';
		if (strset_put(map, sp + 1, l) < 0)
			return -ENOMEM;
	}
	return 1;
}

static int verify_layer(struct ovl_root *r, int layers_fd, const char *name, struct rec_walk *w)
{
	_cleanup_(strset_free) struct strset map = { 0 };
	const char *key;
	size_t i = 0;
	int q = rec_load(r, name, &map);

	if (q <= 0) {
		if (q == 0)
			log_debug("overlay: layer '%s' of '%s' has no record: not compared", name, r->path);
		return q;
	}
	_cleanup_close_ int lfd = openat(layers_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (lfd < 0) {
		rec_differ(w, NULL, "layer");
		return 0;
	}
	w->map = &map;
	q = rec_walk_dir(w, lfd);
	while ((key = strset_next(&map, &i, NULL))) {
		char raw[4096];
		size_t n = 0;
		for (const char *p = key; *p && n + 1 < sizeof(raw); n++) { /* undo rec_escape */
			unsigned c;
			raw[n] = *p == '%' && sscanf(p + 1, "%2X", &c) == 1 ? (char)c : *p;
			p += *p == '%' ? 3 : 1;
		}
		raw[n] = '\0';
		rec_differ(w, raw, "missing");
	}
	return q;
}

static bool upper_empty(struct ovl_root *r)
{
	char p[64];
	snprintf(p, sizeof(p), "u/%s", r->upper);
	int fd = openat(r->rdir_fd, p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	struct dirent *de;
	bool empty = d != NULL;

	while (d && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = false;
	if (d)
		closedir(d);
	else if (fd >= 0)
		close(fd);
	return empty;
}

int overlay_verify_root(struct ovl_root *r, const struct ovl_chain *chain, bool mounted_ok, struct verify_diffs *diffs,
			size_t max, ckpt_error *err)
{
	struct rec_walk w = { .diffs = diffs, .root_path = r->path, .max = max };
	_cleanup_close_ int l = openat(r->rdir_fd, "l", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (!mounted_ok || !overlay_chain_equal(&r->mounted, chain))
		rec_differ(&w, NULL, "mount");
	if (!upper_empty(r))
		rec_differ(&w, NULL, "upper");
	if (l < 0)
		return err_set(err, errno, NULL, "open the layers of '%s': %m", r->path);
	for (size_t i = 0; i < chain->n; i++) {
		int q = verify_layer(r, l, chain->v[i], &w);
		if (q < 0)
			return err_set(err, -q, NULL, "read layer '%s' of '%s': %s", chain->v[i], r->path,
				       strerror(-q));
	}
	return 0;
}
