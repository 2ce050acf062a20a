/* overlay_json.c: every JSON format of the overlay backend, one pair each
 * (build and read), between the structs of overlay_state.c and the text
 * on disk or the data the engine keeps. Writing, syncing and renaming stay
 * with the callers, at their failpoints. The text is what jansson's compact
 * dump of the same members in the same order gives, as it always was. */
#include "backend/overlay/overlay_internal.h"

static json_t *overlay_json_chain(const struct ovl_chain *c)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < c->n; i++)
		if (json_array_append_new(a, json_string(c->v[i])) < 0)
			json_decref(TAKE_PTR(a));
	return a;
}

/* A JSON array of layer names; anything else is -EBADMSG. */
static int overlay_json_chain_read(json_t *a, struct ovl_chain *out)
{
	struct ovl_chain c = { 0 };
	size_t i;
	json_t *v;
	if (!json_is_array(a))
		return -EBADMSG;
	json_array_foreach (a, i, v) {
		int q = overlay_chain_push(&c, json_string_value(v));
		if (q < 0) {
			overlay_chain_free(&c);
			return q == -EINVAL ? -EBADMSG : q;
		}
	}
	overlay_chain_free(out);
	*out = c;
	return 0;
}

/* A read's result: out becomes cs when it succeeded (q 0), else stays. */
static int overlay_json_chains_give(int q, struct ovl_chains *cs, struct ovl_chains *out)
{
	if (q < 0) {
		overlay_chains_free(cs);
		return q;
	}
	overlay_chains_free(out);
	*out = *cs;
	return 0;
}

/* {h: [layers, newest first]}: c/<id>.json, fk/<fork>.json, a fork's data. */
json_t *overlay_json_chains(const struct ovl_chains *cs)
{
	json_t *o = json_object();
	for (size_t i = 0; o && i < cs->n; i++)
		if (json_object_set_new(o, cs->v[i].h, overlay_json_chain(&cs->v[i].c)) < 0)
			json_decref(TAKE_PTR(o));
	return o;
}

int overlay_json_chains_read(json_t *j, struct ovl_chains *out)
{
	struct ovl_chains cs = { 0 };
	const char *h;
	json_t *a;
	int q = json_is_object(j) ? 0 : -EBADMSG;
	json_object_foreach (j, h, a) {
		struct ovl_chain c = { 0 };
		if (q == 0 && strlen(h) != OVL_NAME_LEN)
			q = -EBADMSG;
		if (q == 0)
			q = overlay_json_chain_read(a, &c);
		if (q == 0)
			q = overlay_chains_set(&cs, h, &c);
		overlay_chain_free(&c);
	}
	return overlay_json_chains_give(q, &cs, out);
}

char *overlay_json_chains_dump(const struct ovl_chains *cs)
{
	json_auto_t *j = overlay_json_chains(cs);
	return j ? json_dumps(j, JSON_COMPACT) : NULL;
}

int overlay_json_chains_parse(const char *s, struct ovl_chains *out)
{
	json_auto_t *j = json_loads(s, 0, NULL);
	return overlay_json_chains_read(j, out);
}

/* A checkpoint's record data (the catalog keeps it under "_backend"):
 * {roots: [{path, layers}]}, the roots in the backend's order. */
json_t *overlay_json_data(const struct ovl *o, const struct ovl_chains *cs)
{
	json_auto_t *roots = json_array();
	for (size_t i = 0; roots && i < o->n_roots; i++) {
		const struct ovl_chain *c = overlay_chains_get(cs, o->roots[i].h);
		json_t *layers = c ? overlay_json_chain(c) : NULL;
		if (c &&
		    json_array_append_new(roots, json_pack("{s:s,s:o}", "path", o->roots[i].path, "layers", layers)) <
			    0)
			return NULL;
	}
	return roots ? json_pack("{s:O}", "roots", roots) : NULL;
}

/* The chains of the roots data names (an imported or older checkpoint has
 * no chain file); -ENOENT when it names none of ours. */
int overlay_json_data_read(const struct ovl *o, json_t *data, struct ovl_chains *out)
{
	struct ovl_chains cs = { 0 };
	json_t *e;
	size_t i;
	int q = 0;
	json_array_foreach (json_object_get(data, "roots"), i, e) {
		const char *path = json_string_value(json_object_get(e, "path"));
		json_t *layers = json_object_get(e, "layers");
		for (size_t k = 0; q == 0 && path && json_is_array(layers) && k < o->n_roots; k++) {
			struct ovl_chain c = { 0 };
			if (strcmp(o->roots[k].path, path))
				continue;
			if ((q = overlay_json_chain_read(layers, &c)) == 0)
				q = overlay_chains_set(&cs, o->roots[k].h, &c);
			overlay_chain_free(&c);
		}
	}
	if (q == 0 && !cs.n)
		q = -ENOENT;
	return overlay_json_chains_give(q, &cs, out);
}

/* A fork's data (the engine keeps it with the fork): {chains: {h: [layers]}}. */
json_t *overlay_json_fork_data(const struct ovl_chains *cs)
{
	json_t *c = overlay_json_chains(cs);
	return c ? json_pack("{s:o}", "chains", c) : NULL;
}

