/* change_track_common.c: the sets change tracking fills, whichever way it
 * hears of changes (change_track.c, change_track_inotify.c), and the count
 * of its fallbacks for /metrics. */
#include "backend/change_track_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

int chg_dirty_add(struct chg_dirty_set *s, const char *path, size_t len, bool deep)
{
	if (s->n == s->cap) {
		struct pathindex_dirty *v = realloc(s->v, (s->cap = s->cap ? 2 * s->cap : 32) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->v = v;
	}
	char *p = strndup(path, len);
	if (!p)
		return -ENOMEM;
	s->v[s->n++] = (struct pathindex_dirty){ .path = p, .deep = deep };
	return 0;
}

int chg_dirty_add_name(struct chg_dirty_set *s, const char *path, size_t len, const char *name)
{
	char **names = name ? malloc(sizeof(*names)) : NULL;
	if (name && (!names || !(names[0] = strdup(name)))) {
		free(names);
		return -ENOMEM;
	}
	if (chg_dirty_add(s, path, len, false) < 0) {
		if (names)
			free(names[0]);
		free(names);
		return -ENOMEM;
	}
	struct pathindex_dirty *d = &s->v[s->n - 1];
	d->named = true, d->n_names = name ? 1 : 0, d->names = names;
	return 0;
}

/* relpath into the set *sus (made when NULL). */
int chg_suspect_add(struct pathindex **sus, const char *rel)
{
	static const struct stat none;
	if (!*sus && !(*sus = pathindex_new()))
		return -ENOMEM;
	return pathindex_put(*sus, rel, &none);
}

static _Atomic uint64_t fallbacks_total;

void chg_track_count_fallback(struct chg_track *t)
{
	t->fallbacks++;
	atomic_fetch_add(&fallbacks_total, 1);
}

uint64_t chg_track_fallbacks_total(void)
{
	return atomic_load(&fallbacks_total);
}

static _Atomic uint64_t events_total;

void chg_track_count_events(uint64_t n)
{
	atomic_fetch_add_explicit(&events_total, n, memory_order_relaxed);
}

uint64_t chg_track_events_total(void)
{
	return atomic_load(&events_total);
}
