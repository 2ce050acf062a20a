/* reaper.h: a forked child that knows this instance's containers and runs
 * `runsc delete -force` on each of them when ckptd exits for any reason
 * (kill -9 included): its pipe closes and it cleans up. So a takeover never
 * finds a second running copy left by a dead instance. */
#pragma once
#include "host/runsc.h"

/* Take lock_path from the reaper of a previous run (waiting for it), remove
 * the containers left in our runsc root, and fork the reaper, which holds
 * the lock until it is done; *ret_fd gets the write end of its pipe
 * (O_CLOEXEC). */
int reaper_start(const struct runsc *rs, const char *lock_path, int *ret_fd);
/* Tell the reaper about a container: op '+' (created) or '-' (removed). */
void reaper_note(int fd, char op, const char *container);
