/*
 * cai.h — public API of libcai, pg_cai's inference engine.
 *
 * The engine knows nothing of PostgreSQL or CUDA headers.  Every call that can fail returns a
 * cai_status and fills a cai_error with a one-line, lower-case message; nothing here calls exit()
 * or abort() on bad input.  There is no global state: everything hangs off a cai_model (read-only
 * after load, shareable) or a cai_engine (one per serving thread; not thread-safe).
 *
 * A request's life through this API:
 *   cai_chat_build_prompt()   -> token ids (chat template over the turns, stored ids reused)
 *   cai_engine_submit()       -> request id; the request waits, then runs
 *   cai_engine_step() ...     -> each step runs ONE batched forward over every running request
 *                                and reports what each produced (tokens, text, finish + usage)
 *   cai_engine_cancel()       -> drops a request and frees its KV at once
 */
#ifndef CAI_H
#define CAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Status and errors
 * ------------------------------------------------------------------------------------------- */

typedef enum cai_status
{
	CAI_OK = 0,
	CAI_ERR_INVALID_ARGUMENT,	/* a caller-supplied value is out of range or malformed */
	CAI_ERR_IO,					/* a file could not be opened, read or mapped */
	CAI_ERR_FORMAT,				/* a file is malformed, truncated or inconsistent */
	CAI_ERR_UNSUPPORTED,		/* well-formed, but an architecture/type the engine lacks */
	CAI_ERR_NO_MEMORY,			/* an allocation failed (host or device) */
	CAI_ERR_CONTEXT_FULL,		/* the prompt does not fit the context window */
	CAI_ERR_QUEUE_FULL,			/* admission control refused the request */
	CAI_ERR_NOT_FOUND,			/* unknown request id, token, template name, ... */
	CAI_ERR_BACKEND,			/* the compute backend failed (a CUDA error, say) */
	CAI_ERR_INTERNAL			/* a bug: an invariant did not hold */
} cai_status;

#define CAI_ERROR_MESSAGE_SIZE 512

typedef struct cai_error
{
	cai_status	status;
	char		message[CAI_ERROR_MESSAGE_SIZE];
} cai_error;

/* "ok", "invalid argument", ... */
const char *cai_status_name(cai_status status);

/* Frees memory returned by this API (token arrays, strings). */
void		cai_free(void *ptr);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

typedef struct cai_model cai_model;

/* Where the GEMMs' weights come from (cai_model_params.weights). */
typedef enum cai_weights_mode
{
	CAI_WEIGHTS_AUTO = 0,		/* the file's own formats when every matrix is in one the engine
								 * multiplies directly (Q4_0 .. Q8_0, K-quants) and the model
								 * is large (auto_file_min_weights), else int8 */
	CAI_WEIGHTS_FILE,			/* the file's own formats; a file without them is refused */
	CAI_WEIGHTS_INT8			/* requantized to int8 per output channel at load (calibrated,
								 * rotated: the int8 path, and the only one a GPU runs) */
} cai_weights_mode;

/* "auto", "file", "int8"; NULL for an unknown mode. */
const char *cai_weights_mode_name(cai_weights_mode mode);

/* The mode named name; false for an unknown name. */
bool		cai_weights_mode_parse(const char *name, cai_weights_mode *mode);

/*
 * How the int8 path rounds its weights (cai_model_params.rounding).  auto: GPTQ for a small
 * model's int8 path (CAI_AUTO_FILE_MIN_WEIGHTS), nearest otherwise.
 */
typedef enum cai_rounding_mode
{
	CAI_ROUNDING_AUTO = 0,
	CAI_ROUNDING_NEAREST,		/* each weight to its nearest int8 level */
	CAI_ROUNDING_GPTQ			/* along the calibration inputs' second moment: closer to
								 * float on average, loads about 4x slower (calibrate.c,
								 * "GPTQ rounding"); the weights cache keeps the result */
} cai_rounding_mode;

/*
 * How the GEMM inputs become integers (cai_model_params.activations).  auto: two digits on a
 * small model's int8 path, one otherwise (where the file's own formats run, two digits give
 * only the keys a second digit).
 */
