/* locks_etcd.h: sandbox locks as etcd keys, through etcd's v3 JSON gateway
 * (libcurl + jansson). The ops table of locks.h with:
 *   {prefix}lock/{id} = {"owner": me}, attached to a lease of its own (ttl
 *     seconds, the taker's ttl + margin), kept alive by renew;
 *   taken with a txn comparing create_revision == 0, so one taker wins;
 *   the fencing token is the key's mod_revision (it only grows, across lock
 *     generations); every fenced write and ack compares it in a txn first;
 *   a waiter puts {prefix}wait/{id}; one watch stream over the prefix tells
 *     the owner of a waiter (on_waiter) and wakes waiters (locks_wait) when
 *     a lock is released. */
#pragma once
#include "host/etcd_http.h"
#include "host/locks.h"

extern const struct locks_ops locks_etcd_ops;

/* Connect L to etcd (conf: endpoints tried in turn, TLS files, user), log
 * in, check that etcd answers and lets us read prefix, and start the watch
 * thread. on_waiter(ctx, id) runs on that thread when another instance
 * starts waiting for lock id. */
int locks_etcd_open(struct locks *L, const struct etcd_http_conf *conf, const char *prefix,
		    void (*on_waiter)(void *ctx, const char *id), void *ctx, ckpt_error *err);
/* Stop the watch thread and free; leases left run out on their own. */
void locks_etcd_close(struct locks *L);
