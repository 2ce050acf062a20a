/* overlay_state.c: the overlay backend's state as C structs: a chain of
 * layers, every root's chain of one checkpoint or fork, the map of those by
 * id, the reference counts of layers and a restore's intent. Nothing here
 * touches the disk: the files' formats are overlay_json.c's. */
#include "backend/overlay/overlay_internal.h"
#include "lib/hash.h"

bool overlay_chain_name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	return n > 0 && n < OVL_LAYER_LEN && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

static int overlay_chain_reserve(struct ovl_chain *c, size_t n)
{
	void *v = realloc(c->v, (n ? n : 1) * sizeof(*c->v));
	if (!v)
		return -ENOMEM;
	c->v = v;
	return 0;
}

int overlay_chain_push(struct ovl_chain *c, const char *name)
{
	if (!overlay_chain_name_ok(name))
		return -EINVAL;
	if (overlay_chain_reserve(c, c->n + 1) < 0)
		return -ENOMEM;
	snprintf(c->v[c->n++], OVL_LAYER_LEN, "%s", name);
	return 0;
}

int overlay_chain_push_top(struct ovl_chain *c, const char *name)
{
	int q = overlay_chain_push(c, name);
	if (q < 0)
		return q;
	memmove(c->v[1], c->v[0], (c->n - 1) * sizeof(*c->v));
	snprintf(c->v[0], OVL_LAYER_LEN, "%s", name);
	return 0;
}

int overlay_chain_extend(struct ovl_chain *c, const struct ovl_chain *x)
{
	if (!x->n)
		return 0;
	if (overlay_chain_reserve(c, c->n + x->n) < 0)
		return -ENOMEM;
	memcpy(c->v[c->n], x->v[0], x->n * sizeof(*c->v));
	c->n += x->n;
	return 0;
}

/* dst becomes a copy of src (either may be the other); on failure dst is as it was. */
int overlay_chain_copy(struct ovl_chain *dst, const struct ovl_chain *src)
{
	struct ovl_chain t = { 0 };
	if (src == dst)
		return 0;
	if (overlay_chain_extend(&t, src) < 0)
		return -ENOMEM;
	overlay_chain_free(dst);
	*dst = t;
	return 0;
}

void overlay_chain_free(struct ovl_chain *c)
{
	free(c->v);
	*c = (struct ovl_chain){ 0 };
}

bool overlay_chain_equal(const struct ovl_chain *a, const struct ovl_chain *b)
{
	if (a->n != b->n)
		return false;
	for (size_t i = 0; i < a->n; i++)
		if (strcmp(a->v[i], b->v[i]))
			return false;
	return true;
}

bool overlay_chain_has(const struct ovl_chain *c, const char *name)
{
	for (size_t i = 0; i < c->n; i++)
		if (!strcmp(c->v[i], name))
			return true;
	return false;
}

const struct ovl_chain *overlay_chains_get(const struct ovl_chains *cs, const char *h)
{
	for (size_t i = 0; cs && i < cs->n; i++)
		if (!strcmp(cs->v[i].h, h))
			return &cs->v[i].c;
	return NULL;
}

/* Root h's chain becomes a copy of c: in place when h has one (the order
 * of the roots stays as loaded), else after the others. */
int overlay_chains_set(struct ovl_chains *cs, const char *h, const struct ovl_chain *c)
{
	if (strlen(h) != OVL_NAME_LEN)
		return -EINVAL;
	for (size_t i = 0; i < cs->n; i++)
		if (!strcmp(cs->v[i].h, h))
			return overlay_chain_copy(&cs->v[i].c, c);
	void *v = realloc(cs->v, (cs->n + 1) * sizeof(*cs->v));
	if (!v)
		return -ENOMEM;
	cs->v = v;
	struct ovl_root_chain *e = &cs->v[cs->n];
	*e = (struct ovl_root_chain){ 0 };
	memcpy(e->h, h, sizeof(e->h));
	if (overlay_chain_copy(&e->c, c) < 0)
		return -ENOMEM;
	cs->n++;
	return 0;
}

int overlay_chains_copy(struct ovl_chains *dst, const struct ovl_chains *src)
{
	struct ovl_chains t = { 0 };
	for (size_t i = 0; i < src->n; i++)
		if (overlay_chains_set(&t, src->v[i].h, &src->v[i].c) < 0) {
			overlay_chains_free(&t);
			return -ENOMEM;
		}
	overlay_chains_free(dst);
	*dst = t;
	return 0;
}

void overlay_chains_free(struct ovl_chains *cs)
{
	for (size_t i = 0; i < cs->n; i++)
		overlay_chain_free(&cs->v[i].c);
	free(cs->v);
	*cs = (struct ovl_chains){ 0 };
}

struct ovl_chains *overlay_chain_map_get(const struct ovl_chain_map *m, const char *id)
{
	for (size_t i = 0; i < m->n; i++)
		if (!strcmp(m->v[i].id, id))
			return &m->v[i].cs;
	return NULL;
}

/* id's chains become cs (taken: *cs is left empty), in place when id has
 * some (iteration keeps the order of first insertion). */
