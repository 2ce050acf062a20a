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

int overlay_intent_add(struct ovl_intent *in, const struct ovl_root *r, const struct ovl_chain *chain,
		       const char *upper)
{
	struct ovl_intent_root e = { 0 };
	memcpy(e.h, r->h, sizeof(e.h));
	snprintf(e.upper, sizeof(e.upper), "%s", upper);
	int q = overlay_chain_copy(&e.chain, chain);
	if (q == 0 && (q = overlay_intent_push(in, &e)) < 0)
		overlay_chain_free(&e.chain);
	return q;
}

/* restore.json orders the live.json renames of several roots. With one,
 * that one rename already leaves the root before or after, never between,
 * and restore.json would only add three syncs (its file, its directory
 * twice) to every restore: the retry loop's swap (issue 26). */
bool overlay_intent_needed(const struct ovl *o)
{
	return o->n_roots > 1;
}

int overlay_intent_write(struct ovl *o, const struct ovl_intent *in)
{
	_cleanup_free_ char *s = overlay_json_intent_dump(in);
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

/* At start: the intent of a restore that a kill interrupted, into o->intent
 * (1), or none (0). A torn file cannot exist (it is renamed into place); one
 * that does not parse is refused rather than guessed at. */
int overlay_intent_load(struct ovl *o)
{
	_cleanup_free_ char *s = NULL;
	write_file_atomic_sweep(o->odir_fd); /* .restore.json.tmp.* of a killed daemon */
	int q = read_file_at(o->odir_fd, OVL_INTENT, 1 << 24, &s, NULL);
	if (q == -ENOENT)
		return 0;
	if (q == 0)
		q = overlay_json_intent_parse(s, &o->intent);
	if (q < 0) {
		overlay_intent_free(&o->intent);
		return q;
	}
	return 1;
}

/* Finish the interrupted restore for root r: its live.json takes the chain
 * and upper the intent names (the caller then mounts them). */
int overlay_intent_apply(const struct ovl_intent *in, struct ovl_root *r)
{
	const struct ovl_intent_root *one = NULL;
	for (size_t i = 0; i < in->n && !one; i++)
		if (!strcmp(in->v[i].h, r->h))
			one = &in->v[i];
	if (!one)
		return 0;
	if (one->bad)
		return -EBADMSG;
	if (!strcmp(one->upper, r->upper) && overlay_chain_equal(&one->chain, &r->chain))
		return 0;
	log_info("overlay: finishing an interrupted restore of '%s'", r->path);
	int q = overlay_live_set(r, &one->chain, &one->chain);
	if (q < 0)
		return q;
	memcpy(r->upper, one->upper, sizeof(r->upper));
	return overlay_live_save(r);
}
