/* test_engine.c: the engine's order of steps over a fake backend that can be
 * told to fail: limits, expiry, force and fresh restores, the sweeper's
 * delete, crash recovery of deletes, async create with progress, reopen,
 * and the services bracket (stop, swap, start; freeze, thaw) over a fake
 * systemd whose stops, starts and freezes fail on demand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/backend.h"
#include "engine/catalog.h"
#include "config.h"
#include "engine/engine.h"
#include "http/api.h"
#include "http/http.h"
#include "lib/metrics.h"

#include "engine_fake.h"
#include "services_fake.h"
#include "testlib.h"

/* ---- fixtures ---- */

static char dir[TESTLIB_DIR_LEN], root[128], state[128];
static struct config cfg;
static struct engine *eng;
static struct services *svcs; /* the fake systemd, when a test set it up */

static void put_root(const char *text)
{
	struct fake_st st;
	snprintf(st.root, sizeof(st.root), "%s", root);
	assert_int_equal(fake_write_root(&st, text), 0);
}

static char *get_root(void)
{
	struct fake_st st;
	snprintf(st.root, sizeof(st.root), "%s", root);
	return fake_read_root(&st);
}

static void assert_root(const char *want)
{
	char *have = get_root();
	assert_string_equal(have, want);
	free(have);
}

static const struct backend_ops *backend_ops = &fake_ops; /* a test may swap it */

static void open_engine(void)
{
	ckpt_error err = { 0 };
	struct engine_deps deps = { .backend = backend_ops, .services = svcs };
	int r = engine_open(&cfg, &deps, &eng, &err);
	if (r < 0)
		fail_msg("engine_open: %s", err.msg);
}

static void reopen_engine(void)
{
	engine_close(eng);
	eng = NULL;
	open_engine();
}

static int setup(void **state_)
{
	(void)state_;
	if (testlib_mkdir(dir, "engine") < 0)
		return -1;
	snprintf(root, sizeof(root), "%s/root", dir);
	snprintf(state, sizeof(state), "%s/state", dir);
	mkdir(root, 0755);
	mkdir(state, 0700);
	put_root("base");
	memset(&fake, 0, offsetof(struct fake, lock));
	fake.store = json_object();
	fake.create_size = 100;
	config_defaults(&cfg);
	cfg.state_dir = strdup(state);
	cfg.roots[0] = strdup(root);
	cfg.n_roots = 1;
	cfg.backend = BACKEND_TAR; /* ignored: deps name the backend */
	cfg.services_auto = false;
	cfg.cleanup_interval_secs = 3600; /* tests call engine_sweep themselves */
	open_engine();
	return 0;
}

static int teardown(void **state_)
{
	(void)state_;
	engine_close(eng);
	eng = NULL;
	services_close(svcs);
	svcs = NULL;
	config_free(&cfg);
	json_decref(fake.store);
	free(fake.base);
	testlib_rmdir(dir);
	return 0;
}

/* ---- helpers ---- */

/* engine_create, answered as the API writes it. */
static int create_json(const struct create_req *req, json_t **ret, ckpt_error *err)
{
	struct ckpt_view v;
	int r = engine_create(eng, req, &v, err);
	if (r == 0) {
		*ret = api_record_json(&v);
		ckpt_view_free(&v);
	}
	return r;
}

static json_t *create_ok(const char *name, int64_t ttl)
{
	ckpt_error err = { 0 };
	json_t *rec = NULL;
	struct create_req req = { .name = name, .has_ttl = ttl >= 0, .ttl_secs = ttl };
	int r = create_json(&req, &rec, &err);
	if (r < 0)
		fail_msg("create '%s': %s", name, err.msg);
	return rec;
}

static char *create_id(const char *name, int64_t ttl)
{
	json_t *rec = create_ok(name, ttl);
	char *id = strdup(json_string_value(json_object_get(rec, "checkpoint_id")));
	json_decref(rec);
	return id;
}