int overlay_chain_map_put(struct ovl_chain_map *m, const char *id, struct ovl_chains *cs)
{
	struct ovl_chains *old = overlay_chain_map_get(m, id);
	if (old) {
		overlay_chains_free(old);
		*old = *cs;
		*cs = (struct ovl_chains){ 0 };
		return 0;
	}
	if (strlen(id) >= sizeof(m->v[0].id))
		return -EINVAL;
	if (m->n == m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 16;
		void *v = realloc(m->v, cap * sizeof(*m->v));
		if (!v)
			return -ENOMEM;
		m->v = v;
		m->cap = cap;
	}
	struct ovl_chain_entry *e = &m->v[m->n++];
	snprintf(e->id, sizeof(e->id), "%s", id);
	e->cs = *cs;
	*cs = (struct ovl_chains){ 0 };
	return 0;
}

void overlay_chain_map_del(struct ovl_chain_map *m, const char *id)
{
	for (size_t i = 0; i < m->n; i++)
		if (!strcmp(m->v[i].id, id)) {
			overlay_chains_free(&m->v[i].cs);
			memmove(&m->v[i], &m->v[i + 1], (m->n - i - 1) * sizeof(*m->v));
			m->n--;
			return;
		}
}

void overlay_chain_map_clear(struct ovl_chain_map *m)
{
	for (size_t i = 0; i < m->n; i++)
		overlay_chains_free(&m->v[i].cs);
	m->n = 0;
}

void overlay_chain_map_free(struct ovl_chain_map *m)
{
	overlay_chain_map_clear(m);
	free(m->v);
	*m = (struct ovl_chain_map){ 0 };
}

/* restore.json's entries (read or written by overlay_intent.c). */
int overlay_intent_push(struct ovl_intent *in, struct ovl_intent_root *e)
{
	void *v = realloc(in->v, (in->n + 1) * sizeof(*in->v));
	if (!v)
		return -ENOMEM;
	in->v = v;
	in->v[in->n++] = *e;
	*e = (struct ovl_intent_root){ 0 };
	return 0;
}

void overlay_intent_free(struct ovl_intent *in)
{
	for (size_t i = 0; i < in->n; i++)
		overlay_chain_free(&in->v[i].chain);
	free(in->v);
	*in = (struct ovl_intent){ 0 };
}

/* The reference counts: an open-addressing table keyed by "h/layer". A
 * count that drops to 0 keeps its slot until the table is rebuilt, which
 * keeps only the counts above 0: no tombstones, and layers long deleted
 * do not pile up. */
static void overlay_refs_key(char key[OVL_REF_KEY_LEN], const char *h, const char *name)
{
	snprintf(key, OVL_REF_KEY_LEN, "%s/%s", h, name);
}

static struct ovl_ref *overlay_refs_slot(const struct ovl_refs *t, const char *key)
{
	if (!t->cap)
		return NULL;
	size_t i = hash_fnv32(HASH_FNV32_INIT, key, strlen(key)) & (t->cap - 1);
	while (t->v[i].key[0] && strcmp(t->v[i].key, key))
		i = (i + 1) & (t->cap - 1);
	return &t->v[i];
}

static int overlay_refs_rebuild(struct ovl_refs *t, size_t live)
{
	size_t cap = 16;
	while (cap < 4 * (live + 1))
		cap *= 2;
	struct ovl_refs n = { .v = calloc(cap, sizeof(*n.v)), .cap = cap };
	if (!n.v)
		return -ENOMEM;
	for (size_t i = 0; i < t->cap; i++)
		if (t->v[i].n > 0) {
			*overlay_refs_slot(&n, t->v[i].key) = t->v[i];
			n.used++;
		}
	free(t->v);
	*t = n;
	return 0;
}

int overlay_refs_get(const struct ovl_refs *t, const char *h, const char *name)
{
	char key[OVL_REF_KEY_LEN];
	overlay_refs_key(key, h, name);
	const struct ovl_ref *e = overlay_refs_slot(t, key);
	return e && e->key[0] ? e->n : 0;
}

static void overlay_refs_add_one(struct ovl_refs *t, const char *key, int delta)
{
	struct ovl_ref *e = overlay_refs_slot(t, key);
	if (!e || !e->key[0]) {
		if (delta <= 0)
			return;
		if (2 * (t->used + 1) > t->cap) {
			size_t live = 0;
			for (size_t i = 0; i < t->cap; i++)
				live += t->v[i].n > 0;
			if (overlay_refs_rebuild(t, live) < 0) {
				log_warn("overlay: out of memory counting the users of layer %s", key);
				return;
			}
			e = overlay_refs_slot(t, key);
		}
		snprintf(e->key, sizeof(e->key), "%s", key);
		e->n = 0;
		t->used++;
	}
	e->n = e->n + delta > 0 ? e->n + delta : 0;
}

void overlay_refs_add(struct ovl_refs *t, const char *h, const struct ovl_chain *c, int delta)
{
	for (size_t i = 0; c && i < c->n; i++) {
		char key[OVL_REF_KEY_LEN];
		overlay_refs_key(key, h, c->v[i]);
		overlay_refs_add_one(t, key, delta);
	}
}

void overlay_refs_add_all(struct ovl_refs *t, const struct ovl_chains *cs, int delta)
{
	for (size_t i = 0; cs && i < cs->n; i++)
		overlay_refs_add(t, cs->v[i].h, &cs->v[i].c, delta);
}

void overlay_refs_clear(struct ovl_refs *t)
{
	if (t->cap)
		memset(t->v, 0, t->cap * sizeof(*t->v));
	t->used = 0;
}

void overlay_refs_free(struct ovl_refs *t)
{
	free(t->v);
	*t = (struct ovl_refs){ 0 };
}
