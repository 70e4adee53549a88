/*
 * guc.c — defines pg_cai's configuration settings.
 *
 * What sizes shared memory (max_batch, max_queue: the intake ring) or the set of background
 * workers is PGC_POSTMASTER.  What configures the engine process (the model file, its template,
 * device, threads, context, step budget, cache size) is PGC_SIGHUP: a configuration reload makes
 * the worker start a new engine process with it, and such settings can only be set in the
 * configuration files or by ALTER SYSTEM, never by an ordinary user.  cache_isolation is
 * superuser-only (PGC_SUSET) because it decides who may share cached prompt prefixes, a security
 * property.  max_tokens is an ordinary per-session default.
 */
#include "postgres.h"

#include <ctype.h>
#include <limits.h>

#include "lib/stringinfo.h"
#include "utils/guc.h"
#include "utils/varlena.h"

#include "cai.h"
#include "guc.h"

char	   *cai_model_path = NULL;
char	   *cai_models_setting = NULL;
char	   *cai_chat_template = NULL;
char	   *cai_weights_cache = NULL;
int			cai_device = CAI_DEVICE_AUTO;
int			cai_weight_rounding = CAI_ROUNDING_AUTO;
int			cai_weights = CAI_WEIGHTS_AUTO;
int			cai_activation_precision = CAI_ACTIVATIONS_AUTO;
int			cai_threads = 0;
int			cai_max_batch = 16;
int			cai_max_step_tokens = 512;
int			cai_context_length = 0;
int			cai_host_cache_size_mb = 256;
char	   *cai_disk_cache_dir = NULL;
int			cai_disk_cache_size_mb = 1024;
int			cai_max_queue = 64;
char	   *cai_job_databases = NULL;
int			cai_job_workers = 2;
int			cai_max_queue_wait_ms = 0;
int			cai_reload_grace_ms = 30000;
int			cai_engine_hang_timeout_ms = 30000;
int			cai_cache_isolation = CAI_ISOLATION_ROLE;
int			cai_default_max_tokens = 256;
int			cai_max_requests_per_role = 0;
int			cai_max_request_messages = 1000;
int			cai_max_request_bytes = 1048576;

static const struct config_enum_entry device_options[] = {
	{"auto", CAI_DEVICE_AUTO, false},
	{"cpu", CAI_DEVICE_CPU, false},
	{"cuda", CAI_DEVICE_CUDA, false},
	{NULL, 0, false}
};

static const struct config_enum_entry weight_rounding_options[] = {
	{"auto", CAI_ROUNDING_AUTO, false},
	{"nearest", CAI_ROUNDING_NEAREST, false},
	{"gptq", CAI_ROUNDING_GPTQ, false},
	/* the old name, accepted for one release; hidden from the listed values */
	{"compensated", CAI_ROUNDING_GPTQ, true},
	{NULL, 0, false}
};

static const struct config_enum_entry weights_options[] = {
	{"auto", CAI_WEIGHTS_AUTO, false},
	{"file", CAI_WEIGHTS_FILE, false},
	{"int8", CAI_WEIGHTS_INT8, false},
	{NULL, 0, false}
};

static const struct config_enum_entry activation_precision_options[] = {
	{"auto", CAI_ACTIVATIONS_AUTO, false},
	{"int8", CAI_ACTIVATIONS_INT8, false},
	{"two_digit", CAI_ACTIVATIONS_TWO_DIGIT, false},
	{"int8_256", CAI_ACTIVATIONS_INT8_256, false},
	/* the old name, accepted for one release; hidden from the listed values */
	{"int8x2", CAI_ACTIVATIONS_TWO_DIGIT, true},
	{NULL, 0, false}
};

static const struct config_enum_entry cache_isolation_options[] = {
	{"role", CAI_ISOLATION_ROLE, false},
	{"conversation", CAI_ISOLATION_CONVERSATION, false},
	{"none", CAI_ISOLATION_NONE, false},
	{NULL, 0, false}
};

/*
 * CaiDeviceSettingName
 *		The engine's name for a pg_cai.device value ("auto", "cpu", "cuda").
 */
const char *
CaiDeviceSettingName(int device)
{
	const struct config_enum_entry *entry;

	for (entry = device_options; entry->name != NULL; entry++)
	{
		if (entry->val == device)
			return entry->name;
	}
	return "auto";
}