static const char *str_of(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

/* "2026-11-22T10:00:00.123Z" -> ms since the epoch */
static int64_t rfc3339_ms(const char *s)
{
	struct tm tm = { 0 };
	assert_non_null(s);
	const char *rest = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
	assert_non_null(rest);
	assert_int_equal(strlen(rest), 5); /* ".123Z" */
	return (int64_t)timegm(&tm) * 1000 + atoi(rest + 1);
}

static bool record_file_exists(const char *id)
{
	char p[256];
	struct stat st;
	snprintf(p, sizeof(p), "%s/catalog/%s.json", state, id);
	return stat(p, &st) == 0;
}

/* Rewrite a record on disk while the engine is closed: crash and clock tricks. */
static void edit_record(const char *id, const char *key, json_t *value)
{
	char p[256];
	engine_close(eng);
	eng = NULL;
	snprintf(p, sizeof(p), "%s/catalog/%s.json", state, id);
	json_t *rec = json_load_file(p, 0, NULL);
	assert_non_null(rec);
	json_object_set_new(rec, key, value);
	assert_int_equal(json_dump_file(rec, p, JSON_COMPACT), 0);
	json_decref(rec);
	open_engine();
}

static void expire(const char *id)
{
	edit_record(id, "_expires_ms", json_integer(now_ms() - 1000));
}

static int restore(const char *id, bool force, const char *if_expired, json_t **ret, ckpt_error *err)
{
	struct restore_req req = { .force = force, .if_expired = if_expired };
	struct restore_report rep;
	int r = engine_restore(eng, id, &req, &rep, err);
	if (r == 0 && ret)
		*ret = api_restore_json(&rep);
	if (r == 0)
		restore_report_free(&rep);
	return r;
}

/* engine_get, answered as the API writes it. */
static int get_json(const char *id, json_t **ret, ckpt_error *err)
{
	struct ckpt_view v;
	int r = engine_get(eng, id, &v, err);
	if (r == 0) {
		*ret = api_record_json(&v);
		ckpt_view_free(&v);
	}
	return r;
}

/* Every checkpoint named name (NULL: any), as GET /v1/checkpoints lists it. */
static json_t *list_json(const char *name)
{
	struct ckpt_view_list l;
	char *next = NULL;
	json_t *out = json_array();
	assert_int_equal(engine_list_page(eng, name, SIZE_MAX, NULL, &l, &next, NULL), 0);
	assert_null(next);
	for (size_t i = 0; i < l.n; i++)
		json_array_append_new(out, api_record_json(&l.v[i]));
	ckpt_view_list_free(&l);
	return out;
}

static json_t *wait_status(const char *id, const char *want)
{
	int64_t deadline = mono_ms() + 5000;
	while (mono_ms() < deadline) {
		json_t *rec = NULL;
		assert_int_equal(get_json(id, &rec, NULL), 0);
		if (!strcmp(str_of(rec, "status"), want))
			return rec;
		json_decref(rec);
		usleep(2000);
	}
	fail_msg("checkpoint %s never reached %s", id, want);
	return NULL;
}

/* ---- cases ---- */

/* The engine lists exactly n checkpoints. */
static void assert_listed(size_t n)
{
	json_t *all = list_json(NULL);
	assert_int_equal(json_array_size(all), n);
	json_decref(all);
}

static void test_create_get_list_delete(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = create_ok("first", -1), *got = NULL;
	const char *id = str_of(rec, "checkpoint_id");

	assert_true(id_valid(id));
	assert_string_equal(str_of(rec, "status"), "active");
	assert_string_equal(str_of(rec, "backend"), "fake");
	assert_int_equal(json_integer_value(json_object_get(rec, "size_bytes")), 100);
	assert_null(json_object_get(rec, "_backend")); /* internal members stay inside */
	assert_true(record_file_exists(id));

	assert_int_equal(get_json(id, &got, &err), 0);
	assert_string_equal(str_of(got, "name"), "first");
	json_decref(got);
	assert_int_equal(get_json("first", &got, &err), 0); /* by name */
	assert_string_equal(str_of(got, "checkpoint_id"), id);
	json_decref(got);

	char *id2 = create_id("second", -1);
	json_t *all = list_json(NULL);
	assert_int_equal(json_array_size(all), 2);
	assert_string_equal(str_of(json_array_get(all, 0), "checkpoint_id"), id2); /* newest first */
	json_decref(all);
	all = list_json("first");
	assert_int_equal(json_array_size(all), 1);
	json_decref(all);

	assert_int_equal(engine_delete(eng, id, &err), 0);
	assert_false(record_file_exists(id));
	assert_null(json_object_get(fake.store, id));
	assert_int_equal(get_json(id, &got, &err), -ENOENT);
	assert_string_equal(err.code, "not_found");
	assert_int_equal(engine_delete(eng, id, &err), -ENOENT);
	free(id2);
	json_decref(rec);
}

static void test_ttl_fields(void **state_)
{
	(void)state_;
	json_t *a = create_ok("default-ttl", -1), *b = create_ok("no-ttl", 0), *c = create_ok("ttl", 60);

	/* default 14 days */
	assert_int_equal(json_integer_value(json_object_get(a, "ttl_secs")), 14 * 24 * 3600);
	assert_true(json_is_string(json_object_get(a, "expires_at")));
	assert_true(json_is_null(json_object_get(a, "last_used_at")));
	assert_true(json_is_null(json_object_get(b, "expires_at")));
	assert_int_equal(json_integer_value(json_object_get(b, "ttl_secs")), 0);
	assert_int_equal(json_integer_value(json_object_get(c, "ttl_secs")), 60);
	/* expires_at = created_at + ttl */
	assert_int_equal(rfc3339_ms(str_of(c, "expires_at")) - rfc3339_ms(str_of(c, "created_at")), 60000);
	assert_int_equal(rfc3339_ms(str_of(a, "expires_at")) - rfc3339_ms(str_of(a, "created_at")),
			 14LL * 24 * 3600 * 1000);
	json_decref(a);
	json_decref(b);
	json_decref(c);

	cfg.default_ttl_secs = 0; /* a server default of 0 means never */
	json_t *d = create_ok("never", -1);
	assert_true(json_is_null(json_object_get(d, "expires_at")));
	json_decref(d);
}

static void test_invalid_input(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = NULL, *labels = json_pack("{s:i}", "k", 1);
	struct create_req bad_ttl = { .name = "x", .has_ttl = true, .ttl_secs = -1 };
	struct create_req bad_name = { .name = "" };
	struct create_req bad_labels = { .name = "x", .labels = labels };

	assert_int_equal(create_json(&bad_ttl, &rec, &err), -EINVAL);
	assert_string_equal(err.code, "invalid_field");
	assert_int_equal(create_json(&bad_name, &rec, &err), -EINVAL);
	assert_int_equal(create_json(&bad_labels, &rec, &err), -EINVAL);
	json_decref(labels);
	assert_listed(0); /* bad input changes nothing */
	assert_int_equal(fake.n_create, 0);
}

static void test_max_checkpoints(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = NULL;
	struct create_req req = { .name = "over" };

	cfg.max_checkpoints = 2;
	char *a = create_id("a", -1), *b = create_id("b", -1);
	assert_int_equal(create_json(&req, &rec, &err), -EDQUOT);
	assert_string_equal(err.code, "checkpoint_limit");
	assert_int_equal(fake.n_create, 2); /* refused before the backend ran */
	assert_listed(2);
	/* deleting one makes room again */
	assert_int_equal(engine_delete(eng, a, &err), 0);
	free(create_id("c", -1));
	free(a);
	free(b);
}

/* The backend wrote the checkpoint, but it brings state over the budget: the
 * engine must take it back out completely. */
static void test_max_state_bytes_after_create(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = NULL;
	struct create_req req = { .name = "big" };

	cfg.max_state_bytes = 250;
	free(create_id("a", -1));
	free(create_id("b", -1)); /* 200 of 250 */
	assert_int_equal(create_json(&req, &rec, &err), -ENOSPC);
	assert_string_equal(err.code, "insufficient_storage");
	assert_int_equal(fake.n_create, 3);
	assert_int_equal(fake.n_remove, 1); /* its data went */
	assert_int_equal(json_object_size(fake.store), 2);
	assert_listed(2); /* its record never appeared */
	reopen_engine();  /* and nothing of it shows after a restart */
	assert_listed(2);
}

static void test_max_state_bytes_full(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = NULL;
	struct create_req req = { .name = "more" };

	cfg.max_state_bytes = 100;
	free(create_id("a", -1)); /* exactly at the budget */
	assert_int_equal(create_json(&req, &rec, &err), -ENOSPC);
	assert_string_equal(err.code, "insufficient_storage");
	assert_int_equal(fake.n_create, 1); /* refused up front */
}

static void test_create_fails(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = NULL;
	struct create_req req = { .name = "doomed" };

	put_root("live");
	fake.fail_create = ENOSPC;
	assert_int_equal(create_json(&req, &rec, &err), -ENOSPC);
	assert_string_equal(err.code, "insufficient_storage");
	fake.fail_create = EIO;
	assert_int_equal(create_json(&req, &rec, &err), -EIO);
	assert_listed(0);
	assert_root("live");
	reopen_engine();
	assert_listed(0);
	/* and the engine still works */
	fake.fail_create = 0;
	free(create_id("ok", -1));
}

static void test_restore_fails_keeps_record(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *got = NULL;

	put_root("v1");
	char *id = create_id("v1", -1);
	put_root("v2");
	fake.fail_restore = EIO;
	assert_int_equal(restore(id, false, NULL, NULL, &err), -EIO);
	assert_int_equal(get_json(id, &got, &err), 0);
	assert_string_equal(str_of(got, "status"), "active");
	assert_true(json_is_null(json_object_get(got, "last_used_at")));
	json_decref(got);
	fake.fail_restore = 0;
	assert_int_equal(restore(id, false, NULL, NULL, &err), 0);
	assert_root("v1");
	assert_int_equal(restore("cp_000000000000000000000000", false, NULL, NULL, &err), -ENOENT);
	free(id);
}

/* Only the engine gives a backend's failure a kind: a full disk is no_space,
 * anything else (a filesystem EACCES, an EINVAL) stays unset and answers 500. */
static void test_backend_error_kinds(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };

	put_root("v1");
	char *id = create_id("v1", -1);
	fake.fail_restore = EACCES;
	assert_int_equal(restore(id, false, NULL, NULL, &err), -EACCES);
	assert_int_equal(err.kind, ERR_UNSET);
	assert_int_equal(http_status_of(&err, NULL), 500);
	fake.fail_restore = EINVAL;
	assert_int_equal(restore(id, false, NULL, NULL, &err), -EINVAL);
	assert_int_equal(http_status_of(&err, NULL), 500);
	fake.fail_restore = EDQUOT;
	assert_int_equal(restore(id, false, NULL, NULL, &err), -ENOSPC);
	assert_int_equal(err.kind, ERR_NO_SPACE);
	assert_int_equal(http_status_of(&err, NULL), 507);
	assert_non_null(strstr(err.msg, "fake restore failure"));
	fake.fail_restore = 0;
	fake.fail_create = EACCES;
	json_t *rec = NULL;
	struct create_req cr = { .name = "denied" };
	assert_int_equal(create_json(&cr, &rec, &err), -EACCES);
	assert_int_equal(http_status_of(&err, NULL), 500);
	fake.fail_create = ENOSPC;
	assert_int_equal(create_json(&cr, &rec, &err), -ENOSPC);
	assert_int_equal(err.kind, ERR_NO_SPACE);
	assert_string_equal(err.code, "insufficient_storage");
	fake.fail_create = 0;
	free(id);
}

