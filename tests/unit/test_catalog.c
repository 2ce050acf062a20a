/* Unit tests of the checkpoint catalog: durability, ordering, torn files, the
 * typed record and its JSON, name lookup, and lookups at 10,000 checkpoints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sys/stat.h>

#include "engine/catalog.h"
#include "engine/engine_oci.h"
#include "testlib.h"

static struct ckpt_record *rec(const char *id, const char *name, int64_t created)
{
	struct ckpt_record *r = record_new(id, name, CKPT_ACTIVE);
	assert_non_null(r);
	r->created_ms = created;
	r->backend_data = json_pack("{s:i}", "x", 1);
	return r;
}

static char dir[TESTLIB_DIR_LEN];
static int sfd = -1;

static int setup(void **state)
{
	(void)state;
	assert_int_equal(testlib_mkdir(dir, "cat"), 0);
	sfd = open(dir, O_RDONLY | O_DIRECTORY);
	return sfd < 0;
}

static int teardown(void **state)
{
	(void)state;
	close(sfd);
	testlib_rmdir(dir);
	return 0;
}

static void put_file(const char *file, const char *text)
{
	int cfd = openat(sfd, "catalog", O_RDONLY | O_DIRECTORY);
	assert_true(cfd >= 0);
	assert_int_equal(write_file_atomic(cfd, file, text, strlen(text), 0600), 0);
	close(cfd);
}

static bool file_exists(const char *file)
{
	char p[128];
	snprintf(p, sizeof(p), "catalog/%s", file);
	return faccessat(sfd, p, F_OK, 0) == 0;
}

static void test_catalog(void **state)
{
	(void)state;
	ckpt_error err = { 0 };
	struct catalog *c;
	struct catalog_list l;
	assert_int_equal(catalog_open(sfd, &c, &err), 0);

	const char *a = "cp_000000000001aaaaaaaaaaaa", *b = "cp_000000000002bbbbbbbbbbbb",
		   *v = "cp_000000000003cccccccccccc";
	struct ckpt_record *r;
	assert_int_equal(catalog_put(c, r = rec(a, "one", 1), &err), 0), record_unref(r);
	assert_int_equal(catalog_put(c, r = rec(b, "one", 2), &err), 0), record_unref(r);
	assert_int_equal(catalog_put_volatile(c, r = rec(v, "two", 3)), 0), record_unref(r);
	assert_int_equal(catalog_count(c), 3);

	assert_int_equal(catalog_list(c, NULL, &l), 0);
	assert_int_equal(l.n, 3);
	assert_string_equal(l.v[0]->id, v); /* newest first */
	assert_string_equal(l.v[2]->id, a);
	catalog_list_free(&l);
	assert_int_equal(catalog_list(c, "one", &l), 0);
	assert_int_equal(l.n, 2);
	assert_string_equal(l.v[0]->id, b);
	catalog_list_free(&l);

	const struct ckpt_record *got = catalog_get(c, a);
	json_t *pub = record_json(got, false);
	assert_null(json_object_get(pub, "_backend"));
	assert_string_equal(json_string_value(json_object_get(pub, "name")), "one");
	json_decref(pub), record_unref(got);

	/* A torn temp file and a foreign file are ignored at load; volatile records vanish. */
	put_file(".x.json.tmp.1234", "{");
	put_file("cp_000000000009dddddddddddd.json",
		 "{\"checkpoint_id\":\"cp_000000000009eeeeeeeeeeee\",\"name\":\"x\",\"status\":\"active\"}");
	put_file("cp_00000000000affffffffffff.json", "{\"checkpoint_id\":");
	catalog_close(c);
	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	assert_int_equal(catalog_count(c), 2);
	assert_null(catalog_get(c, v));
	assert_false(file_exists(".x.json.tmp.1234"));

	assert_int_equal(catalog_remove(c, a, &err), 0);
	assert_null(catalog_get(c, a));
	assert_int_equal(catalog_remove(c, "../evil", &err), -EINVAL);
	catalog_close(c);
	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	assert_int_equal(catalog_count(c), 1);
	catalog_close(c);
}

/* A record without a status, or with one this version does not know, is left
 * out at load (and so never reaches a status comparison); the file stays. */