/* Trims the blanks around [*start, *end). */
static void
trim_blanks(const char **start, const char **end)
{
	while (*start < *end && isspace((unsigned char) **start))
		(*start)++;
	while (*end > *start && isspace((unsigned char) (*end)[-1]))
		(*end)--;
}

/*
 * parse_model_entry
 *		One "name=path" entry of pg_cai.models, [start, end) of the setting; false with the
 *		reason in error when it is not a valid one.
 */
static bool
parse_model_entry(const char *start, const char *end, CaiModelEntry *entry, char *error,
				  int error_size)
{
	const char *eq;
	const char *name_end;
	const char *path_start;
	int			name_len;

	trim_blanks(&start, &end);
	eq = memchr(start, '=', end - start);
	if (eq == NULL)
	{
		snprintf(error, error_size, "Entry \"%.*s\" is not of the form name=path.",
				 (int) Min(end - start, 200), start);
		return false;
	}
	name_end = eq;
	path_start = eq + 1;
	trim_blanks(&start, &name_end);
	trim_blanks(&path_start, &end);
	name_len = name_end - start;
	if (name_len < 1 || name_len > CAI_MODEL_NAME_MAX)
	{
		snprintf(error, error_size,
				 "Entry \"%.*s\": a model name has 1 to %d characters.",
				 (int) Min(end - start, 200), start, CAI_MODEL_NAME_MAX);
		return false;
	}
	for (const char *c = start; c < name_end; c++)
	{
		if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-'))
		{
			snprintf(error, error_size,
					 "Entry \"%.*s\": model name \"%.*s\" may hold only a-z, 0-9, _ and -.",
					 (int) Min(end - start, 200), start, name_len, start);
			return false;
		}
	}
	if (end == path_start)
	{
		snprintf(error, error_size, "Entry \"%.*s\" names no model file.",
				 (int) Min(end - start, 200), start);
		return false;
	}
	if (end - path_start >= MAXPGPATH)
	{
		snprintf(error, error_size, "The path of model \"%.*s\" is too long.", name_len, start);
		return false;
	}
	memcpy(entry->name, start, name_len);
	entry->name[name_len] = '\0';
	memcpy(entry->path, path_start, end - path_start);
	entry->path[end - path_start] = '\0';
	return true;
}

/*
 * CaiModelsParse
 *		Parses a pg_cai.models value: "name=path" entries separated by commas, blanks around
 *		them ignored, distinct names, at most CAI_MAX_MODELS.  An empty value gives an empty
 *		list.  False with the reason (naming the bad entry) in error.
 */
bool
CaiModelsParse(const char *value, CaiModelList *list, char *error, int error_size)
{
	const char *p = value;

	memset(list, 0, sizeof(*list));
	if (value == NULL)
		return true;
	while (*p != '\0')
	{
		const char *comma = strchr(p, ',');
		const char *end = comma ? comma : p + strlen(p);
		const char *s = p;
		const char *e = end;

		trim_blanks(&s, &e);
		if (s == e)
		{
			/* blank entries are allowed only as the whole value */
			if (comma != NULL || list->n > 0)
			{
				snprintf(error, error_size, "The list has an empty entry.");
				return false;
			}
		}
		else
		{
			if (list->n == CAI_MAX_MODELS)
			{
				snprintf(error, error_size, "At most %d models can be served at once.",
						 CAI_MAX_MODELS);
				return false;
			}
			if (!parse_model_entry(s, e, &list->entries[list->n], error, error_size))
				return false;
			if (CaiModelsFind(list, list->entries[list->n].name) >= 0)
			{
				snprintf(error, error_size, "Model \"%s\" is listed twice.",
						 list->entries[list->n].name);
				return false;
			}
			list->n++;
		}
		p = comma ? comma + 1 : end;
	}
	return true;
}

/*
 * CaiModelsFind
 *		The position of the named model in the list, or -1.
 */
int
CaiModelsFind(const CaiModelList *list, const char *name)
{
	for (int i = 0; i < list->n; i++)
	{
		if (strcmp(list->entries[i].name, name) == 0)
			return i;
	}
	return -1;
}

/*
 * CaiModelsConfigured
 *		The models this process's settings say to serve: pg_cai.models when it is set, else the
 *		one model of pg_cai.model, named "default" (with an empty path when no model is set:
 *		the worker then says so).  Never empty.  The check hook has validated pg_cai.models.
 */
