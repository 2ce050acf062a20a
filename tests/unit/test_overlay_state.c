/* Unit tests of the overlay backend's state structs (overlay_state.c) and
 * of its JSON formats (overlay_json.c). The texts below are what the
 * backend wrote before its state became structs (taken from a state dir a
 * build of that time made): each must read back and be written again byte
 * for byte, so a state dir from an older ckptd loads and stays the same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/overlay/overlay_internal.h"

static const char chains_text[] = "{\"6b01863b\":[\"c333d11a\",\"c88534a8\"],\"6a0184a8\":[\"0c118ccc\",\"ceefad65\"]}";
static const char live_text[] = "{\"path\":\"/tmp/ovl_compat/run/root1\",\"chain\":[\"ceefad65\"],\"mounted\":["
				"\"ceefad65\",\"B1234567\"],\"upper\":\"79733f63\"}";
static const char intent_text[] = "{\"6b01863b\":{\"chain\":[\"c88534a8\"],\"upper\":\"bd8390d0\"},\"6a0184a8\":{"
				  "\"chain\":[],\"upper\":\"79733f63\"}}";
static const char release_text[] = "{\"ino\":1234567,\"layers\":true,\"base\":\"B0a1b2c3\"}";
static const char mnt_text[] = "{\"id\":417,\"upper\":\"bd8390d0\"}";

static void test_chains_round_trip(void **state)
{
	(void)state;
	struct ovl_chains cs = { 0 };
	assert_int_equal(overlay_json_chains_parse(chains_text, &cs), 0);
	assert_int_equal(cs.n, 2);
	assert_string_equal(cs.v[0].h, "6b01863b"); /* the file's order */
	const struct ovl_chain *c = overlay_chains_get(&cs, "6a0184a8");
	assert_non_null(c);
	assert_int_equal(c->n, 2);
	assert_string_equal(c->v[0], "0c118ccc");
	char *s = overlay_json_chains_dump(&cs);
	assert_string_equal(s, chains_text);
	free(s);
	/* the fork's data carries the same object */
	json_t *fd = overlay_json_fork_data(&cs);
	struct ovl_chains back = { 0 };
	assert_int_equal(overlay_json_fork_data_read(fd, &back), 0);
	s = overlay_json_chains_dump(&back);
	assert_string_equal(s, chains_text);
	free(s);
	json_decref(fd);
	overlay_chains_free(&back);
	overlay_chains_free(&cs);
	/* what is not a chain file is refused, not half read */
	assert_int_equal(overlay_json_chains_parse("[]", &cs), -EBADMSG);
	assert_int_equal(overlay_json_chains_parse("{\"6b01863b\":[\"a/b\"]}", &cs), -EBADMSG);
	assert_int_equal(overlay_json_chains_parse("{\"6b01863b\":\"x\"}", &cs), -EBADMSG);
	assert_int_equal(cs.n, 0);
}

static void test_live_round_trip(void **state)
{
	(void)state;
	struct ovl_live live = { 0 };
	assert_int_equal(overlay_json_live_parse(live_text, &live), 0);
	struct ovl_root r = { .path = "/tmp/ovl_compat/run/root1", .chain = live.chain, .mounted = live.mounted };
	memcpy(r.upper, live.upper, sizeof(r.upper));
	assert_int_equal(r.mounted.n, 2);
	char *s = overlay_json_live_dump(&r);
	assert_string_equal(s, live_text);
	free(s);
	overlay_chain_free(&live.chain);
	overlay_chain_free(&live.mounted);
	/* an older live.json without "mounted" mounts its chain */
	assert_int_equal(overlay_json_live_parse("{\"chain\":[\"aa\"],\"upper\":\"12345678\"}", &live), 0);
	assert_true(overlay_chain_equal(&live.chain, &live.mounted));
	overlay_chain_free(&live.chain);
	overlay_chain_free(&live.mounted);
	assert_int_equal(overlay_json_live_parse("{\"chain\":[],\"upper\":\"1234\"}", &live), -EBADMSG);
}

static void test_intent_round_trip(void **state)
{
	(void)state;
	struct ovl_intent in = { 0 };
	assert_int_equal(overlay_json_intent_parse(intent_text, &in), 0);
	assert_int_equal(in.n, 2);
	assert_false(in.v[0].bad);
	assert_int_equal(in.v[1].chain.n, 0);
	char *s = overlay_json_intent_dump(&in);
	assert_string_equal(s, intent_text);
	free(s);
	overlay_intent_free(&in);
	/* a bad entry is marked: only a root it names refuses it */
	assert_int_equal(overlay_json_intent_parse("{\"6b01863b\":{\"upper\":\"x\"}}", &in), 0);
	assert_true(in.v[0].bad);
	overlay_intent_free(&in);
}

static void test_release_and_mnt(void **state)
{
	(void)state;
	struct ovl_release_intent ri;
	assert_int_equal(overlay_json_release_parse(release_text, &ri), 0);
	assert_int_equal(ri.ino, 1234567);
	assert_true(ri.layers);
	assert_string_equal(ri.base, "B0a1b2c3");
	char *s = overlay_json_release_dump(&ri);
	assert_string_equal(s, release_text);
	free(s);
	/* unsure: the layers stay; a name that is no base layer is none */
	overlay_json_release_parse("{\"base\":\"0a1b2c3d\"}", &ri);
	assert_true(ri.layers);
	assert_string_equal(ri.base, "");
	assert_int_equal(ri.ino, 0);
	int64_t id;
	char up[OVL_NAME_LEN + 1];
	assert_int_equal(overlay_json_mnt_parse(mnt_text, &id, up), 0);
	assert_int_equal(id, 417);
	s = overlay_json_mnt_dump((int)id, up);
	assert_string_equal(s, mnt_text);
	free(s);
}

