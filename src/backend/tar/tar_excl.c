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

/* What the roots leave out now, for GET /v1/health; or why it is unknown. */
void tar_excl_health(const struct tar_state *s, struct backend_tar_health *out)
{
	ckpt_error err = { 0 };
	if (tar_excl_build(s, &out->excluded, &err) < 0)
		snprintf(out->excluded_error, sizeof(out->excluded_error), "%s", err.msg);
}