static void test_restore_updates_last_used(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rep = NULL, *got = NULL;

	put_root("v1");
	char *id = create_id("v1", -1);
	put_root("v2");
	assert_int_equal(restore("v1", false, NULL, &rep, &err), 0); /* by name */
	assert_true(json_is_true(json_object_get(rep, "ok")));
	assert_true(json_is_true(json_object_get(rep, "restored_from_checkpoint")));
	assert_true(json_is_false(json_object_get(rep, "ttl_expired")));
	assert_string_equal(str_of(rep, "services"), "unavailable");
	json_decref(rep);
	assert_root("v1");
	assert_int_equal(get_json(id, &got, &err), 0);
	assert_true(json_is_string(json_object_get(got, "last_used_at")));
	json_decref(got);
	reopen_engine(); /* durable */
	assert_int_equal(get_json(id, &got, &err), 0);
	assert_true(json_is_string(json_object_get(got, "last_used_at")));
	json_decref(got);
	free(id);
}

static void test_expired_restore(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rep = NULL, *got = NULL;

	put_root("v1");
	char *id = create_id("v1", 3600);
	put_root("v2");
	expire(id);

	assert_int_equal(restore(id, false, NULL, NULL, &err), -EKEYEXPIRED);
	assert_string_equal(err.code, "checkpoint_expired");
	assert_int_equal(restore(id, false, "fail", NULL, &err), -EKEYEXPIRED);
	assert_root("v2"); /* nothing changed */
	assert_int_equal(fake.n_restore + fake.n_reset, 0);
	assert_int_equal(get_json(id, &got, &err), 0);
	assert_true(json_is_null(json_object_get(got, "last_used_at")));
	json_decref(got);

	assert_int_equal(restore(id, false, "fresh", &rep, &err), 0);
	assert_int_equal(fake.n_reset, 1);
	assert_root("base");
	assert_true(json_is_false(json_object_get(rep, "restored_from_checkpoint")));
	assert_true(json_is_true(json_object_get(rep, "ttl_expired")));
	json_decref(rep);

	assert_int_equal(restore(id, true, NULL, &rep, &err), 0);
	assert_root("v1");
	assert_true(json_is_true(json_object_get(rep, "restored_from_checkpoint")));
	assert_true(json_is_true(json_object_get(rep, "ttl_expired")));
	json_decref(rep);
	free(id);
}

