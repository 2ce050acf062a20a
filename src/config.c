/* config.c: command line and JSON config file. */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <sys/stat.h>

static const char usage[] =
	"Usage: ckptd [OPTIONS]\n"
	"Filesystem checkpoint and rollback service.\n\n"
	"  --listen HOST:PORT|unix:PATH  where to serve the API (repeatable; default 127.0.0.1:7070)\n"
	"  --state-dir DIR               where checkpoints and state live (default /var/lib/ckptd)\n"
	"  --root PATH                   a managed directory (repeatable)\n"
	"  --backend auto|overlay|tar    storage backend (default auto)\n"
	"  --config FILE                 JSON config file; flags win over it\n"
	"  --token-file FILE             require 'Authorization: Bearer <token>'\n"
	"  --mode sandbox|host           host mode runs gVisor sandboxes (default sandbox)\n"
	"  --unmount-on-exit             unmount overlay roots when stopping\n"
	"  --instance-id ID              host mode: this instance's name in lock files\n"
	"  --create-roots                create roots that do not exist (else an error)\n"
	"  --check-config                validate the configuration, print the outcome, exit 0 or 1\n"
	"  -v, --verbose                 debug logs\n"
	"  -h, --help                    this text\n"
	"  -V, --version                 print the version\n";

void config_defaults(struct config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->backend = BACKEND_AUTO;
	cfg->mode = MODE_SANDBOX;
	cfg->flatten_depth = 64;
	cfg->tar_chain_max = 8;
	cfg->track_changes = TRACK_AUTO;
	cfg->default_ttl_secs = 14 * 24 * 3600;
	cfg->cleanup_interval_secs = 60;
	cfg->max_checkpoints = 100;
	cfg->max_state_bytes = 0;
	cfg->max_import_bytes = 16LL << 30;
	cfg->services_auto = true;
	cfg->service_timeout_secs = 30;
	cfg->lock_ttl_secs = 30;
	cfg->lock_renew_secs = 5;
	cfg->lock_margin_secs = 2;
	cfg->default_idle_timeout_secs = 300;
}

static void free_list(char **v, size_t *n)
{
	for (size_t i = 0; i < *n; i++)
		free(v[i]);
	*n = 0;
}

void config_free(struct config *cfg)
{
	free_list(cfg->listen, &cfg->n_listen);
	free_list(cfg->roots, &cfg->n_roots);
	free_list(cfg->excludes, &cfg->n_excludes);
	free_list(cfg->etcd_endpoints, &cfg->n_etcd_endpoints);
	free_list(cfg->registry_insecure, &cfg->n_registry_insecure);
	free(cfg->registry_auth_file);
	free(cfg->registry_ca_file);
	for (size_t i = 0; i < cfg->n_units; i++)
		free(cfg->units[i]);
	free(cfg->units);
	free(cfg->state_dir);
	free(cfg->token);
	free(cfg->config_file);
	free(cfg->instance_id);
	free(cfg->runsc_path);
	free(cfg->sandbox_rootfs);
	free(cfg->sandbox_state_dir);
	free(cfg->etcd_ca_file);
	free(cfg->etcd_cert_file);
	free(cfg->etcd_key_file);
	free(cfg->etcd_user);
	free(cfg->checkpoint_bucket);
	free(cfg->checkpoint_mount);
	if (cfg->etcd_password)
		explicit_bzero(cfg->etcd_password, strlen(cfg->etcd_password));
	free(cfg->etcd_password);
	memset(cfg, 0, sizeof(*cfg));
}

const char *backend_kind_name(enum backend_kind k)
{
	return k == BACKEND_OVERLAY ? "overlay" : k == BACKEND_TAR ? "tar" : "auto";
}

static int set_str(char **dst, const char *v)
{
	char *n = strdup(v);
	if (!n)
		return -ENOMEM;
	free(*dst);
	*dst = n;
	return 0;
}

static int add_list(char **v, size_t *n, size_t max, const char *s, const char *what, ckpt_error *err)
{
	if (*n >= max)
		return err_set(err, EINVAL, NULL, "too many %s (at most %zu)", what, max);
	if (!(v[*n] = strdup(s)))
		return -ENOMEM;
	(*n)++;
	return 0;
}

