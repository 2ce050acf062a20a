/* tar_manifest.c: write, load, validate and index the per-root manifest.
 * Format: a magic line, then one tab-separated line per entry:
 *   type mode uid gid size mtime ctime ino nlink xhash path link sha256 src off
 * (sha256: of a regular file's content, "-" otherwise; absent in version 1;
 * src: the checkpoint whose archive holds the data, "-" for this one's own
 * archive; absent before version 3; off: where the entry begins in that
 * archive's uncompressed stream, "-" when not known; absent before 4)
 * the root directory first (path "."), its xattrs as "x name hexvalue" lines,
 * then the entries in archive order. Paths are %XX-escaped for bytes <= ' ',
 * '%' and DEL, so a line never holds a tab or a newline of a name. */
#include "backend/tar/tar_manifest.h"
#include "lib/hash.h"

#include <ctype.h>
#include <limits.h>

#define MANIFEST_MAX (1u << 30)

bool tar_path_valid(const char *path)
{
	size_t len;

	if (!path || !*path || path[0] == '/')
		return false;
	len = strlen(path);
	if (len >= PATH_MAX || path[len - 1] == '/')
		return false;
	for (const char *p = path; *p;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		if (n == 0 || n > NAME_MAX)
			return false;
		if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return false;
		p += n;
		if (*p == '/')
			p++;
	}
	return true;
}

char tar_type_of(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return 'f';
	case S_IFDIR:
		return 'd';
	case S_IFLNK:
		return 'l';
	case S_IFIFO:
		return 'p';
	case S_IFCHR:
		return 'c';
	case S_IFBLK:
		return 'b';
	default:
		return 0;
	}
}

bool tar_type_matches(const struct tar_mentry *e, const struct stat *st)
{
	char t = tar_type_of(st->st_mode);
	return t && (e->type == t || (e->type == 'h' && t == 'f'));
}

void tar_mentry_from_stat(struct tar_mentry *e, const struct stat *st)
{
	e->type = tar_type_of(st->st_mode);
	e->mode = st->st_mode & 07777;
	e->uid = st->st_uid;
	e->gid = st->st_gid;
	e->size = S_ISREG(st->st_mode) ? (uint64_t)st->st_size : 0;
	e->mtime = st->st_mtim;
	e->ctime = st->st_ctim;
	e->ino = st->st_ino;
	e->nlink = (uint32_t)st->st_nlink;
	e->group = -1;
	e->off = -1;
}

/* A manifest has a line per file: each is built in a buffer by hand and
 * written with one call, not with fprintf's conversions and a locked fputc
 * per character of its paths. */
struct mline {
	char *p, *end; /* end: where the line must stop (it then says so) */
	bool over;
};

static void ml_char(struct mline *l, char c)
{
	if (l->p < l->end)
		*l->p++ = c;
	else
		l->over = true;
}

static void ml_str(struct mline *l, const char *s)
{
	while (*s)
		ml_char(l, *s++);
}

/* v in decimal, at least width digits (zeros before). */
static void ml_dec(struct mline *l, unsigned long long v, int width)
{
	char tmp[24];
	int n = 0;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n < width)
		tmp[n++] = '0';
	while (n)
		ml_char(l, tmp[--n]);
}

/* v in octal (a mode), or in lowercase hex with all 16 digits (a hash). */
static void ml_oct(struct mline *l, unsigned v)
{
	char tmp[12];
	int n = 0;
	do {
		tmp[n++] = (char)('0' + (v & 7));
		v >>= 3;
	} while (v);
	while (n)
		ml_char(l, tmp[--n]);
}

static void ml_hex16(struct mline *l, unsigned long long v)
{
	for (int shift = 60; shift >= 0; shift -= 4)
		ml_char(l, "0123456789abcdef"[(v >> shift) & 15]);
}