static void test_sweep(void **state_)
{
	(void)state_;
	json_t *got = NULL;
	char *old = create_id("old", 3600), *keep = create_id("keep", 3600), *never = create_id("never", 0);

	expire(old);
	assert_int_equal(engine_sweep(eng), 1);
	assert_int_equal(get_json(old, &got, NULL), -ENOENT);
	assert_false(record_file_exists(old));
	assert_null(json_object_get(fake.store, old));
	assert_int_equal(get_json(keep, &got, NULL), 0);
	json_decref(got);
	assert_int_equal(engine_sweep(eng), 0);
	free(old);
	free(keep);
	free(never);
}

static void test_sweeper_thread(void **state_)
{
	(void)state_;
	char *old = create_id("old", 3600);
	expire(old); /* reopens with the sweeper due every second */
	engine_close(eng);
	cfg.cleanup_interval_secs = 1;
	open_engine();
	int64_t deadline = mono_ms() + 5000;
	json_t *got = NULL;
	while (get_json(old, &got, NULL) == 0 && mono_ms() < deadline) {
		json_decref(got);
		usleep(20000);
	}
	assert_int_equal(get_json(old, &got, NULL), -ENOENT);
	assert_null(json_object_get(fake.store, old));
	free(old);
}

static void test_delete_fails_then_reopen(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *got = NULL;
	char *id = create_id("x", -1);

	fake.fail_remove = EIO;
	assert_int_equal(engine_delete(eng, id, &err), -EIO);
	assert_int_equal(get_json(id, &got, &err), 0);
	assert_string_equal(str_of(got, "status"), "deleting");
	json_decref(got);
	fake.fail_remove = 0;
	reopen_engine();
	assert_int_equal(get_json(id, &got, &err), -ENOENT);
	assert_null(json_object_get(fake.store, id));
	free(id);
}

static void test_crash_while_deleting(void **state_)
{
	(void)state_;
	json_t *got = NULL;
	char *id = create_id("x", -1), *other = create_id("y", -1);

	edit_record(id, "status", json_string("deleting")); /* as if killed mid-delete */
	assert_int_equal(get_json(id, &got, NULL), -ENOENT);
	assert_false(record_file_exists(id));
	assert_null(json_object_get(fake.store, id));
	assert_int_equal(get_json(other, &got, NULL), 0);
	json_decref(got);
	assert_non_null(json_object_get(fake.store, other));
	free(id);
	free(other);
}

/* A record file without a status (or with an unknown one) is left out at
 * start: the daemon runs, the name means the checkpoint still readable, the
 * file and the checkpoint's data stay for a person to look at. */
static void test_record_without_status(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *got = NULL;
	char *good = create_id("n", -1), *bad = create_id("n", -1), *odd = create_id("o", -1);

	edit_record(bad, "status", json_null());
	edit_record(odd, "status", json_string("zombie"));
	assert_int_equal(get_json(bad, &got, NULL), -ENOENT);
	assert_int_equal(get_json(odd, &got, NULL), -ENOENT);
	assert_int_equal(get_json("n", &got, &err), 0);
	assert_string_equal(str_of(got, "checkpoint_id"), good);
	json_decref(got);
	assert_listed(1);
	assert_int_equal(engine_delete(eng, "o", &err), -ENOENT);
	assert_int_equal(engine_sweep(eng), 0);
	char *text = engine_metrics(eng);
	assert_non_null(strstr(text, "ckptd_checkpoints{state=\"active\"} 1\n"));
	free(text);
	assert_true(record_file_exists(bad));
	assert_true(record_file_exists(odd));
	assert_non_null(json_object_get(fake.store, bad)); /* recovery kept the data */
	assert_non_null(json_object_get(fake.store, odd));
	free(good);
	free(bad);
	free(odd);
}