void
CaiModelsConfigured(CaiModelList *list)
{
	char		error[256];

	if (cai_models_setting != NULL && cai_models_setting[0] != '\0' &&
		CaiModelsParse(cai_models_setting, list, error, sizeof(error)) && list->n > 0)
		return;
	memset(list, 0, sizeof(*list));
	list->n = 1;
	strlcpy(list->entries[0].name, CAI_DEFAULT_MODEL_NAME, sizeof(list->entries[0].name));
	strlcpy(list->entries[0].path, cai_model_path ? cai_model_path : "",
			sizeof(list->entries[0].path));
}

/*
 * CaiModelsNames
 *		The list's names, comma-separated, for messages.
 */
char *
CaiModelsNames(const CaiModelList *list)
{
	StringInfoData names;

	initStringInfo(&names);
	for (int i = 0; i < list->n; i++)
		appendStringInfo(&names, "%s%s", i > 0 ? ", " : "", list->entries[i].name);
	return names.data;
}

/*
 * check_models
 *		Check hook of pg_cai.models: the whole list parses.
 */
static bool
check_models(char **newval, void **extra, GucSource source)
{
	CaiModelList list;
	char		error[512];

	if (*newval == NULL || CaiModelsParse(*newval, &list, error, sizeof(error)))
		return true;
	GUC_check_errdetail("%s", error);
	GUC_check_errhint("Write entries like 'chat=/path/a.gguf, embed=/path/b.gguf'.");
	return false;
}

/*
 * check_job_databases
 *		Check hook of pg_cai.job_databases: a list of distinct database names.  The jobs' code
 *		parses the list again in the postmaster, trusting this check.
 */
static bool
check_job_databases(char **newval, void **extra, GucSource source)
{
	char	   *raw;
	List	   *names;
	ListCell   *a;
	bool		ok = true;

	if (*newval == NULL)
		return true;
	raw = pstrdup(*newval);
	if (!SplitIdentifierString(raw, ',', &names))
	{
		GUC_check_errdetail("List syntax is invalid.");
		ok = false;
	}
	else
	{
		foreach(a, names)
		{
			ListCell   *b;

			for_each_cell(b, names, lnext(names, a))
			{
				if (strcmp((char *) lfirst(a), (char *) lfirst(b)) == 0)
				{
					GUC_check_errdetail("Database \"%s\" is listed twice.", (char *) lfirst(a));
					ok = false;
				}
			}
		}
	}
	list_free(names);
	pfree(raw);
	return ok;
}

/*
 * define_postmaster_settings
 *		The settings that size shared memory (the intake ring, the job runners' slots) or the set of
 *		background workers: fixed while the server runs.
 */
