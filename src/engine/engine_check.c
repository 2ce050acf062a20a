/* engine_check.c: the checks an operation makes before it starts, shared by
 * create, restore, fork, diff, import and delete: that every root is still
 * managed, that the checkpoint asked for is not still being created, and
 * that no fork uses a checkpoint about to be deleted. */
#include "config.h"
#include "engine/engine_internal.h"

/* A root was released: nothing that changes the roots runs until ckptd
 * restarts and adopts it again (engine_release.c). */
int engine_check_managed(struct engine *e, ckpt_error *err)
{
	pthread_mutex_lock(&e->state_lock);
	const char *root = e->n_released ? e->released[0] : NULL;
	int r = root
		? err_set_kind(err, ERR_CONFLICT, EBUSY, "root_released",
			       "'%s' was released and is not managed until ckptd restarts and adopts it again", root)
		: 0;
	pthread_mutex_unlock(&e->state_lock);
	return r;
}

/* A checkpoint still being created answers 409 at once, not after the
 * create (which holds the operation lock) is done. */
int engine_check_not_creating(struct engine *e, const char *id_or_name, ckpt_error *err)
{
	_cleanup_record_ const struct ckpt_record *rec = id_or_name ? engine_resolve(e, id_or_name) : NULL;
	if (rec && rec->status == CKPT_CREATING)
		return err_set_kind(err, ERR_CONFLICT, EBUSY, "conflict", "checkpoint '%s' is still being created",
				    id_or_name);
	return 0;
}

/* Whether a fork (engine_fork.c) uses checkpoint id: such a checkpoint is
 * not deleted, neither by a client nor by expiry. */
bool engine_check_forked(struct engine *e, const char *id)
{
	bool used = false;
	pthread_mutex_lock(&e->state_lock);
	for (const struct engine_fork *f = e->forks; f; f = f->next)
		used |= !strcmp(f->info.checkpoint_id, id);
	pthread_mutex_unlock(&e->state_lock);
	return used;
}