static void test_async_create(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = NULL, *got = NULL;
	struct create_req req = { .name = "bg", .async = true };

	fake.block_create = true;
	assert_int_equal(create_json(&req, &rec, &err), 0);
	assert_string_equal(str_of(rec, "status"), "creating");
	const char *id = str_of(rec, "checkpoint_id");
	fake_wait_in_create();
	assert_int_equal(get_json(id, &got, &err), 0);
	assert_string_equal(str_of(got, "status"), "creating");
	json_t *p = json_object_get(got, "progress");
	assert_non_null(p);
	assert_int_equal(json_integer_value(json_object_get(p, "bytes_total")), 1000);
	assert_int_equal(json_integer_value(json_object_get(p, "bytes_done")), 400);
	assert_int_equal(json_integer_value(json_object_get(p, "files_total")), 10);
	assert_int_equal(json_integer_value(json_object_get(p, "files_done")), 4);
	json_decref(got);
	assert_false(record_file_exists(id)); /* not acknowledged yet */
	assert_int_equal(engine_delete(eng, id, &err), -EBUSY);
	assert_int_equal(restore(id, false, NULL, NULL, &err), -EBUSY);
	fake_release();
	got = wait_status(id, "active");
	assert_true(record_file_exists(id));
	json_decref(got);
	/* the progress goes with the operation, a moment after the state changes */
	int64_t deadline = mono_ms() + 5000;
	do {
		assert_int_equal(get_json(id, &got, &err), 0);
		bool gone = !json_object_get(got, "progress");
		json_decref(got);
		if (gone)
			break;
		usleep(1000);
	} while (mono_ms() < deadline);
	assert_true(mono_ms() < deadline);
	json_decref(rec);
}

/* Creates still running hold their place: the limit cannot be overrun by
 * starting many at once. */
static void test_async_limit(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *a = NULL, *b = NULL, *c = NULL;
	struct create_req req = { .name = "bg", .async = true };

	cfg.max_checkpoints = 2;
	fake.block_create = true;
	assert_int_equal(create_json(&req, &a, &err), 0);
	assert_int_equal(create_json(&req, &b, &err), 0);
	assert_int_equal(create_json(&req, &c, &err), -EDQUOT);
	assert_string_equal(err.code, "checkpoint_limit");
	char *text = engine_metrics(eng);
	assert_non_null(strstr(text, "ckptd_checkpoints{state=\"creating\"} 2\n"));
	free(text);
	fake_release();
	json_decref(wait_status(str_of(a, "checkpoint_id"), "active"));
	json_decref(wait_status(str_of(b, "checkpoint_id"), "active"));
	json_decref(a);
	json_decref(b);
}

static void test_async_create_fails(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = NULL, *got = NULL;
	struct create_req req = { .name = "bg", .async = true };

	cfg.max_checkpoints = 1;
	fake.fail_create = ENOSPC;
	assert_int_equal(create_json(&req, &rec, &err), 0);
	const char *id = str_of(rec, "checkpoint_id");
	got = wait_status(id, "failed");
	json_t *e = json_object_get(got, "error");
	assert_string_equal(str_of(e, "code"), "insufficient_storage");
	json_decref(got);
	assert_false(record_file_exists(id));
	fake.fail_create = 0;
	free(create_id("fits", -1)); /* a failed create does not count against the limit */
	char *text = engine_metrics(eng);
	assert_non_null(strstr(text, "ckptd_checkpoints{state=\"failed\"} 1\n"));
	assert_non_null(strstr(text, "ckptd_checkpoints{state=\"active\"} 1\n"));
	assert_non_null(strstr(text, "ckptd_checkpoint_bytes 100\n"));
	assert_non_null(strstr(text, "ckptd_operations_total{op=\"create\",result=\"error\"} 1\n"));
	free(text);
	assert_int_equal(engine_delete(eng, id, &err), 0); /* and can be dismissed */
	assert_int_equal(get_json(id, &got, &err), -ENOENT);
	json_decref(rec);
}

/* A failed async create stays visible until it expires; then the sweeper
 * takes it away like any expired checkpoint. */
static void test_failed_create_expires(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	json_t *rec = NULL, *got = NULL;
	struct create_req req = { .name = "bg", .async = true, .has_ttl = true, .ttl_secs = 1 };

	fake.fail_create = EIO;
	assert_int_equal(create_json(&req, &rec, &err), 0);
	const char *id = str_of(rec, "checkpoint_id");
	json_decref(wait_status(id, "failed"));
	int64_t deadline = mono_ms() + 3000;
	while (engine_sweep(eng) == 0 && mono_ms() < deadline)
		usleep(20000);
	assert_int_equal(get_json(id, &got, &err), -ENOENT);
	json_decref(rec);
}

/* Each record's duration_ms taken off, after checking that the file's
 * (after) is at most what the create answered (before): the answer counts
 * the record's own sync, which the file, written before it, cannot. */
