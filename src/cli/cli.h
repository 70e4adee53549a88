/*
 * cli.h — shared pieces of `cai`, the command-line front end of libcai: a table-driven option
 * parser, model/engine setup with error reporting, prompt building and a streaming generation
 * loop.  Each subcommand lives in its own file (cmd_*.c) and returns the process exit status:
 * 0 success, 1 an error (message on stderr), 2 a usage error.
 */
#ifndef CAI_CLI_H
#define CAI_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cai.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_ERROR 1
#define CLI_EXIT_USAGE 2

/* ---------------------------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------------------------- */

typedef enum cli_option_kind
{
	CLI_OPT_FLAG,				/* bool; takes no value */
	CLI_OPT_STRING,				/* const char * */
	CLI_OPT_INT,				/* int, within [min, max] */
	CLI_OPT_FLOAT,				/* float, within [min, max] */
	CLI_OPT_U64,				/* uint64_t */
	CLI_OPT_STRING_LIST,		/* cli_string_list: the option may repeat */
	CLI_OPT_INT_LIST			/* cli_int_list: comma-separated ints within [min, max] */
} cli_option_kind;

#define CLI_LIST_MAX 16

typedef struct cli_string_list
{
	const char *items[CLI_LIST_MAX];
	int			n;
} cli_string_list;

typedef struct cli_int_list
{
	int			items[CLI_LIST_MAX];
	int			n;
} cli_int_list;

typedef struct cli_option
{
	const char *name;			/* long name without dashes: "max-tokens" */
	const char *alias;			/* an old long name still accepted (not in --help), or NULL */
	char		short_name;		/* 'm', or 0 */
	cli_option_kind kind;
	void	   *target;			/* where the value goes (type per kind) */
	const char *metavar;		/* "N", "TEXT"; NULL for flags */
	const char *help;
	double		min;			/* numeric range (ignored unless min < max) */
	double		max;
	bool		min_exclusive;	/* the range excludes min itself (top-p: above 0) */
	int			max_items;		/* list kinds: at most this many (0 = CLI_LIST_MAX) */
	int			max_len;		/* CLI_OPT_STRING_LIST: bytes per item at most (0 = any) */
} cli_option;

typedef struct cli_command
{
	const char *name;			/* "run" */
	const char *synopsis;		/* "-m MODEL -p PROMPT [options]" */
	const char *summary;		/* one line for `cai --help` */
	const char *description;	/* a paragraph for `cai run --help` */
	const cli_option *options;
	int			n_options;
	const char *positional;		/* name of positional arguments ("FILE"), NULL if none */
	int			min_positional;
	int			max_positional;
} cli_command;

/*
 * Parses argv[1..argc) (argv[0] is the command name) against the command's options.  "--name
 * VALUE", "--name=VALUE" and "-x VALUE" are accepted; "--" ends the options.  Positional
 * arguments are returned in positional[] (up to max_positional).  Returns CLI_EXIT_OK when the
 * command should run, -1 after printing help (exit 0), CLI_EXIT_USAGE after printing an error.
 */
int			cli_parse(const cli_command *cmd, int argc, char **argv,
					  char **positional, int *n_positional);

/* Prints the command's usage and options to `out`. */
void		cli_print_usage(const cli_command *cmd, FILE *out);

/* Reports a usage error ("cai run: ...") and a hint to use --help; returns CLI_EXIT_USAGE. */
int			cli_usage_error(const cli_command *cmd, const char *fmt, ...)
			__attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------------------------------------
 * Errors, models, engines
 * ------------------------------------------------------------------------------------------- */

/* Prints "cai: what: status: message" for a failed libcai call; returns CLI_EXIT_ERROR. */
int			cli_report(const char *what, const cai_error *err);

