/* overlay_root.c: the live state of a managed root: which chain and upper P
 * is (to be) mounted with, kept in r/<h>/live.json, and mounting a chain of
 * layers. It calls nothing else in the backend but overlay_mount.c: the ops
 * (backend_overlay.c), the layer store (overlay_layers.c), forks and diffs
 * all call it. */
#include "backend/overlay/overlay_internal.h"
#include "backend/overlay/overlay_mount.h"

void overlay_live_set(struct ovl_root *r, json_t *chain, json_t *mounted)
{
	json_incref(chain);
	json_incref(mounted);
	json_decref(r->chain);
	json_decref(r->mounted);
	r->chain = chain;
	r->mounted = mounted;
}

int overlay_live_save(struct ovl_root *r)
{
	json_auto_t *j = json_pack("{s:s,s:O,s:O,s:s}", "path", r->path, "chain", r->chain, "mounted", r->mounted,
				   "upper", r->upper);
	_cleanup_free_ char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (!s)
		return -ENOMEM;
	return write_file_atomic(r->rdir_fd, "live.json", s, strlen(s), 0600);
}

int overlay_live_load(struct ovl_root *r)
{
	_cleanup_free_ char *s = NULL;
	int q = read_file_at(r->rdir_fd, "live.json", 1 << 20, &s, NULL);
	if (q < 0)
		return q;
	json_auto_t *j = json_loads(s, 0, NULL);
	const char *up = json_string_value(json_object_get(j, "upper"));
	json_t *c = json_object_get(j, "chain"), *m = json_object_get(j, "mounted");
	if (!up || strlen(up) != OVL_NAME_LEN || !json_is_array(c))
		return -EBADMSG;
	snprintf(r->upper, sizeof(r->upper), "%s", up);
	overlay_live_set(r, c, json_is_array(m) ? m : c);
	return 0;
}

bool overlay_chain_on_base(json_t *chain)
{
	size_t n = json_array_size(chain);
	return n == 0 || !overlay_layer_is_base(json_string_value(json_array_get(chain, n - 1)));
}

/* Mount chain (+ base, unless the chain ends with a base layer) at target
 * with upper/work dirs up and wk (relative to the root's state dir). */
int overlay_mount_layers(struct ovl_root *r, json_t *chain, const char *target, const char *up, const char *wk,
			 ckpt_error *err)
{
	size_t n = json_array_size(chain);
	char(*names)[OVL_NAME_LEN + 3] = calloc(n + 1, sizeof(*names));
	const char **lowers = calloc(n + 1, sizeof(*lowers));
	int q;

	if (!names || !lowers) {
		free(names);
		free(lowers);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "l/%s", json_string_value(json_array_get(chain, i)));
		lowers[i] = names[i];
	}
	lowers[n] = "base"; /* unless the chain ends with a base layer */
	struct overlay_spec s = { .target = target,
				  .dir = r->rdir,
				  .dir_fd = r->rdir_fd,
				  .lowers = lowers,
				  .n_lowers = n + overlay_chain_on_base(chain),
				  .upper = up,
				  .work = wk };
	q = overlay_mount(&s, err);
	free(names);
	free(lowers);
	return q;
}