typedef enum cai_activations_mode
{
	CAI_ACTIVATIONS_AUTO = 0,
	CAI_ACTIVATIONS_INT8,		/* one int8 digit per value */
	CAI_ACTIVATIONS_TWO_DIGIT,	/* each input also carries its rounding error as a second
								 * int8 digit (about 15 bits in all) and every int8 GEMM runs
								 * twice: closer to float, slower (forward.c, "two-digit
								 * activations") */
	CAI_ACTIVATIONS_INT8_256	/* one digit, and where the file's own K-quants run their
								 * inputs one scale per 256 (llama.cpp's Q8_K) rather than per
								 * 32: faster prefill, less faithful (cpu/gemm_blocks.h,
								 * "super-block activations") */
} cai_activations_mode;

/* "auto", "nearest", "gptq"; NULL for an unknown value.  Parse: false for an unknown name. */
const char *cai_rounding_mode_name(cai_rounding_mode rounding);
bool		cai_rounding_mode_parse(const char *name, cai_rounding_mode *rounding);

/*
 * "auto", "int8", "two_digit", "int8_256"; NULL for an unknown value.  Parse: false for an
 * unknown name.
 */
const char *cai_activations_mode_name(cai_activations_mode precision);
bool		cai_activations_mode_parse(const char *name, cai_activations_mode *precision);

typedef struct cai_model_params
{
	int			n_threads;		/* threads for requantization at load; 0 = all online cores */
	bool		load_float_reference;	/* also keep fp32 weights (cai eval, fidelity tests) */
	const char *chat_template;	/* "chatml", "llama3", "gemma", "llama2"; NULL = detect from GGUF */
	cai_rounding_mode rounding;	/* the int8 weights' rounding (default auto) */
	cai_activations_mode activations;	/* the GEMM inputs' digits (default auto) */
	cai_weights_mode weights;	/* the file's own formats or int8 (default auto) */
	int64_t		auto_file_min_weights;	/* auto: the file's formats only for models with at
										 * least this many matrix weights, and the precise
										 * int8 numerics only below it (default
										 * CAI_AUTO_FILE_MIN_WEIGHTS) */
	const char *weights_cache;	/* a directory where the CPU backend's prepared weights are
								 * kept across processes (weight_cache.h); NULL = none */
} cai_model_params;

/*
 * Where auto starts keeping the file's formats: 500M matrix weights.  Below it the int8 copy is
 * a few hundred MB, decoding is bound by arithmetic rather than by memory, and the int8
 * kernels (one scale per row, not one per 32 weights) are the faster ones; above it the int8
 * copy costs about 2.5x the file's memory and several seconds of conversion per start, and
 * decoding streams the weights from memory, where the file's 4.5 bits beat 8.
 *
 * Below it auto numerics are also the precise ones (GPTQ rounding, two-digit inputs): a small
 * model's next-token margins are thin, and with one int8 digit its greedy choices part from
 * the float model's more often than llama.cpp's do on the same file (docs/numerics.md,
 * "Fidelity against llama.cpp"); with both, more seldom.  Its GEMMs then do twice the
 * work (prefill at about half the rate).
 */
#define CAI_AUTO_FILE_MIN_WEIGHTS INT64_C(500000000)

void		cai_model_params_default(cai_model_params *params);

/* Memory-maps a GGUF file, validates it and converts its weights to the engine's int8 layout. */
cai_status	cai_model_load(const char *path, const cai_model_params *params,
						   cai_model **out, cai_error *err);
void		cai_model_free(cai_model *model);

/*
 * Frees the model's row-major int8 GEMM matrices once the one engine that serves it has made
 * its backend's copies (serve.c): host memory holds one copy of the weights, not two.  A forward
 * context made on the model afterwards is refused.
 */
void		cai_model_release_gemm_sources(cai_model *model);

/* What became of a model's weights cache (cai_model_params.weights_cache). */
typedef enum cai_weights_cache_state
{
	CAI_WEIGHTS_CACHE_OFF = 0,	/* none asked for (or a float reference: converted) */
	CAI_WEIGHTS_CACHE_MAPPED,	/* the prepared weights were mapped from the file: nothing
								 * converted */
	CAI_WEIGHTS_CACHE_PENDING,	/* converted; the first forward context writes the file, a
								 * thread of its own while it runs */
	CAI_WEIGHTS_CACHE_WRITTEN,	/* converted, and the file written */
	CAI_WEIGHTS_CACHE_FAILED	/* converted; the file could not be written (failure) */
} cai_weights_cache_state;

