/* locks_etcd.c: sandbox locks as etcd keys over the v3 JSON gateway (see
 * locks_etcd.h; the transport, TLS and etcd's authentication are in
 * etcd_http.c). int64 fields travel as JSON strings, keys and values in
 * base64. */
#include "host/locks_etcd.h"

#include <nettle/base64.h>
#include <pthread.h>

#include "lib/failpoint.h"

#define WATCH_RETRY_MS 200

struct lease {
	char id[LOCKS_NAME_MAX];
	char lease[32]; /* the lease ID, as etcd writes it */
	uint64_t token; /* the key's mod_revision when we took it */
	struct lease *next;
};

struct locks_etcd {
	struct etcd_http *http;
	char *prefix;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	struct lease *leases; /* the locks we hold */
	uint64_t events;      /* watch events seen: locks_wait waits for it to move */
	bool stop;
	pthread_t watcher;
	bool watcher_started;
	void (*on_waiter)(void *ctx, const char *id);
	void *ctx;
};

static char *b64(const char *s)
{
	size_t n = strlen(s);
	char *out = malloc(BASE64_ENCODE_RAW_LENGTH(n) + 1);
	if (!out)
		return NULL;
	base64_encode_raw(out, n, (const uint8_t *)s);
	out[BASE64_ENCODE_RAW_LENGTH(n)] = '\0';
	return out;
}

/* Decoded text of a base64 JSON string, NUL-terminated; NULL if invalid. */
static char *unb64(json_t *v)
{
	const char *s = json_string_value(v);
	struct base64_decode_ctx ctx;
	size_t n, len;
	char *out;

	if (!s)
		return NULL;
	len = strlen(s);
	if (!(out = malloc(BASE64_DECODE_LENGTH(len) + 1)))
		return NULL;
	base64_decode_init(&ctx);
	n = BASE64_DECODE_LENGTH(len);
	if (!base64_decode_update(&ctx, &n, (uint8_t *)out, len, s) || !base64_decode_final(&ctx)) {
		free(out);
		return NULL;
	}
	out[n] = '\0';
	return out;
}

/* An int64 field: a JSON string (the gateway's way) or a number; 0 if absent. */
static int64_t jint(json_t *v)
{
	if (json_is_integer(v))
		return json_integer_value(v);
	return json_is_string(v) ? strtoll(json_string_value(v), NULL, 10) : 0;
}

static char *key_of(const struct locks_etcd *E, const char *kind, const char *id)
{
	char *k;
	return asprintf(&k, "%s%s/%s", E->prefix, kind, id) < 0 ? NULL : k;
}

/* POST body (stolen) to path on the endpoint that answered last, then the
 * others: 0 with *ret the JSON answer; -EIO when none answered well. */
static int call(struct locks_etcd *E, const char *path, json_t *body, json_t **ret)
{
	return etcd_http_call(E->http, path, body, ret);
}

static struct lease *lease_find(struct locks_etcd *E, const char *id)
{
	for (struct lease *l = E->leases; l; l = l->next)
		if (!strcmp(l->id, id))
			return l;
	return NULL;
}

/* A compare of the lock key's mod_revision with our token. */
static json_t *cmp_token(const char *key64, uint64_t token)
{
	char rev[32];
	snprintf(rev, sizeof(rev), "%llu", (unsigned long long)token);
	return json_pack("[{s:s, s:s, s:s, s:s}]", "key", key64, "result", "EQUAL", "target", "MOD", "mod_revision",
			 rev);
}

static json_t *op_range(const char *key64)
{
	return json_pack("{s:{s:s}}", "request_range", "key", key64);
}

/* The first kv of the i-th response of a txn (a range), or NULL. */
static json_t *txn_kv(json_t *ans, size_t i)
{
	json_t *resp = json_array_get(json_object_get(ans, "responses"), i);
	return json_array_get(json_object_get(json_object_get(resp, "response_range"), "kvs"), 0);
}