/* Prints "cai: message" to stderr; returns CLI_EXIT_ERROR. */
int			cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The int8 path's numerics options of the commands that load a model (CLI_NUMERICS_OPTIONS). */
typedef struct cli_numerics
{
	bool		gptq_rounding;	/* --gptq-rounding: --weight-rounding gptq */
	bool		two_digit_activations;	/* --two-digit-activations: --activations two_digit */
	const char *weight_rounding;	/* --weight-rounding: "auto", "nearest", "gptq" (NULL: auto) */
	const char *activations;	/* --activations: "auto", "int8", "two_digit", "int8_256" (NULL:
								 * auto) */
	const char *weights;		/* --weights: "auto", "file" or "int8" (NULL: auto) */
	const char *weights_cache;	/* --weights-cache: a directory of prepared weights, or NULL */
} cli_numerics;

/* Sets params' numerics from the options; false (reported) for an unknown mode's name. */
bool		cli_numerics_apply(const cli_numerics *numerics, cai_model_params *params);

/*
 * One line to stderr saying where the model's weights came from (mapped from the weights
 * cache, or converted and cached), "prefix: weights: ..."; nothing without a weights cache.
 * Returns true while the file is still being written (the engine writes it as it runs):
 * cli_report_weights_cache_end then says how that ended, once the engine is freed.
 */
bool		cli_report_weights_cache(const cai_model *model, const char *prefix);
void		cli_report_weights_cache_end(const cai_model *model, const char *prefix);

/* Loads a model (reporting any error); n_threads 0 = all cores; numerics NULL = the defaults. */
cai_model  *cli_load_model(const char *path, int n_threads, bool float_reference,
							const cli_numerics *numerics);

/*
 * The grammar of --json-schema FILE or --json-object (*out stays NULL without either).  Reports
 * errors (an unsupported keyword, say); false on failure.
 */
bool		cli_load_grammar(const char *schema_file, bool json_object, bool free_whitespace,
							 cai_grammar **out);

/* Whether the model's tokenizer asks for BOS before raw text (tokenizer.ggml.add_bos_token). */
bool		cli_model_adds_bos(const cai_model *model);

/* Seconds on a monotonic clock. */
double		cli_now(void);

/* A growable token vector owned by the CLI. */
typedef struct cli_tokens
{
	int32_t    *ids;
	int			n;
	int			cap;
} cli_tokens;

bool		cli_tokens_append(cli_tokens *t, const int32_t *ids, int n);
void		cli_tokens_free(cli_tokens *t);

/*
 * Tokenizes raw text (special-token text stays plain text) with BOS first when the model wants
 * it.  Reports errors; false on failure.
 */
bool		cli_tokenize_raw(const cai_model *model, const char *text, cli_tokens *out);

/* Reads a whole file (or stdin for "-") into a NUL-terminated malloc'd buffer; NULL on error. */
char	   *cli_read_file(const char *path, size_t *len);

/* ---------------------------------------------------------------------------------------------
 * Generation
 * ------------------------------------------------------------------------------------------- */

/* Ctrl-C while generating cancels the request instead of killing the process. */
void		cli_install_interrupt_handler(void);
bool		cli_interrupted(void);
void		cli_clear_interrupt(void);

typedef struct cli_generation
{
	cli_tokens	tokens;			/* every generated token id, the final end-of-turn included */
	cai_finish_reason finish;
	cai_usage	usage;
	bool		cancelled;		/* interrupted by Ctrl-C */
	bool		ends_with_newline;	/* the streamed text's last byte was '\n' */
	size_t		text_bytes;
	double		decode_seconds; /* from the first token to the finish */
	/* set by the caller: a JSON line per token with its logprobs (request asks logprobs) */
	FILE	   *logprobs_out;
	const cai_model *model;		/* the tokens' text for logprobs_out */
} cli_generation;

/*
 * Submits one request and steps the engine until it finishes, streaming its text to `out`
 * (flushed per step; NULL to discard).  Returns CLI_EXIT_OK, or CLI_EXIT_ERROR after reporting.
 * gen->tokens must be zeroed (or freed) by the caller.
 */
int			cli_generate(cai_engine *engine, const cai_request_params *params, FILE *out,
						 cli_generation *gen);

/* ---------------------------------------------------------------------------------------------
 * Commands
 * ------------------------------------------------------------------------------------------- */

