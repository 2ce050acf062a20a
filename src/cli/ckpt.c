/* ckpt.c: main of the ckpt client: the command line, where the daemon is,
 * and the token. The subcommands live in cli_cmd.c. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include "cli/cli.h"

#define CKPT_TOKEN_MAX 4096

static const char ckpt_usage[] =
	"Usage: ckpt [--url URL | --socket PATH] [--token-file FILE] [--json] COMMAND [ARGS]\n"
	"\n"
	"Client of ckptd, the in-sandbox filesystem checkpoint and rollback service.\n"
	"\n"
	"Commands:\n"
	"  create NAME [--ttl SECS] [--label K=V]... [--async] [-q]   make a checkpoint\n"
	"  list [--name NAME] [-q]                                   list checkpoints, newest first\n"
	"  show ID|NAME                                              show one checkpoint\n"
	"  delete ID|NAME [-q]                                       delete a checkpoint\n"
	"  restore ID|NAME [--force] [--if-expired fail|fresh] [--verify] [--yes] [--dry-run]\n"
	"                                                            roll the roots back to it\n"
	"  fork ID|NAME DIR                                          mount a writable copy of a checkpoint at DIR\n"
	"  forks                                                     list forks\n"
	"  fork-delete FORK_ID                                       unmount and remove a fork\n"
	"  diff ID|NAME [--against ID|NAME]                          what changed since a checkpoint\n"
	"  export ID|NAME -o FILE                                    write it as one portable archive\n"
	"  import FILE                                               a new checkpoint from an archive\n"
	"  push ID|NAME HOST[:PORT]/REPO[:TAG]                       push it to a registry as an OCI image\n"
	"  pull HOST[:PORT]/REPO[:TAG|@DIGEST]                       a new checkpoint from a registry image\n"
	"  release [ROOT] [--drop-checkpoints]                       stop managing a root, keep its contents\n"
	"  health                                                    the daemon's health\n"
	"  help [COMMAND]                                            this text, or a command's\n"
	"  version                                                   ckpt's version\n"
	"\n"
	"Options:\n"
	"  --url URL          daemon URL (default $CKPTD_URL, else " CKPT_DEFAULT_URL ")\n"
	"  --socket PATH      talk HTTP over this unix socket (default $CKPTD_SOCKET)\n"
	"  --token-file FILE  bearer token file (default: the token in $CKPTD_TOKEN)\n"
	"  --json             print the API's JSON as is\n"
	"  -h, --help         this help;  -V, --version  the version\n"
	"\n"
	"Exit status: 0 success, 1 the daemon answered with an error, 2 usage error,\n"
	"3 the daemon could not be reached.\n";

enum {
	OPT_URL = 256,
	OPT_SOCKET,
	OPT_TOKEN_FILE,
	OPT_JSON,
	OPT_TTL,
	OPT_LABEL,
	OPT_ASYNC,
	OPT_NAME,
	OPT_FORCE,
	OPT_IF_EXPIRED,
	OPT_QUIET,
	OPT_YES,
	OPT_DRY_RUN,
	OPT_VERIFY,
	OPT_AGAINST,
	OPT_OUTPUT,
	OPT_DROP_CHECKPOINTS,
};

/* In the order of the enum above: ckpt_parse_opt indexes it by c - OPT_URL. */
static const struct option ckpt_options[] = {
	{ "url", required_argument, NULL, OPT_URL },
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "token-file", required_argument, NULL, OPT_TOKEN_FILE },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "ttl", required_argument, NULL, OPT_TTL },
	{ "label", required_argument, NULL, OPT_LABEL },
	{ "async", no_argument, NULL, OPT_ASYNC },
	{ "name", required_argument, NULL, OPT_NAME },
	{ "force", no_argument, NULL, OPT_FORCE },
	{ "if-expired", required_argument, NULL, OPT_IF_EXPIRED },
	{ "quiet", no_argument, NULL, OPT_QUIET },
	{ "yes", no_argument, NULL, OPT_YES },
	{ "dry-run", no_argument, NULL, OPT_DRY_RUN },
	{ "verify", no_argument, NULL, OPT_VERIFY },
	{ "against", required_argument, NULL, OPT_AGAINST },
	{ "output", required_argument, NULL, OPT_OUTPUT },
	{ "drop-checkpoints", no_argument, NULL, OPT_DROP_CHECKPOINTS },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ 0 },
};

