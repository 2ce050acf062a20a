/* backend_diff.h: what both backends' diffs share: one entry's metadata on
 * either side and the JSON a difference is reported as.
 *
 * A change is {"path", "change": "added"|"deleted"|"modified", "type", "size"}
 * plus, for "modified", what changed: "changes": ["type","content","mode",
 * "owner"] with "old_type", "old_size", "old_mode", "mode", "old_uid",
 * "uid", "old_gid", "gid" as they apply. path is absolute (the root's path
 * joined with the entry's). Directories' times are not compared: an added
 * or removed child is reported itself. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

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
int bdiff_compare(json_t *out, const char *root, const char *rel, const struct bdiff_ent *a, const struct bdiff_ent *b);
/* Sort out by "path". */
void bdiff_sort(json_t *out);
const char *bdiff_type_name(char t);