static int parse_backend(struct config *cfg, const char *v, ckpt_error *err)
{
	if (!strcmp(v, "auto"))
		cfg->backend = BACKEND_AUTO;
	else if (!strcmp(v, "overlay"))
		cfg->backend = BACKEND_OVERLAY;
	else if (!strcmp(v, "tar"))
		cfg->backend = BACKEND_TAR;
	else
		return err_set(err, EINVAL, NULL, "backend must be auto, overlay or tar, not '%s'", v);
	return 0;
}

const char *track_mode_name(enum track_mode m)
{
	return m == TRACK_ALWAYS ? "always" : m == TRACK_NEVER ? "never" : "auto";
}

static int parse_track(struct config *cfg, json_t *v, ckpt_error *err)
{
	const char *s = json_string_value(v);
	for (enum track_mode m = TRACK_AUTO; s && m <= TRACK_NEVER; m++)
		if (!strcmp(s, track_mode_name(m))) {
			cfg->track_changes = m;
			return 0;
		}
	return err_set(err, EINVAL, NULL, "config: track_changes must be \"auto\", \"always\" or \"never\"");
}

static int parse_mode(struct config *cfg, const char *v, ckpt_error *err)
{
	if (!strcmp(v, "sandbox"))
		cfg->mode = MODE_SANDBOX;
	else if (!strcmp(v, "host"))
		cfg->mode = MODE_HOST;
	else
		return err_set(err, EINVAL, NULL, "mode must be sandbox or host, not '%s'", v);
	return 0;
}

/* A secret kept in a file (a token, a password): its text without the
 * trailing newline (and, with spaces, trailing blanks), never empty. The
 * old value in *dst is wiped. Errors name the file, never its content. */
static int load_secret(char **dst, const char *file, const char *what, bool spaces, ckpt_error *err)
{
	_cleanup_free_ char *buf = NULL;
	size_t len;
	int r = read_file_at(AT_FDCWD, file, 4096, &buf, &len);
	if (r < 0)
		return err_set(err, -r, NULL, "%s '%s': %s", what, file, strerror(-r));
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || (spaces && buf[len - 1] == ' ')))
		buf[--len] = '\0';
	if (len == 0)
		return err_set(err, EINVAL, NULL, "%s '%s' is empty", what, file);
	if (*dst)
		explicit_bzero(*dst, strlen(*dst));
	free(*dst);
	*dst = TAKE_PTR(buf);
	return 0;
}

static int load_token(struct config *cfg, const char *file, ckpt_error *err)
{
	return load_secret(&cfg->token, file, "token file", true, err);
}

/* Config file keys that take a list of strings. A lone string is refused:
 * "roots": "/srv/app" is most likely a list someone meant to grow. */
static int json_list(json_t *v, char **dst, size_t *n, size_t max, const char *what, ckpt_error *err)
{
	size_t i;
	json_t *e;
	if (json_is_string(v))
		return err_set(err, EINVAL, NULL, "config: %s must be a list of strings: [\"%s\"]", what,
			       json_string_value(v));
	if (!json_is_array(v))
		return err_set(err, EINVAL, NULL, "config: %s must be a list of strings", what);
	json_array_foreach (v, i, e) {
		if (!json_is_string(e))
			return err_set(err, EINVAL, NULL, "config: %s must hold strings", what);
		int r = add_list(dst, n, max, json_string_value(e), what, err);
		if (r < 0)
			return r;
	}
	return 0;
}

static int json_int(json_t *obj, const char *key, int64_t min, int64_t *dst, ckpt_error *err)
{
	json_t *v = json_object_get(obj, key);
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < min)
		return err_set(err, EINVAL, NULL, "config: %s must be an integer >= %lld", key, (long long)min);
	*dst = json_integer_value(v);
	return 0;
}

static int json_bool(json_t *obj, const char *key, bool *dst, ckpt_error *err)
{
	json_t *v = json_object_get(obj, key);
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return err_set(err, EINVAL, NULL, "config: %s must be true or false", key);
	*dst = json_is_true(v);
	return 0;
}