/* What the command line said, before it is checked against the command. */
struct ckpt_args {
	const char *url, *socket, *token_file;
	const char *only; /* the first command-specific option seen, for errors */
	unsigned used;    /* bit per command-specific option */
	bool help;        /* -h: the command's help, or the usage */
};

static int ckpt_usage_error(const char *fmt, const char *arg)
{
	fputs("ckpt: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs("\nTry 'ckpt --help'.\n", stderr);
	return CKPT_EXIT_USAGE;
}

static int ckpt_read_token(const char *file, char **ret)
{
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	char *buf = calloc(1, CKPT_TOKEN_MAX + 1);
	ssize_t n = buf ? read(fd, buf, CKPT_TOKEN_MAX) : -1;
	int e = errno;
	close(fd);
	if (n < 0) {
		free(buf);
		return buf ? -e : -ENOMEM;
	}
	while (n > 0 && strchr(" \t\r\n", buf[n - 1]))
		buf[--n] = '\0';
	*ret = buf;
	return 0;
}

static int ckpt_parse_ttl(struct cli_opts *o, const char *s)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < 0)
		return ckpt_usage_error("--ttl wants a whole number of seconds >= 0, not \"%s\"", s);
	o->has_ttl = true;
	o->ttl_secs = v;
	return 0;
}

static int ckpt_parse_label(struct cli_opts *o, const char *s)
{
	const char *eq = strchr(s, '=');
	if (!eq || eq == s)
		return ckpt_usage_error("--label wants KEY=VALUE, not \"%s\"", s);
	_cli_cleanup_free_ char *key = strndup(s, (size_t)(eq - s));
	if (!key)
		return CKPT_EXIT_SERVER;
	json_object_set_new(o->labels, key, json_string(eq + 1));
	return 0;
}

static int ckpt_parse_opt(int c, struct cli_opts *o, struct ckpt_args *a)
{
	switch (c) {
	case OPT_URL:
		a->url = optarg;
		return 0;
	case OPT_SOCKET:
		a->socket = optarg;
		return 0;
	case OPT_TOKEN_FILE:
		a->token_file = optarg;
		return 0;
	case OPT_JSON:
		o->json = true;
		return 0;
	case 'h':
		a->help = true;
		return 0;
	case 'V':
		puts("ckpt " CKPTD_VERSION);
		return -1;
	}
	if (c == 'q' || c == 'y' || c == 'o')
		c = c == 'q' ? OPT_QUIET : c == 'y' ? OPT_YES : OPT_OUTPUT;
	if (!a->used)
		a->only = ckpt_options[c - OPT_URL].name;
	a->used |= 1u << (c - OPT_URL);
	switch (c) {
	case OPT_TTL:
		return ckpt_parse_ttl(o, optarg);
	case OPT_LABEL:
		return ckpt_parse_label(o, optarg);
	case OPT_ASYNC:
		o->async = true;
		return 0;
	case OPT_NAME:
		o->name_filter = optarg;
		return 0;
	case OPT_FORCE:
		o->force = true;
		return 0;
	case OPT_QUIET:
		o->quiet = true;
		return 0;
	case OPT_YES:
		o->yes = true;
		return 0;
	case OPT_DRY_RUN:
		o->dry_run = true;
		return 0;
	case OPT_IF_EXPIRED:
		if (strcmp(optarg, "fail") && strcmp(optarg, "fresh"))
			return ckpt_usage_error("--if-expired wants \"fail\" or \"fresh\", not \"%s\"", optarg);
		o->if_expired = optarg;
		return 0;
	case OPT_VERIFY:
		o->verify = true;
		return 0;
	case OPT_AGAINST:
		o->against = optarg;
		return 0;
	case OPT_OUTPUT:
		o->output = optarg;
		return 0;
	case OPT_DROP_CHECKPOINTS:
		o->drop_checkpoints = true;
		return 0;
	}
	return CKPT_EXIT_USAGE; /* getopt printed the message */
}

