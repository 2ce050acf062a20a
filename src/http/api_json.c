/* api_json.c: the engine's structs written as the API's JSON. Every route
 * file renders through here, so one shape serves each of them (and none of
 * them calls another route file for it). */
#include "http/api.h"

#include "engine/catalog.h"
#include "engine/engine.h"

json_t *api_record_json(const struct ckpt_view *v)
{
	json_t *o = record_json(v->rec, false);
	if (o && v->has_progress)
		json_object_set_new(o, "progress",
				    json_pack("{s:I, s:I, s:I, s:I}", "bytes_done", (json_int_t)v->bytes_done,
					      "bytes_total", (json_int_t)v->bytes_total, "files_done",
					      (json_int_t)v->files_done, "files_total", (json_int_t)v->files_total));
	if (o && v->push)
		json_object_set(o, "push", v->push);
	return o;
}