static int json_units(struct config *cfg, json_t *v, ckpt_error *err)
{
	size_t i;
	json_t *e;
	if (json_is_string(v)) {
		const char *s = json_string_value(v);
		if (!strcmp(s, "auto") || !strcmp(s, "none")) {
			cfg->services_auto = !strcmp(s, "auto");
			return 0;
		}
		return err_set(err, EINVAL, NULL, "config: services must be \"auto\", \"none\" or a list of units");
	}
	if (!json_is_array(v))
		return err_set(err, EINVAL, NULL, "config: services must be \"auto\", \"none\" or a list of units");
	cfg->services_auto = false;
	json_array_foreach (v, i, e) {
		if (!json_is_string(e))
			return err_set(err, EINVAL, NULL, "config: services must hold unit names");
		if (!strcmp(json_string_value(e), "auto")) {
			cfg->services_auto = true;
			continue;
		}
		char **n = realloc(cfg->units, (cfg->n_units + 1) * sizeof(*n));
		if (!n || !(n[cfg->n_units] = strdup(json_string_value(e))))
			return -ENOMEM;
		cfg->units = n;
		cfg->n_units++;
	}
	return 0;
}

static int json_str(json_t *obj, const char *key, char **dst, ckpt_error *err)
{
	json_t *v = json_object_get(obj, key);
	if (!v)
		return 0;
	if (!json_is_string(v))
		return err_set(err, EINVAL, NULL, "config: %s must be a string", key);
	return set_str(dst, json_string_value(v));
}

/* A file ckptd will read later (a certificate, a key): readable now. */
static int json_readable_file(json_t *obj, const char *key, char **dst, ckpt_error *err)
{
	int r = json_str(obj, key, dst, err);

	if (r == 0 && *dst && access(*dst, R_OK) < 0)
		return err_set(err, errno, NULL, "config: %s '%s': %s", key, *dst, strerror(errno));
	return r;
}

/* etcd over TLS and etcd's user authentication. */
static int json_etcd(struct config *cfg, json_t *obj, ckpt_error *err)
{
	json_t *v;
	int r;

	if ((r = json_readable_file(obj, "etcd_ca_file", &cfg->etcd_ca_file, err)) < 0 ||
	    (r = json_readable_file(obj, "etcd_cert_file", &cfg->etcd_cert_file, err)) < 0 ||
	    (r = json_readable_file(obj, "etcd_key_file", &cfg->etcd_key_file, err)) < 0 ||
	    (r = json_str(obj, "etcd_user", &cfg->etcd_user, err)) < 0)
		return r;
	if ((v = json_object_get(obj, "etcd_password_file")))
		return json_is_string(v)
			? load_secret(&cfg->etcd_password, json_string_value(v), "etcd_password_file", false, err)
			: err_set(err, EINVAL, NULL, "config: etcd_password_file must be a string");
	return 0;
}