#define OPT_BIT(o) (1u << ((o)-OPT_URL))

struct ckpt_command {
	const char *name;
	int n_args;    /* positional arguments after the command; -1: one, optional */
	unsigned opts; /* command-specific options it accepts */
	const char *arg_name;
	int (*run)(const struct cli_opts *o, const char *arg);
	const char *help; /* `ckpt help CMD`, `ckpt CMD --help` */
};

static const struct ckpt_command ckpt_commands[] = {
	{ "create", 1, OPT_BIT(OPT_TTL) | OPT_BIT(OPT_LABEL) | OPT_BIT(OPT_ASYNC) | OPT_BIT(OPT_QUIET), "NAME",
	  cli_cmd_create,
	  "Usage: ckpt create NAME [--ttl SECS] [--label K=V]... [--async] [-q]\n"
	  "Make a checkpoint of every managed root.\n"
	  "  --ttl SECS     expire after SECS seconds (0: never; default: the daemon's)\n"
	  "  --label K=V    attach a label (repeatable)\n"
	  "  --async        return at once; the checkpoint is then \"creating\"\n"
	  "  -q, --quiet    print the checkpoint id only\n"
	  "On a terminal a bar shows the progress; Ctrl-C leaves the create running.\n" },
	{ "list", 0, OPT_BIT(OPT_NAME) | OPT_BIT(OPT_QUIET), NULL, cli_cmd_list,
	  "Usage: ckpt list [--name NAME] [-q]\n"
	  "List checkpoints, newest first.\n"
	  "  --name NAME    only those named NAME\n"
	  "  -q, --quiet    print ids only, one per line\n" },
	{ "show", 1, 0, "ID", cli_cmd_show,
	  "Usage: ckpt show ID|NAME\n"
	  "Show one checkpoint. A name means its newest active checkpoint.\n" },
	{ "delete", 1, OPT_BIT(OPT_QUIET), "ID", cli_cmd_delete,
	  "Usage: ckpt delete ID|NAME [-q]\n"
	  "Delete a checkpoint and its data; prints `Deleted ID`, the id even when a name\n"
	  "was given (-q: the id alone).\n" },
	{ "restore", 1,
	  OPT_BIT(OPT_FORCE) | OPT_BIT(OPT_IF_EXPIRED) | OPT_BIT(OPT_VERIFY) | OPT_BIT(OPT_YES) | OPT_BIT(OPT_DRY_RUN),
	  "ID", cli_cmd_restore,
	  "Usage: ckpt restore ID|NAME [--force] [--if-expired fail|fresh] [--verify] [--yes] [--dry-run]\n"
	  "Roll every managed root back to a checkpoint, stopping and starting the units\n"
	  "that use the roots.\n"
	  "  --force               restore an expired checkpoint anyway\n"
	  "  --if-expired fresh    reset the roots to their base if it expired\n"
	  "  --verify              compare the roots with the checkpoint after the swap\n"
	  "  -y, --yes             do not ask (a terminal asks before restoring)\n"
	  "  --dry-run             show what would be restored; change nothing\n" },
	{ "fork", 2, 0, "ID and DIR", cli_cmd_fork,
	  "Usage: ckpt fork ID|NAME DIR\n"
	  "Mount a writable copy of a checkpoint at DIR, an existing empty directory\n"
	  "outside the managed roots and the state dir. Writes there touch neither the\n"
	  "roots nor other forks. Prints the fork id.\n" },
	{ "forks", 0, 0, NULL, cli_cmd_forks, "Usage: ckpt forks\nList forks: id, checkpoint, directory.\n" },
	{ "fork-delete", 1, 0, "FORK_ID", cli_cmd_fork_delete,
	  "Usage: ckpt fork-delete FORK_ID\n"
	  "Unmount a fork and remove its data; its directory stays, empty.\n" },
	{ "diff", 1, OPT_BIT(OPT_AGAINST), "ID", cli_cmd_diff,
	  "Usage: ckpt diff ID|NAME [--against ID|NAME]\n"
	  "What changed from a checkpoint to the live roots (or to another checkpoint),\n"
	  "one path a line like `git status --short`: A added, D deleted, M modified\n"
	  "(content, mode or owner), T type changed.\n" },
	{ "health", 0, 0, NULL, cli_cmd_health, "Usage: ckpt health\nThe daemon's health.\n" },
	{ "status", 0, 0, NULL, cli_cmd_status,
	  "Usage: ckpt status\nA short summary of health: warnings (processes using a root that no\n"
	  "managed unit covers), backend, roots, how each root's changes are tracked\n"
	  "(fanotify, inotify or none, and why), checkpoints, the units restarted at adoption.\n" },
	{ "export", 1, OPT_BIT(OPT_OUTPUT), "ID", cli_cmd_export,
	  "Usage: ckpt export ID|NAME -o FILE\n"
	  "Write a checkpoint as one portable archive (pax tar, zstd) to FILE (\"-\": stdout).\n"
	  "  -o, --output FILE  where the archive goes; written as FILE.part, renamed when complete\n"
	  "On a terminal a bar shows the progress.\n" },
	{ "import", 1, 0, "FILE", cli_cmd_import,
	  "Usage: ckpt import FILE\n"
	  "Make a new checkpoint from an archive made by `ckpt export` (FILE \"-\": stdin is not\n"
	  "supported; the size must be known). Prints the new record; import_of names the\n"
	  "exported checkpoint. On a terminal a bar shows the upload.\n" },
	{ "push", 2, 0, "ID and REF", cli_cmd_push,
	  "Usage: ckpt push ID|NAME HOST[:PORT]/REPO[:TAG]\n"
	  "Push a checkpoint to a registry as an OCI image: its base layer and the layer of\n"
	  "what it changed. The tag defaults to the checkpoint's name (else its id). Layers\n"
	  "the registry holds are not sent again. On a terminal a bar shows the progress.\n" },
	{ "pull", 1, 0, "REF", cli_cmd_pull,
	  "Usage: ckpt pull HOST[:PORT]/REPO:TAG|HOST[:PORT]/REPO@sha256:HEX\n"
	  "Make a new checkpoint from a registry image (one ckptd pushed, or any image whose\n"
	  "layers hold the roots' paths). Prints the new record; pull_of names the image.\n" },
	{ "release", -1, OPT_BIT(OPT_DROP_CHECKPOINTS), "ROOT", cli_cmd_release,
	  "Usage: ckpt release [ROOT] [--drop-checkpoints]\n"
	  "Stop managing ROOT (default: every root) and leave there a plain directory\n"
	  "holding what it shows now. The units using it are stopped and started again.\n"
	  "Until ckptd restarts (and adopts the root again) it makes no checkpoint and\n"
	  "restores none. Tar checkpoints are kept and restore after that; overlay\n"
	  "checkpoints need the directory release replaces and must be dropped:\n"
	  "  --drop-checkpoints  delete every checkpoint (export the ones to keep first)\n" },
};

