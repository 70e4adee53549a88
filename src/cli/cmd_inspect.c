/*
 * cmd_inspect.c — `cai inspect`: what a GGUF model is (architecture, metadata, tensors and
 * their types), as the engine sees it after loading.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static struct
{
	const char *model;
	int			threads;
} inspect_opts;

static const cli_option inspect_options[] = {
	{
		.name = "model",
		.short_name = 'm',
		.kind = CLI_OPT_STRING,
		.target = &inspect_opts.model,
		.metavar = "MODEL",
		.help = "GGUF model file (or give it as the argument)",
	},
	{
		.name = "threads",
		.short_name = 'T',
		.kind = CLI_OPT_INT,
		.target = &inspect_opts.threads,
		.metavar = "N",
		.help = "threads for loading; 0 = all cores",
		.min = 0,
		.max = 1024,
	},
};

const cli_command cli_inspect_command = {
	.name = "inspect",
	.synopsis = "MODEL",
	.summary = "describe a GGUF model: architecture, metadata, tensors",
	.description =
	"Loads MODEL and prints its architecture, configuration, metadata and tensors with their\n"
	"types.  The model is fully loaded, so a file the engine cannot use is reported as such.",
	.options = inspect_options,
	.n_options = sizeof(inspect_options) / sizeof(inspect_options[0]),
	.positional = "MODEL",
	.min_positional = 0,
	.max_positional = 1,
};

int
cmd_inspect(int argc, char **argv)
{
	char	   *positional[1];
	int			n_positional;
	int			rc;
	const char *path;
	cai_model  *model;
	cai_error	err = {0};
	char	   *text = NULL;

	memset(&inspect_opts, 0, sizeof(inspect_opts));
	rc = cli_parse(&cli_inspect_command, argc, argv, positional, &n_positional);
	if (rc != CLI_EXIT_OK)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (n_positional == 1 && inspect_opts.model)
		return cli_usage_error(&cli_inspect_command, "give the model either as -m or as MODEL");
	path = n_positional == 1 ? positional[0] : inspect_opts.model;
	if (!path)
		return cli_usage_error(&cli_inspect_command, "missing MODEL");

	model = cli_load_model(path, inspect_opts.threads, false, NULL);
	if (!model)
		return CLI_EXIT_ERROR;
	if (cai_model_describe(model, &text, &err) != CAI_OK)
		rc = cli_report("could not describe the model", &err);
	else
	{
		fputs(text, stdout);
		if (text[0] && text[strlen(text) - 1] != '\n')
			fputc('\n', stdout);
		rc = CLI_EXIT_OK;
	}
	cai_free(text);
	cai_model_free(model);
	return rc;
}