static void take_durations(json_t *before, json_t *after)
{
	for (size_t i = 0; i < json_array_size(before); i++) {
		json_t *b = json_array_get(before, i), *a = json_array_get(after, i);
		assert_non_null(a);
		assert_true(json_integer_value(json_object_get(a, "duration_ms")) <=
			    json_integer_value(json_object_get(b, "duration_ms")));
		json_object_del(b, "duration_ms");
		json_object_del(a, "duration_ms");
	}
}

static void test_reopen_lists_same(void **state_)
{
	(void)state_;
	char *ids[3] = { create_id("a", -1), create_id("b", 0), create_id("c", 60) };
	json_t *before = list_json(NULL);
	reopen_engine();
	json_t *after = list_json(NULL);
	assert_int_equal(json_array_size(after), 3);
	take_durations(before, after);
	assert_true(json_equal(before, after));
	for (int i = 0; i < 3; i++) {
		assert_non_null(json_object_get(fake.store, ids[i]));
		free(ids[i]);
	}
	json_decref(before);
	json_decref(after);
}

static void test_metrics_follow(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	char *id = create_id("m", -1);
	assert_int_equal(restore(id, false, NULL, NULL, &err), 0);
	char *text = engine_metrics(eng);
	assert_non_null(text);
	assert_non_null(strstr(text, "ckptd_checkpoint_create_duration_seconds_count 1\n"));
	assert_non_null(strstr(text, "ckptd_checkpoint_restore_duration_seconds_count 1\n"));
	assert_non_null(strstr(text, "ckptd_checkpoints{state=\"active\"} 1\n"));
	assert_non_null(strstr(text, "ckptd_checkpoint_bytes 100\n"));
	assert_non_null(strstr(text, "ckptd_operations_total{op=\"create\",result=\"success\"} 1\n"));
	assert_null(strstr(text, "ckptd_http_requests_total")); /* HTTP counts are src/http's */
	assert_non_null(strstr(text, "ckptd_build_info{version=\"" CKPTD_VERSION "\",backend=\"fake\"} 1\n"));
	free(text);
	free(id);
}

/* ---- the services bracket, over the fake systemd ---- */

/* a and b use the root, c does not, d uses it but is not running. */
static int setup_svc(void **state_)
{
	ckpt_error err = { 0 };
	if (setup(state_) < 0)
		return -1;
	engine_close(eng);
	svc_fake_reset();
	svc_add("a.service", "active", true);
	svc_add("b.service", "active", true);
	svc_add("c.service", "active", false);
	svc_add("d.service", "inactive", true);
	cfg.services_auto = true;
	if (services_open(&cfg, &svc_fake_ops, &svcs, &err) < 0)
		return -1;
	open_engine();
	return 0;
}

/* A checkpoint of "v1", the root changed to "v2", the log cleared. */
static char *svc_checkpoint(void)
{
	put_root("v1");
	char *id = create_id("v1", -1);
	put_root("v2");
	svc.log[0] = '\0';
	svc.swaps_logged = fake.n_restore + fake.n_reset;
	return id;
}

/* The names in a report's list, space separated. */
static char *names(json_t *rep, const char *key)
{
	static char buf[256];
	json_t *v;
	size_t i;
	buf[0] = '\0';
	json_array_foreach (json_object_get(rep, key), i, v) {
		size_t len = strlen(buf);
		snprintf(buf + len, sizeof(buf) - len, "%s%s", len ? " " : "", json_string_value(v));
	}
	return buf;
}

static json_t *svc_restore(const char *id)
{
	ckpt_error err = { 0 };
	json_t *rep = NULL;
	if (restore(id, false, NULL, &rep, &err) < 0)
		fail_msg("restore: %s", err.msg);
	return rep;
}

static void test_svc_bracket_order(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	json_t *rep = svc_restore(id);
	assert_string_equal(svc.log, "stop:a.service stop:b.service swap start:a.service start:b.service");
	assert_true(json_is_true(json_object_get(rep, "ok")));
	assert_true(json_is_true(json_object_get(rep, "swapped")));
	assert_string_equal(str_of(rep, "services"), "ok");
	assert_string_equal(names(rep, "stopped_services"), "a.service b.service");
	assert_string_equal(names(rep, "started_services"), "a.service b.service");
	assert_string_equal(names(rep, "failed_services"), "");
	assert_int_equal(json_object_size(json_object_get(rep, "failures")), 0);
	assert_string_equal(svc_unit("c.service")->state, "active");
	assert_string_equal(svc_unit("d.service")->state, "inactive"); /* not running before: not started */
	assert_root("v1");
	json_decref(rep);
	free(id);
}

/* b survives even SIGKILL: nothing is swapped, a (already stopped) comes back. */
static void test_svc_stop_fails(void **state_)
{
	(void)state_;
	json_t *got = NULL;
	char *id = svc_checkpoint();
	svc_unit("b.service")->survives_stop = true;
	json_t *rep = svc_restore(id);
	assert_string_equal(svc.log, "stop:a.service stop:b.service start:a.service");
	assert_int_equal(fake.n_restore, 0);
	assert_root("v2");
	assert_true(json_is_false(json_object_get(rep, "ok")));
	assert_true(json_is_false(json_object_get(rep, "swapped")));
	assert_string_equal(names(rep, "stopped_services"), "a.service");
	assert_string_equal(names(rep, "started_services"), "a.service");
	assert_string_equal(names(rep, "failed_services"), "b.service");
	const char *why = json_string_value(json_object_get(json_object_get(rep, "failures"), "b.service"));
	assert_non_null(strstr(why, "SIGKILL"));
	assert_non_null(strstr(why, "deactivating"));
	assert_string_equal(svc_unit("a.service")->state, "active");
	/* Not restored: its last use is not recorded. */
	assert_int_equal(get_json(id, &got, NULL), 0);
	assert_true(json_is_null(json_object_get(got, "last_used_at")));
	json_decref(got);
	json_decref(rep);
	free(id);
}

