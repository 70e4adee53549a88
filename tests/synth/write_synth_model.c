/*
 * write_synth_model.c — writes a small synthetic GGUF model (tests/synth/synth_model.c) to a
 * file, for the scenario tests that need a second model (a configuration reload, say).
 *
 *   write_synth_model PATH [NAME [SEED]]
 */
#include <stdio.h>
#include <stdlib.h>

#include "synth_model.h"

int
main(int argc, char **argv)
{
	synth_model_config cfg;
	cai_error	err;

	if (argc < 2 || argc > 4)
	{
		fprintf(stderr, "usage: %s PATH [NAME [SEED]]\n", argv[0]);
		return 2;
	}
	synth_model_default_config(&cfg);
	cfg.context_length = 1024;
	if (argc >= 3)
		cfg.name = argv[2];
	if (argc >= 4)
		cfg.seed = strtoull(argv[3], NULL, 10);
	if (synth_model_write(argv[1], &cfg, &err) != CAI_OK)
	{
		fprintf(stderr, "%s: %s\n", argv[0], err.message);
		return 1;
	}
	return 0;
}
