/* config.h: daemon settings from the command line and an optional JSON file.
 * Flags win over the file; the file wins over the defaults. */
#pragma once
#include <jansson.h>
#include "lib/util.h"

#ifndef CKPTD_VERSION /* the one version string is in the Makefile */
#error "CKPTD_VERSION is not defined: build with the Makefile, which passes -DCKPTD_VERSION"
#endif
#define MAX_LISTEN 8
#define MAX_ROOTS 16
#define MAX_EXCLUDES 64

enum backend_kind {
	BACKEND_AUTO,
	BACKEND_OVERLAY,
	BACKEND_TAR
};
/* Change tracking of a create (fanotify, change_track.h): "auto" tracks
 * overlay uppers from 2,000 entries and every tar root. */
enum track_mode {
	TRACK_AUTO, /* the default: 0, so a zeroed backend_ctx has it */
	TRACK_ALWAYS,
	TRACK_NEVER
};
enum run_mode {
	MODE_SANDBOX,
	MODE_HOST
};

struct config {
	char *listen[MAX_LISTEN]; /* "HOST:PORT" or "unix:PATH" */
	size_t n_listen;
	char *state_dir;        /* absolute */
	char *roots[MAX_ROOTS]; /* absolute, canonical */
	size_t n_roots;
	enum backend_kind backend;
	enum run_mode mode;
	bool whole_root;              /* the one root is "/" (docs/whole-root.md) */
	char *excludes[MAX_EXCLUDES]; /* "exclude": absolute paths inside a root, never captured */
	size_t n_excludes;
	char *token; /* NULL = no auth */
	char *config_file;
	bool verbose;
	bool check_only;         /* --check-config: validate, create nothing */
	bool create_roots;       /* a missing root is created rather than an error */
	bool metrics_token_free; /* GET /metrics without the token */

	/* connections (0: the HTTP layer's defaults) */
	int64_t max_connections;            /* per listener, default 1024 */
	int64_t max_connections_per_client; /* per client address, default 64 */
	int64_t header_timeout_secs;        /* to send a request's headers, default 10 */

	/* overlay */
	bool unmount_on_exit; /* default off */
	int flatten_depth;    /* flatten chains deeper than this (default 64) */
	int tar_chain_max;    /* tar: compact chains longer than this (default 8) */

	/* change tracking (default auto); track_check: compare each tracked
	 * create with a full walk, read-only, and fail it on a difference (the
	 * tests; default off) */
	enum track_mode track_changes;
	bool track_check;

	/* lifecycle */
	int64_t default_ttl_secs;      /* default 14 days, 0 = never */
	int64_t cleanup_interval_secs; /* default 60 */
	int64_t max_checkpoints;       /* default 100 */
	int64_t max_state_bytes;       /* default 0 = unlimited */
	int64_t max_import_bytes;      /* body of POST /v1/checkpoints/import; default 16 GiB */

	/* services */
	bool services_auto; /* also discover units using the roots (default true) */
	char **units;       /* units configured for every root */
	size_t n_units;
	int service_timeout_secs; /* default 30 */

	/* host mode */
	char *instance_id;                /* default: hostname-pid-random */
	char *runsc_path;                 /* default "runsc" */
	char *sandbox_rootfs;             /* default "/" */
	char *sandbox_state_dir;          /* default <state_dir>/sandboxes */
	int64_t lock_ttl_secs;            /* default 30 */
	int64_t lock_renew_secs;          /* default 5 */
	int64_t lock_margin_secs;         /* default 2: a taker waits ttl + this */
	bool lock_etcd;                   /* lock_backend "etcd" (default "volume") */
	char *etcd_endpoints[MAX_LISTEN]; /* http(s)://HOST:PORT of etcd's v3 JSON gateway */
	size_t n_etcd_endpoints;
	char *etcd_ca_file;   /* CA that signed etcd's certificate (default: the system's) */
	char *etcd_cert_file; /* client certificate for etcd, with etcd_key_file */
	char *etcd_key_file;
	char *etcd_user;                   /* etcd's user authentication, with etcd_password */
	char *etcd_password;               /* read from etcd_password_file; never logged */
	int64_t default_idle_timeout_secs; /* default 300 */
	/* checkpoint volume, from the environment (SANDBOX_CHECKPOINT_BUCKET and
	 * SANDBOX_CHECKPOINT_MOUNT_PATH, as the sandbox API's clients set them);
	 * NULL or empty: checkpointing off */
	char *checkpoint_bucket;
	char *checkpoint_mount;

	/* registries (push and pull, engine_oci.c) */
	char *registry_auth_file;            /* resolved at parse: key, $REGISTRY_AUTH_FILE, ... */
	char *registry_ca_file;              /* NULL: the system CAs */
	char *registry_insecure[MAX_LISTEN]; /* HOST[:PORT] spoken to over plain HTTP */
	size_t n_registry_insecure;
	bool registry_gzip; /* registry_compression "gzip" (default "zstd") */
};

/* Parse argv (and the --config file it names). On --help/--version prints and
 * returns 1; on error fills err and returns <0. */
int config_parse(struct config *cfg, int argc, char **argv, ckpt_error *err);
/* Apply a JSON object of settings (the config file format). */
int config_apply_json(struct config *cfg, json_t *obj, ckpt_error *err);
void config_defaults(struct config *cfg);
/* The known config file key nearest to key (for "did you mean"). */
const char *config_nearest_key(const char *key);
void config_free(struct config *cfg);
const char *backend_kind_name(enum backend_kind k);
const char *track_mode_name(enum track_mode m);