static void
define_postmaster_settings(void)
{
	DefineCustomIntVariable("pg_cai.max_batch",
							"Sequences the engine runs together in one batch.",
							NULL,
							&cai_max_batch,
							16, 1, 1024,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.max_queue",
							"Requests that may wait for the engine before new ones are refused.",
							NULL,
							&cai_max_queue,
							64, 1, 65536,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomStringVariable("pg_cai.job_databases",
							   "Databases whose asynchronous reply jobs (cai.jobs) are run.",
							   "A comma-separated list of database names. Each listed database that "
							   "exists gets pg_cai.job_workers job runners; empty means none.",
							   &cai_job_databases,
							   "",
							   PGC_POSTMASTER,
							   GUC_LIST_INPUT,
							   check_job_databases, NULL, NULL);

	DefineCustomIntVariable("pg_cai.job_workers",
							"Job runners per database of pg_cai.job_databases.",
							"Each runner answers one message at a time; the engine batches "
							"the runners' generations with everyone else's.",
							&cai_job_workers,
							2, 1, 64,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);
}

/*
 * define_engine_process_settings
 *		The settings of the engine process: a reload that changes one starts a new engine with it,
 *		so they are PGC_SIGHUP and set only in the configuration files or by ALTER SYSTEM.
 */
static void
define_engine_process_settings(void)
{
	DefineCustomStringVariable("pg_cai.model",
							   "Path of the GGUF model file the engine worker loads.",
							   "An absolute path, or relative to the data directory. "
							   "Empty means no model: calls fail with a hint. A reload "
							   "starts an engine with the new model.",
							   &cai_model_path,
							   "",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);

	/* paths of files the engines read: only the configuration files or ALTER SYSTEM set it */
	DefineCustomStringVariable("pg_cai.models",
							   "Models served at once, each by an engine process of its own.",
							   "Comma-separated name=path entries, e.g. 'chat=/path/a.gguf, "
							   "embed=/path/b.gguf'; names are 1 to 32 of a-z, 0-9, _ and -. "
							   "Calls pick one with the model option; the first is the default. "
							   "Empty means the one model of pg_cai.model, named default. A "
							   "reload starts, stops or restarts only the engines whose entry "
							   "changed.",
							   &cai_models_setting,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   check_models, NULL, NULL);

	DefineCustomStringVariable("pg_cai.chat_template",
							   "Chat template to use instead of the one detected from the model.",
							   "One of chatml, llama3, gemma, llama2; empty means detect.",
							   &cai_chat_template,
							   "",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);

	DefineCustomEnumVariable("pg_cai.device",
							 "Compute device of the engine worker.",
							 "auto uses CUDA when a GPU is usable, the CPU otherwise.",
							 &cai_device,
							 CAI_DEVICE_AUTO,
							 device_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomEnumVariable("pg_cai.weights",
							 "Which weights the engine's matrix products read.",
							 "file: the model file's own 4- to 8-bit formats, as they are (small, "
							 "fast to load); int8: every weight requantized to int8 at load (the "
							 "path a GPU runs, where pg_cai.weight_rounding and "
							 "pg_cai.activation_precision apply); auto (the default): file for "
							 "models of 500M weights or more whose every matrix has such a "
							 "format, else int8.",
							 &cai_weights,
							 CAI_WEIGHTS_AUTO,
							 weights_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	/* a path the engine writes to: only the configuration files or ALTER SYSTEM set it */
	DefineCustomStringVariable("pg_cai.weights_cache",
							   "Directory where the engine keeps its prepared weights across restarts.",
							   "An absolute path, or relative to the data directory; empty "
							   "disables it. An engine that starts with the same model and "
							   "weight settings maps the weights from there instead of "
							   "converting them. One file per model file name is kept. "
							   "The default's name begins with pgsql_tmp, so base backups "
							   "leave the cache out. The directory must belong to the "
							   "server's user and be writable by no one else; otherwise the "
							   "engine serves without it.",
							   &cai_weights_cache,
							   CAI_WEIGHTS_CACHE_DEFAULT,
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomEnumVariable("pg_cai.weight_rounding",
							 "How the engine rounds the model's weights to int8 at load.",
							 "nearest: to the nearest value; gptq: GPTQ along the calibration "
							 "inputs, closer to the float model at about four times the "
							 "load time; auto (the default): gptq for models under 500M "
							 "weights, else nearest.",
							 &cai_weight_rounding,
							 CAI_ROUNDING_AUTO,
							 weight_rounding_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomEnumVariable("pg_cai.activation_precision",
							 "How the engine quantizes the inputs of its int8 GEMMs.",
							 "int8: one int8 digit per value; two_digit: a second digit (the rounding "
							 "error quantized again), closer to the float model with every int8 "
							 "GEMM run twice; int8_256: one digit, and the inputs of the file's own "
							 "K-quant weights one scale per 256 rather than per 32, faster prefill, "
							 "less faithful; auto (the default): two_digit for models under "
							 "500M weights on int8 weights, else int8.",
							 &cai_activation_precision,
							 CAI_ACTIVATIONS_AUTO,
							 activation_precision_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.threads",
							"CPU threads of the engine worker.",
							"0 means all online cores. With several models (pg_cai.models), "
							"each engine gets an equal share, at least one.",
							&cai_threads,
							0, 0, 1024,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.max_step_tokens",
							"Token budget of one engine step (decodes plus prefill chunks).",
							NULL,
							&cai_max_step_tokens,
							512, 16, 65536,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.context_length",
							"Context window of one sequence, in tokens.",
							"0 means the model's trained context, capped at 4096.",
							&cai_context_length,
							0, 0, 1048576,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.host_cache_size",
							"Host memory for the KV cache of past turns (the prefix cache).",
							"0 turns the prefix cache off. With several models (pg_cai.models), "
							"each engine gets an equal share.",
							&cai_host_cache_size_mb,
							256, 0, INT_MAX / 2,
							PGC_SIGHUP,
							GUC_UNIT_MB,
							NULL, NULL, NULL);

	/*
	 * The default lies in the data directory under a name pg_basebackup and pg_rewind skip
	 * (their rule for temporary files), so backups and replicas do not carry the KV along.
	 */
	DefineCustomStringVariable("pg_cai.disk_cache_dir",
							   "Directory of the prefix cache's disk tier.",
							   "An absolute path, or relative to the data directory; empty "
							   "disables the tier. Cached KV blocks of past turns are kept "
							   "there, so that they outlive the host cache's budget and an "
							   "engine restart. The default is left out of base backups.",
							   &cai_disk_cache_dir,
							   "pgsql_tmp_pg_cai_kv",
							   PGC_POSTMASTER,
							   GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.disk_cache_size",
							"Disk space for the prefix cache's disk tier.",
							"0 turns the disk tier off. With several models (pg_cai.models), "
							"each engine gets an equal share.",
							&cai_disk_cache_size_mb,
							1024, 0, INT_MAX / 2,
							PGC_SIGHUP,
							GUC_UNIT_MB | GUC_SUPERUSER_ONLY,
							NULL, NULL, NULL);
}

/*
 * define_running_engine_settings
 *		Reloadable settings the worker applies to the running engine, without a restart.
 */
static void
define_running_engine_settings(void)
{
	DefineCustomIntVariable("pg_cai.max_queue_wait",
							"Refuse a request at once when its estimated wait for the engine is longer.",
							"The estimate is the requests ahead of it times the recent service time. "
							"0 means no limit: requests wait until pg_cai.max_queue is reached.",
							&cai_max_queue_wait_ms,
							0, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.reload_grace",
							"How long a configuration change waits for running requests before the engine restarts.",
							"After a reload that changes the engine's settings, requests in flight may "
							"finish for this long; those still running then fail and may be retried.",
							&cai_reload_grace_ms,
							30000, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.engine_hang_timeout",
							"How long the engine process may stay silent before it is killed and restarted.",
							"A healthy engine says it is alive between its steps and while idle, several "
							"times a second, so this must exceed the engine's longest step. Requests in "
							"flight in a killed engine fail. A loading engine is killed likewise when its "
							"load makes no progress (no CPU time, no reads) for this long. 0 turns the "
							"check off.",
							&cai_engine_hang_timeout_ms,
							30000, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.max_requests_per_role",
							"Requests of one role that an engine holds at once (running or queued in it).",
							"A role's requests over this wait in the engine worker, behind, until one of "
							"its own finishes; up to pg_cai.max_queue of them, then more are refused. "
							"0 means no limit.",
							&cai_max_requests_per_role,
							0, 0, 65536,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

/*
 * define_session_settings
 *		cache_isolation decides who may share cached prompt prefixes, a security property, so only a
 *		superuser sets it, and so are the request size limits, which protect everyone's share of
 *		the engine; max_tokens is an ordinary per-session default.
 */
static void
define_session_settings(void)
{
	DefineCustomEnumVariable("pg_cai.cache_isolation",
							 "Which requests may share cached prompt prefixes.",
							 "role: requests of the same role; conversation: turns of the same "
							 "conversation; none: all requests.",
							 &cai_cache_isolation,
							 CAI_ISOLATION_ROLE,
							 cache_isolation_options,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.max_request_messages",
							"Messages one request may carry to the engine.",
							"cai_chat_completion refuses more; a conversation sends only its newest "
							"stored turns, up to this many.",
							&cai_max_request_messages,
							1000, 1, 1000000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.max_request_bytes",
							"Bytes of text and token ids one request may carry to the engine.",
							"A larger request is refused before it is sent.",
							&cai_max_request_bytes,
							1048576, 1024, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pg_cai.max_tokens",
							"Default for the max_tokens option: completion tokens at most.",
							NULL,
							&cai_default_max_tokens,
							256, 1, 1048576,
							PGC_USERSET,
							0,
							NULL, NULL, NULL);
}

/*
 * CaiGucInit
 *		Defines every pg_cai.* setting and reserves the prefix.  Called from _PG_init while
 *		shared_preload_libraries is processed.
 */
void
CaiGucInit(void)
{
	define_postmaster_settings();
	define_engine_process_settings();
	define_running_engine_settings();
	define_session_settings();

	MarkGUCPrefixReserved("pg_cai");
}
