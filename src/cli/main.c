/*
 * main.c — `cai`: run, chat with, benchmark, evaluate and inspect a GGUF model with libcai,
 * without PostgreSQL.  This file only dispatches to the subcommand.
 */
#include <string.h>

#include "cli.h"

typedef struct cli_entry
{
	const cli_command *command;
	int			(*run) (int argc, char **argv);
} cli_entry;

static const cli_entry entries[] = {
	{&cli_run_command, cmd_run},
	{&cli_chat_command, cmd_chat},
	{&cli_bench_command, cmd_bench},
	{&cli_eval_command, cmd_eval},
	{&cli_embed_command, cmd_embed},
	{&cli_inspect_command, cmd_inspect},
	{&cli_serve_command, cmd_serve},
};

int			cli_argc;
char	  **cli_argv;

#define N_ENTRIES ((int) (sizeof(entries) / sizeof(entries[0])))

static void
print_main_usage(FILE *out)
{
	fprintf(out,
			"usage: cai COMMAND [options]\n"
			"\n"
			"Runs a GGUF chat model with pg_cai's inference engine, outside PostgreSQL.\n"
			"\n"
			"commands:\n");
	for (int i = 0; i < N_ENTRIES; i++)
		fprintf(out, "  %-9s %s\n", entries[i].command->name, entries[i].command->summary);
	fprintf(out, "\n\"cai COMMAND --help\" describes a command's options.\n");
}

int
main(int argc, char **argv)
{
	cli_argc = argc;
	cli_argv = argv;
	if (argc < 2)
	{
		print_main_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
		strcmp(argv[1], "help") == 0)
	{
		print_main_usage(stdout);
		return CLI_EXIT_OK;
	}
	for (int i = 0; i < N_ENTRIES; i++)
		if (strcmp(argv[1], entries[i].command->name) == 0)
			return entries[i].run(argc - 1, argv + 1);
	fprintf(stderr, "cai: unknown command \"%s\"\n\n", argv[1]);
	print_main_usage(stderr);
	return CLI_EXIT_USAGE;
}
