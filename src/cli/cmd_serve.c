/*
 * cmd_serve.c — `cai serve`: the engine process of pg_cai.
 *
 * PostgreSQL's engine worker execs the installed `cai` as "pg_cai engine serve --fd 3 ..." with
 * a connected socket on fd 3, so the database runs the very engine the command line runs, in a
 * process that is not a child of the postmaster and attaches nothing of PostgreSQL's shared
 * memory: a fault in the engine costs only the requests in flight.  The worker has already set
 * the parent-death signal and closed every other descriptor before the exec; this file names the
 * process and hands the socket to cai_serve() (src/serve/serve.c).
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>

#include "cli.h"
#include "serve.h"

static struct
{
	int			fd;
	const char *model;
	const char *template_name;
	const char *device;
	const char *cuda_library;
	int			threads;
	int			max_batch;
	int			max_step_tokens;
	int			ctx;
	int			cache_mb;
	const char *disk_cache_dir;
	int			disk_cache_mb;
	int			max_queue;
	int			max_queue_wait_ms;
	cli_numerics numerics;
} serve_opts;

static const cli_option serve_options[] = {
	{
		.name = "fd",
		.kind = CLI_OPT_INT,
		.target = &serve_opts.fd,
		.metavar = "FD",
		.help = "a connected stream socket to serve on (required)",
		.min = 0,
		.max = 1 << 20,
	},
	CLI_MODEL_OPTION(serve_opts),
	{
		.name = "template",
		.kind = CLI_OPT_STRING,
		.target = &serve_opts.template_name,
		.metavar = "NAME",
		.help = "chat template instead of the detected one (chatml, llama3, gemma, llama2)",
	},
	{
		.name = "device",
		.kind = CLI_OPT_STRING,
		.target = &serve_opts.device,
		.metavar = "DEV",
		.help = "auto, cpu or cuda (default auto)",
	},
	{
		.name = "cuda-library",
		.kind = CLI_OPT_STRING,
		.target = &serve_opts.cuda_library,
		.metavar = "PATH",
		.help = "the CUDA backend library, an absolute path (default: the installed one)",
	},
	CLI_THREADS_OPTION(serve_opts),
	CLI_NUMERICS_OPTIONS(serve_opts),
	{
		.name = "max-batch",
		.kind = CLI_OPT_INT,
		.target = &serve_opts.max_batch,
		.metavar = "N",
		.help = "sequences in one batch (default 16)",
		.min = 1,
		.max = 4096,
	},
	{
		.name = "max-step-tokens",
		.kind = CLI_OPT_INT,
		.target = &serve_opts.max_step_tokens,
		.metavar = "N",
		.help = "token budget of one step (default 512)",
		.min = 1,
		.max = 1 << 20,
	},
	{
		.name = "ctx",
		.short_name = 'c',
		.kind = CLI_OPT_INT,
		.target = &serve_opts.ctx,
		.metavar = "N",
		.help = "context length; 0 = the model's, capped at 4096",
		.min = 0,
		.max = 1 << 20,
	},
	{
		.name = "cache-mb",
		.kind = CLI_OPT_INT,
		.target = &serve_opts.cache_mb,
		.metavar = "MB",
		.help = "prefix cache budget in MiB; 0 = off",
		.min = 0,
		.max = 1 << 30,
	},
	{
		.name = "disk-cache-dir",
		.kind = CLI_OPT_STRING,
		.target = &serve_opts.disk_cache_dir,
		.metavar = "DIR",
		.help = "directory of the prefix cache's disk tier (none by default)",
	},
	{
		.name = "disk-cache-mb",
		.kind = CLI_OPT_INT,
		.target = &serve_opts.disk_cache_mb,
		.metavar = "MB",
		.help = "disk tier budget in MiB; 0 = off",
		.min = 0,
		.max = 1 << 30,
	},
	{
		.name = "max-queue",
		.kind = CLI_OPT_INT,
		.target = &serve_opts.max_queue,
		.metavar = "N",
		.help = "requests that may wait for a batch slot (default 64)",
		.min = 0,
		.max = 1 << 20,
	},
	{
		.name = "max-queue-wait-ms",
		.kind = CLI_OPT_INT,
		.target = &serve_opts.max_queue_wait_ms,
		.metavar = "MS",
		.help = "refuse a request whose estimated wait is longer; 0 = no limit",
		.min = 0,
		.max = 1 << 30,
	},
};

const cli_command cli_serve_command = {
	.name = "serve",
	.synopsis = "--fd FD -m MODEL [options]",
	.summary = "serve pg_cai's engine worker over a socket (started by PostgreSQL)",
	.description =
	"Loads MODEL and serves requests in pg_cai's wire format (src/common/wire.h) on the\n"
	"connected socket FD until the other end closes it.  PostgreSQL's engine worker starts it;\n"
	"it is not meant to be run by hand.",
	.options = serve_options,
	.n_options = sizeof(serve_options) / sizeof(serve_options[0]),
};

/*
 * Names the process "pg_cai engine: MODEL" in ps and top: the command line is rewritten in
 * place (the options were copied first), and the thread name (comm) becomes "pg_cai engine".
 */
