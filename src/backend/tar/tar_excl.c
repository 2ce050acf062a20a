/* tar_excl.c: what the tar backend leaves out of the roots (rootexcl.h),
 * built afresh for each create, restore, diff and verify, since mounts come
 * and go; and the list health shows. */
#include "backend/tar/tar_internal.h"

int tar_excl_build(const struct tar_state *s, struct rootexcl *x, ckpt_error *err)
{
	bool whole = s->ctx->whole_root;
	int r = rootexcl_build(x, whole, whole ? s->ctx->state_dir : NULL, s->ctx->excludes, s->ctx->n_excludes,
			       "/proc/self/mountinfo");
	return r < 0 ? err_set(err, -r, NULL, "cannot list what the roots leave out: %s", strerror(-r)) : 0;
}

/* "excluded": [{path, reason}] for GET /v1/health. */
void tar_excl_health(const struct tar_state *s, json_t *out)
{
	struct rootexcl x;
	ckpt_error err = { 0 };
	if (tar_excl_build(s, &x, &err) < 0) {
		json_object_set_new(out, "excluded_error", json_string(err.msg));
		return;
	}
	json_object_set_new(out, "excluded", rootexcl_json(&x));
	rootexcl_free(&x);
}