int overlay_json_fork_data_read(json_t *fdata, struct ovl_chains *out)
{
	return overlay_json_chains_read(json_object_get(fdata, "chains"), out);
}

/* r/<h>/live.json: {path, chain, mounted, upper}. */
char *overlay_json_live_dump(const struct ovl_root *r)
{
	json_t *c = overlay_json_chain(&r->chain), *m = overlay_json_chain(&r->mounted);
	if (!c || !m) {
		json_decref(c);
		json_decref(m);
		return NULL;
	}
	/* "o" takes c and m, also when the pack fails */
	json_auto_t *j = json_pack("{s:s,s:o,s:o,s:s}", "path", r->path, "chain", c, "mounted", m, "upper", r->upper);
	return j ? json_dumps(j, JSON_COMPACT) : NULL;
}

/* A live.json without "mounted" (an older one) mounts its chain. */
int overlay_json_live_parse(const char *s, struct ovl_live *out)
{
	json_auto_t *j = json_loads(s, 0, NULL);
	const char *up = json_string_value(json_object_get(j, "upper"));
	json_t *m = json_object_get(j, "mounted");
	if (!up || strlen(up) != OVL_NAME_LEN)
		return -EBADMSG;
	int q = overlay_json_chain_read(json_object_get(j, "chain"), &out->chain);
	if (q == 0)
		q = overlay_json_chain_read(json_is_array(m) ? m : json_object_get(j, "chain"), &out->mounted);
	if (q < 0)
		return q;
	memcpy(out->upper, up, sizeof(out->upper));
	return 0;
}

/* restore.json: {h: {chain, upper}}. */
char *overlay_json_intent_dump(const struct ovl_intent *in)
{
	json_auto_t *j = json_object();
	for (size_t i = 0; j && i < in->n; i++) {
		json_t *c = overlay_json_chain(&in->v[i].chain);
		json_t *one = c ? json_pack("{s:o,s:s}", "chain", c, "upper", in->v[i].upper) : NULL;
		if (json_object_set_new(j, in->v[i].h, one) < 0)
			return NULL;
	}
	return j ? json_dumps(j, JSON_COMPACT) : NULL;
}

/* A root whose entry is not {chain, upper} is marked bad: only a start
 * that has that root refuses the file. */
int overlay_json_intent_parse(const char *s, struct ovl_intent *out)
{
	json_auto_t *j = json_loads(s, 0, NULL);
	const char *h;
	json_t *one;
	if (!json_is_object(j))
		return -EBADMSG;
	json_object_foreach (j, h, one) {
		struct ovl_intent_root e = { 0 };
		const char *up = json_string_value(json_object_get(one, "upper"));
		snprintf(e.h, sizeof(e.h), "%s", h);
		int q = overlay_json_chain_read(json_object_get(one, "chain"), &e.chain);
		e.bad = q < 0 || !up || strlen(up) != OVL_NAME_LEN || strlen(h) != OVL_NAME_LEN;
		if (!e.bad)
			memcpy(e.upper, up, sizeof(e.upper));
		if ((q == -ENOMEM || overlay_intent_push(out, &e) < 0)) {
			overlay_chain_free(&e.chain);
			return -ENOMEM;
		}
	}
	return 0;
}

/* r/<h>/release.json, then rebase.json (the same file renamed):
 * {ino, layers, base}. */
char *overlay_json_release_dump(const struct ovl_release_intent *ri)
{
	json_auto_t *j = json_pack("{s:I,s:b,s:s}", "ino", (json_int_t)ri->ino, "layers", ri->layers, "base", ri->base);
	return j ? json_dumps(j, JSON_COMPACT) : NULL;
}

/* What it says, each member on its own: no inode (0) when it has none, the
 * layers kept when unsure, no base layer ("") unless a base layer's name. */
int overlay_json_release_parse(const char *s, struct ovl_release_intent *out)
{
	json_auto_t *j = json_loads(s, 0, NULL);
	const char *base = json_string_value(json_object_get(j, "base"));
	*out = (struct ovl_release_intent){ .ino = (uint64_t)json_integer_value(json_object_get(j, "ino")),
					    .layers = !json_is_false(json_object_get(j, "layers")) };
	if (base && strlen(base) == OVL_NAME_LEN && overlay_layer_is_base(base))
		memcpy(out->base, base, sizeof(out->base));
	return json_is_object(j) ? 0 : -EBADMSG;
}

/* r/<h>/mnt.json (gVisor): {id, upper}. */
char *overlay_json_mnt_dump(int id, const char *upper)
{
	json_auto_t *j = json_pack("{s:i,s:s}", "id", id, "upper", upper);
	return j ? json_dumps(j, JSON_COMPACT) : NULL;
}

int overlay_json_mnt_parse(const char *s, int64_t *ret_id, char upper[OVL_NAME_LEN + 1])
{
	json_auto_t *j = json_loads(s, 0, NULL);
	const char *u = json_string_value(json_object_get(j, "upper"));
	if (!u || strlen(u) != OVL_NAME_LEN)
		return -EBADMSG;
	*ret_id = json_integer_value(json_object_get(j, "id"));
	memcpy(upper, u, OVL_NAME_LEN + 1);
	return 0;
}