static void test_status_required(void **state)
{
	(void)state;
	ckpt_error err = { 0 };
	struct catalog *c;
	const char *why = NULL;

	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	catalog_close(c);
	put_file("cp_000000000011aaaaaaaaaaaa.json",
		 "{\"checkpoint_id\":\"cp_000000000011aaaaaaaaaaaa\",\"name\":\"n\"}");
	put_file("cp_000000000012aaaaaaaaaaaa.json",
		 "{\"checkpoint_id\":\"cp_000000000012aaaaaaaaaaaa\",\"name\":\"n\",\"status\":\"zombie\"}");
	put_file("cp_000000000013aaaaaaaaaaaa.json",
		 "{\"checkpoint_id\":\"cp_000000000013aaaaaaaaaaaa\",\"name\":\"n\",\"status\":7}");
	put_file("cp_000000000014aaaaaaaaaaaa.json",
		 "{\"checkpoint_id\":\"cp_000000000014aaaaaaaaaaaa\",\"name\":\"n\",\"status\":\"deleting\"}");
	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	assert_int_equal(catalog_count(c), 1);
	const struct ckpt_record *r = catalog_find_name(c, "n");
	assert_non_null(r);
	assert_string_equal(r->id, "cp_000000000014aaaaaaaaaaaa");
	assert_int_equal(r->status, CKPT_DELETING);
	record_unref(r);
	const char(*left_out)[32];
	assert_int_equal(catalog_left_out_ids(c, &left_out), 3); /* their data is kept */
	for (int i = 0; i < 3; i++)
		assert_non_null(
			strstr("cp_000000000011aaaaaaaaaaaa cp_000000000012aaaaaaaaaaaa cp_000000000013aaaaaaaaaaaa",
			       left_out[i]));
	catalog_close(c);
	assert_true(file_exists("cp_000000000011aaaaaaaaaaaa.json"));

	json_t *j = json_pack("{s:s, s:s}", "checkpoint_id", "cp_000000000011aaaaaaaaaaaa", "name", "n");
	assert_null(record_from_json(j, &why));
	assert_string_equal(why, "no status");
	json_object_set_new(j, "status", json_string("zombie"));
	assert_null(record_from_json(j, &why));
	assert_string_equal(why, "unknown status");
	json_decref(j);
}

/* JSON -> record -> JSON gives the same members and values, unknown members
 * included; the client's view leaves out the '_' members. */
static void test_round_trip(void **state)
{
	(void)state;
	const char *text = "{\"checkpoint_id\":\"cp_000000000021aaaaaaaaaaaa\",\"name\":\"rt\",\"status\":\"failed\","
			   "\"created_at\":\"2026-11-22T10:00:00.123Z\",\"expires_at\":null,\"last_used_at\":"
			   "\"2026-11-22T11:00:00.000Z\",\"size_bytes\":4096,\"duration_ms\":12,\"backend\":\"tar\","
			   "\"labels\":{\"k\":\"v\"},\"roots\":[\"/w\"],\"frozen_services\":[\"a.service\"],"
			   "\"ttl_secs\":0,\"freeze_failures\":{\"b.service\":\"no\"},\"error\":{\"code\":\"internal\","
			   "\"detail\":\"x\"},\"_created_ms\":5,\"_expires_ms\":0,\"_backend\":{\"layers\":[\"1\"]},"
			   "\"freeze_ms\":3,\"queue_ms\":0,\"import_of\":null,"
			   "\"future\":[1,2],\"_future\":true}";
	json_t *in = json_loads(text, 0, NULL);
	const char *why = NULL;
	assert_non_null(in);
	struct ckpt_record *r = record_from_json(in, &why);
	assert_non_null(r);
	assert_int_equal(r->status, CKPT_FAILED);
	assert_int_equal(r->size_bytes, 4096);
	assert_int_equal(r->created_ms, 5);
	assert_string_equal(r->expires_at, "");
	assert_int_equal(r->frozen_services.n, 1);
	assert_string_equal(r->frozen_services.v[0], "a.service");
	assert_int_equal(r->n_freeze_failures, 1);
	assert_string_equal(r->freeze_failures[0].reason, "no");
	assert_string_equal(r->error.code, "internal");
	assert_true(r->extra.has_freeze_ms && r->extra.freeze_ms == 3 && r->extra.has_queue_ms);
	assert_true(r->extra.has_import_of && !r->extra.import_of[0]);
	assert_int_equal(json_object_size(r->extra.unknown), 2);

	json_t *out = record_json(r, true);
	assert_true(json_equal(in, out));
	json_decref(out);

	/* the client's view: same members as before, in the order a fresh record has them */
	json_t *pub = record_json(r, false);
	assert_null(json_object_get(pub, "_backend"));
	assert_null(json_object_get(pub, "_future"));
	assert_non_null(json_object_get(pub, "future"));
	assert_int_equal(json_object_size(pub), json_object_size(in) - 4);
	assert_true(json_is_null(json_object_get(pub, "import_of")));
	_cleanup_free_ char *s = json_dumps(pub, JSON_COMPACT);
	assert_int_equal(strncmp(s,
				 "{\"checkpoint_id\":\"cp_000000000021aaaaaaaaaaaa\",\"name\":\"rt\",\"status\":"
				 "\"failed\",\"created_at\":",
				 90),
			 0);
	json_decref(pub);

	/* a copy is deep: changing it leaves the original alone */
	struct ckpt_record *d = record_dup(r);
	d->status = CKPT_ACTIVE;
	json_object_set_new(d->labels, "k", json_string("changed"));
	assert_int_equal(r->status, CKPT_FAILED);
	assert_string_equal(json_string_value(json_object_get(r->labels, "k")), "v");
	record_unref(d);
	record_unref(r);
	json_decref(in);
}