/* Fill l from the lock's kv (and the wait key's, if any). */
static int parse_kv(json_t *kv, json_t *wkv, struct lock_info *l)
{
	_cleanup_free_ char *val = unb64(json_object_get(kv, "value"));
	_cleanup_free_ char *w = wkv ? unb64(json_object_get(wkv, "value")) : NULL;
	json_auto_t *o = val ? json_loads(val, 0, NULL) : NULL;
	const char *owner = json_string_value(json_object_get(o, "owner"));

	memset(l, 0, sizeof(*l));
	if (!owner || strlen(owner) >= LOCKS_NAME_MAX)
		return -EBADMSG;
	strcpy(l->owner, owner);
	l->token = (uint64_t)jint(json_object_get(kv, "mod_revision"));
	l->timestamp = now_ms() / 1000; /* etcd keeps time: a lock that exists is live */
	if (w && strlen(w) < LOCKS_NAME_MAX)
		strcpy(l->waiter, w);
	return 0;
}

/* Lock and wait keys in one read; with token, only while the lock's
 * mod_revision is token (-ESTALE otherwise). */
static int read_both(struct locks_etcd *E, const char *id, uint64_t token, struct lock_info *ret)
{
	_cleanup_free_ char *k = key_of(E, "lock", id), *w = key_of(E, "wait", id);
	_cleanup_free_ char *k64 = k ? b64(k) : NULL, *w64 = w ? b64(w) : NULL;
	json_auto_t *ans = NULL;
	int r;

	if (!k64 || !w64)
		return -ENOMEM;
	json_t *req = json_pack("{s:[o,o]}", "success", op_range(k64), op_range(w64));
	if (req && token)
		json_object_set_new(req, "compare", cmp_token(k64, token));
	if ((r = call(E, "/v3/kv/txn", req, &ans)) < 0)
		return r;
	if (token && !json_is_true(json_object_get(ans, "succeeded")))
		return -ESTALE;
	if (!txn_kv(ans, 0))
		return -ENOENT;
	return parse_kv(txn_kv(ans, 0), txn_kv(ans, 1), ret);
}

static int etcd_read(const struct locks *L, const char *id, struct lock_info *ret)
{
	return read_both(L->etcd, id, 0, ret);
}

static int lease_call(struct locks_etcd *E, const char *path, const char *lease, json_t **ans)
{
	return call(E, path, json_pack("{s:s}", "ID", lease), ans);
}

static void lease_revoke(struct locks_etcd *E, const char *lease)
{
	json_auto_t *ans = NULL;
	lease_call(E, "/v3/lease/revoke", lease, &ans);
}

static int etcd_renew(const struct locks *L, const char *id, const char *me, uint64_t token, int64_t now,
		      char ret_waiter[LOCKS_NAME_MAX])
{
	struct locks_etcd *E = L->etcd;
	char lease[32] = "";
	json_auto_t *ans = NULL;
	struct lock_info l;
	int r;

	(void)now;
	pthread_mutex_lock(&E->mu);
	struct lease *le = lease_find(E, id);
	if (le && le->token == token)
		memcpy(lease, le->lease, sizeof(lease));
	pthread_mutex_unlock(&E->mu);
	if (!lease[0])
		return -ESTALE;
	if ((r = lease_call(E, "/v3/lease/keepalive", lease, &ans)) < 0)
		return r;
	if (jint(json_object_get(json_object_get(ans, "result"), "TTL")) <= 0)
		return -ESTALE; /* the lease ran out: its key is gone */
	if ((r = read_both(E, id, token, &l)) < 0)
		return r == -ENOENT ? -ESTALE : r;
	if (strcmp(l.owner, me))
		return -ESTALE;
	if (ret_waiter)
		strcpy(ret_waiter, l.waiter);
	return 0;
}

static int etcd_acquire(const struct locks *L, const char *id, const char *me, int64_t ttl, int64_t now,
			struct lock_info *cur, uint64_t *ret_token)
{
	struct locks_etcd *E = L->etcd;
	_cleanup_free_ char *k = key_of(E, "lock", id), *w = key_of(E, "wait", id);
	_cleanup_free_ char *k64 = k ? b64(k) : NULL, *w64 = w ? b64(w) : NULL;
	json_auto_t *val = json_pack("{s:s}", "owner", me);
	_cleanup_free_ char *vtext = val ? json_dumps(val, JSON_COMPACT) : NULL;
	_cleanup_free_ char *v64 = vtext ? b64(vtext) : NULL;
	json_auto_t *granted = NULL, *ans = NULL;
	char lease[32];
	int r;

