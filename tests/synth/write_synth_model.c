/*
 * write_synth_model.c — writes a small synthetic GGUF model (tests/synth/synth_model.c) to a
 * file: for the scenario tests that need a second model (a configuration reload, say), and for
 * tests/bench/make_arch_goldens.py, which has llama.cpp score the architecture presets
 * (synth_presets.h) on the golden tokens.
 *
 *   write_synth_model PATH [NAME [SEED]]      the default small llama
 *   write_synth_model --preset ARCH PATH      a golden preset (llama, llama3, qwen2, qwen3, ...)
 *   write_synth_model --shape NAME PATH [TOKENIZER_GGUF]
 *                                             a real model's shape (llama32-1b, ...) in F16,
 *                                             its vocabulary padded from TOKENIZER_GGUF's
 *                                             tokenizer (else the built-in one)
 *   write_synth_model --golden-tokens         prints the golden token ids, space-separated
 *   write_synth_model --presets | --shapes    prints the preset or shape names, one a line
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth_model.h"
#include "synth_presets.h"

static int
usage(const char *argv0)
{
	fprintf(stderr,
			"usage: %s PATH [NAME [SEED]]\n"
			"       %s --preset ARCH PATH\n"
			"       %s --shape NAME PATH [TOKENIZER_GGUF]\n"
			"       %s --golden-tokens | --presets | --shapes\n", argv0, argv0, argv0, argv0);
	return 2;
}

int
main(int argc, char **argv)
{
	synth_model_config cfg;
	cai_error	err;
	const char *path;

	if (argc == 2 && strcmp(argv[1], "--golden-tokens") == 0)
	{
		int			tokens[SYNTH_GOLDEN_TOKENS];

		synth_golden_tokens(tokens);
		for (int i = 0; i < SYNTH_GOLDEN_TOKENS; i++)
			printf("%s%d", i ? " " : "", tokens[i]);
		printf("\n");
		return 0;
	}
	if (argc == 2 && strcmp(argv[1], "--presets") == 0)
	{
		for (int i = 0; synth_preset_name(i); i++)
			printf("%s\n", synth_preset_name(i));
		return 0;
	}
	if (argc == 2 && strcmp(argv[1], "--shapes") == 0)
	{
		for (int i = 0; synth_shape_name(i); i++)
			printf("%s\n", synth_shape_name(i));
		return 0;
	}
	if (argc >= 2 && strcmp(argv[1], "--shape") == 0)
	{
		if (argc != 4 && argc != 5)
			return usage(argv[0]);
		if (!synth_shape_config(argv[2], &cfg))
		{
			fprintf(stderr, "%s: unknown shape '%s'\n", argv[0], argv[2]);
			return 2;
		}
		path = argv[3];
		if (argc == 5)
			cfg.vocab_from = argv[4];
	}
	else if (argc >= 2 && strcmp(argv[1], "--preset") == 0)
	{
		if (argc != 4)
			return usage(argv[0]);
		if (!synth_preset_config(argv[2], &cfg))
		{
			fprintf(stderr, "%s: unknown preset '%s'\n", argv[0], argv[2]);
			return 2;
		}
		path = argv[3];
	}
	else
	{
		if (argc < 2 || argc > 4 || argv[1][0] == '-')
			return usage(argv[0]);
		synth_model_default_config(&cfg);
		cfg.context_length = 1024;
		if (argc >= 3)
			cfg.name = argv[2];
		if (argc >= 4)
			cfg.seed = strtoull(argv[3], NULL, 10);
		path = argv[1];
	}
	if (synth_model_write(path, &cfg, &err) != CAI_OK)
	{
		fprintf(stderr, "%s: %s\n", argv[0], err.message);
		return 1;
	}
	return 0;
}