/* "_idempotency" (the key of the create that made it): kept on disk, never
 * in the client's view, and taken only as engine_idem_begin makes it: a file
 * name that is not 64 lowercase hex digits and ".json" stays an unknown
 * member, never a path. */
static void test_idempotency_member(void **state)
{
	(void)state;
	const char *fmt = "{\"checkpoint_id\":\"cp_000000000021aaaaaaaaaaaa\",\"name\":\"k\",\"status\":\"active\","
			  "\"_created_ms\":5,\"_idempotency\":{\"key\":\"retry-1\",\"file\":\"%s\","
			  "\"fingerprint\":\"%064d\",\"status\":%d}}";
	const char *good = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.json";
	const struct {
		const char *file;
		int status;
		bool taken;
	} cases[] = {
		{ good, 201, true },
		{ good, 202, true },
		{ good, 200, false },
		{ "../../../../etc/passwd", 201, false },
		{ "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef.json", 201, false },
		{ "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde/.json", 201, false },
		{ "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.jsonx", 201, false },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		char text[1024];
		snprintf(text, sizeof(text), fmt, cases[i].file, 0, cases[i].status);
		json_t *in = json_loads(text, 0, NULL);
		const char *why = NULL;
		assert_non_null(in);
		struct ckpt_record *r = record_from_json(in, &why);
		assert_non_null(r);
		assert_int_equal(r->extra.idem != NULL, cases[i].taken);
		if (cases[i].taken) {
			assert_string_equal(r->extra.idem->key, "retry-1");
			assert_string_equal(r->extra.idem->file, good);
			assert_int_equal(r->extra.idem->status, cases[i].status);
			struct ckpt_record *d = record_dup(r);
			assert_string_equal(d->extra.idem->file, good);
			record_unref(d);
		}
		json_t *out = record_json(r, true); /* kept as read, taken or not */
		assert_true(json_equal(json_object_get(in, "_idempotency"), json_object_get(out, "_idempotency")));
		json_decref(out);
		json_t *pub = record_json(r, false);
		assert_null(json_object_get(pub, "_idempotency"));
		json_decref(pub);
		record_unref(r);
		json_decref(in);
	}
}

/* A name means its newest active checkpoint; newer failed or in-flight ones
 * of that name do not hide it. The counters follow every change. */
/* Record files as a daemon from before the typed members wrote them
 * (compact, sorted keys): read and written back, each keeps its bytes, a
 * member this version cannot read included. */