	if (!k64 || !w64 || !v64)
		return -ENOMEM;
	pthread_mutex_lock(&E->mu);
	struct lease *mine = lease_find(E, id);
	uint64_t held = mine ? mine->token : 0;
	pthread_mutex_unlock(&E->mu);
	if (held && etcd_renew(L, id, me, held, now, NULL) == 0)
		return *ret_token = held, 0;
	if ((r = call(E, "/v3/lease/grant", json_pack("{s:I}", "TTL", (json_int_t)ttl), &granted)) < 0)
		return r;
	snprintf(lease, sizeof(lease), "%lld", (long long)jint(json_object_get(granted, "ID")));
	if (!strcmp(lease, "0"))
		return -EIO;
	/* create_revision == 0: the key does not exist; the put and the removal
	 * of the wait key happen together or not at all */
	json_t *req = json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:{s:s, s:s, s:s}}, {s:{s:s}}], s:[o]}", "compare",
				"key", k64, "result", "EQUAL", "target", "CREATE", "create_revision", "0", "success",
				"request_put", "key", k64, "value", v64, "lease", lease, "request_delete_range", "key",
				w64, "failure", op_range(k64));
	if ((r = FAILPOINT_AROUND("host.etcd.take", call(E, "/v3/kv/txn", req, &ans))) < 0) {
		lease_revoke(E, lease);
		return r;
	}
	if (!json_is_true(json_object_get(ans, "succeeded"))) {
		lease_revoke(E, lease);
		if (cur && txn_kv(ans, 0))
			parse_kv(txn_kv(ans, 0), NULL, cur);
		else if (cur)
			memset(cur, 0, sizeof(*cur));
		return -EBUSY;
	}
	/* the put is the txn's only write: the key's mod_revision is the revision */
	uint64_t token = (uint64_t)jint(json_object_get(json_object_get(ans, "header"), "revision"));
	struct lease *le = calloc(1, sizeof(*le));
	if (!le || token == 0) {
		free(le);
		lease_revoke(E, lease);
		return token ? -ENOMEM : -EIO;
	}
	snprintf(le->id, sizeof(le->id), "%s", id);
	memcpy(le->lease, lease, sizeof(le->lease));
	le->token = token;
	pthread_mutex_lock(&E->mu);
	if ((mine = lease_find(E, id))) /* an older generation of ours: replaced */
		memcpy(mine->lease, lease, sizeof(lease)), mine->token = token, free(le);
	else
		le->next = E->leases, E->leases = le;
	pthread_mutex_unlock(&E->mu);
	*ret_token = token;
	return 0;
}

static int etcd_check(const struct locks *L, const char *id, const char *me, uint64_t token)
{
	struct lock_info l;
	int r = read_both(L->etcd, id, token, &l);
	if (r == -ENOENT)
		return -ESTALE;
	return r < 0 ? r : strcmp(l.owner, me) ? -ESTALE : 0;
}

static int etcd_add_waiter(const struct locks *L, const char *id, const char *me)
{
	struct locks_etcd *E = L->etcd;
	_cleanup_free_ char *w = key_of(E, "wait", id);
	_cleanup_free_ char *w64 = w ? b64(w) : NULL, *v64 = b64(me);
	json_auto_t *ans = NULL;

	if (!w64 || !v64)
		return -ENOMEM;
	return FAILPOINT_AROUND("host.etcd.waiter",
				call(E, "/v3/kv/put", json_pack("{s:s, s:s}", "key", w64, "value", v64), &ans));
}