typedef struct cai_weights_cache_report
{
	cai_weights_cache_state state;
	const char *path;			/* the cache file ("" when off) */
	const char *refused;		/* why an existing file was not used ("" when none was) */
	const char *failure;		/* why it could not be written (FAILED) */
	double		seconds;		/* mapping the file (MAPPED), or converting the weights */
	size_t		file_bytes;		/* the file's size (MAPPED, WRITTEN) */
} cai_weights_cache_report;

/* The model's weights cache as it stands (strings owned by the model). */
void		cai_model_weights_cache_report(const cai_model *model, cai_weights_cache_report *out);

/*
 * How an embedding pools a text's final hidden states: the values of GGUF's {arch}.pooling_type
 * as llama.cpp numbers them.  NONE (per-token vectors) and RANK (rerankers) are not embeddings
 * cai_embed can return; a model whose file names no pooling is pooled by its mean.
 */
typedef enum cai_pooling
{
	CAI_POOLING_NONE = 0,
	CAI_POOLING_MEAN = 1,
	CAI_POOLING_CLS = 2,		/* the first token's */
	CAI_POOLING_LAST = 3,		/* the last token's */
	CAI_POOLING_RANK = 4
} cai_pooling;

/* "none", "mean", "cls", "last", "rank"; "?" for another value. */
const char *cai_pooling_name(cai_pooling pooling);

typedef struct cai_model_info
{
	const char *arch;			/* "llama", "qwen2", ... */
	const char *name;			/* general.name, or the file's base name */
	const char *chat_template;	/* the template in use: "chatml", ... */
	int			n_layers;
	int			d_model;
	int			n_heads;
	int			n_kv_heads;
	int			head_dim;
	int			d_ff;
	int			n_vocab;
	int			context_length; /* the model's trained context */
	int64_t		n_params;
	size_t		weight_bytes;	/* engine-side int8 weights + scales */
	size_t		kv_bytes_per_token; /* int8 KV + scales, all layers that own KV */
	size_t		kv_window_bytes_per_token;	/* of which windowed layers', kept for kv_window */
	int			kv_window;		/* positions the windowed layers look back (0: none) */
	bool		gptq_rounding;	/* int8 weights rounded along the calibration inputs */
	bool		two_digit_activations;	/* GEMM inputs as two int8 digits */
	bool		superblock_activations; /* the file's K-quants' inputs one scale per 256 */
	uint64_t	fingerprint;	/* identifies weights+tokenizer; seeds the prefix cache */
	int32_t		bos_token;		/* -1 when the model has none */
	bool		add_bos;		/* raw text prompts start with bos_token (tokenizer.ggml.add_bos_token) */
	int32_t		eos_token;
	int32_t		eot_token;		/* the chat template's end-of-turn token */
	bool		file_weights;	/* the GEMMs read the file's own block formats */
	cai_pooling pooling;		/* how cai_embed pools (see cai_pooling) */
	bool		causal;			/* false: embedded texts attend both ways */
} cai_model_info;

void		cai_model_get_info(const cai_model *model, cai_model_info *info);

