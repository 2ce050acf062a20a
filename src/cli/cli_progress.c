/* cli_progress.c: a progress bar and a spinner on one terminal line. Only
 * called when stdout is a tty; each frame rewrites the line with \r + EL. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include "cli/cli.h"

#define CLI_BAR_MAX 30
#define CLI_BAR_MIN 10
#define CLI_SPIN_MS 100

int64_t cli_progress_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static unsigned cli_progress_cols(void)
{
	struct winsize ws;
	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
		return ws.ws_col;
	return 80;
}

void cli_progress_start(struct cli_progress *p, const char *label)
{
	memset(p, 0, sizeof(*p));
	p->label = label;
	p->start_ms = cli_progress_now_ms();
}

static double cli_progress_elapsed(const struct cli_progress *p)
{
	return (double)(cli_progress_now_ms() - p->start_ms) / 1000.0;
}

static void cli_progress_emit(struct cli_progress *p, const char *line)
{
	/* Cut to the terminal width so the line never wraps (wrapping breaks \r). */
	unsigned cols = cli_progress_cols();
	printf("\r\033[K%.*s", (int)(cols - 1), line);
	fflush(stdout);
	p->last_ms = cli_progress_now_ms();
	p->drawn = true;
	p->frame++;
}

static uint64_t cli_progress_get(json_t *o, const char *key)
{
	json_int_t v = json_integer_value(json_object_get(o, key));
	return v > 0 ? (uint64_t)v : 0;
}

void cli_progress_bar(struct cli_progress *p, json_t *progress)
{
	uint64_t bd = cli_progress_get(progress, "bytes_done"), bt = cli_progress_get(progress, "bytes_total");
	uint64_t fd = cli_progress_get(progress, "files_done"), ft = cli_progress_get(progress, "files_total");
	if (bt == 0 && ft == 0) {
		cli_progress_spin(p);
		return;
	}
	/* Bytes drive the bar; a tree of empty files still moves by file count. */
	double frac = bt ? (double)bd / (double)bt : (double)fd / (double)ft;
	if (frac > 1.0)
		frac = 1.0;
	char bar[CLI_BAR_MAX + 1], a[32], b[32], files[64] = "", tail[200], line[512];
	if (ft)
		snprintf(files, sizeof(files), "  %" PRIu64 "/%" PRIu64 " files", fd, ft);
	snprintf(tail, sizeof(tail), " %3d%%  %s / %s%s  %.1fs", (int)(frac * 100.0), cli_out_size(bd, a, sizeof(a)),
		 cli_out_size(bt, b, sizeof(b)), files, cli_progress_elapsed(p));
	/* The bar takes what the label and the numbers leave of the line. */
	int room = (int)cli_progress_cols() - 1 - (int)strlen(p->label) - (int)strlen(tail) - 3;
	int width = room > CLI_BAR_MAX ? CLI_BAR_MAX : room < CLI_BAR_MIN ? CLI_BAR_MIN : room;
	int fill = (int)(frac * width);
	for (int i = 0; i < width; i++)
		bar[i] = i < fill ? '#' : i == fill ? '>' : '.';
	bar[width] = '\0';
	snprintf(line, sizeof(line), "%s [%s]%s", p->label, bar, tail);
	cli_progress_emit(p, line);
}

void cli_progress_spin(struct cli_progress *p)
{
	static const char frames[] = "|/-\\";
	char line[512];
	int64_t now = cli_progress_now_ms();
	if (p->drawn && now - p->last_ms < CLI_SPIN_MS)
		return; /* curl wakes us on every packet: keep a steady pace */
	snprintf(line, sizeof(line), "%c %s ... %.1fs", frames[p->frame % 4], p->label, cli_progress_elapsed(p));
	cli_progress_emit(p, line);
}

void cli_progress_end(struct cli_progress *p, bool keep)
{
	if (!p->drawn)
		return;
	fputs(keep ? "\n" : "\r\033[K", stdout);
	fflush(stdout);
	p->drawn = false;
}
