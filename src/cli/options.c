/*
 * options.c — the table-driven option parser and usage printer shared by every `cai` command.
 *
 * Every option of a command is one cli_option row (name, type, target, help, range), so the
 * parser, the range checks and the --help text cannot drift apart.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Prints the command's usage: synopsis, description and one line per option. */
void
cli_print_usage(const cli_command *cmd, FILE *out)
{
	fprintf(out, "usage: cai %s %s\n", cmd->name, cmd->synopsis);
	if (cmd->description)
		fprintf(out, "\n%s\n", cmd->description);
	fprintf(out, "\noptions:\n");
	for (int i = 0; i < cmd->n_options; i++)
	{
		const cli_option *o = &cmd->options[i];
		char		left[64];

		if (o->short_name)
			snprintf(left, sizeof(left), "-%c, --%s%s%s", o->short_name, o->name,
					 o->metavar ? " " : "", o->metavar ? o->metavar : "");
		else
			snprintf(left, sizeof(left), "    --%s%s%s", o->name,
					 o->metavar ? " " : "", o->metavar ? o->metavar : "");
		fprintf(out, "  %-26s %s\n", left, o->help);
	}
	fprintf(out, "  %-26s %s\n", "-h, --help", "show this help");
}

/* Reports a usage error and returns CLI_EXIT_USAGE. */
int
cli_usage_error(const cli_command *cmd, const char *fmt, ...)
{
	va_list		ap;

	fprintf(stderr, "cai %s: ", cmd->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry \"cai %s --help\" for more information.\n", cmd->name);
	return CLI_EXIT_USAGE;
}

static const cli_option *
find_long(const cli_command *cmd, const char *name, size_t len)
{
	for (int i = 0; i < cmd->n_options; i++)
	{
		const char *alias = cmd->options[i].alias;

		if ((strlen(cmd->options[i].name) == len && strncmp(cmd->options[i].name, name, len) == 0) ||
			(alias && strlen(alias) == len && strncmp(alias, name, len) == 0))
			return &cmd->options[i];
	}
	return NULL;
}

static const cli_option *
find_short(const cli_command *cmd, char c)
{
	for (int i = 0; i < cmd->n_options; i++)
		if (cmd->options[i].short_name == c)
			return &cmd->options[i];
	return NULL;
}

static bool
has_range(const cli_option *o)
{
	return o->min < o->max;
}

/* Parses a whole decimal integer within the option's range; false with a message otherwise. */
static bool
parse_int_value(const cli_command *cmd, const cli_option *o, const char *text, long long *out)
{
	char	   *end;
	long long	v;

	errno = 0;
	v = strtoll(text, &end, 10);
	if (errno != 0 || end == text || *end != '\0')
	{
		cli_usage_error(cmd, "--%s expects an integer, got \"%s\"", o->name, text);
		return false;
	}
	if (has_range(o) && (v < (long long) o->min || v > (long long) o->max))
	{
		cli_usage_error(cmd, "--%s must be between %.0f and %.0f, got %lld",
						o->name, o->min, o->max, v);
		return false;
	}
	*out = v;
	return true;
}

/* Stores one option's value; false (after a message) when it does not parse. */
static bool
apply_option(const cli_command *cmd, const cli_option *o, const char *value)
{
	switch (o->kind)
	{
		case CLI_OPT_FLAG:
			*(bool *) o->target = true;
			return true;
		case CLI_OPT_STRING:
			*(const char **) o->target = value;
			return true;
		case CLI_OPT_INT:
			{
				long long	v;

				if (!parse_int_value(cmd, o, value, &v))
					return false;
				if (v < INT_MIN || v > INT_MAX)
				{
					cli_usage_error(cmd, "--%s is out of range: %s", o->name, value);
					return false;
				}
				*(int *) o->target = (int) v;
				return true;
			}
		case CLI_OPT_FLOAT:
			{
				char	   *end;
				double		v;

				errno = 0;
				v = strtod(value, &end);
				if (errno != 0 || end == value || *end != '\0' || !isfinite(v))
				{
					cli_usage_error(cmd, "--%s expects a number, got \"%s\"", o->name, value);
					return false;
				}
				if (has_range(o) && o->min_exclusive && !(v > o->min && v <= o->max))
				{
					cli_usage_error(cmd, "--%s must be greater than %g and at most %g, got %g",
									o->name, o->min, o->max, v);
					return false;
				}
				if (has_range(o) && (v < o->min || v > o->max))
				{
					cli_usage_error(cmd, "--%s must be between %g and %g, got %g",
									o->name, o->min, o->max, v);
					return false;
				}
				*(float *) o->target = (float) v;
				return true;
			}
		case CLI_OPT_U64:
			{
				char	   *end;
				unsigned long long v;

				errno = 0;
				v = strtoull(value, &end, 10);
				if (errno != 0 || end == value || *end != '\0' || value[0] == '-')
				{
					cli_usage_error(cmd, "--%s expects a non-negative integer, got \"%s\"",
									o->name, value);
					return false;
				}
				*(uint64_t *) o->target = (uint64_t) v;
				return true;
			}
		case CLI_OPT_STRING_LIST:
			{
				cli_string_list *list = o->target;
				int			cap = o->max_items > 0 ? o->max_items : CLI_LIST_MAX;

				if (list->n >= cap)
				{
					cli_usage_error(cmd, "--%s may be given at most %d times", o->name, cap);
					return false;
				}
				if (o->max_len > 0 && strlen(value) > (size_t) o->max_len)
				{
					cli_usage_error(cmd, "--%s takes strings of at most %d bytes, got one of %zu",
									o->name, o->max_len, strlen(value));
					return false;
				}
				list->items[list->n++] = value;
				return true;
			}
		case CLI_OPT_INT_LIST:
			{
				cli_int_list *list = o->target;
				int			cap = o->max_items > 0 ? o->max_items : CLI_LIST_MAX;
				const char *p = value;

				list->n = 0;
				for (;;)
				{
					char		item[32];
					const char *comma = strchr(p, ',');
					size_t		len = comma ? (size_t) (comma - p) : strlen(p);
					long long	v;

					if (len == 0 || len >= sizeof(item))
					{
						cli_usage_error(cmd, "--%s expects comma-separated integers, got \"%s\"",
										o->name, value);
						return false;
					}
					memcpy(item, p, len);
					item[len] = '\0';
					if (!parse_int_value(cmd, o, item, &v))
						return false;
					if (list->n >= cap)
					{
						cli_usage_error(cmd, "--%s takes at most %d values", o->name, cap);
						return false;
					}
					list->items[list->n++] = (int) v;
					if (!comma)
						break;
					p = comma + 1;
				}
				return true;
			}
	}
	return false;
}