/* Down by systemd's account, but a process of the unit still uses the root. */
static void test_svc_leftover_process(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	svc_unit("a.service")->leftover = true;
	json_t *rep = svc_restore(id);
	assert_int_equal(fake.n_restore, 0);
	assert_root("v2");
	assert_true(json_is_false(json_object_get(rep, "ok")));
	assert_string_equal(names(rep, "failed_services"), "a.service");
	assert_string_equal(names(rep, "started_services"), "b.service");
	assert_non_null(strstr(str_of(json_object_get(rep, "failures"), "a.service"), "still use a root"));
	json_decref(rep);
	free(id);
}

/* b's ExecStop= fails: down by systemd's account, its cgroup empty, so the
 * swap goes on; b is not "stopped" but failed (phase stop, its Result), reset
 * and started again, and the restore is not ok. */
static void test_svc_stop_ends_failed(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	svc_unit("b.service")->stop_fails = true;
	json_t *rep = svc_restore(id);
	assert_string_equal(svc.log,
			    "stop:a.service stop:b.service swap reset:b.service start:a.service start:b.service");
	assert_root("v1");
	assert_true(json_is_false(json_object_get(rep, "ok")));
	assert_true(json_is_true(json_object_get(rep, "swapped")));
	assert_string_equal(names(rep, "stopped_services"), "a.service");
	assert_string_equal(names(rep, "started_services"), "a.service b.service");
	assert_string_equal(names(rep, "failed_services"), "b.service");
	const char *why = str_of(json_object_get(rep, "failures"), "b.service");
	assert_non_null(strstr(why, "stop failed"));
	assert_non_null(strstr(why, "exit-code"));
	assert_string_equal(svc_unit("b.service")->state, "active");
	json_decref(rep);
	free(id);
}

/* ... and a process is left in its cgroup: nothing is swapped, b stays down. */
static void test_svc_stop_ends_failed_cgroup_kept(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	svc_unit("b.service")->stop_fails = true;
	svc_unit("b.service")->cgroup_kept = true;
	json_t *rep = svc_restore(id);
	assert_string_equal(svc.log, "stop:a.service stop:b.service start:a.service");
	assert_int_equal(fake.n_restore, 0);
	assert_root("v2");
	assert_true(json_is_false(json_object_get(rep, "ok")));
	assert_true(json_is_false(json_object_get(rep, "swapped")));
	assert_string_equal(names(rep, "stopped_services"), "a.service");
	assert_string_equal(names(rep, "started_services"), "a.service");
	assert_string_equal(names(rep, "failed_services"), "b.service");
	assert_non_null(strstr(str_of(json_object_get(rep, "failures"), "b.service"), "left in its cgroup"));
	assert_false(svc_unit("b.service")->reset);
	json_decref(rep);
	free(id);
}

/* The swap fails: the error is answered, and the units come back first. */
static void test_svc_swap_fails(void **state_)
{
	(void)state_;
	ckpt_error err = { 0 };
	char *id = svc_checkpoint();
	fake.fail_restore = EIO;
	assert_int_equal(restore(id, false, NULL, NULL, &err), -EIO);
	assert_string_equal(svc.log, "stop:a.service stop:b.service swap start:a.service start:b.service");
	assert_string_equal(svc_unit("a.service")->state, "active");
	assert_string_equal(svc_unit("b.service")->state, "active");
	free(id);
}

static void test_svc_start_fails(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	svc_unit("b.service")->start_fails = true;
	json_t *rep = svc_restore(id);
	assert_root("v1");
	assert_true(json_is_false(json_object_get(rep, "ok")));
	assert_true(json_is_true(json_object_get(rep, "swapped")));
	assert_string_equal(names(rep, "stopped_services"), "a.service b.service");
	assert_string_equal(names(rep, "started_services"), "a.service");
	assert_string_equal(names(rep, "failed_services"), "b.service");
	const char *why = str_of(json_object_get(rep, "failures"), "b.service");
	assert_non_null(strstr(why, "'failed'"));
	assert_non_null(strstr(why, "exit-code"));
	json_decref(rep);
	free(id);
}

/* Still activating at ckptd's timeout, within its own: not a failure. */
static void test_svc_start_activating(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	svc_unit("b.service")->start_slow = true;
	json_t *rep = svc_restore(id);
	assert_true(json_is_true(json_object_get(rep, "ok")));
	assert_string_equal(names(rep, "started_services"), "a.service");
	assert_string_equal(names(rep, "activating_services"), "b.service");
	assert_string_equal(names(rep, "failed_services"), "");
	json_decref(rep);
	free(id);
}

