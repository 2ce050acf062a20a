/* backend_diff.h: what both backends' diffs share: one entry's metadata on
 * either side and the struct a difference is reported as.
 *
 * A change has a path, a kind (added, deleted, modified), the entry's type
 * and size, plus, when modified, what changed (type, content, mode, owner)
 * with the old values that apply. path is absolute (the root's path
 * joined with the entry's). Directories' times are not compared: an added
 * or removed child is reported itself. src/http writes it as JSON. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

enum bdiff_kind {
	BDIFF_ADDED,
	BDIFF_DELETED,
	BDIFF_MODIFIED
};
/* What changed in a modified entry (bits of bdiff_change.what). */
enum {
	BDIFF_TYPE = 1,
	BDIFF_CONTENT = 2,
	BDIFF_MODE = 4,
	BDIFF_OWNER = 8
};
struct bdiff_change {
	char *path;
	enum bdiff_kind kind;
	const char *type; /* bdiff_type_name's: the entry's now, or before it was deleted */
	uint64_t size;
	bool has_mode; /* added, deleted, or BDIFF_MODE: mode is set */
	uint32_t mode;
	unsigned what;        /* modified: BDIFF_* */
	const char *old_type; /* with BDIFF_TYPE */
	bool has_old_size;    /* the type or the size changed */
	uint64_t old_size;
	uint32_t old_mode;                   /* with BDIFF_MODE */
	uint32_t old_uid, uid, old_gid, gid; /* with BDIFF_OWNER */
};
struct bdiff_list {
	struct bdiff_change *v;
	size_t n;
};
void bdiff_list_free(struct bdiff_list *l);

struct bdiff_ent {
	bool present;
	char type;     /* f d l p c b s */
	uint32_t mode; /* permission bits */
	uint32_t uid, gid;
	uint64_t size;
	int64_t mtime_ns;
	uint64_t rdev;
	bool has_sha;
	unsigned char sha[32];
};

void bdiff_from_stat(struct bdiff_ent *e, const struct stat *st);
/* Append the difference between a (old) and b (new) at rel below root, if
 * any. Returns 1 when one was appended, 0 when equal, -ENOMEM. */
int bdiff_compare(struct bdiff_list *out, const char *root, const char *rel, const struct bdiff_ent *a,
		  const struct bdiff_ent *b);
/* Sort out by path. */
void bdiff_sort(struct bdiff_list *out);
const char *bdiff_type_name(char t);
