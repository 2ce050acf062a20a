/* overlay_intent.c: a restore switches every root to one checkpoint, but each
 * root keeps its own live.json; a kill between two of those writes used to
 * leave a mix (one root on the checkpoint, the other as before). So a restore
 * first writes restore.json in the overlay state dir, naming every root's
 * chain and upper, and only then the roots' live.json files; a start that
 * finds it brings each root's live.json to what it names before mounting,
 * and removes it once every root is open. */
#include "backend/overlay/overlay_internal.h"
#include "lib/failpoint.h"

#define OVL_INTENT "restore.json"

json_t *overlay_intent_new(void)
{
	return json_object();
}

int overlay_intent_add(json_t *intent, const struct ovl_root *r, json_t *chain, const char *upper)
{
	json_t *one = json_pack("{s:O,s:s}", "chain", chain, "upper", upper);
	return one && json_object_set_new(intent, r->h, one) == 0 ? 0 : -ENOMEM;
}

int overlay_intent_write(struct ovl *o, json_t *intent)
{
	_cleanup_free_ char *s = json_dumps(intent, JSON_COMPACT);
	return s ? FAILPOINT_AROUND("overlay.restore.intent.write",
				    write_file_atomic(o->odir_fd, OVL_INTENT, s, strlen(s), 0600))
		 : -ENOMEM;
}

/* Once every live.json agrees with the mounts, the intent says nothing more. */
int overlay_intent_clear(struct ovl *o)
{
	if (FAILPOINT_AROUND("overlay.restore.intent.unlink", unlinkat(o->odir_fd, OVL_INTENT, 0)) < 0)
		return errno == ENOENT ? 0 : -errno;
	return fsync_dirfd(o->odir_fd);
}

/* At start: the intent of a restore that a kill interrupted, or NULL. A torn
 * file cannot exist (it is renamed into place); one that does not parse is
 * refused rather than guessed at. */
int overlay_intent_load(struct ovl *o, json_t **ret)
{
	_cleanup_free_ char *s = NULL;
	*ret = NULL;
	write_file_atomic_sweep(o->odir_fd); /* .restore.json.tmp.* of a killed daemon */
	int q = read_file_at(o->odir_fd, OVL_INTENT, 1 << 24, &s, NULL);
	if (q == -ENOENT)
		return 0;
	if (q < 0)
		return q;
	*ret = json_loads(s, 0, NULL);
	return json_is_object(*ret) ? 0 : -EBADMSG;
}

/* Finish the interrupted restore for root r: its live.json takes the chain
 * and upper the intent names (the caller then mounts them). */
int overlay_intent_apply(json_t *intent, struct ovl_root *r)
{
	json_t *one = json_object_get(intent, r->h);
	if (!one)
		return 0;
	json_t *chain = json_object_get(one, "chain");
	const char *up = json_string_value(json_object_get(one, "upper"));
	if (!json_is_array(chain) || !up || strlen(up) != OVL_NAME_LEN)
		return -EBADMSG;
	if (!strcmp(up, r->upper) && json_equal(chain, r->chain))
		return 0;
	log_info("overlay: finishing an interrupted restore of '%s'", r->path);
	memcpy(r->upper, up, sizeof(r->upper));
	overlay_live_set(r, chain, chain);
	return overlay_live_save(r);
}
