/* devino.h: a map from an inode, (dev, ino), to the first path seen for it:
 * how a tree walk knows that an entry is a hard link of one already copied. */
#pragma once
#include <stddef.h>
#include <sys/types.h>

struct devino_entry {
	dev_t dev;
	ino_t ino;
	char *path; /* NULL = empty slot */
};

/* Zero-initialise; devino_free releases it. */
struct devino_map {
	struct devino_entry *v;
	size_t cap, n;
};

/* The path remembered for (dev, ino), or NULL. */
const char *devino_get(const struct devino_map *m, dev_t dev, ino_t ino);
/* Remember a copy of path for (dev, ino) unless one is there already: 0 or -ENOMEM. */
int devino_put(struct devino_map *m, dev_t dev, ino_t ino, const char *path);
void devino_free(struct devino_map *m);