static void ml_time(struct mline *l, struct timespec t)
{
	if (t.tv_sec < 0)
		ml_char(l, '-');
	ml_dec(l, t.tv_sec < 0 ? 0ULL - (unsigned long long)t.tv_sec : (unsigned long long)t.tv_sec, 1);
	ml_char(l, '.');
	ml_dec(l, (unsigned long long)t.tv_nsec, 9);
}

static void ml_escaped(struct mline *l, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p <= ' ' || *p == '%' || *p == 0x7f) {
			ml_char(l, '%');
			ml_char(l, "0123456789ABCDEF"[*p >> 4]);
			ml_char(l, "0123456789ABCDEF"[*p & 15]);
		} else {
			ml_char(l, (char)*p);
		}
	}
}

static void put_escaped(FILE *f, const char *s)
{
	char buf[3 * PATH_MAX + 1];
	struct mline l = { buf, buf + sizeof(buf), false };
	ml_escaped(&l, s);
	fwrite(buf, 1, (size_t)(l.p - buf), f);
}

static int unescape(char *s)
{
	char *w = s;
	for (char *r = s; *r; r++) {
		if (*r != '%') {
			*w++ = *r;
			continue;
		}
		unsigned v;
		if (sscanf(r + 1, "%2X", &v) != 1 || !r[1] || !r[2] || v == 0)
			return -EINVAL;
		*w++ = (char)v;
		r += 2;
	}
	*w = '\0';
	return 0;
}

/* One entry's line (fields: tar_manifest.h); 0, or -ENAMETOOLONG. */
static int put_line(FILE *f, const struct tar_mentry *e)
{
	/* room for two paths of PATH_MAX bytes, each escaped to three times
	 * its length, and the numbers; a longer line is refused */
	char buf[2 * 3 * PATH_MAX + 512];
	struct mline l = { buf, buf + sizeof(buf), false };
	ml_char(&l, e->type);
	ml_char(&l, '\t');
	ml_oct(&l, (unsigned)e->mode);
	ml_char(&l, '\t');
	ml_dec(&l, (unsigned)e->uid, 1);
	ml_char(&l, '\t');
	ml_dec(&l, (unsigned)e->gid, 1);
	ml_char(&l, '\t');
	ml_dec(&l, e->size, 1);
	ml_char(&l, '\t');
	ml_time(&l, e->mtime);
	ml_char(&l, '\t');
	ml_time(&l, e->ctime);
	ml_char(&l, '\t');
	ml_dec(&l, e->ino, 1);
	ml_char(&l, '\t');
	ml_dec(&l, e->nlink, 1);
	ml_char(&l, '\t');
	if (e->xhash)
		ml_hex16(&l, e->xhash);
	else
		ml_str(&l, "none");
	ml_char(&l, '\t');
	ml_escaped(&l, e->path);
	ml_char(&l, '\t');
	if (e->link)
		ml_escaped(&l, e->link);
	else
		ml_char(&l, '-');
	ml_char(&l, '\t');
	if (e->has_sha256) {
		for (size_t i = 0; i < TAR_SHA256_LEN; i++) {
			ml_char(&l, "0123456789abcdef"[e->sha256[i] >> 4]);
			ml_char(&l, "0123456789abcdef"[e->sha256[i] & 15]);
		}
	} else {
		ml_char(&l, '-');
	}
	ml_char(&l, '\t');
	ml_str(&l, e->src ? e->src : "-");
	ml_char(&l, '\t');
	if (e->off >= 0)
		ml_dec(&l, (unsigned long long)e->off, 1);
	else
		ml_char(&l, '-');
	ml_char(&l, '\n');
	if (l.over)
		return -ENAMETOOLONG;
	fwrite(buf, 1, (size_t)(l.p - buf), f);
	return 0;
}

int tar_manifest_write_header(FILE *f, const struct tar_mentry *root, const struct tar_xattr *xa, size_t n_xa)
{
	fputs(TAR_MANIFEST_MAGIC "\n", f);
	if (put_line(f, root) < 0)
		return -ENAMETOOLONG;
	for (size_t i = 0; i < n_xa; i++) {
		fputs("x\t", f);
		put_escaped(f, xa[i].name);
		fputc('\t', f);
		for (size_t j = 0; j < xa[i].len; j++)
			fprintf(f, "%02x", ((unsigned char *)xa[i].value)[j]);
		fputc('\n', f);
	}
	return ferror(f) ? -EIO : 0;
}