static int apply_json_strings(struct config *cfg, json_t *obj, ckpt_error *err)
{
	json_t *v;
	int r = 0;
	if ((v = json_object_get(obj, "listen")))
		r = json_list(v, cfg->listen, &cfg->n_listen, MAX_LISTEN, "listen", err);
	if (r == 0 && (v = json_object_get(obj, "roots")))
		r = json_list(v, cfg->roots, &cfg->n_roots, MAX_ROOTS, "roots", err);
	if (r == 0 && (v = json_object_get(obj, "exclude")))
		r = json_list(v, cfg->excludes, &cfg->n_excludes, MAX_EXCLUDES, "exclude", err);
	if (r == 0 && (v = json_object_get(obj, "etcd_endpoints")))
		r = json_list(v, cfg->etcd_endpoints, &cfg->n_etcd_endpoints, MAX_LISTEN, "etcd_endpoints", err);
	if (r == 0 && (v = json_object_get(obj, "registry_insecure")))
		r = json_list(v, cfg->registry_insecure, &cfg->n_registry_insecure, MAX_LISTEN, "registry_insecure",
			      err);
	if (r == 0 && (v = json_object_get(obj, "registry_compression"))) {
		const char *b = json_string_value(v);
		if (!b || (strcmp(b, "zstd") && strcmp(b, "gzip")))
			r = err_set(err, EINVAL, NULL, "config: registry_compression must be \"zstd\" or \"gzip\"");
		else
			cfg->registry_gzip = !strcmp(b, "gzip");
	}
	if (r == 0)
		r = json_str(obj, "registry_auth_file", &cfg->registry_auth_file, err);
	if (r == 0)
		r = json_str(obj, "registry_ca_file", &cfg->registry_ca_file, err);
	if (r == 0 && (v = json_object_get(obj, "lock_backend"))) {
		const char *b = json_string_value(v);
		if (!b || (strcmp(b, "volume") && strcmp(b, "etcd")))
			r = err_set(err, EINVAL, NULL, "config: lock_backend must be \"volume\" or \"etcd\"");
		else
			cfg->lock_etcd = !strcmp(b, "etcd");
	}
	if (r == 0 && (v = json_object_get(obj, "track_changes")))
		r = parse_track(cfg, v, err);
	if (r == 0 && (v = json_object_get(obj, "backend")))
		r = json_is_string(v) ? parse_backend(cfg, json_string_value(v), err)
				      : err_set(err, EINVAL, NULL, "config: backend must be a string");
	if (r == 0 && (v = json_object_get(obj, "mode")))
		r = json_is_string(v) ? parse_mode(cfg, json_string_value(v), err)
				      : err_set(err, EINVAL, NULL, "config: mode must be a string");
	if (r == 0 && (v = json_object_get(obj, "token_file")))
		r = json_is_string(v) ? load_token(cfg, json_string_value(v), err)
				      : err_set(err, EINVAL, NULL, "config: token_file must be a string");
	if (r == 0 && (v = json_object_get(obj, "services")))
		r = json_units(cfg, v, err);
	if (r == 0)
		r = json_str(obj, "state_dir", &cfg->state_dir, err);
	if (r == 0)
		r = json_str(obj, "instance_id", &cfg->instance_id, err);
	if (r == 0)
		r = json_str(obj, "runsc_path", &cfg->runsc_path, err);
	if (r == 0)
		r = json_str(obj, "sandbox_rootfs", &cfg->sandbox_rootfs, err);
	if (r == 0)
		r = json_str(obj, "sandbox_state_dir", &cfg->sandbox_state_dir, err);
	if (r == 0)
		r = json_etcd(cfg, obj, err);
	return r;
}

static const char *const known_keys[] = {
	"listen",
	"state_dir",
	"roots",
	"exclude",
	"create_roots",
	"backend",
	"mode",
	"token_file",
	"metrics_token_free",
	"services",
	"service_timeout_secs",
	"instance_id",
	"runsc_path",
	"sandbox_rootfs",
	"sandbox_state_dir",
	"unmount_on_exit",
	"flatten_depth",
	"tar_chain_max",
	"track_changes",
	"track_check",
	"default_ttl_secs",
	"cleanup_interval_secs",
	"max_checkpoints",
	"max_state_bytes",
	"max_import_bytes",
	"lock_ttl_secs",
	"lock_renew_secs",
	"lock_margin_secs",
	"lock_backend",
	"etcd_endpoints",
	"etcd_ca_file",
	"etcd_cert_file",
	"etcd_key_file",
	"etcd_user",
	"etcd_password_file",
	"idle_timeout_secs",
	"max_connections",
	"max_connections_per_client",
	"header_timeout_secs",
	"registry_auth_file",
	"registry_ca_file",
	"registry_insecure",
	"registry_compression",
	NULL,
};

/* Levenshtein distance, for "did you mean". Keys are short. */
static size_t edit_distance(const char *a, const char *b)
{
	size_t lb = strlen(b), row[64], prev;
	if (lb >= ARRAY_SIZE(row))
		return SIZE_MAX;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; a[i - 1]; i++) {
		prev = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t sub = prev + (a[i - 1] != b[j - 1]), cur = row[j];
			row[j] = sub < row[j] + 1 ? sub : row[j] + 1;
			row[j] = row[j] < row[j - 1] + 1 ? row[j] : row[j - 1] + 1;
			prev = cur;
		}
	}
	return row[lb];
}

const char *config_nearest_key(const char *key)
{
	const char *best = NULL;
	size_t best_d = SIZE_MAX;
	for (const char *const *k = known_keys; *k; k++) {
		size_t d = edit_distance(key, *k);
		if (d < best_d)
			best = *k, best_d = d;
	}
	return best;
}