static const struct ckpt_command *ckpt_find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(ckpt_commands) / sizeof(ckpt_commands[0]); i++)
		if (strcmp(ckpt_commands[i].name, name) == 0)
			return &ckpt_commands[i];
	return NULL;
}

/* Edit distance, for "did you mean". */
static size_t ckpt_distance(const char *a, const char *b)
{
	size_t lb = strlen(b), row[32];
	if (lb >= 32)
		return 99;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; a[i - 1]; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
			if (row[j] + 1 < best)
				best = row[j] + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

static const char *ckpt_nearest_command(const char *name)
{
	static const char *const extra[] = { "help", "version" };
	const char *best = NULL;
	size_t best_d = 3; /* at most two edits away */
	for (size_t i = 0; i < sizeof(ckpt_commands) / sizeof(ckpt_commands[0]) + 2; i++) {
		size_t n = sizeof(ckpt_commands) / sizeof(ckpt_commands[0]);
		const char *c = i < n ? ckpt_commands[i].name : extra[i - n];
		size_t d = strlen(name) < 32 ? ckpt_distance(name, c) : 99;
		if (d < best_d || (strncmp(name, c, strlen(name)) == 0 && strlen(name) >= 2 && !best)) {
			best = c;
			best_d = d;
		}
	}
	return best;
}

static int ckpt_unknown_command(const char *name)
{
	const char *near = ckpt_nearest_command(name);
	fprintf(stderr, "ckpt: unknown command \"%s\"", name);
	if (near)
		fprintf(stderr, "; did you mean \"%s\"?", near);
	fputs("\nTry 'ckpt --help'.\n", stderr);
	return CKPT_EXIT_USAGE;
}

/* `ckpt help [CMD]`. */
static int ckpt_help(const char *name)
{
	if (!name) {
		fputs(ckpt_usage, stdout);
		return CKPT_EXIT_OK;
	}
	const struct ckpt_command *cmd = ckpt_find_command(name);
	if (!cmd)
		return ckpt_unknown_command(name);
	fputs(cmd->help, stdout);
	return CKPT_EXIT_OK;
}

/* One random key per run of ckpt: every POST it makes may then be retried
 * without doing the work twice. Without randomness, no key and no retry. */
static void ckpt_idempotency_key(char *buf, size_t len)
{
	unsigned char raw[16];
	buf[0] = '\0';
	if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw) || len < 2 * sizeof(raw) + 6)
		return;
	size_t o = (size_t)snprintf(buf, len, "ckpt-");
	for (size_t i = 0; i < sizeof(raw); i++)
		o += (size_t)snprintf(buf + o, len - o, "%02x", raw[i]);
}

