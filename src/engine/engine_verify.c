/* engine_verify.c: the optional comparison after a restore's swap ("verify":
 * true), before the services start again so nothing they write is blamed. */
#include "engine/engine_internal.h"

#define VERIFY_MAX_DIFFS 20

int64_t engine_verify(struct engine *e, const char *id, json_t *data, json_t *extra)
{
	int64_t t0 = mono_ms(), ms;
	json_t *diffs = json_array();
	ckpt_error err = { 0 };
	int r;

	if (!e->backend->compare)
		r = err_set(&err, EOPNOTSUPP, NULL, "the %s backend cannot verify", e->backend->name);
	else
		r = e->backend->compare->verify(e->bst, id, data, diffs, VERIFY_MAX_DIFFS, &err);
	bool ok = r >= 0 && json_array_size(diffs) == 0;
	ms = mono_ms() - t0;
	json_object_set_new(extra, "verified", json_boolean(ok));
	json_object_set_new(extra, "verify_ms", json_integer(ms));
	json_object_set_new(extra, "verify_differences", diffs);
	if (r < 0)
		json_object_set_new(extra, "verify_error", json_string(err.msg));
	if (ok) {
		log_info("verified the restore of \"%s\" in %lld ms", id ? id : "base", (long long)ms);
		return ms;
	}
	json_object_set_new(extra, "ok", json_false()); /* merged over the report's own */
	log_warn("restore of \"%s\" does not verify: %zu difference(s)%s%s", id ? id : "base", json_array_size(diffs),
		 r < 0 ? ", " : "", r < 0 ? err.msg : "");
	return ms;
}