/* A typo must not pass silently: "root" would leave the roots unset, and
 * "max_checkpoint" the limit at its default. */
static int config_check_keys(json_t *obj, ckpt_error *err)
{
	const char *key;
	json_t *v;
	json_object_foreach (obj, key, v) {
		bool known = false;
		for (const char *const *k = known_keys; *k && !known; k++)
			known = !strcmp(key, *k);
		if (!known)
			return err_set(err, EINVAL, NULL, "config: unknown key '%s' (did you mean '%s'?)", key,
				       config_nearest_key(key));
	}
	return 0;
}

int config_apply_json(struct config *cfg, json_t *obj, ckpt_error *err)
{
	int64_t v64;
	int r;

	if (!json_is_object(obj))
		return err_set(err, EINVAL, NULL, "config: must be a JSON object");
	if ((r = config_check_keys(obj, err)) < 0)
		return r;
	r = apply_json_strings(cfg, obj, err);
	if (r < 0)
		return r;
	if ((r = json_bool(obj, "unmount_on_exit", &cfg->unmount_on_exit, err)) < 0 ||
	    (r = json_bool(obj, "create_roots", &cfg->create_roots, err)) < 0 ||
	    (r = json_bool(obj, "metrics_token_free", &cfg->metrics_token_free, err)) < 0 ||
	    (r = json_bool(obj, "track_check", &cfg->track_check, err)) < 0)
		return r;
	if ((r = json_int(obj, "default_ttl_secs", 0, &cfg->default_ttl_secs, err)) < 0 ||
	    (r = json_int(obj, "cleanup_interval_secs", 1, &cfg->cleanup_interval_secs, err)) < 0 ||
	    (r = json_int(obj, "max_checkpoints", 1, &cfg->max_checkpoints, err)) < 0 ||
	    (r = json_int(obj, "max_state_bytes", 0, &cfg->max_state_bytes, err)) < 0 ||
	    (r = json_int(obj, "max_import_bytes", 1, &cfg->max_import_bytes, err)) < 0 ||
	    (r = json_int(obj, "lock_ttl_secs", 1, &cfg->lock_ttl_secs, err)) < 0 ||
	    (r = json_int(obj, "lock_renew_secs", 1, &cfg->lock_renew_secs, err)) < 0 ||
	    (r = json_int(obj, "lock_margin_secs", 0, &cfg->lock_margin_secs, err)) < 0 ||
	    (r = json_int(obj, "idle_timeout_secs", 1, &cfg->default_idle_timeout_secs, err)) < 0 ||
	    (r = json_int(obj, "max_connections", 16, &cfg->max_connections, err)) < 0 ||
	    (r = json_int(obj, "max_connections_per_client", 1, &cfg->max_connections_per_client, err)) < 0 ||
	    (r = json_int(obj, "header_timeout_secs", 1, &cfg->header_timeout_secs, err)) < 0)
		return r;
	v64 = cfg->service_timeout_secs;
	if ((r = json_int(obj, "service_timeout_secs", 1, &v64, err)) < 0)
		return r;
	cfg->service_timeout_secs = (int)(v64 > 3600 ? 3600 : v64);
	v64 = cfg->flatten_depth;
	if ((r = json_int(obj, "flatten_depth", 2, &v64, err)) < 0)
		return r;
	cfg->flatten_depth = (int)(v64 > 400 ? 400 : v64);
	v64 = cfg->tar_chain_max;
	if ((r = json_int(obj, "tar_chain_max", 0, &v64, err)) < 0)
		return r;
	cfg->tar_chain_max = (int)(v64 > 1000 ? 1000 : v64);
	return 0;
}

static int load_file(struct config *cfg, const char *file, ckpt_error *err)
{
	json_error_t jerr;
	_cleanup_fclose_ FILE *f = fopen(file, "re");
	if (!f)
		return err_set(err, errno, NULL, "cannot open config file '%s': %s", file, strerror(errno));
	json_auto_t *obj = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
	if (!obj)
		return err_set(err, EINVAL, NULL, "config file '%s' line %d column %d: %s", file, jerr.line,
			       jerr.column, jerr.text);
	if (config_apply_json(cfg, obj, err) < 0)
		return err_prefix(err, "config file '%s'", file);
	return set_str(&cfg->config_file, file);
}

