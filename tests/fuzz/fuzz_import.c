/* fuzz_import.c: an archive as POST /v1/checkpoints/import hands it to the
 * engine. One engine is opened once, with the real tar backend over a temp
 * root and state dir (so extraction and the backend's import run for real)
 * and the fake systemd of tests/unit; each input is the import body.
 * Properties (abort on violation):
 *   - a refused input leaves the catalog as it was, <state>/xfer empty, the
 *     root untouched and nothing new beside the state dir;
 *   - an accepted input yields one more checkpoint whose export lists the
 *     same trees as the input's manifest (paths, types, sizes, sha256 digests,
 *     symlink targets); it is then deleted again.
 * Seeds (tests/fuzz/corpus/import): real exports of both backends, zstd and
 * plain pax (import reads either; plain pax lets mutations reach the entries),
 * made by tests/fuzz/import_seeds.py. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "config.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/engine_export.h"
#include "services/services.h"

/* What services_fake.h takes from cmocka and from the fake backend. */
#define assert_ptr_equal(a, b)                  \
	do {                                    \
		if ((void *)(a) != (void *)(b)) \
			abort();                \
	} while (0)
static struct {
	int n_restore, n_reset;
} fake;
#include "../unit/services_fake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[] = "/dev/shm/ckptd-fuzz-import-XXXXXX";
static char root[128], state[128], xfer[160];
static struct config cfg;
static struct engine *eng;
static struct services *svcs;
static char *root_before; /* listing of the root and of dir at start */

static void cleanup(void)
{
	engine_close(eng);
	services_close(svcs);
	rm_rf_at(AT_FDCWD, dir);
}

/* Every name below path with its type, size and content digest, sorted:
 * equal listings mean nothing was written there. */
static void listing(FILE *out, const char *path, int depth)
{
	struct dirent **de;
	int n = scandir(path, &de, NULL, alphasort);
	if (n < 0)
		abort();
	for (int i = 0; i < n; i++) {
		char p[PATH_MAX];
		struct stat st;
		if (!strcmp(de[i]->d_name, ".") || !strcmp(de[i]->d_name, "..") ||
		    (depth == 0 && !strcmp(de[i]->d_name, "state"))) {
			free(de[i]);
			continue;
		}
		snprintf(p, sizeof(p), "%s/%s", path, de[i]->d_name);
		if (lstat(p, &st) < 0)
			abort();
		fprintf(out, "%s %o %lld %lld\n", p, st.st_mode, (long long)st.st_size, (long long)st.st_mtime);
		if (S_ISDIR(st.st_mode))
			listing(out, p, depth + 1);
		free(de[i]);
	}
	free(de);
}

static char *list_outside(void)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		abort();
	listing(f, dir, 0);
	fclose(f);
	return buf;
}

static void setup(void)
{
	ckpt_error err = { 0 };
	struct rlimit fsz = { 64 << 20, 64 << 20 };

	/* A sparse entry or a zstd bomb may announce gigabytes: in /dev/shm they
	 * would be memory. Writes past 64 MiB fail (EFBIG) instead. */
	signal(SIGXFSZ, SIG_IGN);
	setrlimit(RLIMIT_FSIZE, &fsz);
	if (!mkdtemp(dir))
		abort();
	atexit(cleanup);
	snprintf(root, sizeof(root), "%s/root", dir);
	snprintf(state, sizeof(state), "%s/state", dir);
	snprintf(xfer, sizeof(xfer), "%s/xfer", state);
	if (mkdir(root, 0755) < 0 || mkdir(state, 0700) < 0 || mkdir(xfer, 0700) < 0)
		abort();
	char p[256];
	snprintf(p, sizeof(p), "%s/base.txt", root);
	FILE *f = fopen(p, "we");
	if (!f || fputs("the base\n", f) < 0 || fclose(f))
		abort();
	config_defaults(&cfg);
	cfg.state_dir = strdup(state);
	cfg.roots[0] = strdup(root);
	cfg.n_roots = 1;
	cfg.backend = BACKEND_TAR;
	cfg.services_auto = false;
	cfg.cleanup_interval_secs = 3600;
	svc_fake_reset();
	svc_add("app.service", "active", false);
	if (services_open(&cfg, &svc_fake_ops, &svcs, &err) < 0)
		abort();
	struct engine_deps deps = { .backend = &backend_tar_ops, .services = svcs };
	if (engine_open(&cfg, &deps, &eng, &err) < 0) {
		fprintf(stderr, "engine_open: %s\n", err.msg);
		abort();
	}
	root_before = list_outside();
}

static size_t count(void)
{
	struct ckpt_view_list l = { 0 };
	char *next = NULL;
	if (engine_list_page(eng, NULL, SIZE_MAX, NULL, &l, &next, NULL) < 0)
		abort();
	size_t n = l.n;
	ckpt_view_list_free(&l);
	free(next);
	return n;
}

static bool dir_empty(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	bool empty = true;
	if (!d)
		return errno == ENOENT;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = false;
	closedir(d);
	return empty;
}