int			cmd_run(int argc, char **argv);
int			cmd_chat(int argc, char **argv);
int			cmd_bench(int argc, char **argv);
int			cmd_eval(int argc, char **argv);
int			cmd_inspect(int argc, char **argv);
int			cmd_serve(int argc, char **argv);
int			cmd_embed(int argc, char **argv);

extern const cli_command cli_run_command;
extern const cli_command cli_chat_command;
extern const cli_command cli_bench_command;
extern const cli_command cli_eval_command;
extern const cli_command cli_inspect_command;
extern const cli_command cli_serve_command;
extern const cli_command cli_embed_command;

/* The process's own argc and argv, for a command that renames the process (serve). */
extern int	cli_argc;
extern char **cli_argv;

/* Option entries every model-running command shares, over a struct with model / threads. */
#define CLI_MODEL_OPTION(opts) \
	{ \
		.name = "model", .short_name = 'm', .kind = CLI_OPT_STRING, .target = &(opts).model, \
		.metavar = "MODEL", .help = "GGUF model file (required)", \
	}
#define CLI_THREADS_OPTION(opts) \
	{ \
		.name = "threads", .short_name = 'T', .kind = CLI_OPT_INT, .target = &(opts).threads, \
		.metavar = "N", .help = "CPU threads; 0 = all cores", .min = 0, .max = 1024, \
	}
#define CLI_ISA_OPTION(opts) \
	{ \
		.name = "isa", .kind = CLI_OPT_STRING, .target = &(opts).isa, .metavar = "PATH", \
		.help = "CPU kernels: avx512-amx, avx512-vnni, avx-vnni, avx2 or generic (default: the best " \
			"here)", \
	}
#define CLI_NUMERICS_OPTIONS(opts) \
	{ \
		.name = "weights", .kind = CLI_OPT_STRING, .target = &(opts).numerics.weights, \
		.metavar = "MODE", \
		.help = "auto (default): file from 500M weights up, else int8; file: the GGUF's own 4-8 bit formats; int8: requantized", \
	}, \
	{ \
		.name = "weight-rounding", .kind = CLI_OPT_STRING, .target = &(opts).numerics.weight_rounding, \
		.metavar = "MODE", \
		.help = "int8 weights: auto (default): gptq on a model under 500M weights, else nearest; nearest; gptq (along the calibration inputs)", \
	}, \
	{ \
		.name = "activations", .kind = CLI_OPT_STRING, .target = &(opts).numerics.activations, \
		.metavar = "MODE", \
		.help = "GEMM inputs: auto (default): two_digit on a model under 500M weights with int8 weights, else int8; int8; two_digit (closer to float, GEMMs twice the work); int8_256 (the file's K-quants: a scale per 256 inputs, faster prefill, less faithful)", \
	}, \
	{ \
		.name = "gptq-rounding", .alias = "compensated-rounding", .kind = CLI_OPT_FLAG, \
		.target = &(opts).numerics.gptq_rounding, \
		.help = "the same as --weight-rounding gptq", \
	}, \
	{ \
		.name = "two-digit-activations", .kind = CLI_OPT_FLAG, \
		.target = &(opts).numerics.two_digit_activations, \
		.help = "the same as --activations two_digit", \
	}, \
	{ \
		.name = "weights-cache", .kind = CLI_OPT_STRING, .target = &(opts).numerics.weights_cache, \
		.metavar = "DIR", \
		.help = "keep the CPU's prepared weights in DIR: a later run with the same model and settings maps them instead of converting", \
	}

/* --json-schema FILE and --json-object, over a struct with json_schema and json_object. */
#define CLI_JSON_OPTIONS(opts) \
	{ \
		.name = "json-schema", .kind = CLI_OPT_STRING, .target = &(opts).json_schema, \
		.metavar = "FILE", .help = "the reply is JSON valid against the JSON Schema in FILE", \
	}, \
	{ \
		.name = "json-object", .kind = CLI_OPT_FLAG, .target = &(opts).json_object, \
		.help = "the reply is a JSON object", \
	}, \
	{ \
		.name = "json-free-whitespace", .kind = CLI_OPT_FLAG, .target = &(opts).json_free_ws, \
		.help = "a JSON reply may put whitespace runs between its tokens (default: one space at most, after ':' or ',')", \
	}