/* Where the daemon is: flags first, then $CKPTD_SOCKET, $CKPTD_URL, the default. */
static int ckpt_resolve_conn(struct cli_opts *o, const struct ckpt_args *a)
{
	if (a->url && a->socket)
		return ckpt_usage_error("%s", "--url and --socket exclude each other");
	const char *url = a->url, *sock = a->socket;
	if (!url && !sock) {
		sock = getenv("CKPTD_SOCKET");
		if (sock && !*sock)
			sock = NULL;
		url = sock ? NULL : getenv("CKPTD_URL");
		if (url && !*url)
			url = NULL;
	}
	if (url && strncmp(url, "unix:", 5) == 0) {
		sock = url + 5;
		url = NULL;
	}
	o->conn.socket_path = sock ? strdup(sock) : NULL;
	/* Over a unix socket the host part only fills the Host header. */
	o->conn.base_url = strdup(sock ? "http://localhost" : url ? url : CKPT_DEFAULT_URL);
	if (!o->conn.base_url)
		return CKPT_EXIT_SERVER;
	size_t n = strlen(o->conn.base_url);
	while (n > 0 && o->conn.base_url[n - 1] == '/')
		o->conn.base_url[--n] = '\0';
	return 0;
}

static int ckpt_resolve_token(struct cli_opts *o, const struct ckpt_args *a)
{
	if (a->token_file) {
		int r = ckpt_read_token(a->token_file, &o->conn.token);
		if (r < 0) {
			fprintf(stderr, "ckpt: cannot read token file %s: %s\n", a->token_file, strerror(-r));
			return CKPT_EXIT_USAGE;
		}
		if (!*o->conn.token)
			return ckpt_usage_error("token file %s is empty", a->token_file);
		return 0;
	}
	const char *env = getenv("CKPTD_TOKEN");
	if (env && *env)
		o->conn.token = strdup(env);
	return 0;
}

