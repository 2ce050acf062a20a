/* services.c: placeholder until the sd-bus services module lands. */
#include "services.h"

struct services { int unused; };

void svc_report_init(struct svc_report *r)
{
	r->stopped = json_array();
	r->started = json_array();
	r->failed = json_array();
	r->frozen = json_array();
	r->failures = json_object();
}

void svc_report_free(struct svc_report *r)
{
	json_decref(r->stopped);
	json_decref(r->started);
	json_decref(r->failed);
	json_decref(r->frozen);
	json_decref(r->failures);
	memset(r, 0, sizeof(*r));
}

int services_open(const struct config *cfg, char *const *roots, size_t n_roots, struct services **ret, ckpt_error *err)
{
	(void)cfg; (void)roots; (void)n_roots; (void)err;
	*ret = calloc(1, sizeof(**ret));
	return *ret ? 0 : -ENOMEM;
}
void services_close(struct services *s) { free(s); }
bool services_available(struct services *s) { (void)s; return false; }
const char *services_unavailable_reason(struct services *s) { (void)s; return "services module not built"; }
int services_stop(struct services *s, struct svc_report *rep) { (void)s; (void)rep; return 0; }
int services_start(struct services *s, struct svc_report *rep) { (void)s; (void)rep; return 0; }
int services_freeze(struct services *s, struct svc_report *rep) { (void)s; (void)rep; return 0; }
int services_thaw(struct services *s, struct svc_report *rep) { (void)s; (void)rep; return 0; }