/* The first entry of a ckptd archive in memory: its manifest. */
static json_t *manifest_of(const void *buf, size_t len)
{
	struct archive *a = archive_read_new();
	struct archive_entry *ae;
	json_t *m = NULL;
	archive_read_support_format_tar(a);
	archive_read_support_filter_zstd(a);
	if (archive_read_open_memory(a, buf, len) == ARCHIVE_OK && archive_read_next_header(a, &ae) == ARCHIVE_OK &&
	    archive_entry_size(ae) > 0 && archive_entry_size(ae) < (64 << 20)) {
		size_t n = (size_t)archive_entry_size(ae), got = 0;
		char *text = malloc(n + 1);
		la_ssize_t k = 0;
		/* in as many reads as libarchive gives it, as engine_import reads it */
		while (text && got < n && (k = archive_read_data(a, text + got, n - got)) > 0)
			got += (size_t)k;
		if (text && got == n) {
			text[n] = '\0';
			m = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
		}
		free(text);
	}
	archive_read_free(a);
	return m;
}

/* root -> { path: "type size sha256 link" }, a hard link as the file it names. */
static json_t *trees(json_t *m)
{
	json_t *out = json_array(), *r, *en;
	size_t i, j;
	json_array_foreach (json_object_get(m, "roots"), i, r) {
		json_t *t = json_object(), *ents = json_object_get(r, "entries");
		json_t *byp = json_object();
		json_array_foreach (ents, j, en)
			json_object_set(byp, json_string_value(json_object_get(en, "path")) ?: "", en);
		json_array_foreach (ents, j, en) {
			const char *type = json_string_value(json_object_get(en, "type")) ?: "?";
			json_t *src = en;
			if (!strcmp(type, "hardlink")) {
				src = json_object_get(byp, json_string_value(json_object_get(en, "link")) ?: "");
				type = "file";
			}
			char *line = NULL;
			if (asprintf(&line, "%s %lld %s %s", type,
				     (long long)json_integer_value(json_object_get(src, "size")),
				     json_string_value(json_object_get(src, "sha256")) ?: "-",
				     strcmp(type, "symlink") ? "-" : json_string_value(json_object_get(en, "link")) ?: "")
			    < 0)
				abort();
			json_object_set_new(t, json_string_value(json_object_get(en, "path")) ?: "", json_string(line));
			free(line);
		}
		json_decref(byp);
		json_array_append_new(out, t);
	}
	return out;
}

/* The imported checkpoint, exported again, shows what the input announced. */
static void check_content(const char *id, const uint8_t *data, size_t size)
{
	ckpt_error err = { 0 };
	struct engine_export *x = NULL;
	char *buf = NULL, chunk[65536];
	size_t len = 0;
	ssize_t k;
	if (engine_export_open(eng, id, &x, &err) < 0) {
		fprintf(stderr, "export of the import %s: %s\n", id, err.msg);
		abort();
	}
	FILE *f = open_memstream(&buf, &len);
	while ((k = engine_export_read(x, chunk, sizeof(chunk))) > 0)
		fwrite(chunk, 1, (size_t)k, f);
	fclose(f);
	engine_export_free(x);
	if (k < 0)
		abort();
	json_t *in = manifest_of(data, size), *out = manifest_of(buf, len);
	json_t *ti = trees(in), *to = trees(out);
	if (!in || !out || !json_equal(ti, to)) {
		char *a = json_dumps(ti, JSON_INDENT(1)), *b = json_dumps(to, JSON_INDENT(1));
		fprintf(stderr, "imported %s differs from its archive:\n%s\nvs export\n%s\n", id, a, b);
		abort();
	}
	json_decref(ti);
	json_decref(to);
	json_decref(in);
	json_decref(out);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ckpt_error err = { 0 };
	struct ckpt_view rec = { 0 };

	if (!eng)
		setup();
	size_t before = count();
	int fd = memfd_create("body", MFD_CLOEXEC);
	if (fd < 0 || write(fd, data, size) != (ssize_t)size || lseek(fd, 0, SEEK_SET) != 0)
		abort();
	int r = engine_import(eng, fd, NULL, &rec, &err);
	close(fd);
	if (!dir_empty(xfer)) {
		fprintf(stderr, "import (%s) left files in %s\n", r < 0 ? err.msg : "ok", xfer);
		abort();
	}
	char *now = list_outside();
	if (strcmp(now, root_before)) {
		fprintf(stderr, "import (%s) wrote outside the state dir:\n%s\nwas\n%s\n", r < 0 ? err.msg : "ok", now,
			root_before);
		abort();
	}
	free(now);
	if (r < 0) {
		if (!err.msg[0] || count() != before)
			abort();
		return 0;
	}
	char id[sizeof(rec.rec->id)];
	snprintf(id, sizeof(id), "%s", rec.rec->id);
	ckpt_view_free(&rec);
	if (!id[0] || count() != before + 1)
		abort();
	check_content(id, data, size);
	if (engine_delete(eng, id, &err) < 0 || count() != before)
		abort();
	return 0;
}
