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