/* See cli.h. */
int
cli_parse(const cli_command *cmd, int argc, char **argv, char **positional, int *n_positional)
{
	bool		options_done = false;

	*n_positional = 0;
	for (int i = 1; i < argc; i++)
	{
		const char *arg = argv[i];
		const cli_option *o = NULL;
		const char *value = NULL;

		if (!options_done && (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0))
		{
			cli_print_usage(cmd, stdout);
			return -1;
		}
		if (!options_done && strcmp(arg, "--") == 0)
		{
			options_done = true;
			continue;
		}
		if (!options_done && arg[0] == '-' && arg[1] == '-')
		{
			const char *name = arg + 2;
			const char *eq = strchr(name, '=');

			o = find_long(cmd, name, eq ? (size_t) (eq - name) : strlen(name));
			if (!o)
				return cli_usage_error(cmd, "unknown option \"%s\"", arg);
			if (eq)
			{
				if (o->kind == CLI_OPT_FLAG)
					return cli_usage_error(cmd, "--%s takes no value", o->name);
				value = eq + 1;
			}
		}
		else if (!options_done && arg[0] == '-' && arg[1] != '\0')
		{
			o = find_short(cmd, arg[1]);
			if (!o || arg[2] != '\0')
				return cli_usage_error(cmd, "unknown option \"%s\"", arg);
		}
		else
		{
			if (*n_positional >= cmd->max_positional)
				return cli_usage_error(cmd, "unexpected argument \"%s\"", arg);
			positional[(*n_positional)++] = argv[i];
			continue;
		}

		if (o->kind != CLI_OPT_FLAG && value == NULL)
		{
			if (i + 1 >= argc)
				return cli_usage_error(cmd, "--%s needs a value (%s)", o->name, o->metavar);
			value = argv[++i];
		}
		if (!apply_option(cmd, o, value))
			return CLI_EXIT_USAGE;
	}
	if (*n_positional < cmd->min_positional)
		return cli_usage_error(cmd, "missing %s", cmd->positional ? cmd->positional : "argument");
	return CLI_EXIT_OK;
}

/* See cli.h. */
void
cli_penalties_default(cli_penalties *p)
{
	memset(p, 0, sizeof(*p));
	p->repetition = 1.0f;
}

/* See cli.h.  The vocabulary check is the engine's (at submit), which knows the model. */
bool
cli_penalties_apply(const cli_command *cmd, cli_penalties *p, cai_sampling_params *sp)
{
	sp->presence_penalty = p->presence;
	sp->frequency_penalty = p->frequency;
	sp->repetition_penalty = p->repetition;
	sp->min_p = p->min_p;
	for (int i = 0; i < p->logit_bias.n; i++)
	{
		const char *pair = p->logit_bias.items[i];
		char	   *end;
		long		id;
		double		bias;

		errno = 0;
		id = strtol(pair, &end, 10);
		if (errno != 0 || end == pair || *end != '=' || id < 0 || id > INT32_MAX ||
			!isdigit((unsigned char) pair[0]))
		{
			cli_usage_error(cmd, "--logit-bias expects ID=BIAS with a token id ID >= 0, got \"%s\"",
							pair);
			return false;
		}
		const char *bias_text = end + 1;

		bias = strtod(bias_text, &end);
		if (errno != 0 || *end != '\0' || end == bias_text ||
			!(bias >= -CAI_LOGIT_BIAS_MAX && bias <= CAI_LOGIT_BIAS_MAX))
		{
			cli_usage_error(cmd, "--logit-bias BIAS must be a number between %g and %g, got \"%s\"",
							-CAI_LOGIT_BIAS_MAX, CAI_LOGIT_BIAS_MAX, pair);
			return false;
		}
		p->bias[i].token = (int32_t) id;
		p->bias[i].bias = (float) bias;
	}
	sp->n_logit_bias = p->logit_bias.n;
	sp->logit_bias = p->logit_bias.n > 0 ? p->bias : NULL;
	return true;
}
