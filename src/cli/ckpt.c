/* ckpt.c: main of the ckpt client: the command line, where the daemon is,
 * and the token. The subcommands live in cli_cmd.c. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "cli/cli.h"

#define CKPT_TOKEN_MAX 4096

static const char ckpt_usage[] =
	"Usage: ckpt [--url URL | --socket PATH] [--token-file FILE] [--json] COMMAND [ARGS]\n"
	"\n"
	"Client of ckptd, the in-sandbox filesystem checkpoint and rollback service.\n"
	"\n"
	"Commands:\n"
	"  create NAME [--ttl SECS] [--label K=V]... [--async]   make a checkpoint\n"
	"  list [--name NAME]                                   list checkpoints, newest first\n"
	"  show ID|NAME                                         show one checkpoint\n"
	"  delete ID|NAME                                       delete a checkpoint\n"
	"  restore ID|NAME [--force] [--if-expired fail|fresh] [--verify]  roll the roots back to it\n"
	"  health                                               the daemon's health\n"
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
	OPT_VERIFY,
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
	{ "verify", no_argument, NULL, OPT_VERIFY },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ 0 },
};

/* What the command line said, before it is checked against the command. */
struct ckpt_args {
	const char *url, *socket, *token_file;
	const char *only; /* the first command-specific option seen, for errors */
	unsigned used;    /* bit per command-specific option */
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
		fputs(ckpt_usage, stdout);
		return -1;
	case 'V':
		puts("ckpt " CKPT_VERSION);
		return -1;
	}
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
	case OPT_IF_EXPIRED:
		if (strcmp(optarg, "fail") && strcmp(optarg, "fresh"))
			return ckpt_usage_error("--if-expired wants \"fail\" or \"fresh\", not \"%s\"", optarg);
		o->if_expired = optarg;
		return 0;
	case OPT_VERIFY:
		o->verify = true;
		return 0;
	}
	return CKPT_EXIT_USAGE; /* getopt printed the message */
}

#define OPT_BIT(o) (1u << ((o)-OPT_URL))

struct ckpt_command {
	const char *name;
	int n_args;    /* positional arguments after the command */
	unsigned opts; /* command-specific options it accepts */
	const char *arg_name;
	int (*run)(const struct cli_opts *o, const char *arg);
};

static const struct ckpt_command ckpt_commands[] = {
	{ "create", 1, OPT_BIT(OPT_TTL) | OPT_BIT(OPT_LABEL) | OPT_BIT(OPT_ASYNC), "NAME", cli_cmd_create },
	{ "list", 0, OPT_BIT(OPT_NAME), NULL, cli_cmd_list },
	{ "show", 1, 0, "ID", cli_cmd_show },
	{ "delete", 1, 0, "ID", cli_cmd_delete },
	{ "restore", 1, OPT_BIT(OPT_FORCE) | OPT_BIT(OPT_IF_EXPIRED) | OPT_BIT(OPT_VERIFY), "ID", cli_cmd_restore },
	{ "health", 0, 0, NULL, cli_cmd_health },
};

static const struct ckpt_command *ckpt_find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(ckpt_commands) / sizeof(ckpt_commands[0]); i++)
		if (strcmp(ckpt_commands[i].name, name) == 0)
			return &ckpt_commands[i];
	return NULL;
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
	opterr = 1;
	while ((c = getopt_long(argc, argv, "hV", ckpt_options, NULL)) != -1) {
		if (c == '?' || c == ':')
			return CKPT_EXIT_USAGE;
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
	if (n_args > cmd->n_args)
		return ckpt_usage_error("unexpected argument \"%s\"", args[cmd->n_args]);
	return 0;
}

static int ckpt_main(int argc, char **argv, struct cli_opts *o)
{
	struct ckpt_args a = { 0 };
	int r = ckpt_parse(argc, argv, o, &a);
	if (r)
		return r < 0 ? CKPT_EXIT_OK : r;
	if (optind >= argc)
		return ckpt_usage_error("%s", "missing command");
	const struct ckpt_command *cmd = ckpt_find_command(argv[optind]);
	if (!cmd)
		return ckpt_usage_error("unknown command \"%s\"", argv[optind]);
	r = ckpt_check_command(cmd, &a, argc - optind - 1, argv + optind + 1);
	if (!r)
		r = ckpt_resolve_conn(o, &a);
	if (!r)
		r = ckpt_resolve_token(o, &a);
	if (r)
		return r;
	o->tty = isatty(STDOUT_FILENO);
	return cmd->run(o, cmd->n_args ? argv[optind + 1] : NULL);
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