static const char *const old_files[][2] = {
	{ "cp_000000000031aaaaaaaaaaaa.json",
	  "{\"_backend\":{\"layers\":[\"a\"]},\"_created_ms\":1700000000000,\"_expires_ms\":0,\"backend\":"
	  "\"overlay\",\"checkpoint_id\":\"cp_000000000031aaaaaaaaaaaa\",\"created_at\":\"2026-11-22T10:00:00.123Z\","
	  "\"duration_ms\":40,\"expires_at\":null,\"freeze_failures\":{\"a.service\":\"late\","
	  "\"b.service\":\"not frozen: "
	  "gone\"},\"freeze_ms\":3,\"frozen_services\":[\"c.service\",\"a.service\"],\"labels\":{"
	  "\"k\":\"v\"},\"last_used_at\":null,\"name\":\"one\",\"push\":{\"digest\":\"sha256:ab\",\"ref\":"
	  "\"reg:5000/x:one\",\"reused_bytes\":0,\"status\":\"done\",\"uploaded_bytes\":123},\"queue_ms\":0,"
	  "\"roots\":[\"/w\"],\"size_bytes\":4096,\"status\":\"active\",\"ttl_secs\":0}" },
	{ "cp_000000000032aaaaaaaaaaaa.json",
	  "{\"_backend\":{},\"_created_ms\":2,\"_expires_ms\":9,\"backend\":\"tar\",\"checkpoint_id\":"
	  "\"cp_000000000032aaaaaaaaaaaa\",\"created_at\":\"2026-11-22T10:00:01.000Z\",\"duration_ms\":0,"
	  "\"expires_at\":\"2026-11-22T10:00:09.000Z\",\"frozen_services\":[],\"labels\":{},\"last_used_at\":null,"
	  "\"name\":\"pulled\",\"pull_of\":{\"digest\":\"sha256:cd\",\"ref\":\"reg:5000/x:one\",\"roots\":{"
	  "\"/img\":\"/w\"}},\"push\":{\"error\":{\"code\":\"registry_error\",\"detail\":\"refused\"},\"ref\":"
	  "\"reg:5000/y:t\",\"status\":\"failed\"},\"roots\":[\"/w\"],\"size_bytes\":1,\"status\":\"active\","
	  "\"ttl_secs\":7}" },
	{ "cp_000000000033aaaaaaaaaaaa.json",
	  "{\"_created_ms\":3,\"_expires_ms\":0,\"backend\":\"tar\",\"checkpoint_id\":\"cp_000000000033aaaaaaaaaaaa\","
	  "\"created_at\":null,\"duration_ms\":0,\"expires_at\":null,\"frozen_services\":[],\"future\":{\"a\":2,"
	  "\"b\":1},\"import_of\":\"cp_000000000031aaaaaaaaaaaa\",\"labels\":{},\"last_used_at\":null,\"name\":"
	  "\"imp\",\"push\":{\"status\":\"odd\"},\"roots\":[],\"size_bytes\":0,\"status\":\"deleting\","
	  "\"ttl_secs\":0}" },
};

static void test_old_files(void **state)
{
	(void)state;
	ckpt_error err = { 0 };
	struct catalog *c;

	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	catalog_close(c);
	for (size_t i = 0; i < ARRAY_SIZE(old_files); i++)
		put_file(old_files[i][0], old_files[i][1]);
	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	assert_int_equal(catalog_count(c), ARRAY_SIZE(old_files));
	const struct ckpt_record *one = catalog_get(c, "cp_000000000031aaaaaaaaaaaa");
	assert_int_equal(one->frozen_services.n, 2);
	assert_int_equal(one->n_freeze_failures, 2);
	assert_int_equal(one->extra.push->state, PUSH_DONE);
	assert_int_equal(one->extra.push->uploaded_bytes, 123);
	record_unref(one);
	const struct ckpt_record *two = catalog_get(c, "cp_000000000032aaaaaaaaaaaa");
	assert_string_equal(two->extra.pull_of->digest, "sha256:cd");
	assert_string_equal(two->extra.push->code, "registry_error");
	record_unref(two);
	const struct ckpt_record *three = catalog_get(c, "cp_000000000033aaaaaaaaaaaa");
	assert_null(three->extra.push); /* not a push this version knows: kept as read */
	assert_string_equal(three->extra.import_of, "cp_000000000031aaaaaaaaaaaa");
	record_unref(three);

	int cfd = openat(sfd, "catalog", O_RDONLY | O_DIRECTORY);
	assert_true(cfd >= 0);
	for (size_t i = 0; i < ARRAY_SIZE(old_files); i++) {
		char id[32];
		snprintf(id, sizeof(id), "%.*s", (int)strlen(old_files[i][0]) - 5, old_files[i][0]);
		const struct ckpt_record *r = catalog_get(c, id);
		struct ckpt_record *d = record_dup(r);
		assert_non_null(d);
		assert_int_equal(catalog_put(c, d, &err), 0);
		record_unref(d), record_unref(r);
		_cleanup_free_ char *text = NULL;
		size_t len;
		assert_int_equal(read_file_at(cfd, old_files[i][0], 1 << 20, &text, &len), 0);
		assert_string_equal(text, old_files[i][1]);
	}
	close(cfd);
	catalog_close(c);
}

