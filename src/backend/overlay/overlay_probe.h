/* overlay_probe.h: which overlay keeps every promise of a managed root here. */
#pragma once
#include "backend/overlay/overlay_mount.h"

/* Try the kernel's overlay with redirect_dir=on, then gVisor's (no options),
 * then userxattr (a user namespace), each on a test tree in
 * <state_dir>/overlay with a lower directory renamed and a lower file
 * deleted. 0 with *ret: the first that mounts and does both. Else <0 and
 * err says what each attempt lacked (userxattr: directory renames give EXDEV;
 * gVisor on its gofer root: no whiteouts). */
int overlay_probe(const char *state_dir, struct overlay_opts *ret, ckpt_error *err);