static void test_record_data(void **state)
{
	(void)state;
	struct ovl_root roots[2] = { { .path = "/r0", .h = "6b01863b" }, { .path = "/r1", .h = "6a0184a8" } };
	struct ovl o = { .roots = roots, .n_roots = 2 };
	struct ovl_chains cs = { 0 };
	assert_int_equal(overlay_json_chains_parse(chains_text, &cs), 0);
	json_t *d = overlay_json_data(&o, &cs);
	char *s = json_dumps(d, JSON_COMPACT);
	assert_string_equal(s,
			    "{\"roots\":[{\"path\":\"/r0\",\"layers\":[\"c333d11a\",\"c88534a8\"]},{\"path\":\"/r1\","
			    "\"layers\":[\"0c118ccc\",\"ceefad65\"]}]}");
	free(s);
	struct ovl_chains back = { 0 };
	assert_int_equal(overlay_json_data_read(&o, d, &back), 0);
	s = overlay_json_chains_dump(&back);
	assert_string_equal(s, chains_text);
	free(s);
	json_decref(d);
	overlay_chains_free(&back);
	overlay_chains_free(&cs);
	/* data of other roots names none of ours */
	d = json_pack("{s:[{s:s,s:[s]}]}", "roots", "path", "/elsewhere", "layers", "aa");
	assert_int_equal(overlay_json_data_read(&o, d, &back), -ENOENT);
	json_decref(d);
}

/* Counts go up and down per root and layer; many layers come and go
 * without the table growing past what is in use. */
static void test_refs(void **state)
{
	(void)state;
	struct ovl_refs t = { 0 };
	struct ovl_chain c = { 0 };
	assert_int_equal(overlay_chain_push(&c, "aaaaaaaa"), 0);
	assert_int_equal(overlay_chain_push(&c, "bbbbbbbb"), 0);
	overlay_refs_add(&t, "11111111", &c, +1);
	overlay_refs_add(&t, "11111111", &c, +1);
	assert_int_equal(overlay_refs_get(&t, "11111111", "aaaaaaaa"), 2);
	assert_int_equal(overlay_refs_get(&t, "22222222", "aaaaaaaa"), 0);
	overlay_refs_add(&t, "11111111", &c, -1);
	assert_int_equal(overlay_refs_get(&t, "11111111", "bbbbbbbb"), 1);
	overlay_refs_add(&t, "11111111", &c, -1);
	assert_int_equal(overlay_refs_get(&t, "11111111", "bbbbbbbb"), 0);
	overlay_chain_free(&c);
	for (int i = 0; i < 100000; i++) {
		char name[OVL_NAME_LEN + 1];
		snprintf(name, sizeof(name), "%08x", i);
		struct ovl_chain one = { 0 };
		assert_int_equal(overlay_chain_push(&one, name), 0);
		overlay_refs_add(&t, "11111111", &one, +1);
		if (i % 100)
			overlay_refs_add(&t, "11111111", &one, -1);
		overlay_chain_free(&one);
	}
	assert_int_equal(overlay_refs_get(&t, "11111111", "00000064"), 1); /* 100 */
	assert_int_equal(overlay_refs_get(&t, "11111111", "00000065"), 0);
	assert_true(t.cap <= 8192); /* 1,000 in use, not 100,000 */
	overlay_refs_clear(&t);
	assert_int_equal(overlay_refs_get(&t, "11111111", "00000064"), 0);
	overlay_refs_free(&t);
}

/* The map keeps the order ids came in, replacing in place. */
static void test_chain_map(void **state)
{
	(void)state;
	struct ovl_chain_map m = { 0 };
	struct ovl_chains a = { 0 }, b = { 0 };
	assert_int_equal(overlay_json_chains_parse(chains_text, &a), 0);
	assert_int_equal(overlay_chain_map_put(&m, "cp_1", &a), 0);
	assert_int_equal(a.n, 0); /* taken */
	assert_int_equal(overlay_json_chains_parse("{\"6b01863b\":[]}", &b), 0);
	assert_int_equal(overlay_chain_map_put(&m, "cp_2", &b), 0);
	assert_int_equal(overlay_json_chains_parse("{\"6b01863b\":[\"x\"]}", &a), 0);
	assert_int_equal(overlay_chain_map_put(&m, "cp_1", &a), 0);
	assert_int_equal(m.n, 2);
	assert_string_equal(m.v[0].id, "cp_1");
	assert_string_equal(overlay_chains_get(overlay_chain_map_get(&m, "cp_1"), "6b01863b")->v[0], "x");
	overlay_chain_map_del(&m, "cp_1");
	assert_null(overlay_chain_map_get(&m, "cp_1"));
	assert_string_equal(m.v[0].id, "cp_2");
	overlay_chain_map_free(&m);
	/* a chain grows on top and at the bottom */
	struct ovl_chain c = { 0 };
	assert_int_equal(overlay_chain_push(&c, "mid"), 0);
	assert_int_equal(overlay_chain_push_top(&c, "top"), 0);
	assert_int_equal(overlay_chain_push(&c, "bottom"), 0);
	assert_string_equal(c.v[0], "top");
	assert_string_equal(c.v[2], "bottom");
	assert_int_equal(overlay_chain_push(&c, ".."), -EINVAL);
	overlay_chain_free(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chains_round_trip), cmocka_unit_test(test_live_round_trip),
		cmocka_unit_test(test_intent_round_trip), cmocka_unit_test(test_release_and_mnt),
		cmocka_unit_test(test_record_data),       cmocka_unit_test(test_refs),
		cmocka_unit_test(test_chain_map),
	};
	return cmocka_run_group_tests_name("overlay_state", tests, NULL, NULL);
}