/* catalog_write writes the file catalog_put writes, through one syncfs
 * and no fsync of its own too, and leaves memory as it was and no temp
 * file; a bad id writes nothing. catalog_dev is the catalog directory's
 * file system. */
static void test_write(void **state)
{
	(void)state;
	ckpt_error err = { 0 };
	struct catalog *c;
	struct stat st;
	const char *a = "cp_000000000041aaaaaaaaaaaa", *b = "cp_000000000042aaaaaaaaaaaa";

	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	assert_int_equal(fstatat(sfd, "catalog", &st, 0), 0);
	assert_true(catalog_dev(c) == st.st_dev);
	struct ckpt_record *r = rec(a, "one", 1), *q = rec(b, "one", 1);
	assert_int_equal(catalog_write(c, r, true, &err), 0);
	assert_null(catalog_get(c, a)); /* memory is the caller's */
	assert_int_equal(catalog_put(c, q, &err), 0);
	int cfd = openat(sfd, "catalog", O_RDONLY | O_DIRECTORY);
	assert_true(cfd >= 0);
	_cleanup_free_ char *ta = NULL, *tb = NULL;
	size_t la, lb;
	assert_int_equal(read_file_at(cfd, "cp_000000000041aaaaaaaaaaaa.json", 1 << 20, &ta, &la), 0);
	assert_int_equal(read_file_at(cfd, "cp_000000000042aaaaaaaaaaaa.json", 1 << 20, &tb, &lb), 0);
	assert_non_null(strstr(ta, a));
	assert_string_equal(strstr(ta, "\"name\""), strstr(tb, "\"name\"")); /* the same fields as catalog_put */
	assert_int_equal(write_file_atomic_sweep(cfd), 0);                   /* no temp file left */
	close(cfd);

	struct ckpt_record *bad = rec("../evil", "x", 1);
	assert_int_equal(catalog_write(c, bad, true, &err), -EINVAL);
	assert_false(file_exists("../evil.json"));
	record_unref(bad);
	catalog_close(c);
	assert_int_equal(catalog_open(sfd, &c, &err), 0);
	assert_int_equal(catalog_count(c), 2);
	const struct ckpt_record *got = catalog_get(c, a);
	assert_non_null(got);
	assert_int_equal(got->status, CKPT_ACTIVE);
	record_unref(got), record_unref(r), record_unref(q);
	catalog_close(c);
}

static void test_find_name_and_stats(void **state)
{
	(void)state;
	ckpt_error err = { 0 };
	struct catalog *c;
	struct catalog_stats st;
	struct ckpt_record *r;
	assert_int_equal(catalog_open(sfd, &c, &err), 0);

	assert_int_equal(catalog_put_volatile(c, r = rec("cp_000000000031aaaaaaaaaaaa", "n", 1)), 0), record_unref(r);
	r = rec("cp_000000000032aaaaaaaaaaaa", "n", 2), r->status = CKPT_ACTIVE, r->size_bytes = 100;
	assert_int_equal(catalog_put_volatile(c, r), 0), record_unref(r);
	r = rec("cp_000000000033aaaaaaaaaaaa", "n", 3), r->status = CKPT_FAILED, r->size_bytes = 7;
	assert_int_equal(catalog_put_volatile(c, r), 0), record_unref(r);
	r = rec("cp_000000000034aaaaaaaaaaaa", "n", 4), r->status = CKPT_CREATING;
	assert_int_equal(catalog_put_volatile(c, r), 0), record_unref(r);
	assert_int_equal(catalog_put_volatile(c, r = rec("cp_000000000035aaaaaaaaaaaa", "m", 5)), 0), record_unref(r);
	assert_int_equal(catalog_put_volatile(c, r = rec("cp_000000000036aaaaaaaaaaaa", "o", 0)), 0), record_unref(r);

	const struct ckpt_record *got = catalog_find_name(c, "n");
	assert_string_equal(got->id, "cp_000000000032aaaaaaaaaaaa");
	record_unref(got);
	assert_null(catalog_find_name(c, "nn"));
	assert_null(catalog_find_name(c, "a"));

	catalog_stats(c, &st);
	assert_int_equal(st.count[CKPT_ACTIVE], 4);
	assert_int_equal(st.count[CKPT_FAILED], 1);
	assert_int_equal(st.count[CKPT_CREATING], 1);
	assert_int_equal(st.bytes[CKPT_ACTIVE], 100);
	assert_int_equal(st.bytes[CKPT_FAILED], 7);

	/* replacing a record moves it between counters; a held reference stays valid */
	got = catalog_get(c, "cp_000000000032aaaaaaaaaaaa");
	struct ckpt_record *d = record_dup(got);
	d->status = CKPT_DELETING;
	assert_int_equal(catalog_put_volatile(c, d), 0), record_unref(d);
	assert_int_equal(got->status, CKPT_ACTIVE);
	record_unref(got);
	catalog_stats(c, &st);
	assert_int_equal(st.count[CKPT_ACTIVE], 3);
	assert_int_equal(st.count[CKPT_DELETING], 1);
	assert_int_equal(st.bytes[CKPT_ACTIVE], 0);
	assert_int_equal(st.bytes[CKPT_DELETING], 100);
	got = catalog_find_name(c, "n"); /* the only active one of the name is the oldest now */
	assert_string_equal(got->id, "cp_000000000031aaaaaaaaaaaa");
	record_unref(got);
	assert_int_equal(catalog_remove(c, "cp_000000000031aaaaaaaaaaaa", &err), 0);
	got = catalog_find_name(c, "n"); /* none active: the newest of any state */
	assert_string_equal(got->id, "cp_000000000034aaaaaaaaaaaa");
	record_unref(got);
	assert_int_equal(catalog_count(c), 5);
	catalog_close(c);
}