static void
set_process_title(const char *model_path)
{
	const char *base = strrchr(model_path, '/');
	char	   *start = cli_argv[0];
	char	   *end;
	size_t		room;

	(void) prctl(PR_SET_NAME, "pg_cai engine", 0, 0, 0);
	/* the arguments must lie one after the other to be rewritten as one string */
	end = cli_argv[0] + strlen(cli_argv[0]) + 1;
	for (int i = 1; i < cli_argc; i++)
	{
		if (cli_argv[i] != end)
			return;
		end += strlen(cli_argv[i]) + 1;
	}
	room = (size_t) (end - start);
	memset(start, 0, room);
	snprintf(start, room, "pg_cai engine: %s", base ? base + 1 : model_path);
}

static char *
copy_option(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* The engine's own notes (the disk tier's), into the server's log with the engine's stderr. */
static void
log_to_stderr(void *arg, const char *line)
{
	(void) arg;
	fprintf(stderr, "pg_cai engine: %s\n", line);
}

int
cmd_serve(int argc, char **argv)
{
	int			rc;
	struct stat st;
	cai_serve_config config;
	char	   *model_path;
	char	   *template_name;
	char	   *device;
	char	   *cuda_library;
	char	   *disk_cache_dir;
	char	   *positional[1];
	int			n_positional;

	memset(&serve_opts, 0, sizeof(serve_opts));
	serve_opts.fd = -1;
	serve_opts.max_batch = 16;
	serve_opts.max_step_tokens = 512;
	serve_opts.max_queue = 64;
	rc = cli_parse(&cli_serve_command, argc, argv, positional, &n_positional);
	if (rc != CLI_EXIT_OK)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (serve_opts.fd < 0)
		return cli_usage_error(&cli_serve_command, "missing --fd");
	if (!serve_opts.model)
		return cli_usage_error(&cli_serve_command, "missing --model");
	if (fstat(serve_opts.fd, &st) != 0 || !S_ISSOCK(st.st_mode))
		return cli_error("serve: descriptor %d is not a socket", serve_opts.fd);

	/* the worker is told of a closed socket by the write, not by a signal */
	signal(SIGPIPE, SIG_IGN);

	model_path = copy_option(serve_opts.model);
	template_name = copy_option(serve_opts.template_name);
	device = copy_option(serve_opts.device);
	cuda_library = copy_option(serve_opts.cuda_library);
	disk_cache_dir = copy_option(serve_opts.disk_cache_dir);
	serve_opts.numerics.weights = copy_option(serve_opts.numerics.weights);
	serve_opts.numerics.weights_cache = copy_option(serve_opts.numerics.weights_cache);
	serve_opts.numerics.weight_rounding = copy_option(serve_opts.numerics.weight_rounding);
	serve_opts.numerics.activations = copy_option(serve_opts.numerics.activations);
	if (!model_path || (serve_opts.template_name && !template_name) ||
		(serve_opts.device && !device) || (serve_opts.cuda_library && !cuda_library) ||
		(serve_opts.disk_cache_dir && !disk_cache_dir))
		return cli_error("serve: out of memory");
	set_process_title(model_path);

	memset(&config, 0, sizeof(config));
	config.model_path = model_path;
	cai_model_params_default(&config.model);
	config.model.n_threads = serve_opts.threads;
	config.model.chat_template = template_name;
	if (!cli_numerics_apply(&serve_opts.numerics, &config.model))
		return CLI_EXIT_USAGE;
	cai_engine_params_default(&config.engine);
	config.engine.device = device ? device : "auto";
	/* the cache holds the CPU's layout: an engine told to use the GPU converts for it */
	if (strcmp(config.engine.device, "cuda") == 0)
		config.model.weights_cache = NULL;
	config.engine.cuda_library = cuda_library;
	config.engine.n_threads = serve_opts.threads;
	config.engine.max_running = serve_opts.max_batch;
	config.engine.max_step_tokens = serve_opts.max_step_tokens;
	config.engine.context_length = serve_opts.ctx;
	config.engine.max_queue = serve_opts.max_queue;
	config.engine.max_queue_wait_ms = serve_opts.max_queue_wait_ms;
	config.engine.host_cache_bytes = (size_t) serve_opts.cache_mb * 1024 * 1024;
	config.engine.disk_cache_dir = disk_cache_dir;
	config.engine.disk_cache_bytes = (size_t) serve_opts.disk_cache_mb * 1024 * 1024;
	config.engine.log = log_to_stderr;

	rc = cai_serve(serve_opts.fd, &config);
	free(disk_cache_dir);
	free(model_path);
	free(template_name);
	free(device);
	free(cuda_library);
	return rc;
}