/* An absolute, canonical path. A missing directory is created if `create`;
 * with `check_only` nothing is created and a missing one that may be is
 * taken as it is written. */
static int canonical_dir(char **p, const char *what, bool create, bool check_only, ckpt_error *err)
{
	char buf[PATH_MAX];
	struct stat st;

	if ((*p)[0] != '/' && !realpath(*p, buf) && errno != ENOENT)
		return err_set(err, errno, NULL, "%s '%s': %s", what, *p, strerror(errno));
	if (stat(*p, &st) < 0 && errno == ENOENT) {
		if (!create)
			return err_set(err, ENOENT, NULL,
				       "%s '%s' does not exist (create it, or set \"create_roots\": true)", what, *p);
		if (check_only)
			return (*p)[0] == '/' ? 0 : err_set(err, EINVAL, NULL, "%s '%s' must be absolute", what, *p);
	}
	if (mkdir_p(*p, 0755) < 0 || !realpath(*p, buf))
		return err_set(err, errno, NULL, "%s '%s': %s", what, *p, strerror(errno));
	if (stat(buf, &st) < 0 || !S_ISDIR(st.st_mode))
		return err_set(err, ENOTDIR, NULL, "%s '%s' is not a directory", what, *p);
	if (!strcmp(buf, "/") && strcmp(what, "root"))
		return err_set(err, EINVAL, NULL, "%s may not be /", what);
	return set_str(p, buf);
}

static bool path_within(const char *inner, const char *outer)
{
	size_t n = strlen(outer);
	return !strncmp(inner, outer, n) && (inner[n] == '/' || inner[n] == '\0');
}

/* The etcd keys that only make sense together, checked once every source
 * is read. A URL's user:password@ would end up in logs: refused, unechoed. */
static int config_validate_etcd(const struct config *cfg, ckpt_error *err)
{
	bool tls = cfg->etcd_ca_file || cfg->etcd_cert_file;

	if (!cfg->etcd_cert_file != !cfg->etcd_key_file)
		return err_set(err, EINVAL, NULL, "config: etcd_cert_file and etcd_key_file go together");
	if (!cfg->etcd_user != !cfg->etcd_password)
		return err_set(err, EINVAL, NULL, "config: etcd_user and etcd_password_file go together");
	for (size_t i = 0; i < cfg->n_etcd_endpoints; i++) {
		const char *e = cfg->etcd_endpoints[i], *host = strstr(e, "://");
		if (host && strcspn(host + 3, "/") > strcspn(host + 3, "@"))
			return err_set(err, EINVAL, NULL,
				       "config: etcd_endpoints: put no user or password in a URL; use etcd_user "
				       "and etcd_password_file");
		if (tls && strncmp(e, "https://", 8))
			return err_set(err, EINVAL, NULL,
				       "config: etcd endpoint '%s' is not https:// but etcd_ca_file or "
				       "etcd_cert_file is set",
				       e);
	}
	return 0;
}

/* The containers-auth.json(5) search order, when the config names no file:
 * $REGISTRY_AUTH_FILE, /run/containers/0/auth.json, $HOME/.docker/config.json.
 * The first that exists wins; none is fine (anonymous pulls and pushes). */
static int registry_auth_default(struct config *cfg)
{
	const char *env = getenv("REGISTRY_AUTH_FILE"), *home = getenv("HOME");
	char docker[PATH_MAX];
	if (cfg->registry_auth_file)
		return 0;
	if (env && *env)
		return set_str(&cfg->registry_auth_file, env);
	if (access("/run/containers/0/auth.json", R_OK) == 0)
		return set_str(&cfg->registry_auth_file, "/run/containers/0/auth.json");
	if (home && *home && snprintf(docker, sizeof(docker), "%s/.docker/config.json", home) < (int)sizeof(docker) &&
	    access(docker, R_OK) == 0)
		return set_str(&cfg->registry_auth_file, docker);
	return 0;
}

/* "/" as a root (docs/whole-root.md) is the only root: any other would be
 * inside it. The state dir is inside it too, and excluded from it. */