static int ckpt_parse(int argc, char **argv, struct cli_opts *o, struct ckpt_args *a)
{
	int c;
	opterr = 0; /* our messages, in the style of the others */
	while ((c = getopt_long(argc, argv, ":hVqyo:", ckpt_options, NULL)) != -1) {
		if (c == ':')
			return ckpt_usage_error("option %s needs a value", argv[optind - 1]);
		if (c == '?') {
			if (optopt) {
				char opt[3] = { '-', (char)optopt, '\0' };
				return ckpt_usage_error("unknown option %s", opt);
			}
			return ckpt_usage_error("unknown option %s", argv[optind - 1]);
		}
		int r = ckpt_parse_opt(c, o, a);
		if (r)
			return r;
	}
	return 0;
}

static int ckpt_check_command(const struct ckpt_command *cmd, const struct ckpt_args *a, int n_args, char **args)
{
	if (a->used & ~cmd->opts)
		return ckpt_usage_error("an option does not apply to this command (first: --%s)", a->only);
	if (n_args < cmd->n_args)
		return ckpt_usage_error("missing %s", cmd->arg_name);
	int most = cmd->n_args < 0 ? 1 : cmd->n_args;
	if (n_args > most)
		return ckpt_usage_error("unexpected argument \"%s\"", args[most]);
	return 0;
}

static int ckpt_main(int argc, char **argv, struct cli_opts *o)
{
	struct ckpt_args a = { 0 };
	int r = ckpt_parse(argc, argv, o, &a);
	if (r)
		return r < 0 ? CKPT_EXIT_OK : r;
	if (optind >= argc) {
		if (a.help)
			return ckpt_help(NULL);
		return ckpt_usage_error("%s", "missing command");
	}
	if (strcmp(argv[optind], "help") == 0)
		return optind + 2 < argc ? ckpt_usage_error("unexpected argument \"%s\"", argv[optind + 2])
					 : ckpt_help(optind + 1 < argc ? argv[optind + 1] : NULL);
	if (strcmp(argv[optind], "version") == 0) {
		puts("ckpt " CKPTD_VERSION);
		return CKPT_EXIT_OK;
	}
	const struct ckpt_command *cmd = ckpt_find_command(argv[optind]);
	if (!cmd)
		return ckpt_unknown_command(argv[optind]);
	if (a.help)
		return ckpt_help(cmd->name);
	r = ckpt_check_command(cmd, &a, argc - optind - 1, argv + optind + 1);
	if (!r)
		r = ckpt_resolve_conn(o, &a);
	if (!r)
		r = ckpt_resolve_token(o, &a);
	if (r)
		return r;
	o->tty = isatty(STDOUT_FILENO);
	if (cmd->n_args > 1)
		o->arg2 = argv[optind + 2];
	ckpt_idempotency_key(o->conn.idem_key, sizeof(o->conn.idem_key));
	return cmd->run(o, cmd->n_args && optind + 1 < argc ? argv[optind + 1] : NULL);
}

int main(int argc, char **argv)
{
	struct cli_opts o = { .labels = json_object() };
	if (!o.labels || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		fputs("ckpt: cannot initialise\n", stderr);
		return CKPT_EXIT_SERVER;
	}
	int rc = ckpt_main(argc, argv, &o);
	fflush(stdout);
	json_decref(o.labels);
	free(o.conn.base_url);
	free(o.conn.socket_path);
	free(o.conn.token);
	curl_global_cleanup();
	return rc;
}