static int etcd_release(const struct locks *L, const char *id, const char *me, uint64_t token)
{
	struct locks_etcd *E = L->etcd;
	_cleanup_free_ char *k = key_of(E, "lock", id);
	_cleanup_free_ char *k64 = k ? b64(k) : NULL;
	struct lease *le, **pp;
	json_auto_t *ans = NULL;

	(void)me, (void)token; /* the lease we keep for id knows its generation */
	pthread_mutex_lock(&E->mu);
	for (pp = &E->leases; *pp && strcmp((*pp)->id, id); pp = &(*pp)->next)
		;
	le = *pp;
	if (le)
		*pp = le->next;
	pthread_mutex_unlock(&E->mu);
	if (!le)
		return 0;
	/* delete only our generation (a waiter watches for this), then drop
	 * the lease, which would remove the key anyway */
	if (k64)
		(void)FAILPOINT_AROUND("host.etcd.release",
				       call(E, "/v3/kv/txn",
					    json_pack("{s:o, s:[{s:{s:s}}]}", "compare", cmp_token(k64, le->token),
						      "success", "request_delete_range", "key", k64),
					    &ans));
	FAILPOINT("host.etcd.revoke.before");
	lease_revoke(E, le->lease);
	FAILPOINT("host.etcd.revoke.after");
	free(le);
	return 0;
}

static int etcd_wait(const struct locks *L, const char *id, int timeout_ms)
{
	struct locks_etcd *E = L->etcd;
	struct timespec ts;

	(void)id; /* any event wakes every waiter: each one retries its lock */
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += (long)timeout_ms * 1000000L;
	ts.tv_sec += ts.tv_nsec / 1000000000L;
	ts.tv_nsec %= 1000000000L;
	pthread_mutex_lock(&E->mu);
	uint64_t seen = E->events;
	while (E->events == seen && !E->stop)
		if (pthread_cond_timedwait(&E->cond, &E->mu, &ts) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&E->mu);
	return 0;
}

const struct locks_ops locks_etcd_ops = {
	.name = "etcd",
	.read = etcd_read,
	.acquire = etcd_acquire,
	.renew = etcd_renew,
	.check = etcd_check,
	.add_waiter = etcd_add_waiter,
	.release = etcd_release,
	.wait = etcd_wait,
};

struct stream {
	struct locks_etcd *E;
	struct etcd_http_buf b;
	bool failed; /* the stream answered an error: reconnect */
};

/* One message of the watch stream: tell the owner of a waiter, wake waiters.
 * An error (a stale token, a cancelled watch) ends the stream. */
static void watch_message(struct stream *s, json_t *msg)
{
	struct locks_etcd *E = s->E;
	json_t *res = json_object_get(msg, "result"), *evs = json_object_get(res, "events"), *ev, *e;
	size_t i, plen = strlen(E->prefix);

	if ((e = json_object_get(msg, "error")) || json_is_true(json_object_get(res, "canceled"))) {
		const char *why = json_string_value(json_is_object(e) ? json_object_get(e, "message") : e);
		if (!why)
			why = json_string_value(json_object_get(res, "cancel_reason"));
		etcd_http_stream_error(E->http, why ? why : "the watch was cancelled");
		s->failed = true;
		return;
	}
	json_array_foreach (evs, i, ev) {
		_cleanup_free_ char *key = unb64(json_object_get(json_object_get(ev, "kv"), "key"));
		const char *type = json_string_value(json_object_get(ev, "type"));
		bool put = !type || !strcmp(type, "PUT");

		if (key && put && !strncmp(key, E->prefix, plen) && !strncmp(key + plen, "wait/", 5))
			E->on_waiter(E->ctx, key + plen + 5);
		pthread_mutex_lock(&E->mu);
		E->events++;
		pthread_cond_broadcast(&E->cond);
		pthread_mutex_unlock(&E->mu);
	}
}

/* The gateway streams one JSON object per message: parse whole ones. */
static size_t watch_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct stream *s = arg;
	size_t n = size * nmemb;

	if (etcd_http_collect(data, size, nmemb, &s->b) != n)
		return 0;
	while (!s->failed) {
		json_error_t jerr;
		json_t *msg = json_loadb(s->b.p, s->b.len, JSON_DISABLE_EOF_CHECK, &jerr);
		if (!msg)
			break;
		watch_message(s, msg);
		json_decref(msg);
		size_t used = (size_t)jerr.position;
		memmove(s->b.p, s->b.p + used, s->b.len - used + 1);
		s->b.len -= used;
	}
	return s->failed ? 0 : n;
}

static bool stopping(struct locks_etcd *E)
{
	pthread_mutex_lock(&E->mu);
	bool s = E->stop;
	pthread_mutex_unlock(&E->mu);
	return s;
}

static int watch_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
	(void)a, (void)b, (void)c, (void)d;
	return stopping(arg) ? 1 : 0;
}