/* c is bound to a: systemd stops it with a; it is reported and started again. */
static void test_svc_side_effect(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	svc_unit("c.service")->bound_to = "a.service";
	json_t *rep = svc_restore(id);
	assert_true(json_is_true(json_object_get(rep, "ok")));
	assert_string_equal(names(rep, "stopped_services"), "a.service b.service c.service");
	assert_string_equal(names(rep, "started_services"), "a.service b.service c.service");
	assert_string_equal(svc.log,
			    "stop:a.service stop:b.service swap start:a.service start:b.service "
			    "start:c.service");
	assert_string_equal(svc_unit("c.service")->state, "active");
	json_decref(rep);
	free(id);
}

/* c, bound to a, does not go down with it: not managed, so not using the
 * root, it does not hold up the swap, and is neither stopped nor failed. */
static void test_svc_side_effect_survives(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	svc_unit("c.service")->bound_to = "a.service";
	svc_unit("c.service")->survives_stop = true;
	json_t *rep = svc_restore(id);
	assert_true(json_is_true(json_object_get(rep, "ok")));
	assert_root("v1");
	assert_string_equal(names(rep, "stopped_services"), "a.service b.service");
	assert_string_equal(names(rep, "failed_services"), "");
	json_decref(rep);
	free(id);
}

static void test_svc_unreachable(void **state_)
{
	(void)state_;
	char *id = svc_checkpoint();
	svc.unreachable = true;
	json_t *rep = svc_restore(id);
	assert_int_equal(fake.n_restore, 0);
	assert_true(json_is_false(json_object_get(rep, "ok")));
	assert_string_equal(names(rep, "failed_services"), "a.service b.service");
	assert_non_null(strstr(str_of(json_object_get(rep, "failures"), "a.service"), "cannot reach systemd"));
	json_decref(rep);
	free(id);
}

static void test_svc_freeze_thaw(void **state_)
{
	(void)state_;
	svc_unit("b.service")->freeze_fails = true;
	json_t *rec = create_ok("frozen", -1);
	assert_string_equal(svc.log, "freeze:a.service freeze:b.service thaw:a.service");
	assert_string_equal(names(rec, "frozen_services"), "a.service");
	json_decref(rec);
	json_t *got = NULL;
	assert_int_equal(get_json("frozen", &got, NULL), 0);
	assert_non_null(strstr(str_of(json_object_get(got, "freeze_failures"), "b.service"), "not frozen"));
	json_decref(got);
}

/* A backend that splits create: capture (what the roots hold) and create,
 * which makes that capture the checkpoint. */
static char *captured;

static int split_capture(void *st, struct progress *p, ckpt_error *err)
{
	(void)p, (void)err;
	svc_event("capture", "roots");
	free(captured);
	captured = fake_read_root(st);
	return 0;
}

static int split_create(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p,
			ckpt_error *err)
{
	(void)st, (void)p, (void)err;
	svc_event("create", "roots");
	assert_non_null(captured); /* the engine captured first */
	json_object_set_new(fake.store, id, json_string(captured));
	free(TAKE_PTR(captured));
	*ret_data = json_pack("{s:s}", "fake", id);
	*ret_size = fake.create_size;
	return 0;
}

/* The freeze covers the capture only; the checkpoint holds what it saw. */
static void test_svc_capture_inside_freeze(void **state_)
{
	(void)state_;
	static struct backend_ops split;
	static const struct backend_capture_ops capture = { .capture = split_capture };
	split = fake_ops;
	split.capture = &capture;
	split.create = split_create;
	backend_ops = &split;
	reopen_engine();
	put_root("v1");
	svc.log[0] = '\0';
	char *id = create_id("split", -1);
	assert_string_equal(
		svc.log, "freeze:a.service freeze:b.service capture:roots thaw:a.service thaw:b.service create:roots");
	put_root("v2");
	json_decref(svc_restore(id));
	assert_root("v1");
	backend_ops = &fake_ops;
	free(id);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_create_get_list_delete, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ttl_fields, setup, teardown),
		cmocka_unit_test_setup_teardown(test_invalid_input, setup, teardown),
		cmocka_unit_test_setup_teardown(test_max_checkpoints, setup, teardown),
		cmocka_unit_test_setup_teardown(test_max_state_bytes_after_create, setup, teardown),
		cmocka_unit_test_setup_teardown(test_max_state_bytes_full, setup, teardown),
		cmocka_unit_test_setup_teardown(test_create_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_restore_fails_keeps_record, setup, teardown),
		cmocka_unit_test_setup_teardown(test_backend_error_kinds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_restore_updates_last_used, setup, teardown),
		cmocka_unit_test_setup_teardown(test_expired_restore, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sweep, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sweeper_thread, setup, teardown),
		cmocka_unit_test_setup_teardown(test_delete_fails_then_reopen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_crash_while_deleting, setup, teardown),
		cmocka_unit_test_setup_teardown(test_record_without_status, setup, teardown),
		cmocka_unit_test_setup_teardown(test_async_create, setup, teardown),
		cmocka_unit_test_setup_teardown(test_async_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_async_create_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_create_expires, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reopen_lists_same, setup, teardown),
		cmocka_unit_test_setup_teardown(test_metrics_follow, setup, teardown),
		cmocka_unit_test_setup_teardown(test_svc_bracket_order, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_stop_fails, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_leftover_process, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_stop_ends_failed, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_stop_ends_failed_cgroup_kept, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_swap_fails, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_start_fails, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_start_activating, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_side_effect, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_side_effect_survives, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_unreachable, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_freeze_thaw, setup_svc, teardown),
		cmocka_unit_test_setup_teardown(test_svc_capture_inside_freeze, setup_svc, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
