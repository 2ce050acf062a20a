/* fuzz_config.c: a configuration file's JSON applied over the defaults. */
#include <jansson.h>
#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct config cfg;
	ckpt_error err = { 0 };
	json_error_t jerr;

	config_defaults(&cfg);
	json_t *obj = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
	if (obj) {
		int r = config_apply_json(&cfg, obj, &err);
		if (r < 0 && !err.msg[0])
			abort(); /* a refusal says why */
		if (r == 0 &&
		    (cfg.flatten_depth < 2 || cfg.flatten_depth > 400 || cfg.service_timeout_secs < 1 ||
		     cfg.service_timeout_secs > 3600 || cfg.max_checkpoints < 1))
			abort();
		json_decref(obj);
	}
	config_free(&cfg);
	return 0;
}
