/* services_strv.c: the small string list the services module keeps unit
 * names in; below every other services file, so none of them calls up. */
#include "services/services_ops.h"

int services_strv_add(struct strv *s, const char *str)
{
	if (services_strv_contains(s, str))
		return 0;
	char **v = realloc(s->v, (s->n + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	s->v = v;
	if (!(v[s->n] = strdup(str)))
		return -ENOMEM;
	s->n++;
	return 0;
}

bool services_strv_contains(const struct strv *s, const char *str)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], str) == 0)
			return true;
	return false;
}

void services_strv_clear(struct strv *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	s->v = NULL;
	s->n = 0;
}

json_t *services_strv_json(const struct strv *s)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < s->n; i++)
		json_array_append_new(a, json_string(s->v[i]));
	return a;
}

int services_strv_from_json(struct strv *s, json_t *a)
{
	int r = json_is_array(a) ? 0 : -EINVAL;
	size_t i;
	json_t *v;
	json_array_foreach (a, i, v) {
		if (!json_is_string(v))
			r = r < 0 ? r : -EINVAL;
		else if (services_strv_add(s, json_string_value(v)) < 0)
			return -ENOMEM;
	}
	return r;
}
