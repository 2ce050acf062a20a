/* engine_err.c: classify a failure from below the engine, once, at the
 * engine's boundary. Backends and the catalog report an errno, a message and
 * at most a reason code; which kind (and so which answer) that is gets
 * decided here and nowhere else. */
#include <errno.h>
#include "engine/engine_err.h"

#include <limits.h>

#include "lib/walk.h"

#define CTX_ALL ((1u << ENGINE_CTX_COUNT_) - 1)
#define CTX(c) (1u << (c))

/* The rules, first match wins. A rule matches when ctx is in its mask, errnum
 * is its errnum (0: any) and the reason code is its code (NULL: any). */
static const struct engine_err_rule {
	unsigned ctx_mask;
	int errnum;
	const char *code;
	enum ckpt_err_kind kind;
	const char *out_code; /* the code the client sees */
	bool too_deep;        /* the message starts with the limit: its own may be cut short */
} engine_err_rules[] = {
	/* Reasons a backend names because its errno alone cannot say them. */
	{ CTX_ALL, 0, "not_found", ERR_NOT_FOUND, "not_found", false }, /* the checkpoint's data is gone */
	{ CTX(ENGINE_CTX_RELEASE), 0, "forks_exist", ERR_CONFLICT, "forks_exist", false },
	{ CTX(ENGINE_CTX_RELEASE), 0, "root_busy", ERR_CONFLICT, "root_busy", false },
	/* released, but the next start has to finish it: the root counts as released */
	{ CTX(ENGINE_CTX_RELEASE), 0, "release_incomplete", ERR_INTERNAL, "release_incomplete", false },
	/* Unmounting a root something still holds open. */
	{ CTX(ENGINE_CTX_RELEASE), EBUSY, NULL, ERR_CONFLICT, "root_busy", false },
	/* The disk's ENOSPC and a quota's EDQUOT both: out of room. */
	{ CTX_ALL, ENOSPC, NULL, ERR_NO_SPACE, "insufficient_storage", false },
	{ CTX_ALL, EDQUOT, NULL, ERR_NO_SPACE, "insufficient_storage", false },
	/* A tree deeper than the walks go: a path below a root of PATH_MAX
	 * bytes or more, or more than WALK_DEPTH_MAX levels. The tree's state,
	 * not ckptd's failure: the client can make it shallower. Each walk says
	 * it in its own words, with a path that fills the message: the same
	 * reason comes first in every operation. */
	{ CTX(ENGINE_CTX_CREATE) | CTX(ENGINE_CTX_RESTORE) | CTX(ENGINE_CTX_READ), ENAMETOOLONG, NULL, ERR_CONFLICT,
	  "path_too_long", true },
	{ CTX(ENGINE_CTX_CREATE) | CTX(ENGINE_CTX_RESTORE) | CTX(ENGINE_CTX_READ), ELOOP, NULL, ERR_CONFLICT,
	  "path_too_long", true },
};

static bool engine_err_rule_matches(const struct engine_err_rule *rule, const ckpt_error *err, enum engine_err_ctx ctx)
{
	if (!(rule->ctx_mask & CTX(ctx)))
		return false;
	if (rule->errnum && rule->errnum != err->errnum)
		return false;
	return !rule->code || (err->code && !strcmp(rule->code, err->code));
}

int engine_err_classify(ckpt_error *err, enum engine_err_ctx ctx, int r)
{
	if (r >= 0 || !err || err->kind != ERR_UNSET || (unsigned)ctx >= ENGINE_CTX_COUNT_)
		return r;
	for (size_t i = 0; i < ARRAY_SIZE(engine_err_rules); i++) {
		const struct engine_err_rule *rule = &engine_err_rules[i];
		if (!engine_err_rule_matches(rule, err, ctx))
			continue;
		if (rule->kind == ERR_NO_SPACE) { /* one errno for the client, whichever limit it was */
			err->errnum = ENOSPC;
			r = -ENOSPC;
		}
		if (rule->too_deep)
			err_prefix(err, "a path below a root is %d bytes or longer, or more than %d directories deep",
				   PATH_MAX, WALK_DEPTH_MAX);
		return err_mark(err, rule->kind, rule->out_code, r);
	}
	return r;
}