static double elapsed_us(struct timespec *t0)
{
	struct timespec t1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0->tv_sec) * 1e6 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e3;
}

/* 10,000 checkpoints in 100 names: a lookup by id or name costs microseconds,
 * and a list copies pointers, not records. Prints the figures. */
static void test_scale(void **state)
{
	(void)state;
	enum {
		N = 10000,
		LOOKUPS = 10000,
		LISTS = 100
	};
	ckpt_error err = { 0 };
	struct catalog *c;
	struct catalog_list l;
	struct timespec t0;
	char id[32], name[16];
	assert_int_equal(catalog_open(sfd, &c, &err), 0);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof(id), "cp_%012x%012x", i, i * 7919);
		snprintf(name, sizeof(name), "name%d", i % 100);
		struct ckpt_record *r = rec(id, name, 1000 + i);
		json_object_set_new(r->labels, "step", json_integer(i));
		assert_int_equal(catalog_put_volatile(c, r), 0);
		record_unref(r);
	}
	double put_us = elapsed_us(&t0) / N;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < LOOKUPS; i++) {
		snprintf(id, sizeof(id), "cp_%012x%012x", (i * 37) % N, ((i * 37) % N) * 7919);
		const struct ckpt_record *r = catalog_get(c, id);
		assert_non_null(r);
		record_unref(r);
	}
	double get_us = elapsed_us(&t0) / LOOKUPS;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < LOOKUPS; i++) {
		snprintf(name, sizeof(name), "name%d", i % 100);
		const struct ckpt_record *r = catalog_find_name(c, name);
		assert_non_null(r);
		assert_int_equal(r->created_ms, 1000 + 9900 + i % 100); /* the newest of that name */
		record_unref(r);
	}
	double name_us = elapsed_us(&t0) / LOOKUPS;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < LISTS; i++) {
		assert_int_equal(catalog_list(c, NULL, &l), 0);
		assert_int_equal(l.n, N);
		catalog_list_free(&l);
	}
	double list_us = elapsed_us(&t0) / LISTS;

	struct catalog_stats st;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < LOOKUPS; i++)
		catalog_stats(c, &st);
	double stats_us = elapsed_us(&t0) / LOOKUPS;
	assert_int_equal(st.count[CKPT_ACTIVE], N);

	print_message("catalog at %d checkpoints: put %.2f us, get by id %.3f us, by name %.3f us, "
		      "list of all %.0f us, usage counters %.3f us\n",
		      N, put_us, get_us, name_us, list_us, stats_us);
	/* Bounds far above the figures (tens of times), far below a scan per lookup. */
	assert_true(get_us < 50);
	assert_true(name_us < 50);
	assert_true(list_us < 20000);
	catalog_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_catalog, setup, teardown),
		cmocka_unit_test_setup_teardown(test_status_required, setup, teardown),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_idempotency_member),
		cmocka_unit_test_setup_teardown(test_old_files, setup, teardown),
		cmocka_unit_test_setup_teardown(test_write, setup, teardown),
		cmocka_unit_test_setup_teardown(test_find_name_and_stats, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scale, setup, teardown),
	};
	return cmocka_run_group_tests_name("catalog", tests, NULL, NULL);
}
