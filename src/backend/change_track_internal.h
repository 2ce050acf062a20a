/* change_track_internal.h: what the fanotify (change_track.c) and inotify
 * (change_track_inotify.c) halves of change tracking share. */
#pragma once
#include "backend/change_track.h"

struct chg_dirty_set {
	struct pathindex_dirty *v;
	size_t n, cap;
};

/* Directories outside the upper, by fanotify handle (change_track.c). */
#define CHG_OUTSIDE_SLOTS 4096
struct chg_outside {
	uint64_t h[CHG_OUTSIDE_SLOTS]; /* hash of the handle, 0: empty */
};

/* The events read so far: the directories they name, the handles known to
 * be outside, and why tracking gave up (NULL while it has not). */
struct chg_track_seen {
	struct chg_dirty_set s;
	struct chg_outside out;
	struct pathindex *sus; /* files closed after a write (CLOSE_WRITE), or NULL */
	ino_t *ino;            /* plain_dir: files named outside whose links changed */
	size_t n_ino;
	const char *why;
};

/* path[0..len) into the set; deep: its whole subtree. */
int chg_dirty_add(struct chg_dirty_set *s, const char *path, size_t len, bool deep);
/* path[0..len) into the set, changed at its entry name alone (named), or
 * only in its own metadata (name NULL). */
int chg_dirty_add_name(struct chg_dirty_set *s, const char *path, size_t len, const char *name);
/* relpath into the set *sus (made when NULL). */
int chg_suspect_add(struct pathindex **sus, const char *rel);
/* A collect gave up for lost events or watches: counted for /metrics. */
void chg_track_count_fallback(struct chg_track *t);
/* n events read from a queue (fanotify or inotify): counted for /metrics. */
void chg_track_count_events(uint64_t n);

/* One /proc scan (change_track_scan.c): the directories of the files of the
 * root at root_path (device root_dev) in use or mapped (want_dirs: a
 * collect's), else the files mapped shared only (chg_scan_mapped's). */
struct chg_scan *chg_scan_new(const char *root_path, dev_t root_dev, bool plain, bool want_dirs);
void chg_scan_run(struct chg_scan *sc);
/* chg_scan_run on a thread of its own (here when none can be had). */
void chg_scan_spawn(struct chg_scan *sc);
void chg_scan_free(struct chg_scan *sc);
/* t's scan started apart, waited for and taken from t; NULL when none. */
struct chg_scan *chg_scan_join(struct chg_track *t);
/* What a scan that ended found, into a collect: its directories into s,
 * its suspects into t's, the inodes outside a plain root into t's. */
int chg_scan_merge(struct chg_track *t, struct chg_scan *sc, struct chg_dirty_set *s, const char **why);

/* inotify (change_track_inotify.c): arm below t->upper (t->path set), read
 * the queued events into s (own: ckptd's own writes, no suspects), free. */
int chg_inotify_arm(struct chg_track *t);
int chg_inotify_read(struct chg_track *t, struct chg_dirty_set *s, bool own, const char **why);
void chg_inotify_free(struct chg_inotify *in);