int tar_manifest_write_entry(FILE *f, const struct tar_mentry *e)
{
	if (put_line(f, e) < 0)
		return errno = ENAMETOOLONG, -ENAMETOOLONG;
	return ferror(f) ? -(errno ? errno : EIO) : 0;
}

void tar_xattrs_free(struct tar_xattr *xa, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(xa[i].name);
		free(xa[i].value);
	}
	free(xa);
}

uint64_t tar_xattrs_hash(const struct tar_xattr *xa, size_t n)
{
	uint64_t h = HASH_FNV64_INIT;
	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		h = hash_fnv64(h, xa[i].name, strlen(xa[i].name) + 1); /* the NUL separates name and value */
		h = hash_fnv64(h, xa[i].value, xa[i].len);
	}
	return h ? h : 1;
}

/* Decimal digits up to stop (or the end), nothing else: a manifest has a
 * line per file, and strtoull's locale and sign handling showed in
 * profiles. NULL when not a number that fits; else where it stopped. */
static const char *parse_dec(const char *s, char stop, uint64_t *v)
{
	uint64_t x = 0;
	const char *p = s;
	for (; *p && *p != stop; p++) {
		unsigned d = (unsigned)(*p - '0');
		if (d > 9 || x > (UINT64_MAX - d) / 10)
			return NULL;
		x = x * 10 + d;
	}
	*v = x;
	return p == s ? NULL : p;
}

static int parse_ts(const char *s, struct timespec *ts)
{
	uint64_t sec, nsec;
	bool neg = *s == '-';
	const char *p = parse_dec(s + neg, '.', &sec);
	if (!p || *p != '.' || sec > INT64_MAX || !(p = parse_dec(p + 1, '\0', &nsec)) || nsec > 999999999)
		return -EINVAL;
	ts->tv_sec = neg ? -(time_t)sec : (time_t)sec;
	ts->tv_nsec = (long)nsec;
	return 0;
}

/* Split a line into at most max tab-separated fields in place. */
static size_t split_tabs(char *line, char **f, size_t max)
{
	size_t n = 0;
	while (n < max) {
		f[n++] = line;
		char *t = strchr(line, '\t');
		if (!t)
			break;
		*t = '\0';
		line = t + 1;
	}
	return n;
}

/* By table (each value plus one; 0: not a digit): a manifest holds a
 * digest per file. */
