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

json_t *api_names_json(const struct strv *l)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < l->n; i++)
		json_array_append_new(a, json_string(l->v[i]));
	return a;
}

json_t *api_failures_json(const struct svc_report *r)
{
	json_t *o = json_object();
	for (size_t i = 0; o && i < r->n_failures; i++)
		json_object_set_new(o, r->failures[i].unit, json_string(r->failures[i].reason));
	return o;
}