static int config_validate_whole(const struct config *cfg, ckpt_error *err)
{
	if (!cfg->whole_root)
		return 0;
	if (cfg->n_roots > 1)
		return err_set(err, EINVAL, NULL, "root / is the whole sandbox: it must be the only root");
	if (cfg->backend == BACKEND_OVERLAY)
		return err_set(err, EINVAL, NULL,
			       "root / needs the tar backend: the overlay backend would mount over the running "
			       "root, which it cannot replace under the programs using it");
	return 0;
}

/* Each exclude is absolute, canonical (no "." or ".." part, no "//", no
 * trailing "/"), and inside a root, but not the root itself. It need not
 * exist: a path made later is excluded once it exists. */
static int config_validate_excludes(const struct config *cfg, ckpt_error *err)
{
	for (size_t i = 0; i < cfg->n_excludes; i++) {
		const char *x = cfg->excludes[i];
		bool in = false;
		if (x[0] != '/' || strstr(x, "//") || strstr(x, "/./") || strstr(x, "/../") ||
		    (strlen(x) > 1 && x[strlen(x) - 1] == '/') || !strcmp(x, "/") ||
		    (strlen(x) >= 2 && !strcmp(x + strlen(x) - 2, "/.")) ||
		    (strlen(x) >= 3 && !strcmp(x + strlen(x) - 3, "/..")) || strlen(x) >= PATH_MAX)
			return err_set(err, EINVAL, NULL,
				       "config: exclude '%s' must be an absolute path without '.', '..', '//' or a "
				       "trailing '/'",
				       x);
		for (size_t j = 0; j < cfg->n_roots && !in; j++)
			in = (!strcmp(cfg->roots[j], "/") || path_within(x, cfg->roots[j])) && strcmp(x, cfg->roots[j]);
		if (!in && !cfg->check_only)
			return err_set(err, EINVAL, NULL, "config: exclude '%s' is inside no root", x);
	}
	return 0;
}

static int config_validate(struct config *cfg, ckpt_error *err)
{
	int r;
	if (registry_auth_default(cfg) < 0)
		return -ENOMEM;
	if (!cfg->state_dir && set_str(&cfg->state_dir, "/var/lib/ckptd") < 0)
		return -ENOMEM;
	if ((r = canonical_dir(&cfg->state_dir, "state dir", true, cfg->check_only, err)) < 0)
		return r;
	if (cfg->n_listen == 0 &&
	    add_list(cfg->listen, &cfg->n_listen, MAX_LISTEN, "127.0.0.1:7070", "listen", err) < 0)
		return -ENOMEM;
	if ((r = config_validate_etcd(cfg, err)) < 0)
		return r;
	if (cfg->mode == MODE_SANDBOX && cfg->n_roots == 0)
		return err_set(err, EINVAL, NULL, "no --root given: name at least one directory to manage");
	for (size_t i = 0; i < cfg->n_roots; i++) {
		if ((r = canonical_dir(&cfg->roots[i], "root", cfg->create_roots, cfg->check_only, err)) < 0)
			return r;
		if (!strcmp(cfg->roots[i], "/")) {
			cfg->whole_root = true;
			continue; /* the state dir and other roots: checked below */
		}
		if (path_within(cfg->state_dir, cfg->roots[i]) || path_within(cfg->roots[i], cfg->state_dir))
			return err_set(err, EINVAL, NULL, "root '%s' and state dir '%s' overlap", cfg->roots[i],
				       cfg->state_dir);
		for (size_t j = 0; j < i; j++)
			if (path_within(cfg->roots[i], cfg->roots[j]) || path_within(cfg->roots[j], cfg->roots[i]))
				return err_set(err, EINVAL, NULL, "roots '%s' and '%s' overlap", cfg->roots[j],
					       cfg->roots[i]);
	}
	if ((r = config_validate_whole(cfg, err)) < 0)
		return r;
	return config_validate_excludes(cfg, err);
}

enum {
	OPT_LISTEN = 256,
	OPT_STATE,
	OPT_ROOT,
	OPT_BACKEND,
	OPT_CONFIG,
	OPT_TOKEN,
	OPT_MODE,
	OPT_UNMOUNT,
	OPT_INSTANCE,
	OPT_CREATE_ROOTS,
	OPT_CHECK
};

