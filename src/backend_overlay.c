/* backend_overlay.c: placeholder until the overlay backend lands. */
#include "backend.h"
static int overlay_probe(const struct backend_ctx *ctx, ckpt_error *err)
{
	(void)ctx;
	return err_set(err, ENOTSUP, NULL, "overlay backend not built yet");
}
const struct backend_ops backend_overlay_ops = { .name = "overlay", .probe = overlay_probe };
