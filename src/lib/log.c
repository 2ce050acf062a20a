/* log.c: ckptd's log. Under journald (stderr is the stream named by
 * JOURNAL_STREAM) every event is sent with sd_journal_send, so that its fields
 * (OPERATION, CHECKPOINT_ID, UNIT, DURATION_MS) can be queried with journalctl;
 * anywhere else it is one line on stderr with a UTC timestamp. */
#include "lib/util.h"

#include <inttypes.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>
#include <time.h>

static bool log_journal, log_verbose;

/* journald sets JOURNAL_STREAM=DEV:INO for the stream it reads; it counts only
 * when that is still our stderr (a child of a unit may have been redirected). */
static bool log_stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_init(bool verbose)
{
	log_journal = log_stderr_is_journal();
	log_verbose = verbose;
}

bool log_is_verbose(void)
{
	return log_verbose;
}

#define LOG_FIELDS_MAX 8

static void log_journal_send(int prio, const struct log_fields *f, const char *msg)
{
	char buf[LOG_FIELDS_MAX][96];
	struct iovec iov[LOG_FIELDS_MAX + 1];
	int n = 0;
	_cleanup_free_ char *message = NULL;
	if (asprintf(&message, "MESSAGE=%s", msg) < 0)
		return;
	iov[n++] = (struct iovec){ message, strlen(message) };
#define LOG_FIELD(...)                                             \
	do {                                                       \
		snprintf(buf[n], sizeof(buf[n]), __VA_ARGS__);     \
		iov[n] = (struct iovec){ buf[n], strlen(buf[n]) }; \
		n++;                                               \
	} while (0)
	LOG_FIELD("PRIORITY=%d", prio);
	LOG_FIELD("SYSLOG_IDENTIFIER=ckptd");
	if (f && f->operation)
		LOG_FIELD("OPERATION=%s", f->operation);
	if (f && f->checkpoint_id)
		LOG_FIELD("CHECKPOINT_ID=%s", f->checkpoint_id);
	if (f && f->unit)
		LOG_FIELD("UNIT=%s", f->unit);
	if (f && f->duration_ms >= 0)
		LOG_FIELD("DURATION_MS=%" PRId64, f->duration_ms);
#undef LOG_FIELD
	if (sd_journal_sendv(iov, n) < 0)
		fprintf(stderr, "<%d>%s\n", prio, msg); /* the stream still reaches journald */
}

static void log_line(int prio, const struct log_fields *f, const char *msg)
{
	static const char *names[] = { "emerg", "alert", "crit", "error", "warning", "notice", "info", "debug" };
	char when[40], extra[256] = "";
	fmt_rfc3339_ms(now_ms(), when, sizeof(when));
	if (f) {
		size_t o = 0;
		if (f->operation)
			o += (size_t)snprintf(extra + o, sizeof(extra) - o, " op=%s", f->operation);
		if (f->checkpoint_id && o < sizeof(extra))
			o += (size_t)snprintf(extra + o, sizeof(extra) - o, " id=%s", f->checkpoint_id);
		if (f->unit && o < sizeof(extra))
			o += (size_t)snprintf(extra + o, sizeof(extra) - o, " unit=%s", f->unit);
		if (f->duration_ms >= 0 && o < sizeof(extra))
			snprintf(extra + o, sizeof(extra) - o, " duration_ms=%" PRId64, f->duration_ms);
	}
	fprintf(stderr, "%s ckptd[%d]: %s: %s%s%s%s\n", when, (int)getpid(), names[prio & 7], msg, *extra ? " [" : "",
		*extra ? extra + 1 : "", *extra ? "]" : "");
}

static void log_vevent(int prio, const struct log_fields *f, const char *fmt, va_list ap)
{
	char msg[2048];
	if (prio >= LOG_DEBUG_ && !log_verbose)
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (log_journal)
		log_journal_send(prio, f, msg);
	else
		log_line(prio, f, msg);
}

void log_msg(int prio, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vevent(prio, NULL, fmt, ap);
	va_end(ap);
}

void log_event(int prio, const struct log_fields *f, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vevent(prio, f, fmt, ap);
	va_end(ap);
}
