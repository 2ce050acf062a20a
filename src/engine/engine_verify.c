/* engine_verify.c: the optional comparison after a restore's swap ("verify":
 * true), before the services start again so nothing they write is blamed. */
#include "engine/engine_internal.h"

void engine_verify(struct engine *e, const char *id, json_t *data, struct verify_report *ret)
{
	int64_t t0 = mono_ms();
	ckpt_error err = { 0 };
	int r;

	*ret = (struct verify_report){ .ran = true };
	if (!e->backend->compare)
		r = err_set(&err, EOPNOTSUPP, NULL, "the %s backend cannot verify", e->backend->name);
	else
		r = e->backend->compare->verify(e->bst, id, data, &ret->differences, VERIFY_MAX_DIFFS, &err);
	ret->verified = r >= 0 && ret->differences.n == 0;
	ret->verify_ms = mono_ms() - t0;
	if (r < 0)
		ret->error = strdup(err.msg);
	if (ret->verified) {
		log_info("verified the restore of \"%s\" in %lld ms", id ? id : "base", (long long)ret->verify_ms);
		return;
	}
	log_warn("restore of \"%s\" does not verify: %zu difference(s)%s%s", id ? id : "base", ret->differences.n,
		 r < 0 ? ", " : "", r < 0 ? err.msg : "");
}