/* A key and the end of its range: [prefix, prefix with its last byte + 1). */
static json_t *prefix_range(const char *prefix)
{
	_cleanup_free_ char *p64 = b64(prefix), *end = strdup(prefix), *e64 = NULL;

	if (!p64 || !end)
		return NULL;
	end[strlen(end) - 1]++;
	if (!(e64 = b64(end)))
		return NULL;
	return json_pack("{s:s, s:s}", "key", p64, "range_end", e64);
}

/* The watch request for our prefix. */
static char *watch_body(const char *prefix)
{
	json_t *range = prefix_range(prefix);
	json_auto_t *req = range ? json_pack("{s:o}", "create_request", range) : NULL;
	return req ? json_dumps(req, JSON_COMPACT) : NULL;
}

/* The watch stream over our prefix, reconnected (to the next endpoint) when
 * it breaks. Events missed meanwhile are caught by renew's read of the wait
 * key and the waiters' own retries. */
static void *watch_main(void *arg)
{
	struct locks_etcd *E = arg;
	_cleanup_free_ char *body = watch_body(E->prefix);

	for (size_t at = 0; body && !stopping(E); at++) {
		struct stream s = { .E = E };
		CURLcode cr = etcd_http_stream(E->http, at, "/v3/watch", body, watch_write, &s, watch_progress, E);
		free(s.b.p);
		if (!stopping(E)) {
			log_debug("etcd watch: %s; reconnecting", s.failed ? "error answer" : curl_easy_strerror(cr));
			usleep(WATCH_RETRY_MS * 1000);
		}
	}
	return NULL;
}

/* Log in, then read our prefix: etcd answers, and lets this user at it. */
static int check_reach(struct locks_etcd *E, const struct etcd_http_conf *conf, ckpt_error *err)
{
	json_t *req = prefix_range(E->prefix);
	json_auto_t *ans = NULL;
	char why[400];
	int r;

	if ((r = etcd_http_login(E->http, err)) < 0)
		return r;
	if (req)
		json_object_set_new(req, "limit", json_string("1")), json_object_set_new(req, "keys_only", json_true());
	if (req && call(E, "/v3/kv/range", req, &ans) == 0)
		return 0;
	etcd_http_why(E->http, why, sizeof(why));
	return err_set(err, EHOSTUNREACH, NULL, "lock_backend etcd: no etcd answers at %s%s: %s",
		       conf->n ? conf->endpoints[0] : "(no etcd_endpoints)",
		       conf->n > 1 ? " or the other endpoints" : "", why);
}

int locks_etcd_open(struct locks *L, const struct etcd_http_conf *conf, const char *prefix,
		    void (*on_waiter)(void *ctx, const char *id), void *ctx, ckpt_error *err)
{
	struct locks_etcd *E = calloc(1, sizeof(*E));
	int r;

	if (!E || !(E->prefix = strdup(prefix))) {
		free(E);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	pthread_mutex_init(&E->mu, NULL);
	pthread_cond_init(&E->cond, NULL);
	E->on_waiter = on_waiter;
	E->ctx = ctx;
	L->etcd = E;
	L->ops = &locks_etcd_ops;
	curl_global_init(CURL_GLOBAL_DEFAULT); /* at start-up, before our threads */
	if ((r = etcd_http_new(conf, &E->http, err)) < 0 || (r = check_reach(E, conf, err)) < 0) {
		locks_etcd_close(L);
		return r;
	}
	if (pthread_create(&E->watcher, NULL, watch_main, E) == 0)
		E->watcher_started = true;
	return 0;
}

void locks_etcd_close(struct locks *L)
{
	struct locks_etcd *E = L->etcd;

	if (!E)
		return;
	pthread_mutex_lock(&E->mu);
	E->stop = true;
	pthread_cond_broadcast(&E->cond);
	pthread_mutex_unlock(&E->mu);
	if (E->watcher_started)
		pthread_join(E->watcher, NULL);
	while (E->leases) {
		struct lease *le = E->leases;
		E->leases = le->next;
		free(le);
	}
	etcd_http_free(E->http);
	free(E->prefix);
	free(E);
	L->etcd = NULL;
	L->ops = &locks_volume_ops;
}