/*
 * The sampling options that `run` and `chat` share, as cli_option entries over a struct with
 * the fields temperature, top_p, top_k and seed.  Their ranges are cai.h's request limits.
 */
#define CLI_SAMPLING_OPTIONS(opts) \
	{ \
		.name = "temp", .short_name = 't', .kind = CLI_OPT_FLOAT, .target = &(opts).temperature, \
		.metavar = "T", .help = "sampling temperature; 0 = greedy (default 0)", \
		.min = 0, .max = CAI_TEMPERATURE_MAX, \
	}, \
	{ \
		.name = "top-p", .kind = CLI_OPT_FLOAT, .target = &(opts).top_p, .metavar = "P", \
		.help = "nucleus sampling mass; 1 = off (default 1)", .min = 0, .max = 1, \
		.min_exclusive = true, \
	}, \
	{ \
		.name = "top-k", .kind = CLI_OPT_INT, .target = &(opts).top_k, .metavar = "K", \
		.help = "sample among the K best tokens; 0 = off", .min = 0, .max = CAI_TOP_K_MAX, \
	}, \
	{ \
		.name = "seed", .short_name = 's', .kind = CLI_OPT_U64, .target = &(opts).seed, \
		.metavar = "S", .help = "sampling seed (default 0)", \
	}

/*
 * The penalties and filters that `run` and `chat` share (a field `pen` of their options).
 * --logit-bias ID=BIAS repeats; cli_penalties_apply parses the pairs and fills the request.
 */
typedef struct cli_penalties
{
	float		presence;
	float		frequency;
	float		repetition;
	float		min_p;
	cli_string_list logit_bias;
	cai_logit_bias bias[CLI_LIST_MAX];
} cli_penalties;

#define CLI_PENALTY_OPTIONS(opts) \
	{ \
		.name = "presence-penalty", .kind = CLI_OPT_FLOAT, .target = &(opts).pen.presence, \
		.metavar = "X", .help = "subtract X from the logit of every token the reply holds (default 0)", \
		.min = -CAI_PENALTY_MAX, .max = CAI_PENALTY_MAX, \
	}, \
	{ \
		.name = "frequency-penalty", .kind = CLI_OPT_FLOAT, .target = &(opts).pen.frequency, \
		.metavar = "X", .help = "subtract X times its count in the reply from a token's logit (default 0)", \
		.min = -CAI_PENALTY_MAX, .max = CAI_PENALTY_MAX, \
	}, \
	{ \
		.name = "repetition-penalty", .kind = CLI_OPT_FLOAT, .target = &(opts).pen.repetition, \
		.metavar = "X", .help = "llama.cpp's repeat penalty over the last 64 tokens; 1 = off (default 1)", \
		.min = 0, .max = CAI_REPETITION_PENALTY_MAX, .min_exclusive = true, \
	}, \
	{ \
		.name = "min-p", .kind = CLI_OPT_FLOAT, .target = &(opts).pen.min_p, .metavar = "P", \
		.help = "drop tokens less likely than P times the likeliest; 0 = off (default 0)", \
		.min = 0, .max = 1, \
	}, \
	{ \
		.name = "logit-bias", .kind = CLI_OPT_STRING_LIST, .target = &(opts).pen.logit_bias, \
		.metavar = "ID=BIAS", .help = "add BIAS (-100..100; -100 bans) to token ID's logit (repeatable)", \
	}

void		cli_penalties_default(cli_penalties *p);
/* Fills sp's penalties from p; false (after a usage message naming the option) on a bad pair. */
bool		cli_penalties_apply(const cli_command *cmd, cli_penalties *p, cai_sampling_params *sp);

#endif							/* CAI_CLI_H */