static const struct option long_opts[] = {
	{ "listen", required_argument, NULL, OPT_LISTEN },
	{ "state-dir", required_argument, NULL, OPT_STATE },
	{ "root", required_argument, NULL, OPT_ROOT },
	{ "backend", required_argument, NULL, OPT_BACKEND },
	{ "config", required_argument, NULL, OPT_CONFIG },
	{ "token-file", required_argument, NULL, OPT_TOKEN },
	{ "mode", required_argument, NULL, OPT_MODE },
	{ "unmount-on-exit", no_argument, NULL, OPT_UNMOUNT },
	{ "instance-id", required_argument, NULL, OPT_INSTANCE },
	{ "create-roots", no_argument, NULL, OPT_CREATE_ROOTS },
	{ "check-config", no_argument, NULL, OPT_CHECK },
	{ "verbose", no_argument, NULL, 'v' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ 0 },
};

/* Flags replace the file's lists rather than add to them. */
static int apply_flag(struct config *cfg, int c, const char *arg, bool *listen_seen, bool *roots_seen, ckpt_error *err)
{
	switch (c) {
	case OPT_LISTEN:
		if (!*listen_seen)
			free_list(cfg->listen, &cfg->n_listen);
		*listen_seen = true;
		return add_list(cfg->listen, &cfg->n_listen, MAX_LISTEN, arg, "--listen", err);
	case OPT_ROOT:
		if (!*roots_seen)
			free_list(cfg->roots, &cfg->n_roots);
		*roots_seen = true;
		return add_list(cfg->roots, &cfg->n_roots, MAX_ROOTS, arg, "--root", err);
	case OPT_STATE:
		return set_str(&cfg->state_dir, arg);
	case OPT_BACKEND:
		return parse_backend(cfg, arg, err);
	case OPT_TOKEN:
		return load_token(cfg, arg, err);
	case OPT_MODE:
		return parse_mode(cfg, arg, err);
	case OPT_UNMOUNT:
		cfg->unmount_on_exit = true;
		return 0;
	case OPT_INSTANCE:
		return set_str(&cfg->instance_id, arg);
	case OPT_CREATE_ROOTS:
		cfg->create_roots = true;
		return 0;
	case OPT_CHECK:
		cfg->check_only = true;
		return 0;
	case 'v':
		cfg->verbose = true;
		return 0;
	case OPT_CONFIG:
		return 0; /* loaded first */
	default:
		return err_set(err, EINVAL, NULL, "unknown option (see --help)");
	}
}

/* Host mode's checkpoint volume comes from the environment, not the file:
 * the sandbox API defines these two variables and its clients set them. */
static int config_env(struct config *cfg)
{
	const char *bucket = getenv("SANDBOX_CHECKPOINT_BUCKET");
	const char *mount = getenv("SANDBOX_CHECKPOINT_MOUNT_PATH");
	if (bucket && set_str(&cfg->checkpoint_bucket, bucket) < 0)
		return -ENOMEM;
	if (mount && set_str(&cfg->checkpoint_mount, mount) < 0)
		return -ENOMEM;
	return 0;
}

int config_parse(struct config *cfg, int argc, char **argv, ckpt_error *err)
{
	bool listen_seen = false, roots_seen = false;
	int c, r;

	config_defaults(cfg);
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		cfg->check_only |= !strcmp(argv[i], "--check-config"); /* known before any error */
	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "vhV", long_opts, NULL)) != -1) {
		if (c == 'h') {
			fputs(usage, stdout);
			return 1;
		}
		if (c == 'V') {
			printf("ckptd %s\n", CKPTD_VERSION);
			return 1;
		}
		if (c == '?')
			return err_set(err, EINVAL, NULL, "unknown or incomplete option '%s' (see --help)",
				       argv[optind - 1]);
		if (c == OPT_CONFIG && (r = load_file(cfg, optarg, err)) < 0)
			return r;
	}
	if (optind < argc)
		return err_set(err, EINVAL, NULL, "unexpected argument '%s' (see --help)", argv[optind]);
	optind = 1;
	while ((c = getopt_long(argc, argv, "vhV", long_opts, NULL)) != -1)
		if ((r = apply_flag(cfg, c, optarg, &listen_seen, &roots_seen, err)) < 0)
			return r;
	if (config_env(cfg) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	return config_validate(cfg, err);
}
