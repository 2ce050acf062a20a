/* overlay_root.c: the live state of a managed root: which chain and upper P
 * is (to be) mounted with, kept in r/<h>/live.json. It calls nothing else in
 * the backend: the ops (backend_overlay.c) and the layer store
 * (overlay_layers.c) both call it. */
#include "backend/overlay/overlay_internal.h"

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