/* Writes a human-readable dump (metadata, tensors and their types) like `cai inspect`. */
cai_status	cai_model_describe(const cai_model *model, char **text, cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * Tokens and chat prompts
 * ------------------------------------------------------------------------------------------- */

/*
 * Tokenizes UTF-8 text.  With parse_special false, text that looks like a special token
 * ("<|im_end|>") is tokenized as plain text and can never produce a control token.  No BOS is added.
 * *ids is allocated with malloc (free with cai_free).
 */
cai_status	cai_tokenize(const cai_model *model, const char *text, size_t len, bool parse_special,
						 int32_t **ids, int *n_ids, cai_error *err);

/* Concatenates the tokens' text (special tokens included as their text); NUL-terminated. */
cai_status	cai_detokenize(const cai_model *model, const int32_t *ids, int n_ids,
						   char **text, size_t *len, cai_error *err);

typedef enum cai_role
{
	CAI_ROLE_SYSTEM = 0,
	CAI_ROLE_USER,
	CAI_ROLE_ASSISTANT,
	CAI_ROLE_TOOL				/* a tool's result, answering an assistant's tool call */
} cai_role;

typedef struct cai_chat_message
{
	cai_role	role;
	const char *content;		/* UTF-8, NUL-terminated; may be NULL when tokens are given */
	const int32_t *tokens;		/* the content's token ids as stored (model-generated ids for
								 * assistant turns); NULL = tokenize content */
	int			n_tokens;
	const char *tool_calls;		/* assistant: the calls it made, a JSON array of {"name": ...,
								 * "arguments": {...}} (NUL-terminated), or NULL */
} cai_chat_message;

typedef struct cai_prompt_params
{
	bool		add_generation_prompt;	/* end with the assistant header */
	int			max_prompt_tokens;		/* 0 = no limit */
	bool		truncate;		/* over the limit: drop the oldest non-system turns (true) or fail
								 * with CAI_ERR_CONTEXT_FULL (false) */
	const struct cai_tool_set *tools;	/* tools offered to the model, or NULL (see below) */
} cai_prompt_params;

typedef struct cai_prompt
{
	int32_t    *ids;			/* malloc'd; free with cai_prompt_free */
	int			n_ids;
	int			first_message;	/* index of the oldest message kept after truncation */
	int32_t    *last_content_ids;	/* the last message's content ids (to store with the turn) */
	int			n_last_content_ids;
} cai_prompt;

/* Renders the model's chat template over the messages into token ids. */
cai_status	cai_chat_build_prompt(const cai_model *model, const cai_chat_message *messages,
								  int n_messages, const cai_prompt_params *params,
								  cai_prompt *out, cai_error *err);
void		cai_prompt_free(cai_prompt *prompt);

/* ---------------------------------------------------------------------------------------------
 * Engines: batched generation
 * ------------------------------------------------------------------------------------------- */

typedef struct cai_engine cai_engine;

typedef struct cai_engine_params
{
	const char *device;			/* "auto" | "cpu" | "cuda" */
	const char *cuda_library;	/* the CUDA backend library, an absolute path; NULL = the
								 * installed one (or $CAI_CUDA_LIBRARY) */
	int			n_threads;		/* CPU threads; 0 = all online cores */
	int			max_running;	/* sequences in one batch */
	int			max_step_tokens;	/* token budget of one step (decodes + prefill chunks) */
	int			context_length; /* per sequence; 0 = the model's, capped at 4096 */
	int			max_queue;		/* requests that may wait for a batch slot; more are refused */
	double		max_queue_wait_ms;	/* refuse at submit when the estimated wait is longer;
									 * 0 = no limit (Mooncake's early rejection) */
	size_t		kv_cache_bytes; /* working KV for running sequences; 0 = sized from the above */
	size_t		host_cache_bytes;	/* budget of the inter-turn prefix cache; 0 = off */
	bool		whole_kv;		/* keep windowed layers' KV for every position (kv.h), as if
								 * every layer were global: for comparisons */
	const char *disk_cache_dir; /* the prefix cache's disk tier (kv_disk.h); NULL or "" = none */
	size_t		disk_cache_bytes;	/* its budget; 0 = none */
	void		(*log) (void *arg, const char *line);	/* why the disk tier degraded; NULL:
														 * not said */
	void	   *log_arg;
} cai_engine_params;

void		cai_engine_params_default(cai_engine_params *params);

cai_status	cai_engine_create(cai_model *model, const cai_engine_params *params,
							  cai_engine **out, cai_error *err);
void		cai_engine_free(cai_engine *engine);

/* The context window of one sequence, in tokens, after the defaults and the model's limit. */
int			cai_engine_context_length(const cai_engine *engine);

/* Which backend serves ("cpu (avx512-vnni)", "cuda (NVIDIA H100)") and why it was chosen. */
const char *cai_engine_device(const cai_engine *engine);
const char *cai_engine_device_reason(const cai_engine *engine);

/*
 * The CPU's int8 kernels run the best path this CPU has; this picks another, process-wide:
 * "avx512-amx", "avx512-vnni", "avx-vnni", "avx2" or "generic".  Every path gives the same
 * results, so it is for benchmarks that compare them on one machine.  CAI_ERR_INVALID_ARGUMENT for an unknown
 * name, CAI_ERR_UNSUPPORTED for a path this CPU lacks.
 */
cai_status	cai_cpu_use_isa(const char *name, cai_error *err);

/*
 * What a request may ask for: the one table of request limits.  The SQL options
 * (src/pg/options.c), the CLI's flags (src/cli), the engine process's request decoding
 * (src/serve) and cai_engine_submit all check against these, and say the range in the same
 * words ("temperature must be between 0 and 2"), so that a value one front end accepts is never
 * refused by the next.
 *
 *   temperature   0 .. CAI_TEMPERATURE_MAX (OpenAI's range); 0 = greedy
 *   top_p         greater than 0, at most 1; 1 = off
 *   top_k         0 .. CAI_TOP_K_MAX; 0 = off
 *   max_tokens    1 .. CAI_MAX_TOKENS_MAX
 *   seed          any uint64 (SQL takes 0 .. the largest int64, what jsonb integers reach)
 *   stop          at most CAI_MAX_STOP_STRINGS strings of 1 .. CAI_STOP_MAX_BYTES bytes (UTF-8)
 *   presence_penalty, frequency_penalty
 *                 -CAI_PENALTY_MAX .. CAI_PENALTY_MAX (OpenAI's range); 0 = off
 *   repetition_penalty
 *                 greater than 0, at most CAI_REPETITION_PENALTY_MAX; 1 = off
 *   min_p         0 .. 1; 0 = off
 *   logit_bias    at most CAI_MAX_LOGIT_BIAS entries, each a token id of the vocabulary (checked
 *                 at submit, where the vocabulary is known) and a bias in -CAI_LOGIT_BIAS_MAX ..
 *                 CAI_LOGIT_BIAS_MAX; -CAI_LOGIT_BIAS_MAX bans the token
 *   top_logprobs  0 .. CAI_TOP_LOGPROBS_MAX (with logprobs)
 *   n             1 .. CAI_N_SAMPLES_MAX parallel samples of one prompt (OpenAI's n)
 *
 * The sampler applies them in this order (sampler.c, cai_sample_adjusted): the grammar's mask,
 * repetition_penalty, presence/frequency_penalty, logit_bias, min_p, then temperature, top_k and
 * top_p as before.  Logprobs are of the distribution after temperature (before top_k/top_p).
 */
#define CAI_TEMPERATURE_MAX 2.0
#define CAI_TOP_K_MAX 1000000
#define CAI_MAX_TOKENS_MAX 1048576
#define CAI_MAX_STOP_STRINGS 8
#define CAI_STOP_MAX_BYTES 256
#define CAI_PENALTY_MAX 2.0
#define CAI_REPETITION_PENALTY_MAX 10.0
#define CAI_LOGIT_BIAS_MAX 100.0
#define CAI_MAX_LOGIT_BIAS 1024
#define CAI_TOP_LOGPROBS_MAX 20
#define CAI_N_SAMPLES_MAX 16
/*
 * repetition_penalty looks at this many most recent tokens of the sequence, prompt and reply
 * alike (llama.cpp's repeat_last_n default), so that a reply stops echoing its prompt too.
 */
#define CAI_REPEAT_LAST_N 64

/* One logit_bias entry: added to token's logit before sampling */
typedef struct cai_logit_bias
{
	int32_t		token;
	float		bias;
} cai_logit_bias;

typedef struct cai_sampling_params
{
	float		temperature;	/* 0 = greedy */
	float		top_p;			/* 1 = off */
	int			top_k;			/* 0 = off */
	uint64_t	seed;			/* same seed + same prompt = same tokens */
	int			max_tokens;		/* completion tokens at most */
	int			n_stop;
	const char *stop[CAI_MAX_STOP_STRINGS]; /* copied at submit */
	bool		ignore_eos;		/* benchmarks: run to max_tokens */
	float		presence_penalty;	/* 0 = off */
	float		frequency_penalty;	/* 0 = off */
	float		repetition_penalty; /* 1 = off */
	float		min_p;			/* 0 = off */
	int			n_logit_bias;
	const cai_logit_bias *logit_bias;	/* [n_logit_bias]; copied at submit */
	bool		logprobs;		/* report each token's logprob (cai_event.logprobs) */
	int			top_logprobs;	/* and this many most likely alternatives */

	/*
	 * Parallel samples of the prompt (OpenAI's n; default 1).  The prompt is prefilled once and
	 * its KV blocks are shared by the samples; sample i draws from its own random stream seeded
	 * with seed + i, so that any one sample is the reply of the same request with n 1 and that
	 * seed, token for token.  Not with tools (a call is one reply's business).
	 */
	int			n_samples;
} cai_sampling_params;

void		cai_sampling_params_default(cai_sampling_params *params);

/*
 * CAI_OK when every field is within the request limits above; else CAI_ERR_INVALID_ARGUMENT
 * with a message that names the field and its range.  cai_engine_submit checks this; a front
 * end may call it first to refuse a request before doing any work for it.
 */
cai_status	cai_sampling_params_check(const cai_sampling_params *params, cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * Constrained replies: a grammar the reply must follow (JSON Schema, or any JSON object)
 * ------------------------------------------------------------------------------------------- */

typedef struct cai_grammar cai_grammar;

/*
 * Compiles a JSON Schema given as JSON text (a subset: see grammar.h).  An unsupported keyword
 * or a malformed schema is CAI_ERR_INVALID_ARGUMENT with a message that names it and where.
 */
cai_status	cai_grammar_from_schema(const char *schema, size_t len, cai_grammar **out,
									cai_error *err);

/* Any JSON object (OpenAI's {"type": "json_object"}). */
cai_status	cai_grammar_any_object(cai_grammar **out, cai_error *err);

/*
 * Where a reply may put whitespace outside strings.  FREE: runs of up to 16 bytes between any
 * two tokens and before the value (room to indent, and room that greedy decoding of a small
 * model fills with newlines).  COMPACT: at most one space, and only after a ':' or a ','
 * (`{"a": 1, "b": [1, 2]}` or `{"a":1,"b":[1,2]}`), nothing before the value.
 */
typedef enum cai_json_whitespace
{
	CAI_JSON_WS_FREE = 0,
	CAI_JSON_WS_COMPACT
} cai_json_whitespace;

/*
 * Sets a grammar's whitespace (a new grammar's is FREE).  Call it before any state uses the
 * grammar: a grammar is read-only once in use.
 */
void		cai_grammar_set_whitespace(cai_grammar *grammar, cai_json_whitespace ws);

void		cai_grammar_free(cai_grammar *grammar);

/*
 * Tool calling (tools.h): OpenAI-shaped declarations, [{"type": "function", "function":
 * {"name", "description", "parameters": a JSON Schema}}], parsed and checked once.  The prompt
 * shows them in the model family's tool format; a request's tool_choice says whether the reply
 * may (AUTO), must (REQUIRED, NAMED) or may not (NONE) call one, and a call's arguments are
 * constrained to its tool's schema.
 */
typedef struct cai_tool_set cai_tool_set;

typedef enum cai_tool_choice
{
	CAI_TOOL_CHOICE_NONE = 0,
	CAI_TOOL_CHOICE_AUTO,
	CAI_TOOL_CHOICE_REQUIRED,
	CAI_TOOL_CHOICE_NAMED
} cai_tool_choice;

/*
 * Parses and checks tools (JSON text): an array of at most 128 declarations, each a function
 * with a name of 1 to 64 letters, digits, '_' or '-', unique, an optional string description
 * and optional parameters that cai_grammar_from_schema accepts.  Errors are
 * CAI_ERR_INVALID_ARGUMENT naming the declaration ("tools[2].function ...").
 */
cai_status	cai_tool_set_parse(const char *json, size_t len, cai_tool_set **out, cai_error *err);
void		cai_tool_set_free(cai_tool_set *set);
int			cai_tool_set_count(const cai_tool_set *set);
/* The index of the function called name, or -1. */
int			cai_tool_set_find(const cai_tool_set *set, const char *name);

/*
 * Reads a generated reply as one call: optional whitespace and <tool_call>, a JSON object with
 * a "name" string and "arguments" (or Llama's "parameters"), optional </tool_call>.  *name and
 * *arguments (compact JSON) are malloc'd (free with cai_free); CAI_ERR_INVALID_ARGUMENT when
 * the reply is something else.  An object inside the arguments may repeat a key (a free-form
 * argument's, which the tool constraint cannot keep unique); the arguments keep it as written.
 */
cai_status	cai_tool_reply_parse(const char *text, size_t len, char **name, char **arguments,
								 cai_error *err);

typedef struct cai_request_params
{
	const int32_t *prompt;		/* copied at submit */
	int			n_prompt;
	cai_sampling_params sampling;
	uint64_t	cache_salt;		/* prefix-cache namespace (the caller's role, say) */
	uint64_t	cache_owner;	/* the conversation its cached blocks belong to (0: none) */
	bool		use_cache;		/* look up and insert into the prefix cache */
	void	   *user_data;		/* returned in every event of this request */
	cai_grammar *grammar;		/* NULL, or the grammar the reply must follow: the engine takes
								 * it over at submit (also when submit fails) and frees it; the
								 * reply then ends where its value is complete (ignore_eos does
								 * not apply) and takes no stop strings */
	const struct cai_tool_set *tools;	/* with tool_choice other than NONE: the calls the
										 * reply may make (read at submit only) */
	int			tool_choice;	/* cai_tool_choice */
	const char *tool_name;		/* CAI_TOOL_CHOICE_NAMED: the function, NUL-terminated */
	bool		embed;			/* an embedding of the prompt instead of a reply: the prompt's
								 * prefill alone, in one step (at most max_step_tokens tokens),
								 * batched with the other requests, no prefix cache, no sampling
								 * (sampling, grammar and tools are ignored); its one event
								 * carries the vector (cai_event.embedding) */
} cai_request_params;

cai_status	cai_engine_submit(cai_engine *engine, const cai_request_params *params,
							  uint64_t *request_id, cai_error *err);

/* Drops a waiting or running request and frees its KV now; CAI_ERR_NOT_FOUND if unknown. */
cai_status	cai_engine_cancel(cai_engine *engine, uint64_t request_id);

typedef enum cai_finish_reason
{
	CAI_FINISH_NONE = 0,		/* still running */
	CAI_FINISH_STOP,			/* end-of-turn/EOS token or a stop string */
	CAI_FINISH_LENGTH,			/* max_tokens or the context window */
	CAI_FINISH_ERROR
} cai_finish_reason;

typedef struct cai_usage
{
	int			prompt_tokens;
	int			cached_tokens;	/* prompt tokens whose KV came from the prefix cache */
	int			completion_tokens;
	double		queue_ms;		/* submit -> first scheduled */
	double		ttft_ms;		/* submit -> first token */
	double		total_ms;		/* submit -> finish */
} cai_usage;

/*
 * A generated token's log-probability and its top_logprobs most likely alternatives (best
 * first, ties by lower id), natural log, of the distribution the token was drawn from.
 */
typedef struct cai_token_logprobs
{
	float		logprob;
	int			n_top;
	int32_t		top_token[CAI_TOP_LOGPROBS_MAX];
	float		top_logprob[CAI_TOP_LOGPROBS_MAX];
} cai_token_logprobs;

typedef struct cai_event
{
	uint64_t	request_id;
	void	   *user_data;
	int32_t		token;			/* the token generated this step, or -1 */
	const char *text;			/* newly final UTF-8 text (stop strings withheld), may be "" */
	size_t		text_len;
	cai_finish_reason finish;
	cai_usage	usage;			/* complete when finish != NONE */
	const char *error;			/* with CAI_FINISH_ERROR */
	const cai_token_logprobs *logprobs; /* with token >= 0 when the request asked; else NULL */
	int			sample;			/* which of the request's n_samples (0 .. n - 1) */
	const float *embedding;		/* an embed request's finish (STOP): d_model floats, pooled
								 * as the model says (cai_pooling) and L2-normalized; else NULL */
	int			n_embedding;
} cai_event;

/*
 * Runs one engine step: one batched forward over all running requests (decodes first, then
 * prefill chunks up to the token budget).  *events lists what each request produced; it stays
 * valid until the next call.  A finished request is forgotten after its event.
 *
 * A request with n_samples > 1 reports each sample's tokens and finish in events of their own
 * (cai_event.sample); each finish event's usage is that sample's (the prompt's tokens, the
 * sample's completion tokens), and the request is forgotten once every sample has finished.
 */
cai_status	cai_engine_step(cai_engine *engine, const cai_event **events, int *n_events,
							cai_error *err);

/*
 * Estimated milliseconds before a request submitted now would be admitted: the requests ahead
 * of it, in waves of max_running, times the moving average of a request's service time.
 */
double		cai_engine_estimate_wait_ms(const cai_engine *engine);

/* Changes the admission limits of a running engine (a configuration reload, say). */
void		cai_engine_set_admission_limits(cai_engine *engine, int max_queue,
											double max_queue_wait_ms);

/* True while any request waits or runs. */
bool		cai_engine_has_work(const cai_engine *engine);

typedef struct cai_engine_stats
{
	int			running;
	int			waiting;
	uint64_t	steps;
	uint64_t	step_sequences; /* sum over steps of sequences in the batch */
	uint64_t	prompt_tokens;	/* prompt tokens of submitted requests */
	uint64_t	prefill_tokens; /* prompt tokens actually computed */
	uint64_t	generated_tokens;
	uint64_t	requests_finished;
	uint64_t	requests_cancelled;
	uint64_t	requests_rejected;
	double		busy_seconds;	/* time spent in steps */
	double		mean_service_ms;	/* moving average of admitted -> finished */
	/* prefix cache */
	uint64_t	cache_lookups;
	uint64_t	cache_lookup_tokens;
	uint64_t	cache_hit_tokens;
	uint64_t	cache_evictions;
	uint64_t	cache_blocks;
	size_t		cache_bytes;
	size_t		cache_budget_bytes;
	/* the prefix cache's disk tier */
	uint64_t	disk_hits;		/* blocks read back */
	uint64_t	disk_hit_tokens;	/* cache_hit_tokens served by them */
	uint64_t	disk_bytes_read;
	uint64_t	disk_bytes_written;
	uint64_t	disk_writes_dropped;
	uint64_t	disk_evictions;
	uint64_t	disk_files;
	uint64_t	disk_bytes;
	uint64_t	disk_budget_bytes;	/* 0: no tier */
	/* working KV */
	int			kv_blocks_total;
	int			kv_blocks_free;
	size_t		kv_bytes_total; /* the pool's host memory (kv.h) */
	size_t		kv_bytes_used;	/* of which in use: running sequences and the prefix cache */
	uint64_t	kv_tokens_held; /* positions the running sequences hold KV for, a shared
								 * block once (n samples share their prompt's) */
	/* int8 GEMMs that ran on a fallback kernel (backend.h's gemm_fallbacks; 0 on the CPU) */
	uint64_t	gemm_fallbacks;
} cai_engine_stats;

void		cai_engine_get_stats(const cai_engine *engine, cai_engine_stats *stats);

/*
 * Empties the prefix cache and its disk tier (blocks pinned by running requests are dropped when
 * they finish).
 */
void		cai_engine_cache_reset(cai_engine *engine);

/*
 * Forgets the cached blocks of conversation owner (cai_request_params.cache_owner), in memory and
 * on disk, and those cached after them; returns the blocks dropped from memory.
 */
int			cai_engine_cache_forget(cai_engine *engine, uint64_t owner);

/* Waits until the disk tier has written every queued block (tests and benchmarks). */
void		cai_engine_cache_flush(cai_engine *engine);

/*
 * Fixes the scheduler's step cost estimate (a step costs fixed_seconds plus token_seconds per
 * token), which otherwise it fits to the steps it runs; it caps a step's prefill while requests
 * decode.  For tests and benchmarks; a negative argument returns to measuring.
 */
void		cai_engine_pin_step_cost(cai_engine *engine, double fixed_seconds,
									 double token_seconds);

/*
 * Teacher-forced scoring for evaluation: logits[i] (n_vocab floats) predicts tokens[i+1], for all
 * n positions, on the int8 path or the float reference path (needs load_float_reference).
 * Runs alone (not batched with requests).
 */
cai_status	cai_engine_score(cai_engine *engine, const int32_t *tokens, int n, bool float_reference,
							 float *logits, cai_error *err);

/*
 * The embedding of one text's tokens (out: d_model floats, as an embed request's), computed
 * alone on an idle engine like cai_engine_score, on the int8 path or the float reference path
 * (needs load_float_reference): for comparisons with other engines.  At most max_step_tokens
 * tokens.
 */
cai_status	cai_engine_embed(cai_engine *engine, const int32_t *tokens, int n, bool float_reference,
							 float *out, cai_error *err);

#ifdef __cplusplus
}
#endif

#endif							/* CAI_H */
