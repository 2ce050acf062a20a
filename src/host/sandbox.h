/* sandbox.h: host mode's internal state: the instance (struct host), its
 * registry of running sandboxes, and the sessions (one WebSocket client each).
 * Calls go one way: host_api.c (protocol) > host.c (instance, background
 * thread) > exec.c > sandbox.c (lifecycle) > session.c, reaper.c > locks.c
 * (+ locks_etcd.c),
 * runsc.c, ws.c (adapters). */
#pragma once
#include <pthread.h>
#include <jansson.h>
#include "host/runsc.h"
#include "host/ws.h"
#include "host/locks.h"

#define SANDBOX_ID_MAX 64
/* runsc names its control socket after the container id and refuses ids
 * longer than 92 characters (checked with runsc 0.0~20221219.0). */
#define SANDBOX_CID_MAX 92
#define SANDBOX_CID_TAG_MAX (SANDBOX_CID_MAX - SANDBOX_ID_MAX - 1)

enum sandbox_state {
	SB_STARTING, /* being created or restored; not usable yet */
	SB_RUNNING,
	SB_BUSY, /* checkpointing or stopping */
};

struct session;

struct sandbox {
	char id[SANDBOX_ID_MAX + 1];
	/* the runsc container: "{id}.{instance tag}", unique per instance, so
	 * two instances on one machine can both hold a copy during a handoff */
	char cid[SANDBOX_CID_MAX + 1];
	enum sandbox_state state;
	bool checkpointable;    /* lock held, checkpoints on the volume */
	int64_t idle_timeout_s; /* 0 = never */
	int64_t created_at_ms;
	struct session *client; /* attached session or NULL */
	bool exec_running;
	int64_t detached_mono_ms; /* when the last client left */
	int64_t renewed_at;       /* unix s of our last lock renewal */
	/* The lease: while token != 0 we hold the lock with this fencing token
	 * until lease_until (CLOCK_MONOTONIC ms), ttl after the start of the
	 * last renewal that succeeded. Past it the watchdog kills the container
	 * and sets fenced, whatever the volume does. */
	uint64_t token;
	int64_t lease_until;
	int pidfd;        /* the runsc-sandbox process, or -1 (under h->mu) */
	bool fenced;      /* must not run any more */
	bool killed;      /* the watchdog has killed its container */
	bool waiter_seen; /* another instance waits for it: hand over */
	struct sandbox *next;
};

struct host {
	char *instance_id;
	char cid_tag[SANDBOX_CID_TAG_MAX + 1]; /* instance_id, or a hash of a long one */
	struct runsc runsc;                    /* path and our --root */
	char *runsc_root, *bundles_dir, *logs_dir;
	const char *rootfs;
	char runsc_version[128];
	char **cpu_features;
	size_t n_cpu_features;
	char *mount;             /* NULL: checkpointing not configured */
	struct locks locks;      /* {mount}/locks (fd -1 when off) and the method */
	char *no_checkpoint_why; /* checkpointing refused at start: why */
	char *volume_problem;    /* e.g. a FUSE volume without allow_other, or NULL */
	int64_t lock_ttl, lock_renew, lock_margin, default_idle;
	pthread_mutex_t lock_io; /* orders renewal and release of one lock file */
	int reaper_fd;           /* write end: "+id\n" / "-id\n" */

	pthread_mutex_t mu; /* registry, sandbox fields, session refs */
	pthread_cond_t cond;
	struct sandbox *sandboxes;
	bool stopping;                     /* no new work */
	bool closed;                       /* sandboxes saved: renewal and watchdog end too */
	bool bg_done, saved, renewer_done; /* shutdown's progress (bounded waits) */
	pthread_t bg, watchdog, renewer;   /* work, lease clock, lock renewal */
	bool bg_started, watchdog_started, renewer_started;
};

struct session {
	struct host *h;
	struct ws_conn *ws;
	void *handle;                       /* for http_upgrade_close */
	char attach_id[SANDBOX_ID_MAX + 1]; /* "" for /create */
	struct sandbox *sb;
	int refs;    /* under h->mu */
	bool kicked; /* the sandbox left: end the session */
};

bool sandbox_id_valid(const char *id);

/* Registry (callers hold h->mu). */
struct sandbox *sandbox_find(struct host *h, const char *id);
struct sandbox *sandbox_add(struct host *h, const char *id);
void sandbox_remove(struct host *h, struct sandbox *sb);

/* The lock and its lease (called without h->mu). sandbox_lock: 0 when the
 * lock is ours (sb->token set), -EBUSY (cur filled) when another holds it. */
int sandbox_lock(struct host *h, struct sandbox *sb, struct lock_info *cur);
void sandbox_unlock(struct host *h, struct sandbox *sb);
/* The fence: 0 while our lease runs by our clock and the lock on the volume
 * still carries our token; -ESTALE (err: "lost ownership") otherwise. */
int sandbox_fence(struct host *h, struct sandbox *sb, ckpt_error *err);

/* Lifecycle (called without h->mu; sb is in state SB_STARTING or SB_BUSY,
 * which keeps everyone else away). */
int sandbox_start(struct host *h, struct sandbox *sb, ckpt_error *err);
/* Checkpoint to the volume, publish it (fenced), release the lock, then
 * delete the container. -ESTALE: ownership was lost; nothing may be acked. */
int sandbox_checkpoint(struct host *h, struct sandbox *sb, ckpt_error *err);
/* -ENOENT: no checkpoint on the volume. */
int sandbox_restore(struct host *h, struct sandbox *sb, ckpt_error *err);
bool sandbox_has_checkpoint(struct host *h, const char *id);
void sandbox_stop(struct host *h, struct sandbox *sb);
int sandbox_write_metadata(struct host *h, struct sandbox *sb, const char *latest, ckpt_error *err);
