/* backend_tar.c: placeholder until the tar backend lands. */
#include "backend.h"
static int tar_probe(const struct backend_ctx *ctx, ckpt_error *err)
{
	(void)ctx;
	return err_set(err, ENOTSUP, NULL, "tar backend not built yet");
}
const struct backend_ops backend_tar_ops = { .name = "tar", .probe = tar_probe };
