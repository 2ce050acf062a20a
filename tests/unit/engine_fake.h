/* engine_fake.h: a fake storage backend for the engine tests, included by
 * test_engine.c only. Each root holds one file "f"; checkpoints keep its text
 * in memory; knobs make create, restore or remove fail, or make create wait
 * (with progress published) until the test releases it. */
#pragma once
#include <pthread.h>
#include <stdio.h>

#include "backend/backend.h"

static struct fake {
	json_t *store;                              /* id -> content of <root>/f when created */
	char *base;                                 /* content of <root>/f when first adopted */
	int fail_create, fail_restore, fail_remove; /* errno to fail with, 0 = work */
	uint64_t create_size;
	bool block_create; /* create waits for fake_release() */
	bool in_create;
	int n_create, n_restore, n_reset, n_remove, n_open;
	pthread_mutex_t lock;
	pthread_cond_t cond;
} fake = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

struct fake_st {
	char root[256];
};

static char *fake_read_root(struct fake_st *st)
{
	char p[300], *buf = NULL;
	snprintf(p, sizeof(p), "%s/f", st->root);
	FILE *f = fopen(p, "re");
	size_t n = 0;
	if (!f)
		return strdup("");
	if (getdelim(&buf, &n, '\0', f) < 0) {
		free(buf);
		buf = strdup("");
	}
	fclose(f);
	return buf;
}

static int fake_write_root(struct fake_st *st, const char *text)
{
	char p[300];
	snprintf(p, sizeof(p), "%s/f", st->root);
	FILE *f = fopen(p, "we");
	if (!f)
		return -errno;
	fputs(text, f);
	fclose(f);
	return 0;
}

static int fake_open(const struct backend_ctx *ctx, void **ret_st, ckpt_error *err)
{
	(void)err;
	struct fake_st *st = calloc(1, sizeof(*st));
	snprintf(st->root, sizeof(st->root), "%s", ctx->roots[0]);
	if (!fake.base)
		fake.base = fake_read_root(st);
	fake.n_open++;
	*ret_st = st;
	return 0;
}

static int fake_recover(void *st, const char *const *ids, json_t *const *data, size_t n, ckpt_error *err)
{
	(void)st, (void)data, (void)err;
	json_t *keep = json_object();
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_object_get(fake.store, ids[i]);
		if (v)
			json_object_set(keep, ids[i], v);
	}
	json_decref(fake.store);
	fake.store = keep;
	return 0;
}

static void fake_wait_released(struct progress *p)
{
	pthread_mutex_lock(&fake.lock);
	atomic_store(&p->bytes_total, 1000);
	atomic_store(&p->files_total, 10);
	atomic_store(&p->bytes_done, 400);
	atomic_store(&p->files_done, 4);
	fake.in_create = true;
	pthread_cond_broadcast(&fake.cond);
	while (fake.block_create)
		pthread_cond_wait(&fake.cond, &fake.lock);
	fake.in_create = false;
	pthread_mutex_unlock(&fake.lock);
}

static int fake_create(void *st, const char *id, json_t **ret_data, uint64_t *ret_size, struct progress *p,
		       ckpt_error *err)
{
	fake.n_create++;
	if (fake.block_create)
		fake_wait_released(p);
	if (fake.fail_create) /* a real backend removes its half-made data */
		return err_set(err, fake.fail_create, NULL, "fake create failure");
	char *text = fake_read_root(st);
	json_object_set_new(fake.store, id, json_string(text));
	free(text);
	*ret_data = json_pack("{s:s}", "fake", id);
	*ret_size = fake.create_size;
	return 0;
}

static int fake_restore(void *st, const char *id, json_t *data, struct restore_details *extra, struct progress *p,
			ckpt_error *err)
{
	(void)extra, (void)p;
	fake.n_restore++;
	if (fake.fail_restore)
		return err_set(err, fake.fail_restore, NULL, "fake restore failure");
	assert_string_equal(json_string_value(json_object_get(data, "fake")), id);
	json_t *v = json_object_get(fake.store, id);
	if (!v)
		return err_set(err, ENOENT, NULL, "fake: no data for %s", id);
	return fake_write_root(st, json_string_value(v));
}

static int fake_reset(void *st, struct restore_details *extra, ckpt_error *err)
{
	(void)extra, (void)err;
	fake.n_reset++;
	return fake_write_root(st, fake.base);
}

static int fake_remove(void *st, const char *id, json_t *data, ckpt_error *err)
{
	(void)st, (void)data;
	fake.n_remove++;
	if (fake.fail_remove)
		return err_set(err, fake.fail_remove, NULL, "fake remove failure");
	json_object_del(fake.store, id);
	return 0;
}

static void fake_close(void *st, bool unmount)
{
	(void)unmount;
	free(st);
}

/* The table is total (backend.h): what the fake does not model does nothing. */
static int fake_probe(const struct backend_ctx *ctx, ckpt_error *err)
{
	(void)ctx, (void)err;
	return 0;
}

static int fake_precopy(void *st, bool frozen, struct progress *p, ckpt_error *err)
{
	(void)st, (void)frozen, (void)p, (void)err;
	return 0;
}

static void fake_health(void *st, struct backend_health *out)
{
	(void)st, (void)out;
}

static void fake_maintain(void *st)
{
	(void)st;
}

static int fake_cleanup(void *st)
{
	(void)st;
	return 0;
}

static const struct backend_ops fake_ops = {
	.name = "fake",
	.probe = fake_probe,
	.open = fake_open,
	.recover = fake_recover,
	.create = fake_create,
	.precopy = fake_precopy,
	.restore = fake_restore,
	.reset = fake_reset,
	.remove = fake_remove,
	.health = fake_health,
	.maintain = fake_maintain,
	.cleanup = fake_cleanup,
	.close = fake_close,
};

static void fake_release(void)
{
	pthread_mutex_lock(&fake.lock);
	fake.block_create = false;
	pthread_cond_broadcast(&fake.cond);
	pthread_mutex_unlock(&fake.lock);
}

static void fake_wait_in_create(void)
{
	pthread_mutex_lock(&fake.lock);
	while (!fake.in_create)
		pthread_cond_wait(&fake.cond, &fake.lock);
	pthread_mutex_unlock(&fake.lock);
}
