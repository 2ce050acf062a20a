/* treecopy_internal.h: shared between treecopy.c and treecopy_index.c. */
#pragma once
#include <sys/types.h>

struct link_entry {
	dev_t dev;
	ino_t ino;
	char *path;
};

struct treecopy_links {
	struct link_entry *v;
	size_t cap, n;
};

const char *treecopy_links_get(const struct treecopy_links *m, dev_t dev, ino_t ino);
int treecopy_links_put(struct treecopy_links *m, dev_t dev, ino_t ino, const char *path);
void treecopy_links_free(struct treecopy_links *m);