static const unsigned char hex_plus1[256] = {
	['0'] = 1,  ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
	['8'] = 9,  ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
	['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16
};

static int hexval(char c)
{
	return (int)hex_plus1[(unsigned char)c] - 1;
}

static int parse_sha256(const char *s, struct tar_mentry *e)
{
	if (!strcmp(s, "-"))
		return 0;
	if (strlen(s) != 2 * TAR_SHA256_LEN || e->type != 'f')
		return -EINVAL;
	for (size_t i = 0; i < TAR_SHA256_LEN; i++) {
		int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -EINVAL;
		e->sha256[i] = (unsigned char)(hi << 4 | lo);
	}
	e->has_sha256 = true;
	return 0;
}

static int parse_entry(char *line, size_t n_fields, struct tar_mentry *e)
{
	char *f[16], *end;
	uint64_t v[5];
	static const char *types = "fhdlpcb";

	if (split_tabs(line, f, n_fields + 1) != n_fields || strlen(f[0]) != 1 || !strchr(types, f[0][0]))
		return -EINVAL;
	e->type = f[0][0];
	e->mode = (mode_t)strtoul(f[1], &end, 8);
	if (*end || e->mode > 07777)
		return -EINVAL;
	const int idx[5] = { 2, 3, 4, 7, 8 };
	for (int i = 0; i < 5; i++)
		if (!parse_dec(f[idx[i]], '\0', &v[i]))
			return -EINVAL;
	e->uid = (uid_t)v[0];
	e->gid = (gid_t)v[1];
	e->size = v[2];
	e->ino = v[3];
	e->nlink = (uint32_t)v[4];
	if (parse_ts(f[5], &e->mtime) < 0 || parse_ts(f[6], &e->ctime) < 0)
		return -EINVAL;
	e->xhash = strcmp(f[9], "none") ? strtoull(f[9], NULL, 16) : 0;
	if (unescape(f[10]) < 0)
		return -EINVAL;
	e->path = f[10]; /* in the manifest's text, as link and src */
	e->group = -1;
	if (n_fields > 12 && parse_sha256(f[12], e) < 0)
		return -EINVAL;
	if (n_fields > 13 && strcmp(f[13], "-")) {
		/* a data source: only a regular file's, only a checkpoint's name */
		if (e->type != 'f' || (!id_valid(f[13]) && strcmp(f[13], "base")))
			return -EINVAL;
		e->src = f[13];
	}
	e->off = -1;
	if (n_fields > 14 && strcmp(f[14], "-")) {
		uint64_t off;
		if (!parse_dec(f[14], '\0', &off) || off > INT64_MAX)
			return -EINVAL;
		e->off = (int64_t)off;
	}
	if (e->type != 'h')
		return strcmp(f[11], "-") ? -EINVAL : 0;
	if (unescape(f[11]) < 0)
		return -EINVAL;
	e->link = f[11];
	return 0;
}

static int parse_root_xattr(char *line, struct tar_manifest *m)
{
	char *f[4];
	if (split_tabs(line, f, 4) != 3 || unescape(f[1]) < 0)
		return -EINVAL;
	size_t hl = strlen(f[2]);
	if (hl % 2)
		return -EINVAL;
	struct tar_xattr *n = realloc(m->root_xattrs, (m->n_root_xattrs + 1) * sizeof(*n));
	if (!n)
		return -ENOMEM;
	m->root_xattrs = n;
	struct tar_xattr *x = &n[m->n_root_xattrs];
	x->name = strdup(f[1]);
	x->value = malloc(hl / 2 + 1);
	x->len = hl / 2;
	m->n_root_xattrs++;
	if (!x->name || !x->value)
		return -ENOMEM;
	for (size_t i = 0; i < x->len; i++) {
		unsigned b;
		if (sscanf(f[2] + 2 * i, "%2x", &b) != 1)
			return -EINVAL;
		((unsigned char *)x->value)[i] = (unsigned char)b;
	}
	return 0;
}

static int index_insert(struct tar_manifest *m, size_t i)
{
	size_t mask = m->n_slots - 1;
	for (size_t s = hash_str(m->v[i].path) & mask;; s = (s + 1) & mask) {
		if (m->slots[s] < 0) {
			m->slots[s] = (int32_t)i;
			return 0;
		}
		if (!strcmp(m->v[m->slots[s]].path, m->v[i].path))
			return -EEXIST;
	}
}

struct tar_mentry *tar_manifest_find(const struct tar_manifest *m, const char *path)
{
	if (!m->n_slots)
		return NULL;
	size_t mask = m->n_slots - 1;
	for (size_t s = hash_str(path) & mask; m->slots[s] >= 0; s = (s + 1) & mask)
		if (!strcmp(m->v[m->slots[s]].path, path))
			return &m->v[m->slots[s]];
	return NULL;
}

const struct tar_mentry *tar_manifest_holds_ino(const struct tar_manifest *m, int root_fd, const ino_t *inos, size_t n)
{
	struct stat st;
	for (size_t k = 0; k < n; k++)
		for (size_t i = 0; i < m->n; i++) {
			const struct tar_mentry *e = &m->v[i];
			if (e->ino != (uint64_t)inos[k] && !(e->has_alias && e->alias_ino == (uint64_t)inos[k]))
				continue;
			if (fstatat(root_fd, e->path, &st, AT_SYMLINK_NOFOLLOW) == 0
				    ? st.st_ino == inos[k]
				    : errno != ENOENT && errno != ENOTDIR)
				return e; /* that file still, or cannot tell */
		}
	return NULL;
}

struct tar_mentry *tar_manifest_parent(const struct tar_manifest *m, const char *path)
{
	const char *slash = strrchr(path, '/');
	char buf[PATH_MAX];
	if (!slash || (size_t)(slash - path) >= sizeof(buf))
		return NULL;
	memcpy(buf, path, (size_t)(slash - path));
	buf[slash - path] = '\0';
	return tar_manifest_find(m, buf);
}

/* Build the index and check the structure: unique paths, parents that are
 * directories listed earlier, hardlinks to an earlier regular file. */
static int manifest_index(struct tar_manifest *m, ckpt_error *err)
{
	size_t n_slots = 16;
	while (n_slots < m->n * 2)
		n_slots *= 2;
	m->slots = malloc(n_slots * sizeof(*m->slots));
	if (!m->slots)
		return err_set(err, ENOMEM, NULL, "out of memory");
	m->n_slots = n_slots;
	memset(m->slots, 0xff, n_slots * sizeof(*m->slots));
	const char *pdir = NULL; /* the last entry's directory, and its entry */
	size_t plen = 0;
	struct tar_mentry *p = NULL;
	for (size_t i = 0; i < m->n; i++) {
		struct tar_mentry *e = &m->v[i];
		const char *slash = strrchr(e->path, '/');
		size_t len = slash ? (size_t)(slash - e->path) : 0;
		if (!pdir || len != plen || strncmp(e->path, pdir, len)) { /* entries of a directory come in a row */
			p = tar_manifest_parent(m, e->path);
			pdir = e->path;
			plen = len;
		}
		if (slash && (!p || p->type != 'd'))
			return err_set(err, EBADMSG, NULL, "manifest entry '%s' has no parent directory", e->path);
		if (e->type == 'h') {
			struct tar_mentry *t = tar_manifest_find(m, e->link);
			if (!t || t->type != 'f')
				return err_set(err, EBADMSG, NULL, "manifest hardlink '%s' has no target", e->path);
			e->group = t->group = (int32_t)(t - m->v);
		}
		if (index_insert(m, i) < 0)
			return err_set(err, EBADMSG, NULL, "manifest lists '%s' twice", e->path);
	}
	return 0;
}

static int manifest_append(struct tar_manifest *m, const struct tar_mentry *e)
{
	if (m->n == m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 256;
		struct tar_mentry *n = realloc(m->v, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		m->v = n;
		m->cap = cap;
	}
	m->v[m->n++] = *e;
	return 0;
}

/* Parse one line into m (its strings stay in the text). */
static int manifest_add_line(struct tar_manifest *m, char *line, size_t lineno, size_t n_fields, ckpt_error *err)
{
	struct tar_mentry e = { 0 };
	int r = 0;

	if (lineno > 1 && line[0] == 'x' && line[1] == '\t' && m->n == 0)
		return parse_root_xattr(line, m) < 0
			? err_set(err, EBADMSG, NULL, "bad root xattr at manifest line %zu", lineno)
			: 0;
	if (parse_entry(line, n_fields, &e) < 0)
		r = err_set(err, EBADMSG, NULL, "bad manifest line %zu", lineno);
	else if (lineno == 1 && (strcmp(e.path, ".") || e.type != 'd'))
		r = err_set(err, EBADMSG, NULL, "manifest does not start with its root");
	else if (lineno == 1)
		m->root = e;
	else if (!tar_path_valid(e.path) || (e.link && !tar_path_valid(e.link)))
		r = err_set(err, EBADMSG, "unsafe_path", "unsafe path in manifest: '%s'", e.path);
	else if (manifest_append(m, &e) < 0)
		r = err_set(err, ENOMEM, NULL, "out of memory");
	return r;
}

static int manifest_parse(struct tar_manifest *m, char *text, ckpt_error *err)
{
	char *save = NULL, *line = strtok_r(text, "\n", &save);
	size_t lineno = 0, n_fields = 15;

	if (line && !strcmp(line, TAR_MANIFEST_MAGIC_V1))
		n_fields = 12;
	else if (line && !strcmp(line, TAR_MANIFEST_MAGIC_V2))
		n_fields = 13;
	else if (line && !strcmp(line, TAR_MANIFEST_MAGIC_V3))
		n_fields = 14;
	else if (!line || strcmp(line, TAR_MANIFEST_MAGIC))
		return err_set(err, EBADMSG, NULL, "not a ckptd tar manifest");
	size_t lines = 0; /* the entries' room, made once */
	for (const char *p = save; p && (p = strchr(p, '\n')); p++)
		lines++;
	if (lines && !(m->v = malloc((lines + 1) * sizeof(*m->v))))
		return err_set(err, ENOMEM, NULL, "out of memory");
	m->cap = lines ? lines + 1 : 0;
	while ((line = strtok_r(NULL, "\n", &save))) {
		int r = manifest_add_line(m, line, ++lineno, n_fields, err);
		if (r < 0)
			return r;
	}
	if (lineno == 0)
		return err_set(err, EBADMSG, NULL, "manifest has no root line");
	return manifest_index(m, err);
}

int tar_manifest_load(int dirfd, const char *name, struct tar_manifest *m, ckpt_error *err)
{
	char *text = NULL;
	int r;

	memset(m, 0, sizeof(*m));
	r = read_file_at(dirfd, name, MANIFEST_MAX, &text, NULL);
	if (r < 0)
		return err_set(err, r, NULL, "cannot read manifest '%s': %s", name, strerror(-r));
	m->text = text; /* the entries' strings: freed with m */
	r = manifest_parse(m, text, err);
	if (r < 0) {
		err_prefix(err, "manifest '%s'", name);
		tar_manifest_free(m);
	}
	return r;
}

void tar_manifest_free(struct tar_manifest *m)
{
	free(m->text);
	free(m->v);
	free(m->slots);
	tar_xattrs_free(m->root_xattrs, m->n_root_xattrs);
	memset(m, 0, sizeof(*m));
}

void tar_manifest_alias_load(int dirfd, const char *name, struct tar_manifest *m)
{
	_cleanup_free_ char *text = NULL;
	char *save = NULL;

	if (read_file_at(dirfd, name, MANIFEST_MAX, &text, NULL) < 0)
		return;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		unsigned long long idx, ino;
		char ts[64];
		struct timespec c;
		if (sscanf(line, "%llu %llu %63s", &idx, &ino, ts) != 3 || idx >= m->n || parse_ts(ts, &c) < 0)
			continue;
		m->v[idx].has_alias = true;
		m->v[idx].alias_ino = ino;
		m->v[idx].alias_ctime = c;
	}
}

int tar_manifest_alias_save(int dirfd, const char *name, const struct tar_manifest *m)
{
	_cleanup_free_ char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return -ENOMEM;
	for (size_t i = 0; i < m->n; i++)
		if (m->v[i].has_alias)
			fprintf(f, "%zu %llu %lld.%09ld\n", i, (unsigned long long)m->v[i].alias_ino,
				(long long)m->v[i].alias_ctime.tv_sec, m->v[i].alias_ctime.tv_nsec);
	if (fclose(f) != 0)
		return -ENOMEM;
	/* A cache, not synced, and harmless to lose or find old: it counts
	 * only while ctimes are trusted (tar_internal.h's RUNNING). A clean
	 * stop syncs it (tar_meta_running_close's syncfs of the state dir).
	 * After a crash RUNNING is left: the next restore trusts nothing and
	 * rewrites every file, so each gets a new inode and a ctime after the
	 * crash, which no line written before it (old, torn or empty) names.
	 * (The restore's syncfs is of the root, often another file system: it
	 * is not what makes this safe.) */
	return write_file_replace(dirfd, name, text, len, 0600);
}
