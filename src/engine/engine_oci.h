/* engine_oci.h: checkpoints as OCI images in a registry (docs/registry.md).
 * Knows no HTTP: the API decodes requests into these calls. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include "lib/util.h"

struct engine;

struct push_req {
	const char *ref; /* HOST[:PORT]/REPO[:TAG] */
	bool base;       /* the base as the first layer (default true) */
};
#define PUSH_MAX_LAYERS 64 /* the base, 62 ancestors, the checkpoint */
/* What a push did, as data; the API layer writes the JSON. */
struct push_result {
	char checkpoint_id[32];
	char ref[700];   /* HOST[:PORT]/REPO:TAG as pushed */
	char digest[80]; /* the manifest's */
	struct push_result_layer {
		char digest[80];
		const char *media_type; /* static */
		uint64_t size;
		bool uploaded; /* false: the registry held it, or mounted it */
	} layers[PUSH_MAX_LAYERS];
	size_t n_layers;
	uint64_t uploaded_bytes, reused_bytes;
};
/* Push checkpoint id_or_name; on success fills ret. */
int engine_push(struct engine *e, const char *id_or_name, const struct push_req *req, struct push_result *ret,
		ckpt_error *err);

/* How the last async push of a checkpoint went: its record's "push". */
enum push_state {
	PUSH_PUSHING = 1,
	PUSH_DONE,
	PUSH_FAILED
};
struct push_outcome {
	enum push_state state;
	char ref[700];
	char digest[80];                       /* done */
	uint64_t uploaded_bytes, reused_bytes; /* done */
	char code[64];                         /* failed */
	char detail[512];                      /* failed */
};
/* catalog.h's record_push_json writes it as the record's "push". */

struct ckpt_view;
/* The same in the background: *ret is the checkpoint's record, with its
 * push "pushing" (ckpt_view_free it). While it runs the record's progress
 * counts the bytes; its "push" says how it ended. */
int engine_push_async(struct engine *e, const char *id_or_name, const struct push_req *req, struct ckpt_view *ret,
		      ckpt_error *err);

/* At start: a push a stop cut short ("pushing" on its record) is failed. */
void engine_push_recover(struct engine *e);

/* One root of the image and the local root it fills. */
struct pull_root {
	const char *image, *local;
};
struct pull_req {
	const char *ref;               /* HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:HEX */
	const struct pull_root *roots; /* borrowed; n_roots 0: each image root fills the root of its path */
	size_t n_roots;
};
struct ckpt_view;
/* Pull an image as a new checkpoint; *ret is its record (with pull_of
 * {ref, digest, roots}), ckpt_view_free it. Nothing is kept of a failed
 * pull. */
int engine_pull(struct engine *e, const struct pull_req *req, struct ckpt_view *ret, ckpt_error *err);
