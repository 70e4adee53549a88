/*
 * engine.c — requests, the continuous-batching scheduler and the public engine API.
 *
 * Every cai_engine_step() is one iteration of Orca/vLLM-style continuous batching:
 *   1. admit waiting requests (FIFO) while a batch slot and KV blocks are free: attach the
 *      longest cached prefix from the prefix cache, reserve the rest of the request's blocks;
 *   2. fill the step's token budget with every running decode (1 token each) first, then chunks
 *      of prefill (Sarathi's chunked prefill), so a long prompt never stalls the token streams of
 *      others by more than one chunk, the prefills sharing what is left max-min fairly, so a
 *      short prompt behind a long one is not held until the long one's prefill ends;
 *   3. run ONE ragged forward over all of it;
 *   4. sample, detokenize, apply stop strings, report events; finished requests offer their full
 *      blocks to the prefix cache and drop their references.
 *
 * Parallel samples (n_samples > 1).  The request's first sample, its leader, prefills the prompt
 * as any request does; the others wait beside it in the batch (REQUEST_FORK) holding references
 * on its full prompt blocks and blocks of their own for the rest.  When the prefill ends, each
 * takes a private copy of the rows of the partly filled last prompt block (the first block it
 * writes: copy on write, done as it forks since its first token goes there the very next step)
 * and draws its first token from the same last-position logits with its own random stream.  So
 * n samples hold one prompt's KV plus n replies', and each is the request with n 1 and its seed.
 *
 * KV blocks for a request's whole budget (prompt + max_tokens, capped at the context) are taken
 * at admission, so a running request can never run out of KV mid-generation; a request whose
 * blocks are not available waits (head of line), and one that could never fit is refused at
 * submit.  Blocks kept by the prefix cache live in the same pool and are reclaimed (LRU) when
 * admission needs them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cai.h"
#include "cpu/gemm.h"
#include "backend_loader.h"
#include "threadpool.h"
#include "grammar.h"
#include "tools.h"
#include "kv.h"
#include "model.h"
#include "prefix_cache.h"
#include "reply_text.h"
#include "sampler.h"
#include "step_cost.h"
#include "tokenizer.h"
#include "util.h"

/* Context length used when the caller does not set one: the model's, but at most this. */
#define CAI_DEFAULT_MAX_CONTEXT 4096

typedef enum request_state
{
	REQUEST_WAITING = 0,		/* submitted, not yet admitted */
	REQUEST_PREFILL,			/* admitted; prompt positions still to compute */
	REQUEST_DECODE,				/* generating one token per step */
	REQUEST_FORK,				/* a sample waiting for its leader's prefill to share its KV */
	REQUEST_FINISHED			/* reported; freed at the next step */
} request_state;

typedef struct cai_request
{
	uint64_t	id;
	void	   *user_data;
	request_state state;
	cai_sampling_params sampling;	/* the stop strings live in reply */
	uint64_t	cache_salt;
	uint64_t	cache_owner;
	bool		use_cache;
	bool		embed;			/* an embedding: one prefill step, no sampling */
	float	   *embedding;		/* its vector once computed [d_model] */

	/* the token sequence: prompt then generated tokens */
	cai_tokens	tokens;
	int			n_prompt;
	int			n_computed;		/* positions whose KV is in blocks */
	int			n_generated;
	int			max_tokens;		/* after capping at the context */

	/* KV: block_table[i] holds positions [16 i, 16 i + 16) */
	int32_t    *block_table;
	int			n_blocks;		/* blocks held (cached prefix + reserved) */
	int			n_shared_blocks;	/* the first ones, shared with the prefix cache */

	/*
	 * Window parts (kv.h) of a windowed model: the request's own blocks take theirs when it
	 * reaches them and drop them once behind every window, holding at most window_quota at once.
	 */
	int			window_quota;
	int			window_parts_held;
	int			window_scan;	/* own blocks below it have dropped theirs */

	/* sampling and text */
	cai_rng		rng;
	cai_logit_bias *logit_bias; /* the request's own copy; sampling.logit_bias points here */
	cai_token_logprobs logprobs;	/* of the token sampled last (sampling.logprobs) */
	cai_reply_text reply;		/* detokenized text, stop strings, what was reported */
	cai_grammar *grammar;		/* a constrained reply's grammar (owned), or NULL */
	cai_grammar_state *grammar_state;
	bool		grammar_failed; /* its mask could not be computed (out of memory) */
	cai_tool_state *tool_state; /* tool calls the reply may or must make (tools.h), or NULL */
	int		   *grammar_refs;	/* samples sharing grammar: the last one freed frees it */

	/* parallel samples: this one's index; the leader (sample 0) lists the others until they
	 * fork from its prefill, and owns them while the request waits */
	int			sample;
	struct cai_request **forks;
	int			n_forks;

	/* accounting */
	cai_usage	usage;
	double		submit_time;
	double		first_scheduled_time;

	struct cai_request *next;	/* list links (waiting, running, retired) */
} cai_request;

struct cai_engine
{
	cai_model  *model;
	cai_engine_params params;
	int			context_length;
	char		device[96];
	char		device_reason[512];

	cai_threadpool *pool;
	cai_cuda_loader cuda;		/* loaded when the GPU serves (handle NULL otherwise) */
	bool		use_cuda;
	cai_forward_ctx *forward;
	cai_kv_pool *kv;
	int			kv_window;		/* window parts are dropped behind this window; 0: never */
	int			window_quota_unused;	/* running requests' quotas less what they hold */
	cai_prefix_cache *cache;
	cai_kv_disk *disk;			/* the cache's disk tier, or NULL */
	cai_sampler_scratch *samplers;	/* one per pool thread (see engine_sample_rows) */
	cai_token_index *token_index;	/* the vocabulary indexed for grammars, made at first use */
	uint64_t   *masks;			/* one mask of token_index's words per pool thread */

	/* request lists, in FIFO order */
	cai_request *waiting_head;
	cai_request *waiting_tail;
	int			n_waiting;
	cai_request **running;		/* [max_running], admission order */
	int			n_running;
	cai_request *retired;		/* finished last step; freed at the start of the next */
	uint64_t	next_id;

	/* per-step scratch */
	cai_batch_seq *batch;		/* [max_running] */
	cai_request **batch_req;	/* [max_running] */
	float	   *logits;			/* [max_running, n_vocab] */
	int32_t    *tokens;			/* [max_running] the tokens sampled from the logit rows */
	cai_request **logit_req;	/* [max_running] the request of each sampled token */
	int		   *logit_row;		/* [max_running] the logit row it is drawn from (samples
								 * forking from one prefill share its row) */
	int		   *prefill_chunk;	/* [max_running] each running prefill's share of the step */
	cai_event  *events;			/* [max_running + cancelled], grown as needed */
	int			events_cap;
	cai_step_cost step_cost;	/* what a step costs, for the prefill cap (step_cost.h) */

	cai_engine_stats stats;
};

static void request_release_blocks(cai_engine *engine, cai_request *req, bool offer_to_cache);
static void request_free(cai_request *req);
static void request_free_waiting(cai_request *req);
static void request_admit_fork(cai_engine *engine, const cai_request *leader, cai_request *fork,
							   int quota);

/* ---------------------------------------------------------------------------------------------
 * Window parts
 *
 * On a windowed model (kv.h) a token at position p reads the windowed layers' KV of positions
 * [p - W + 1, p] only.  A request's own blocks take their window parts as it reaches them and
 * drop them once the next token's window has passed, so a finished request offers the prefix
 * cache its global KV for every position and its windowed KV for the window before its end:
 * what the next turn, which resumes there, reads.  Earlier points of the sequence can be resumed
 * from where an earlier turn ended, since the blocks it stored keep their window parts (blocks
 * shared from the cache are never touched: they are the cache's).  A prompt that leaves the
 * sequence anywhere else resumes from the last such point before it (request_admit).
 *
 * Quotas keep this from ever running short.  Admission reserves the most window parts the
 * request can hold at once (the window before a step and the step's chunk) and admits only
 * while the free window parts cover every running request's unused reservation plus the new one,
 * so taking a part inside a quota cannot fail.
 * ------------------------------------------------------------------------------------------- */

static inline int
block_of(int pos)
{
	return pos / CAI_KV_BLOCK_TOKENS;
}

/* The oldest position a token at pos reads in the windowed layers. */
static inline int
window_start(const cai_engine *engine, int pos)
{
	return pos - engine->kv_window + 1 > 0 ? pos - engine->kv_window + 1 : 0;
}

/* The most window parts a request with n_own blocks of its own holds at once. */
static int
engine_window_quota(const cai_engine *engine, int n_own)
{
	int			W = engine->kv_window;
	int			chunk = engine->params.max_step_tokens;
	/* a step over [pos, pos + n) reads blocks block_of(pos - W + 1) .. block_of(pos + n - 1) */
	int			step_blocks = (W + chunk - 2) / CAI_KV_BLOCK_TOKENS + 2;

	return step_blocks < n_own ? step_blocks : n_own;
}

/* Gives window parts to the request's blocks that positions [pos, pos + n) write. */
static void
request_take_windows(cai_engine *engine, cai_request *req, int pos, int n)
{
	int			first = block_of(pos);

	if (engine->kv_window == 0)
		return;
	for (int b = first > req->n_shared_blocks ? first : req->n_shared_blocks;
		 b <= block_of(pos + n - 1); b++)
	{
		if (cai_kv_block_has_window(engine->kv, req->block_table[b]) ||
			!cai_kv_block_add_window(engine->kv, req->block_table[b]))
			continue;		/* a shortfall is reported by the forward's check */
		req->window_parts_held++;
		engine->window_quota_unused--;
	}
}

/* Drops the window parts of the request's blocks that no later token will read. */
static void
request_drop_windows(cai_engine *engine, cai_request *req)
{
	int			behind = block_of(window_start(engine, req->n_computed));
	int			b = req->window_scan > req->n_shared_blocks ? req->window_scan : req->n_shared_blocks;

	if (engine->kv_window == 0)
		return;
	for (; b < behind; b++)
	{
		if (!cai_kv_block_has_window(engine->kv, req->block_table[b]))
			continue;
		cai_kv_block_drop_window(engine->kv, req->block_table[b]);
		req->window_parts_held--;
		engine->window_quota_unused++;
	}
	if (behind > req->window_scan)
		req->window_scan = behind;
}

/*
 * Whether the windowed KV that resuming at position m reads, positions [m - W + 1, m), is all
 * in the first n_table blocks of table (the positions past them are a copied tail's).
 */
static bool
window_present(const cai_engine *engine, const int32_t *table, int n_table, int m)
{
	if (engine->kv_window == 0 || m == 0)
		return true;
	for (int b = block_of(window_start(engine, m)); b <= block_of(m - 1) && b < n_table; b++)
		if (!cai_kv_block_has_window(engine->kv, table[b]))
			return false;
	return true;
}

/* ---------------------------------------------------------------------------------------------
 * Parameters
 * ------------------------------------------------------------------------------------------- */

void
cai_engine_params_default(cai_engine_params *params)
{
	memset(params, 0, sizeof(*params));
	params->device = "auto";
	params->n_threads = 0;
	params->max_running = 32;
	params->max_step_tokens = 512;
	params->context_length = 0;
	params->max_queue = 256;
	params->kv_cache_bytes = 0;
	params->host_cache_bytes = 0;
}

void
cai_sampling_params_default(cai_sampling_params *params)
{
	memset(params, 0, sizeof(*params));
	params->temperature = 0.0f;
	params->top_p = 1.0f;
	params->top_k = 0;
	params->seed = 0;
	params->max_tokens = 256;
	params->repetition_penalty = 1.0f;
	params->n_samples = 1;
}

/* The penalties, filters and logprobs of cai_sampling_params_check; NaN fails every test. */
static cai_status
sampling_adjustments_check(const cai_sampling_params *sp, cai_error *err)
{
	if (!(sp->presence_penalty >= -CAI_PENALTY_MAX && sp->presence_penalty <= CAI_PENALTY_MAX))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"presence_penalty must be between %g and %g (got %.9g)", -CAI_PENALTY_MAX,
						CAI_PENALTY_MAX, (double) sp->presence_penalty);
	if (!(sp->frequency_penalty >= -CAI_PENALTY_MAX && sp->frequency_penalty <= CAI_PENALTY_MAX))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"frequency_penalty must be between %g and %g (got %.9g)", -CAI_PENALTY_MAX,
						CAI_PENALTY_MAX, (double) sp->frequency_penalty);
	if (!(sp->repetition_penalty > 0.0f && sp->repetition_penalty <= CAI_REPETITION_PENALTY_MAX))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"repetition_penalty must be greater than 0 and at most %g (got %.9g)",
						CAI_REPETITION_PENALTY_MAX, (double) sp->repetition_penalty);
	if (!(sp->min_p >= 0.0f && sp->min_p <= 1.0f))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"min_p must be between 0 and 1 (got %.9g)", (double) sp->min_p);
	if (sp->top_logprobs < 0 || sp->top_logprobs > CAI_TOP_LOGPROBS_MAX)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"top_logprobs must be between 0 and %d (got %d)", CAI_TOP_LOGPROBS_MAX,
						sp->top_logprobs);
	if (sp->n_logit_bias < 0 || sp->n_logit_bias > CAI_MAX_LOGIT_BIAS ||
		(sp->n_logit_bias > 0 && sp->logit_bias == NULL))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"logit_bias takes at most %d tokens (got %d)", CAI_MAX_LOGIT_BIAS,
						sp->n_logit_bias);
	for (int i = 0; i < sp->n_logit_bias; i++)
	{
		float		b = sp->logit_bias[i].bias;

		if (sp->logit_bias[i].token < 0)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"logit_bias token ids must not be negative (got %d)",
							sp->logit_bias[i].token);
		if (!(b >= -CAI_LOGIT_BIAS_MAX && b <= CAI_LOGIT_BIAS_MAX))
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"logit_bias values must be between %g and %g (got %.9g for token %d)",
							-CAI_LOGIT_BIAS_MAX, CAI_LOGIT_BIAS_MAX, (double) b,
							sp->logit_bias[i].token);
	}
	return CAI_OK;
}

/* See cai.h; the negated comparisons refuse NaN too. */
cai_status
cai_sampling_params_check(const cai_sampling_params *sp, cai_error *err)
{
	if (!(sp->temperature >= 0.0f && sp->temperature <= CAI_TEMPERATURE_MAX))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"temperature must be between 0 and %g (got %.9g)", CAI_TEMPERATURE_MAX,
						(double) sp->temperature);
	if (!(sp->top_p > 0.0f && sp->top_p <= 1.0f))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"top_p must be greater than 0 and at most 1 (got %.9g)",
						(double) sp->top_p);
	if (sp->top_k < 0 || sp->top_k > CAI_TOP_K_MAX)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"top_k must be between 0 and %d (got %d)", CAI_TOP_K_MAX, sp->top_k);
	if (sp->max_tokens < 1 || sp->max_tokens > CAI_MAX_TOKENS_MAX)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"max_tokens must be between 1 and %d (got %d)", CAI_MAX_TOKENS_MAX,
						sp->max_tokens);
	if (sp->n_stop < 0 || sp->n_stop > CAI_MAX_STOP_STRINGS)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"stop takes at most %d strings (got %d)", CAI_MAX_STOP_STRINGS, sp->n_stop);
	for (int i = 0; i < sp->n_stop; i++)
	{
		size_t		len = sp->stop[i] ? strlen(sp->stop[i]) : 0;

		if (len == 0)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "stop must not contain an empty string");
		if (len > CAI_STOP_MAX_BYTES)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"stop takes strings of at most %d bytes (got one of %zu)",
							CAI_STOP_MAX_BYTES, len);
	}
	if (sp->n_samples < 1 || sp->n_samples > CAI_N_SAMPLES_MAX)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"n must be between 1 and %d (got %d)", CAI_N_SAMPLES_MAX, sp->n_samples);
	return sampling_adjustments_check(sp, err);
}

/* ---------------------------------------------------------------------------------------------
 * Creation
 * ------------------------------------------------------------------------------------------- */

/*
 * Picks the backend for params->device and explains the choice.  "cpu" is the CPU; "auto" takes
 * the GPU when the CUDA backend library loads and sees a device, else the CPU (saying why);
 * "cuda" insists.  Only the process that calls this (the engine worker) ever loads CUDA.
 */
static cai_status
engine_choose_device(cai_engine *engine, const char *device, cai_error *err)
{
	char		why[512];
	int			n_devices;
	bool		insist;

	if (device == NULL || device[0] == '\0')
		device = "auto";
	if (strcmp(device, "auto") != 0 && strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"unknown device \"%s\" (expected auto, cpu or cuda)", device);
	snprintf(engine->device, sizeof(engine->device), "cpu (%s, %d threads)",
			 cai_cpu_isa(), cai_threadpool_size(engine->pool));
	if (strcmp(device, "cpu") == 0)
	{
		snprintf(engine->device_reason, sizeof(engine->device_reason), "device = cpu");
		return CAI_OK;
	}

	/* the reasons name the library's absolute path: which file was tried, or loaded */
	insist = strcmp(device, "cuda") == 0;
	if (!cai_cuda_loader_open(engine->params.cuda_library, &engine->cuda, why, sizeof(why)))
	{
		if (insist)
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"device \"cuda\" requested but the CUDA backend could not be loaded: %s",
							why);
		snprintf(engine->device_reason, sizeof(engine->device_reason),
				 "auto: no CUDA backend library (%.300s), so the CPU serves", why);
		return CAI_OK;
	}
	n_devices = engine->cuda.device_count(why, sizeof(why));
	if (n_devices <= 0)
	{
		char		library[sizeof(engine->cuda.path)];

		memcpy(library, engine->cuda.path, sizeof(library));
		cai_cuda_loader_close(&engine->cuda);
		if (insist)
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"device \"cuda\" requested but no CUDA device is usable (%s loaded): %s",
							library, why);
		snprintf(engine->device_reason, sizeof(engine->device_reason),
				 "auto: %.200s loaded, but no usable CUDA device (%.150s), so the CPU serves",
				 library, why);
		return CAI_OK;
	}
	engine->use_cuda = true;
	snprintf(engine->device_reason, sizeof(engine->device_reason),
			 "%s: %.300s loaded, %d CUDA device(s), using device 0",
			 insist ? "device = cuda" : "auto", engine->cuda.path, n_devices);
	return CAI_OK;
}

/* cai_backend_factory for the CUDA backend: uploads the model to device 0. */
static cai_status
engine_cuda_backend_factory(void *arg, const cai_backend_limits *limits, cai_backend **out,
							cai_error *err)
{
	cai_engine *engine = arg;
	cai_cuda_backend_params bp = {
		.device = 0,
		.model = engine->model,
		.limits = *limits,
		.kv_pool_layout = cai_kv_pool_layout,
		.kv_pool_n_blocks = cai_kv_pool_n_blocks,
	};

	return engine->cuda.backend_create(&bp, out, err);
}

/*
 * Creates the forward context on the chosen backend.  When the GPU was picked by "auto" but
 * cannot take the model (out of device memory, say), the CPU serves and the reason says why.
 */
static cai_status
engine_create_forward(cai_engine *engine, cai_error *err)
{
	bool		insist = engine->params.device && strcmp(engine->params.device, "cuda") == 0;
	cai_status	st;

	if (engine->use_cuda)
	{
		st = cai_forward_ctx_create_on(engine->model, engine_cuda_backend_factory, engine,
									   engine->params.max_step_tokens, engine->context_length,
									   &engine->forward, err);
		if (st == CAI_OK)
		{
			snprintf(engine->device, sizeof(engine->device), "cuda (%s)",
					 engine->cuda.backend_device(cai_forward_ctx_backend(engine->forward)));
			return CAI_OK;
		}
		if (insist)
			return st;
		engine->use_cuda = false;
		cai_cuda_loader_close(&engine->cuda);
		snprintf(engine->device_reason, sizeof(engine->device_reason),
				 "auto: the CUDA device could not take the model (%.200s), so the CPU serves",
				 err ? err->message : "unknown error");
	}
	return cai_forward_ctx_create(engine->model, engine->pool, engine->params.max_step_tokens,
								  engine->context_length, &engine->forward, err);
}

/*
 * The prefix cache's disk tier, when the settings ask for one.  Blocks are written from and read
 * into the KV pool's host memory, which is where the KV lives only on the CPU backend: with a
 * device holding it the tier stays off.  A tier that cannot open leaves the cache in memory
 * alone, saying why; it never fails the engine.
 */
static void
engine_open_disk_tier(cai_engine *engine, const cai_kv_layout *layout, uint64_t fingerprint)
{
	const cai_engine_params *p = &engine->params;
	cai_error	e;
	char		line[sizeof(e.message) + 64];

	if (!p->disk_cache_dir || !p->disk_cache_dir[0] || p->disk_cache_bytes == 0 ||
		p->host_cache_bytes == 0)
		return;
	if (engine->use_cuda)
	{
		if (p->log)
			p->log(p->log_arg, "the disk tier of the prefix cache is not used on the GPU: "
				   "the KV lives in device memory");
		return;
	}
	if (cai_kv_disk_open(p->disk_cache_dir, p->disk_cache_bytes, fingerprint, layout, "cpu",
						 p->log, p->log_arg, &engine->disk, &e) != CAI_OK)
	{
		if (p->log)
		{
			snprintf(line, sizeof(line), "disk tier off, prefix cache in memory only: %s",
					 e.message);
			p->log(p->log_arg, line);
		}
		return;
	}
	cai_prefix_cache_set_disk(engine->cache, engine->disk);
	/* running requests' window quotas come first (see "Window parts") */
	cai_prefix_cache_set_window_reserve(engine->cache, &engine->window_quota_unused);
}

cai_status
cai_engine_create(cai_model *model, const cai_engine_params *params_in,
				  cai_engine **out, cai_error *err)
{
	cai_engine *engine;
	cai_engine_params params;
	cai_kv_layout layout;
	cai_status	st;
	int			n_vocab = model->cfg.n_vocab;
	int			blocks_per_seq;
	size_t		n_blocks;

	*out = NULL;
	if (params_in)
		params = *params_in;
	else
		cai_engine_params_default(&params);
	if (params.n_threads <= 0)
		params.n_threads = cai_cpu_count();
	if (params.max_running <= 0 || params.max_running > 4096)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "max_running must be between 1 and 4096");
	if (params.max_step_tokens < params.max_running)
		params.max_step_tokens = params.max_running;
	if (params.max_queue < 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "max_queue must not be negative");

	engine = calloc(1, sizeof(*engine));
	if (!engine)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory creating the engine");
	cai_step_cost_init(&engine->step_cost);
	engine->model = model;
	engine->params = params;
	engine->next_id = 1;

	engine->context_length = params.context_length > 0 ? params.context_length
		: (model->cfg.context_length < CAI_DEFAULT_MAX_CONTEXT ? model->cfg.context_length
		   : CAI_DEFAULT_MAX_CONTEXT);
	if (engine->context_length > model->cfg.context_length)
		engine->context_length = model->cfg.context_length;
	if (engine->context_length < CAI_KV_BLOCK_TOKENS)
	{
		cai_engine_free(engine);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "context_length must be at least %d",
						CAI_KV_BLOCK_TOKENS);
	}

	engine->pool = cai_threadpool_create(params.n_threads);
	if (!engine->pool)
	{
		cai_engine_free(engine);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "could not start %d threads", params.n_threads);
	}
	st = engine_choose_device(engine, params.device, err);
	if (st != CAI_OK)
	{
		cai_engine_free(engine);
		return st;
	}

	/*
	 * The pool holds the working KV of max_running full-context sequences plus the prefix
	 * cache's budget (on the CPU, cached blocks are used in place, so they share the pool).
	 */
	cai_model_kv_layout(model, &layout);
	blocks_per_seq = (engine->context_length + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
	if (params.kv_cache_bytes > 0)
		n_blocks = params.kv_cache_bytes / layout.block_bytes;
	else
		n_blocks = (size_t) params.max_running * blocks_per_seq;
	/* the cache's blocks cost their global parts, and their window parts where kept */
	n_blocks += params.host_cache_bytes / (cai_kv_global_part_bytes(&layout) > 0 ?
										   cai_kv_global_part_bytes(&layout) : layout.block_bytes);
	if (n_blocks < (size_t) blocks_per_seq)
		n_blocks = blocks_per_seq;
	if (n_blocks > INT32_MAX / 2)
	{
		cai_engine_free(engine);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "kv cache size is too large");
	}

	/*
	 * A windowed model's running sequences hold window parts for about a window each, so the
	 * pool has fewer window parts than blocks: every running sequence's largest quota, plus as
	 * many as the prefix cache's budget holds in whole blocks.
	 */
	engine->kv_window = layout.n_windowed_layers > 0 && !params.whole_kv ? layout.window : 0;
	if (engine->kv_window > 0)
	{
		size_t		n_window_parts = (size_t) params.max_running *
			engine_window_quota(engine, blocks_per_seq) +
			params.host_cache_bytes / layout.block_bytes;

		if (n_window_parts > n_blocks)
			n_window_parts = n_blocks;
		st = cai_kv_pool_create_windowed(&layout, (int) n_blocks, (int) n_window_parts,
										 &engine->kv, err);
	}
	else
		st = cai_kv_pool_create(&layout, (int) n_blocks, &engine->kv, err);
	if (st == CAI_OK)
		st = cai_prefix_cache_create(engine->kv, params.host_cache_bytes, model->fingerprint,
									 &engine->cache, err);
	if (st == CAI_OK)
		engine_open_disk_tier(engine, &layout, model->fingerprint);
	if (st == CAI_OK)
		st = engine_create_forward(engine, err);
	if (st == CAI_OK)
	{
		int			n_threads = cai_threadpool_size(engine->pool);

		engine->samplers = calloc(n_threads, sizeof(cai_sampler_scratch));
		if (!engine->samplers)
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory creating the engine");
		for (int i = 0; st == CAI_OK && i < n_threads; i++)
			st = cai_sampler_scratch_init(&engine->samplers[i], n_vocab, err);
	}
	if (st != CAI_OK)
	{
		cai_engine_free(engine);
		return st;
	}

	engine->running = calloc(params.max_running, sizeof(cai_request *));
	engine->batch = calloc(params.max_running, sizeof(cai_batch_seq));
	engine->batch_req = calloc(params.max_running, sizeof(cai_request *));
	engine->logits = malloc((size_t) params.max_running * n_vocab * sizeof(float));
	engine->tokens = malloc((size_t) params.max_running * sizeof(int32_t));
	engine->logit_req = malloc((size_t) params.max_running * sizeof(cai_request *));
	engine->logit_row = malloc((size_t) params.max_running * sizeof(int));
	engine->prefill_chunk = malloc((size_t) params.max_running * sizeof(int));
	engine->events_cap = params.max_running * 2;
	engine->events = calloc(engine->events_cap, sizeof(cai_event));
	if (!engine->running || !engine->batch || !engine->batch_req || !engine->logits ||
		!engine->tokens || !engine->logit_req || !engine->logit_row || !engine->prefill_chunk ||
		!engine->events)
	{
		cai_engine_free(engine);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory creating the engine");
	}
	engine->stats.kv_blocks_total = cai_kv_pool_n_blocks(engine->kv);
	*out = engine;
	return CAI_OK;
}

void
cai_engine_free(cai_engine *engine)
{
	cai_request *req;

	if (!engine)
		return;
	while ((req = engine->waiting_head) != NULL)
	{
		engine->waiting_head = req->next;
		request_free_waiting(req);
	}
	for (int i = 0; i < engine->n_running; i++)
	{
		request_release_blocks(engine, engine->running[i], false);
		request_free(engine->running[i]);
	}
	while ((req = engine->retired) != NULL)
	{
		engine->retired = req->next;
		request_free(req);
	}
	cai_prefix_cache_free(engine->cache);
	cai_kv_disk_close(engine->disk);
	cai_kv_pool_free(engine->kv);
	cai_forward_ctx_free(engine->forward);
	cai_cuda_loader_close(&engine->cuda);
	free(engine->masks);
	cai_token_index_free(engine->token_index);
	/* the samplers, if any, were made after the pool: one per thread */
	for (int i = 0; engine->samplers && i < cai_threadpool_size(engine->pool); i++)
		cai_sampler_scratch_free(&engine->samplers[i]);
	free(engine->samplers);
	cai_threadpool_free(engine->pool);
	free(engine->running);
	free(engine->batch);
	free(engine->batch_req);
	free(engine->logits);
	free(engine->tokens);
	free(engine->logit_req);
	free(engine->logit_row);
	free(engine->prefill_chunk);
	free(engine->events);
	free(engine);
}

int
cai_engine_context_length(const cai_engine *engine)
{
	return engine->context_length;
}

const char *
cai_engine_device(const cai_engine *engine)
{
	return engine->device;
}

const char *
cai_engine_device_reason(const cai_engine *engine)
{
	return engine->device_reason;
}

cai_status
cai_cpu_use_isa(const char *name, cai_error *err)
{
	if (!cai_cpu_isa_known(name))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"unknown CPU path \"%s\" (expected avx512-amx, avx512-vnni, avx-vnni, avx2 or generic)",
						name ? name : "(null)");
	if (!cai_cpu_force_isa(name))
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "this CPU cannot run the %s path (it runs %s)",
						name, cai_cpu_isa());
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */

static void
request_free(cai_request *req)
{
	if (!req)
		return;
	cai_tokens_free(&req->tokens);
	free(req->logit_bias);
	free(req->block_table);
	cai_reply_text_free(&req->reply);
	cai_grammar_state_free(req->grammar_state);
	if (req->grammar_refs == NULL)
		cai_grammar_free(req->grammar);
	else if (--*req->grammar_refs == 0)
	{
		cai_grammar_free(req->grammar);
		free(req->grammar_refs);
	}
	cai_tool_state_free(req->tool_state);
	free(req->forks);			/* the samples themselves are in the batch once admitted */
	free(req->embedding);
	free(req);
}

/* Frees a request that never left the waiting list, and the samples it owns there. */
static void
request_free_waiting(cai_request *req)
{
	for (int i = 0; req->forks && i < req->n_forks; i++)
		request_free(req->forks[i]);
	request_free(req);
}

/* Blocks a request needs for its whole budget. */
static int
request_blocks_needed(const cai_request *req)
{
	int			positions = req->n_prompt + req->max_tokens;

	return (positions + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
}

/*
 * Blocks a request with its parallel samples takes at admission: the leader's whole budget, and
 * for every other sample its own blocks past the full prompt blocks it shares (the first of
 * them receives the copy of the partly filled prompt block).
 */
static int
request_blocks_total(const cai_request *req)
{
	int			need = request_blocks_needed(req);

	return need + req->n_forks * (need - req->n_prompt / CAI_KV_BLOCK_TOKENS);
}

/*
 * The vocabulary indexed for grammars, made at the first constrained request (a few tens of
 * milliseconds on a large vocabulary), with one mask buffer per pool thread.
 */
static cai_status
engine_token_index(cai_engine *engine, cai_error *err)
{
	int32_t		end_ids[2];
	int			n_end = 0;
	int			n_threads = cai_threadpool_size(engine->pool);
	cai_status	st;

	if (engine->token_index)
		return CAI_OK;
	if (engine->model->tmpl.end_of_turn >= 0)
		end_ids[n_end++] = engine->model->tmpl.end_of_turn;
	if (cai_tokenizer_eos(engine->model->tokenizer) >= 0 &&
		cai_tokenizer_eos(engine->model->tokenizer) != engine->model->tmpl.end_of_turn)
		end_ids[n_end++] = cai_tokenizer_eos(engine->model->tokenizer);
	st = cai_token_index_create(engine->model->tokenizer, end_ids, n_end, &engine->token_index,
								err);
	if (st != CAI_OK)
	{
		engine->token_index = NULL;
		return st;
	}
	engine->masks = malloc(sizeof(uint64_t) * (size_t) n_threads *
						   (size_t) cai_token_index_mask_words(engine->token_index));
	if (!engine->masks)
	{
		cai_token_index_free(engine->token_index);
		engine->token_index = NULL;
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory for grammar masks");
	}
	return CAI_OK;
}

/*
 * The tool options of a request: a call's grammar needs the vocabulary index, and cannot share
 * the reply with another grammar or with stop strings (either would cut the call).
 */
static cai_status
engine_check_tools(cai_engine *engine, const cai_request_params *params, cai_error *err)
{
	if (!params->tools || params->tool_choice == CAI_TOOL_CHOICE_NONE)
		return CAI_OK;
	if (params->tool_choice < CAI_TOOL_CHOICE_NONE || params->tool_choice > CAI_TOOL_CHOICE_NAMED)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "unknown tool_choice %d", params->tool_choice);
	if (params->grammar)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"tools cannot be combined with a JSON response format");
	if (params->sampling.n_stop > 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "stop strings cannot be combined with tools");
	if (params->tool_choice == CAI_TOOL_CHOICE_NAMED &&
		cai_tool_set_find(params->tools, params->tool_name) < 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"tool_choice names \"%s\", which is not among the tools",
						params->tool_name ? params->tool_name : "");
	return engine_token_index(engine, err);
}

/*
 * A new request, or one parallel sample of it (sample > 0: drawn from seed + sample), in
 * *out: its own copy of the prompt, of the sampling options and of the stop strings.  A
 * grammar is the request's (the leader takes it over, the other samples share it); tools are
 * the leader's only, since a request with tools has one sample.
 */
static cai_status
request_create(cai_engine *engine, const cai_request_params *params, int sample,
			   cai_request **out, cai_error *err)
{
	const cai_sampling_params *sp = &params->sampling;
	int			room = engine->context_length - params->n_prompt;
	cai_request *req;
	cai_status	st;

	*out = NULL;
	req = calloc(1, sizeof(*req));
	if (!req)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory queuing the request");
	cai_tokens_init(&req->tokens);
	*out = req;
	req->sample = sample;
	if (sample == 0)
		req->grammar = params->grammar;
	if (params->grammar &&
		(st = cai_grammar_state_create(params->grammar, engine->token_index, &req->grammar_state,
									   err)) != CAI_OK)
		return st;
	if (sample == 0 && params->tools && params->tool_choice != CAI_TOOL_CHOICE_NONE &&
		!params->embed &&
		(st = cai_tool_state_create(params->tools,
									params->tool_choice == CAI_TOOL_CHOICE_NAMED ? params->tool_name : NULL,
									params->tool_choice != CAI_TOOL_CHOICE_AUTO,
									cai_tool_format_for_template(engine->model->tmpl.kind),
									engine->model->tokenizer, engine->token_index,
									&req->tool_state, err)) != CAI_OK)
		return st;
	req->sampling = *sp;
	req->sampling.logit_bias = NULL;
	if (sp->n_logit_bias > 0)
	{
		/* the caller's array may go away after submit */
		req->logit_bias = malloc(sizeof(cai_logit_bias) * (size_t) sp->n_logit_bias);
		if (!req->logit_bias)
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory queuing the request");
		memcpy(req->logit_bias, sp->logit_bias, sizeof(cai_logit_bias) * (size_t) sp->n_logit_bias);
		req->sampling.logit_bias = req->logit_bias;
	}
	/* a constrained reply ends where its value does: the end token cannot be banned */
	if (params->grammar || req->tool_state)
		req->sampling.ignore_eos = false;
	/* the stop strings are copied into the reply's text; the caller's may go away */
	req->sampling.n_stop = 0;
	memset(req->sampling.stop, 0, sizeof(req->sampling.stop));
	st = cai_reply_text_init(&req->reply, engine->model->tokenizer, sp->stop, sp->n_stop, err);
	if (st != CAI_OK)
		return st;
	if (!cai_tokens_append(&req->tokens, params->prompt, params->n_prompt))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory queuing the request");
	req->user_data = params->user_data;
	req->cache_salt = params->cache_salt;
	req->cache_owner = params->cache_owner;
	/* an embedding's KV is of no use to a later prompt: it never enters the cache */
	req->use_cache = params->use_cache && !params->embed;
	req->embed = params->embed;
	req->n_prompt = params->n_prompt;
	req->max_tokens = params->embed ? 0 : sp->max_tokens < room ? sp->max_tokens : room;
	if (req->embed &&
		!(req->embedding = malloc(sizeof(float) * (size_t) engine->model->cfg.d_model)))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory queuing the request");
	cai_rng_seed(&req->rng, sp->seed + (uint64_t) sample);
	req->usage.prompt_tokens = params->n_prompt;
	req->submit_time = cai_now_seconds();
	return CAI_OK;
}

/* The samples 1 .. n - 1 of a request, owned by its leader until it is admitted. */
static cai_status
request_create_forks(cai_engine *engine, const cai_request_params *params, cai_request *leader,
					 cai_error *err)
{
	int			n = params->sampling.n_samples - 1;
	cai_status	st;

	leader->forks = calloc(n, sizeof(cai_request *));
	if (!leader->forks)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory queuing the request");
	if (leader->grammar)
	{
		leader->grammar_refs = malloc(sizeof(int));
		if (!leader->grammar_refs)
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory queuing the request");
		*leader->grammar_refs = 1;
	}
	for (int i = 0; i < n; i++)
	{
		cai_request *fork;

		st = request_create(engine, params, i + 1, &fork, err);
		if (fork)
			leader->forks[leader->n_forks++] = fork;
		if (fork && leader->grammar)
		{
			fork->grammar = leader->grammar;
			fork->grammar_refs = leader->grammar_refs;
			++*leader->grammar_refs;
		}
		if (st != CAI_OK)
			return st;
	}
	return CAI_OK;
}

/*
 * Queues a request; *grammar_taken says whether the request took over params->grammar (it
 * then frees it, whatever happens).
 */
/*
 * What an embed request must be: a whole text in one step (attention may run both ways, and
 * pooling sees every row at once), on a model and backend that give embeddings.
 */
static cai_status
engine_check_embed(const cai_engine *engine, int n_prompt, cai_error *err)
{
	const cai_config *c = &engine->model->cfg;
	const cai_backend *be = cai_forward_ctx_backend(engine->forward);

	if (n_prompt > engine->params.max_step_tokens)
		return cai_fail(err, CAI_ERR_CONTEXT_FULL,
						"a text of %d tokens is longer than the %d tokens an embedding may have (the step budget, max_step_tokens)",
						n_prompt, engine->params.max_step_tokens);
	if (c->pooling != CAI_POOLING_MEAN && c->pooling != CAI_POOLING_CLS &&
		c->pooling != CAI_POOLING_LAST)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"the model's pooling (%s) gives no embedding of a text",
						cai_pooling_name(c->pooling));
	if (strcmp(be->ops->name, "cpu") != 0)
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "embeddings run on the cpu backend only");
	if (c->d_model > c->n_vocab)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"embeddings wider than the vocabulary are not supported");
	return CAI_OK;
}

static cai_status
engine_submit(cai_engine *engine, const cai_request_params *params, uint64_t *request_id,
			  bool *grammar_taken, cai_error *err)
{
	cai_request *req;
	cai_sampling_params embed_sampling;
	const cai_sampling_params *sp = &params->sampling;
	int			n_vocab = engine->model->cfg.n_vocab;
	int			room;
	cai_status	st;

	if (params->n_prompt <= 0 || params->prompt == NULL)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "the prompt is empty");
	for (int i = 0; i < params->n_prompt; i++)
		if (params->prompt[i] < 0 || params->prompt[i] >= n_vocab)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"prompt token %d at position %d is outside the vocabulary (0..%d)",
							params->prompt[i], i, n_vocab - 1);
	if (params->embed)
	{
		if (params->grammar)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"an embedding takes no response format");
		if ((st = engine_check_embed(engine, params->n_prompt, err)) != CAI_OK)
			return st;
		cai_sampling_params_default(&embed_sampling);
		sp = &embed_sampling;
	}
	if ((st = cai_sampling_params_check(sp, err)) != CAI_OK)
		return st;
	for (int i = 0; i < sp->n_logit_bias; i++)
		if (sp->logit_bias[i].token >= n_vocab)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"logit_bias token %d is outside the vocabulary (0..%d)",
							sp->logit_bias[i].token, n_vocab - 1);
	/* a stop string would cut a constrained value wherever it matched */
	if (params->grammar && sp->n_stop > 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"stop strings cannot be combined with a JSON response format");
	if (params->grammar && (st = engine_token_index(engine, err)) != CAI_OK)
		return st;
	if (!params->embed && (st = engine_check_tools(engine, params, err)) != CAI_OK)
		return st;
	if (sp->n_samples > 1 && params->embed)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "an embedding takes no samples (n must be 1)");
	if (sp->n_samples > 1 && params->tools && params->tool_choice != CAI_TOOL_CHOICE_NONE)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "n greater than 1 cannot be combined with tools");
	/* the samples run side by side in one batch */
	if (sp->n_samples > engine->params.max_running)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"n must be at most the engine's max_running, %d (got %d)",
						engine->params.max_running, sp->n_samples);

	/* the prompt plus at least one generated token must fit the context (an embedding: none) */
	room = engine->context_length - params->n_prompt;
	if (room < (params->embed ? 0 : 1))
		return cai_fail(err, CAI_ERR_CONTEXT_FULL,
						"prompt of %d tokens does not fit the context of %d tokens",
						params->n_prompt, engine->context_length);
	/*
	 * max_queue bounds the requests that must really wait: those that the next step admits into
	 * free batch slots do not count, so a burst reaching an idle engine between two steps is not
	 * refused while slots are free.
	 */
	if (engine->n_waiting - (engine->params.max_running - engine->n_running) >=
		engine->params.max_queue)
	{
		engine->stats.requests_rejected++;
		return cai_fail(err, CAI_ERR_QUEUE_FULL,
						"the request queue is full: %d requests already wait for a batch slot, the limit is %d",
						engine->n_waiting - (engine->params.max_running - engine->n_running),
						engine->params.max_queue);
	}
	if (engine->params.max_queue_wait_ms > 0)
	{
		double		wait_ms = cai_engine_estimate_wait_ms(engine);

		if (wait_ms > engine->params.max_queue_wait_ms)
		{
			engine->stats.requests_rejected++;
			return cai_fail(err, CAI_ERR_QUEUE_FULL,
							"estimated wait of %.0f ms exceeds the limit of %.0f ms (%d running, %d waiting)",
							wait_ms, engine->params.max_queue_wait_ms, engine->n_running,
							engine->n_waiting);
		}
	}

	st = request_create(engine, params, 0, &req, err);
	if (req)
		*grammar_taken = true;
	if (st != CAI_OK)
	{
		request_free(req);
		return st;
	}
	if (sp->n_samples > 1 && (st = request_create_forks(engine, params, req, err)) != CAI_OK)
	{
		request_free_waiting(req);
		return st;
	}
	req->id = engine->next_id++;
	for (int i = 0; i < req->n_forks; i++)
		req->forks[i]->id = req->id;
	if (request_blocks_total(req) > cai_kv_pool_n_blocks(engine->kv))
	{
		int			n_blocks = cai_kv_pool_n_blocks(engine->kv);

		request_free_waiting(req);
		return cai_fail(err, CAI_ERR_CONTEXT_FULL,
						"the request needs more KV memory than the engine has (%d blocks)", n_blocks);
	}
	req->state = REQUEST_WAITING;

	if (engine->waiting_tail)
		engine->waiting_tail->next = req;
	else
		engine->waiting_head = req;
	engine->waiting_tail = req;
	engine->n_waiting++;
	engine->stats.prompt_tokens += params->n_prompt;
	*request_id = req->id;
	return CAI_OK;
}

cai_status
cai_engine_submit(cai_engine *engine, const cai_request_params *params,
				  uint64_t *request_id, cai_error *err)
{
	bool		grammar_taken = false;
	cai_status	st = engine_submit(engine, params, request_id, &grammar_taken, err);

	if (st != CAI_OK && !grammar_taken)
		cai_grammar_free(params->grammar);
	return st;
}

/* Whether the backend can copy a cached partial block's rows, which reusing one needs. */
static bool
engine_reuses_partial_blocks(const cai_engine *engine)
{
	return cai_forward_ctx_backend(engine->forward)->ops->kv_copy_rows != NULL;
}

/*
 * Drops the request's block references; finished requests first offer their computed positions
 * to the cache: the full blocks, and the partly filled last one as a partial tail.
 */
static void
request_release_blocks(cai_engine *engine, cai_request *req, bool offer_to_cache)
{
	if (offer_to_cache && req->use_cache && req->n_blocks > 0)
	{
		int			n = req->n_computed;

		/* a tail no admission here could reuse would only take a full block's budget */
		if (!engine_reuses_partial_blocks(engine))
			n -= n % CAI_KV_BLOCK_TOKENS;
		if (n > 0)
			cai_prefix_cache_insert_owned(engine->cache, req->cache_salt, req->cache_owner,
										  req->tokens.ids, n, req->block_table, req->n_blocks);
	}
	for (int i = 0; i < req->n_blocks; i++)
		cai_kv_block_unref(engine->kv, req->block_table[i]);
	req->n_blocks = 0;
	/* the parts it held went with its blocks, to the cache or back to the pool */
	engine->window_quota_unused -= req->window_quota - req->window_parts_held;
	req->window_quota = 0;
	req->window_parts_held = 0;
}

/* Whether the free window parts fall short of every running quota plus a new one of quota. */
static bool
window_parts_short(const cai_engine *engine, int quota)
{
	return engine->kv_window > 0 &&
		cai_kv_pool_n_free_window_parts(engine->kv) - engine->window_quota_unused < quota;
}

/*
 * Admits one waiting request: attaches its longest cached prefix and reserves the rest of its
 * blocks.  Returns false (and changes nothing) when the blocks are not available now.
 *
 * The prefix is reused to the token: full cached blocks are shared in place, and a cached
 * partial tail that continues them is copied (its matched rows) into the request's own next
 * block, which the request then fills on: the tail stays intact for the other continuations.
 * Never all of the prompt is reused: the last prompt token must run to give the first logits.
 */
static bool
request_admit(cai_engine *engine, cai_request *req)
{
	int			need = request_blocks_needed(req);
	int			matched = 0;
	int			tail_tokens = 0;
	cai_prefix_cache_tail tail = {.block = -1, .n_tokens = 0};
	int			missing;
	int			quota;
	int			fork_quota = 0;

	req->block_table = malloc((size_t) need * sizeof(int32_t));
	if (!req->block_table)
		return false;
	for (int i = 0; i < req->n_forks; i++)
	{
		free(req->forks[i]->block_table);
		req->forks[i]->block_table = malloc((size_t) need * sizeof(int32_t));
		if (!req->forks[i]->block_table)
		{
			free(req->block_table);
			req->block_table = NULL;
			return false;
		}
	}

	if (req->use_cache)
	{
		int			max_tokens = req->n_prompt - 1;

		engine->stats.cache_lookups++;
		engine->stats.cache_lookup_tokens += req->n_prompt;
		matched = cai_prefix_cache_lookup_tokens(engine->cache, req->cache_salt, req->tokens.ids,
												 req->n_prompt, max_tokens, req->block_table,
												 max_tokens / CAI_KV_BLOCK_TOKENS,
												 engine_reuses_partial_blocks(engine) ? &tail
												 : NULL);
	}

	/* a windowed model resumes only where the windowed KV before that point is all kept */
	while (matched > 0 || tail.block >= 0)
	{
		int			m = matched * CAI_KV_BLOCK_TOKENS + (tail.block >= 0 ? tail.n_tokens : 0);

		if ((tail.block < 0 || cai_kv_block_has_window(engine->kv, tail.block)) &&
			window_present(engine, req->block_table, matched, m))
			break;
		if (tail.block >= 0)
		{
			cai_kv_block_unref(engine->kv, tail.block);
			tail.block = -1;
		}
		else
			cai_kv_block_unref(engine->kv, req->block_table[--matched]);
	}

	missing = need - matched;
	quota = engine->kv_window > 0 ? engine_window_quota(engine, missing) : 0;
	if (req->n_forks > 0)
	{
		int			own = need - req->n_prompt / CAI_KV_BLOCK_TOKENS;

		missing += req->n_forks * own;
		fork_quota = engine->kv_window > 0 ? engine_window_quota(engine, own) : 0;
		quota += req->n_forks * fork_quota;
	}
	if (cai_kv_pool_n_free(engine->kv) < missing)
		cai_prefix_cache_reclaim(engine->cache, missing);
	/* the cache's blocks may hold the window parts: evict until they cover every quota */
	while (window_parts_short(engine, quota) &&
		   cai_prefix_cache_reclaim(engine->cache, cai_kv_pool_n_free(engine->kv) + 1) > 0)
		;
	if (cai_kv_pool_n_free(engine->kv) < missing || window_parts_short(engine, quota))
	{
		for (int i = 0; i < matched; i++)
			cai_kv_block_unref(engine->kv, req->block_table[i]);
		if (tail.block >= 0)
			cai_kv_block_unref(engine->kv, tail.block);
		free(req->block_table);
		req->block_table = NULL;
		return false;
	}
	for (int i = matched; i < need; i++)
		req->block_table[i] = engine->kv_window > 0 ? cai_kv_block_alloc_without_window(engine->kv)
			: cai_kv_block_alloc(engine->kv);
	req->n_blocks = need;
	req->n_shared_blocks = matched;
	req->window_quota = quota - req->n_forks * fork_quota;
	req->window_scan = matched;
	engine->window_quota_unused += quota;
	for (int i = 0; i < req->n_forks; i++)
		request_admit_fork(engine, req, req->forks[i], fork_quota);
	if (tail.block >= 0)
	{
		cai_error	err;

		/* matched * 16 + tail.n_tokens < n_prompt <= need * 16, so block matched is ours */
		request_take_windows(engine, req, matched * CAI_KV_BLOCK_TOKENS, 1);
		if (cai_forward_kv_copy_rows(engine->forward, engine->kv, tail.block,
									 req->block_table[matched], tail.n_tokens, &err) == CAI_OK)
			tail_tokens = tail.n_tokens;
		cai_kv_block_unref(engine->kv, tail.block);
	}
	req->n_computed = matched * CAI_KV_BLOCK_TOKENS + tail_tokens;
	req->usage.cached_tokens = req->n_computed;
	engine->stats.cache_hit_tokens += req->n_computed;
	req->state = REQUEST_PREFILL;
	req->first_scheduled_time = cai_now_seconds();
	req->usage.queue_ms = (req->first_scheduled_time - req->submit_time) * 1000.0;
	return true;
}

/*
 * Gives a sample its blocks beside its leader's, which was just admitted: references on the full
 * prompt blocks, and its own from the one that holds the end of the prompt on.
 */
static void
request_admit_fork(cai_engine *engine, const cai_request *leader, cai_request *fork, int quota)
{
	int			n_full = leader->n_prompt / CAI_KV_BLOCK_TOKENS;

	for (int b = 0; b < n_full; b++)
	{
		fork->block_table[b] = leader->block_table[b];
		cai_kv_block_ref(engine->kv, fork->block_table[b]);
	}
	for (int b = n_full; b < leader->n_blocks; b++)
		fork->block_table[b] = engine->kv_window > 0 ?
			cai_kv_block_alloc_without_window(engine->kv) : cai_kv_block_alloc(engine->kv);
	fork->n_blocks = leader->n_blocks;
	/* the prompt's blocks are the leader's to fill, and their window parts the leader's */
	fork->n_shared_blocks = n_full;
	fork->window_scan = n_full;
	fork->window_quota = quota;
	fork->state = REQUEST_FORK;
	fork->first_scheduled_time = leader->first_scheduled_time;
	fork->usage.queue_ms = leader->usage.queue_ms;
}

/*
 * A sample's fork from its leader, whose prefill just ended: the rows of the partly filled
 * prompt block are copied into the sample's own block (the leader keeps writing its own), and
 * the sample decodes on from the end of the prompt.  False when the copy failed.
 */
static bool
request_fork(cai_engine *engine, const cai_request *leader, cai_request *fork)
{
	int			n_full = leader->n_prompt / CAI_KV_BLOCK_TOKENS;
	int			rows = leader->n_prompt % CAI_KV_BLOCK_TOKENS;
	cai_error	err;

	if (rows > 0)
	{
		request_take_windows(engine, fork, n_full * CAI_KV_BLOCK_TOKENS, 1);
		if (cai_forward_kv_copy_rows(engine->forward, engine->kv, leader->block_table[n_full],
									 fork->block_table[n_full], rows, &err) != CAI_OK)
			return false;
	}
	fork->n_computed = leader->n_prompt;
	fork->usage.cached_tokens = leader->usage.cached_tokens;
	fork->state = REQUEST_DECODE;
	return true;
}

/* Removes a request from the waiting list (it must be there). */
static void
waiting_remove(cai_engine *engine, cai_request *req)
{
	cai_request *prev = NULL;

	for (cai_request *r = engine->waiting_head; r; prev = r, r = r->next)
	{
		if (r != req)
			continue;
		if (prev)
			prev->next = r->next;
		else
			engine->waiting_head = r->next;
		if (engine->waiting_tail == r)
			engine->waiting_tail = prev;
		engine->n_waiting--;
		r->next = NULL;
		return;
	}
}

static void
running_remove(cai_engine *engine, int index)
{
	memmove(&engine->running[index], &engine->running[index + 1],
			(size_t) (engine->n_running - index - 1) * sizeof(cai_request *));
	engine->n_running--;
}

/*
 * Drops every running sample of request id but keep (NULL: all of them) and frees its KV now;
 * returns how many were dropped.
 */
static int
engine_drop_samples(cai_engine *engine, uint64_t id, const cai_request *keep)
{
	int			n = 0;

	for (int i = engine->n_running - 1; i >= 0; i--)
	{
		cai_request *r = engine->running[i];

		if (r->id != id || r == keep)
			continue;
		running_remove(engine, i);
		request_release_blocks(engine, r, false);
		request_free(r);
		n++;
	}
	return n;
}

cai_status
cai_engine_cancel(cai_engine *engine, uint64_t request_id)
{
	for (cai_request *r = engine->waiting_head; r; r = r->next)
	{
		if (r->id == request_id)
		{
			waiting_remove(engine, r);
			request_free_waiting(r);
			engine->stats.requests_cancelled++;
			return CAI_OK;
		}
	}
	if (engine_drop_samples(engine, request_id, NULL) == 0)
		return CAI_ERR_NOT_FOUND;
	engine->stats.requests_cancelled++;
	return CAI_OK;
}

void
cai_engine_set_admission_limits(cai_engine *engine, int max_queue, double max_queue_wait_ms)
{
	engine->params.max_queue = max_queue < 0 ? 0 : max_queue;
	engine->params.max_queue_wait_ms = max_queue_wait_ms < 0 ? 0 : max_queue_wait_ms;
}

bool
cai_engine_has_work(const cai_engine *engine)
{
	return engine->n_waiting > 0 || engine->n_running > 0;
}

/* ---------------------------------------------------------------------------------------------
 * The step
 * ------------------------------------------------------------------------------------------- */

static cai_event *
engine_new_event(cai_engine *engine, int *n_events, cai_request *req)
{
	cai_event  *ev;

	if (*n_events >= engine->events_cap)
	{
		int			cap = engine->events_cap * 2;
		cai_event  *events = realloc(engine->events, (size_t) cap * sizeof(cai_event));

		if (!events)
			return NULL;
		engine->events = events;
		engine->events_cap = cap;
	}
	ev = &engine->events[(*n_events)++];
	memset(ev, 0, sizeof(*ev));
	ev->request_id = req->id;
	ev->user_data = req->user_data;
	ev->sample = req->sample;
	ev->token = -1;
	ev->text = "";
	return ev;
}

/* Folds one finished request's service time into the moving average (weight 1/8). */
static void
engine_note_service_time(cai_engine *engine, double ms)
{
	if (engine->stats.mean_service_ms <= 0.0)
		engine->stats.mean_service_ms = ms;
	else
		engine->stats.mean_service_ms += (ms - engine->stats.mean_service_ms) / 8.0;
}

double
cai_engine_estimate_wait_ms(const cai_engine *engine)
{
	int			slots = engine->params.max_running;
	int			ahead = engine->n_waiting;
	int			waves;

	if (engine->n_running + ahead < slots)
		return 0.0;				/* a slot is free now */
	/* each wave of `slots` requests ahead must finish before ours starts */
	waves = (engine->n_running + ahead - slots) / slots + 1;
	return waves * engine->stats.mean_service_ms;
}

/* Marks a running request finished: offers its blocks to the cache, moves it to retired. */
static void
request_finish(cai_engine *engine, cai_request *req, cai_finish_reason reason, cai_event *ev)
{
	double		now = cai_now_seconds();

	req->state = REQUEST_FINISHED;
	req->usage.completion_tokens = req->n_generated;
	req->usage.total_ms = (now - req->submit_time) * 1000.0;
	request_release_blocks(engine, req, true);
	ev->finish = reason;
	ev->usage = req->usage;
	/* a request with parallel samples is finished with its last sample */
	for (int i = 0; i < engine->n_running; i++)
		if (engine->running[i]->id == req->id && engine->running[i]->state != REQUEST_FINISHED)
			return;
	engine_note_service_time(engine, (now - req->first_scheduled_time) * 1000.0);
	engine->stats.requests_finished++;
}

/*
 * The next token of a request from its logit row.  It touches only the request's own RNG and
 * the scratch it is given, so that rows can be sampled on different threads (the token does not
 * depend on which).
 */
static int32_t
request_sample(const cai_engine *engine, cai_request *req, const float *logits,
			   cai_sampler_scratch *scratch, uint64_t *mask)
{
	const cai_model *model = engine->model;
	int32_t		banned[2];
	int			n_banned = 0;
	int32_t		eot = model->tmpl.end_of_turn;
	int32_t		eos = cai_tokenizer_eos(model->tokenizer);

	if (req->sampling.ignore_eos)
	{
		if (eot >= 0)
			banned[n_banned++] = eot;
		if (eos >= 0 && eos != eot)
			banned[n_banned++] = eos;
	}
	if (req->tool_state)
	{
		int			constrained = cai_tool_state_allowed(req->tool_state, mask);

		if (constrained < 0)
		{
			req->grammar_failed = true;
			return -1;
		}
		if (constrained)
			return cai_sample_masked(&req->sampling, &req->rng, logits, model->cfg.n_vocab, mask,
									 banned, n_banned, scratch);
	}
	if (req->grammar_state)
	{
		/* the allowed set is the request's own: the same on any thread, alone or batched */
		if (!cai_grammar_state_allowed(req->grammar_state, mask))
		{
			req->grammar_failed = true;
			return -1;
		}
	}
	/* penalties see the whole sequence; logprobs land in the request, read by take_token */
	return cai_sample_adjusted(&req->sampling, &req->rng, logits, model->cfg.n_vocab,
							   req->grammar_state ? mask : NULL, banned, n_banned,
							   req->tokens.ids, req->tokens.n, req->n_prompt, scratch,
							   &req->logprobs);
}

static void
sample_task(void *arg, int row, int thread)
{
	cai_engine *engine = arg;

	uint64_t   *mask = engine->masks ? engine->masks + (size_t) thread *
		(size_t) cai_token_index_mask_words(engine->token_index) : NULL;

	engine->tokens[row] = request_sample(engine, engine->logit_req[row],
										 engine->logits + (size_t) engine->logit_row[row] *
										 engine->model->cfg.n_vocab,
										 &engine->samplers[thread], mask);
}

/*
 * Samples the step's n_rows logit rows into engine->tokens, over the pool: a temperature draw
 * over a 49152-token vocabulary takes 50-120 us (top-p included), which on one thread would add
 * a few milliseconds to a batch-32 step.  One row is sampled inline.
 */
static void
engine_sample_rows(cai_engine *engine, int n_rows)
{
	if (n_rows == 1)
		sample_task(engine, 0, 0);
	else if (n_rows > 1)
		cai_threadpool_run(engine->pool, sample_task, engine, n_rows);
}

/* Reports the token sampled for a request whose logits were ready. */
static void
request_take_token(cai_engine *engine, cai_request *req, int32_t token, cai_event *ev)
{
	const cai_model *model = engine->model;
	int32_t		eot = model->tmpl.end_of_turn;
	int32_t		eos = cai_tokenizer_eos(model->tokenizer);
	bool		end_of_turn;
	bool		last;
	bool		stopped;

	/* a token the grammar did not allow (or no mask at all) is a bug or out of memory: the
	 * request fails rather than returning text outside its format */
	if (req->grammar_state &&
		(req->grammar_failed || token < 0 || !cai_grammar_state_accept(req->grammar_state, token)))
	{
		request_finish(engine, req, CAI_FINISH_ERROR, ev);
		ev->error = "the response format's grammar could not be applied (out of memory)";
		return;
	}
	if (req->tool_state &&
		(req->grammar_failed || token < 0 || !cai_tool_state_accept(req->tool_state, token)))
	{
		request_finish(engine, req, CAI_FINISH_ERROR, ev);
		ev->error = "the tool call's grammar could not be applied (out of memory)";
		return;
	}
	ev->token = token;
	ev->logprobs = req->sampling.logprobs ? &req->logprobs : NULL;
	if (req->n_generated == 0)
		req->usage.ttft_ms = (cai_now_seconds() - req->submit_time) * 1000.0;
	req->n_generated++;
	engine->stats.generated_tokens++;
	cai_tokens_push(&req->tokens, token);

	/* out of memory for the text loses that text, never the request */
	end_of_turn = !req->sampling.ignore_eos && (token == eot || token == eos);
	last = end_of_turn || req->n_generated >= req->max_tokens;
	if (!end_of_turn)
		(void) cai_reply_text_add_token(&req->reply, model->tokenizer, token);
	if (last)
		(void) cai_reply_text_finish(&req->reply);
	stopped = cai_reply_text_take(&req->reply, last, &ev->text, &ev->text_len);

	if (stopped || end_of_turn)
		request_finish(engine, req, CAI_FINISH_STOP, ev);
	else if (req->n_generated >= req->max_tokens)
		request_finish(engine, req, CAI_FINISH_LENGTH, ev);
}

/* Reports an embed request's vector (its forward row) and finishes it. */
static void
request_take_embedding(cai_engine *engine, cai_request *req, const float *row, cai_event *ev)
{
	int			d = engine->model->cfg.d_model;

	memcpy(req->embedding, row, sizeof(float) * (size_t) d);
	req->usage.ttft_ms = (cai_now_seconds() - req->submit_time) * 1000.0;
	request_finish(engine, req, CAI_FINISH_STOP, ev);
	ev->embedding = req->embedding;
	ev->n_embedding = d;
}

/*
 * Admission, FIFO: a request that cannot get its blocks blocks those behind it, so that a long
 * request is not starved by short ones that keep fitting.
 */
static void
engine_admit_waiting(cai_engine *engine)
{
	cai_request *req;

	while (engine->waiting_head &&
		   engine->n_running + 1 + engine->waiting_head->n_forks <= engine->params.max_running)
	{
		req = engine->waiting_head;
		if (!request_admit(engine, req))
			break;
		waiting_remove(engine, req);
		engine->running[engine->n_running++] = req;
		/* the samples run from now on, and the leader only lists them until they fork */
		for (int i = 0; i < req->n_forks; i++)
			engine->running[engine->n_running++] = req->forks[i];
	}
}

/*
 * A prefill chunk is at least this long (unless the prompt's rest is shorter): below it, the
 * step's fixed costs per sequence outweigh what a finer share buys.
 */
#define CAI_PREFILL_MIN_CHUNK 16

/*
 * While requests decode, a step still carries at least this many prefill tokens, whatever the
 * cost estimate says, so that a long prompt progresses every step and a short one admitted
 * beside it still gets its share (CAI_PREFILL_MIN_CHUNK each for two prefills).
 */
#define CAI_PREFILL_DECODING_FLOOR 32

/*
 * Splits the step's prefill budget among the running prefills, into engine->prefill_chunk
 * (indexed like engine->running; 0: not this step).
 *
 * Max-min fair (water-filling): each prefill gets min(its remaining prompt, level), the level
 * the largest whose sum fits the budget, and what rounding leaves goes in admission order.  In
 * admission order, a short prompt admitted behind a long one would wait for the long one's whole
 * prefill (a 4,000-token prompt is eight 512-token steps) before its first token; shared, it
 * finishes in its first step while the long one still advances every step.  Chunk boundaries
 * change no token, so only latencies move.
 *
 * An embedding runs whole or not at all: one whose prompt is above the level waits (its share
 * goes to the others), unless it is the oldest prefill and fits the budget, so that embeddings
 * are never starved by a stream of chat prefills.  When the level would fall below
 * CAI_PREFILL_MIN_CHUNK, shares of that floor go in admission order instead.
 */
static void
engine_share_prefill(cai_engine *engine, int budget)
{
	int		   *chunk = engine->prefill_chunk;
	int			oldest = -1;
	int			n_open = 0;
	int			level = 0;

	for (int i = 0; i < engine->n_running; i++)
	{
		cai_request *req = engine->running[i];

		chunk[i] = 0;
		if (req->state != REQUEST_PREFILL)
			continue;
		if (oldest < 0)
			oldest = i;
		n_open++;
	}
	if (n_open == 0 || budget <= 0)
		return;

	/* the oldest prefill, an embedding that fits: whole, first (it would wait otherwise) */
	if (engine->running[oldest]->embed &&
		engine->running[oldest]->n_prompt - engine->running[oldest]->n_computed <= budget)
	{
		cai_request *req = engine->running[oldest];

		chunk[oldest] = req->n_prompt - req->n_computed;
		budget -= chunk[oldest];
	}

	/*
	 * The level, by bisection over [0, budget] (the sum is monotone in it); embeddings above the
	 * level drop out and the level is found again without them, which can only raise it.
	 */
	for (;;)
	{
		int			lo = 0,
					hi = budget;
		bool		dropped = false;

		while (lo < hi)
		{
			int			mid = lo + (hi - lo + 1) / 2;
			long		sum = 0;

			for (int i = 0; i < engine->n_running; i++)
			{
				cai_request *req = engine->running[i];
				int			need = req->n_prompt - req->n_computed;

				if (req->state != REQUEST_PREFILL || chunk[i] != 0)
					continue;
				sum += need < mid ? need : mid;
			}
			if (sum <= budget)
				lo = mid;
			else
				hi = mid - 1;
		}
		level = lo;
		for (int i = 0; i < engine->n_running; i++)
		{
			cai_request *req = engine->running[i];

			if (req->state == REQUEST_PREFILL && req->embed && chunk[i] == 0 &&
				req->n_prompt - req->n_computed > level)
			{
				chunk[i] = -1;	/* waits this step */
				dropped = true;
			}
		}
		if (!dropped)
			break;
	}
	if (level < CAI_PREFILL_MIN_CHUNK)
		level = CAI_PREFILL_MIN_CHUNK;

	/* shares up to the level, then the rest of the budget, both in admission order */
	for (int pass = 0; pass < 2 && budget > 0; pass++)
		for (int i = 0; i < engine->n_running && budget > 0; i++)
		{
			cai_request *req = engine->running[i];
			int			need = req->n_prompt - req->n_computed - chunk[i];
			int			add;

			if (req->state != REQUEST_PREFILL || chunk[i] < 0 || need <= 0)
				continue;
			add = pass == 0 && need > level ? level : need;
			if (add > budget)
			{
				/* an embedding runs whole or waits for a step with room for it */
				if (req->embed)
					continue;
				add = budget;
			}
			chunk[i] += add;
			budget -= add;
		}
	for (int i = 0; i < engine->n_running; i++)
		if (chunk[i] < 0)
			chunk[i] = 0;
}

/*
 * The step's ragged batch, in engine->batch and engine->batch_req, within max_step_tokens:
 * every running decode's last token first (so that prefills never stall the decodes), then
 * prefill chunks shared fairly with what is left of the budget (engine_share_prefill).  Returns
 * its length.
 *
 * While requests decode, the prefill part is capped at what costs about as much as the decode
 * part (the step cost estimate, step_cost.h; at least CAI_PREFILL_DECODING_FLOOR tokens): a
 * full 512-token chunk of someone's long prompt would otherwise make every decoding request's
 * step as slow as that prefill, a dozen times its decode-only time on a CPU, for as many steps
 * as the prompt has chunks.  Capped, the others' steps at most double, and the long prompt
 * still advances every step.  A short prompt's rest (at most the floor: a follow-up turn after
 * a cache hit) counts with the decodes: it ends this step with a first token someone waits
 * for, so the cap is its tokens plus what costs as much as they and the decodes do.  With
 * nothing decoding and no such prompt the whole budget goes to prefill, so a prompt alone
 * prefills as fast as before.  The oldest prefill, if it is an embedding (which runs whole),
 * may still take the whole budget, or it would wait for as long as anything decodes.
 */
static int
engine_plan_batch(cai_engine *engine)
{
	int			n_batch = 0;
	int			budget = engine->params.max_step_tokens;
	int			prefill_budget;
	int			short_tokens = 0;
	cai_request *req;

	for (int i = 0; i < engine->n_running && budget > 0; i++)
	{
		req = engine->running[i];
		if (req->state != REQUEST_DECODE)
			continue;
		request_take_windows(engine, req, req->n_computed, 1);
		engine->batch[n_batch] = (cai_batch_seq) {
			.tokens = req->tokens.ids + req->n_computed,
			.n_tokens = 1,
			.pos = req->n_computed,
			.block_table = req->block_table,
			.n_blocks = req->n_blocks,
			.logits = CAI_LOGITS_LAST,
		};
		engine->batch_req[n_batch++] = req;
		budget--;
	}
	for (int i = 0; i < engine->n_running; i++)
	{
		int			need = engine->running[i]->n_prompt - engine->running[i]->n_computed;

		if (engine->running[i]->state == REQUEST_PREFILL && need <= CAI_PREFILL_DECODING_FLOOR)
			short_tokens += need;
	}
	if (short_tokens > budget)
		short_tokens = budget;
	prefill_budget = short_tokens +
		cai_step_cost_prefill_cap(&engine->step_cost, n_batch + short_tokens,
								  CAI_PREFILL_DECODING_FLOOR, budget - short_tokens);
	for (int i = 0; i < engine->n_running && prefill_budget < budget; i++)
	{
		req = engine->running[i];
		if (req->state != REQUEST_PREFILL)
			continue;
		if (req->embed && req->n_prompt - req->n_computed > prefill_budget)
			prefill_budget = req->n_prompt - req->n_computed < budget ?
				req->n_prompt - req->n_computed : budget;
		break;
	}
	engine_share_prefill(engine, prefill_budget);
	for (int i = 0; i < engine->n_running; i++)
	{
		int			chunk = engine->prefill_chunk[i];
		bool		last;

		req = engine->running[i];
		if (req->state != REQUEST_PREFILL || chunk == 0)
			continue;
		last = req->n_computed + chunk == req->n_prompt;
		request_take_windows(engine, req, req->n_computed, chunk);
		engine->batch[n_batch] = (cai_batch_seq) {
			.tokens = req->tokens.ids + req->n_computed,
			.n_tokens = chunk,
			.pos = req->n_computed,
			.block_table = req->block_table,
			.n_blocks = req->n_blocks,
			.logits = req->embed ? CAI_LOGITS_EMBED : last ? CAI_LOGITS_LAST : CAI_LOGITS_NONE,
		};
		engine->batch_req[n_batch++] = req;
		engine->stats.prefill_tokens += chunk;
	}
	return n_batch;
}

/*
 * After a failed forward: every request of the batch fails with an error event, since its KV
 * may be half-written and no later step could trust it.
 */
static void
engine_fail_batch(cai_engine *engine, int n_batch, const cai_error *err, int *n_events)
{
	for (int b = 0; b < n_batch; b++)
	{
		for (int i = 0; i < engine->n_running; i++)
			if (engine->running[i] == engine->batch_req[b])
			{
				running_remove(engine, i);
				break;
			}
		request_release_blocks(engine, engine->batch_req[b], false);
	}
	for (int b = 0; b < n_batch; b++)
	{
		cai_request *req = engine->batch_req[b];
		cai_event  *ev = NULL;
		bool		reported = false;

		/* one error per request: samples of it outside the batch (forking ones) go with it */
		for (int c = 0; c < b; c++)
			reported |= engine->batch_req[c]->id == req->id;
		if (!reported)
		{
			(void) engine_drop_samples(engine, req->id, NULL);
			ev = engine_new_event(engine, n_events, req);
		}
		if (ev)
		{
			ev->finish = CAI_FINISH_ERROR;
			ev->error = err ? err->message : "forward failed";
			ev->usage = req->usage;
		}
		req->next = engine->retired;
		engine->retired = req;
	}
}

/*
 * After the forward: samples every row with logits at once, then, in batch order, advances
 * each request and reports the tokens of those that produced one.
 */
static cai_status
engine_take_batch_tokens(cai_engine *engine, int n_batch, int *n_events, cai_error *err)
{
	int			n_drawn = 0;
	int			row = 0;
	int			embed_row;

	/* the forward's rows: the logits' in batch order, then the embeddings' (model.h) */
	for (int b = 0; b < n_batch; b++)
	{
		cai_request *req = engine->batch_req[b];

		if (engine->batch[b].logits == CAI_LOGITS_NONE ||
			engine->batch[b].logits == CAI_LOGITS_EMBED)
			continue;
		engine->logit_req[n_drawn] = req;
		engine->logit_row[n_drawn++] = row;
		/* a leader's prefill just ended: its samples fork and draw from the same logits */
		for (int i = 0; i < req->n_forks; i++)
			if (request_fork(engine, req, req->forks[i]))
			{
				engine->logit_req[n_drawn] = req->forks[i];
				engine->logit_row[n_drawn++] = row;
			}
		row++;
	}
	engine_sample_rows(engine, n_drawn);
	n_drawn = 0;
	embed_row = row;
	for (int b = 0; b < n_batch; b++)
	{
		cai_batch_seq *seq = &engine->batch[b];
		cai_request *req = engine->batch_req[b];
		cai_event  *ev;

		req->n_computed += seq->n_tokens;
		request_drop_windows(engine, req);
		if (seq->logits == CAI_LOGITS_NONE)
			continue;
		if (seq->logits == CAI_LOGITS_EMBED)
		{
			if (!(ev = engine_new_event(engine, n_events, req)))
				return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reporting events");
			request_take_embedding(engine, req,
								   engine->logits + (size_t) embed_row++ * engine->model->cfg.n_vocab,
								   ev);
			continue;
		}
		req->state = REQUEST_DECODE;
		for (int i = -1; i < req->n_forks; i++)
		{
			cai_request *sample = i < 0 ? req : req->forks[i];

			ev = engine_new_event(engine, n_events, sample);
			if (!ev)
				return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reporting events");
			if (sample->state == REQUEST_FORK)
			{
				request_finish(engine, sample, CAI_FINISH_ERROR, ev);
				ev->error = "a sample could not take its copy of the prompt's KV";
			}
			else
				request_take_token(engine, sample, engine->tokens[n_drawn++], ev);
		}
		free(req->forks);
		req->forks = NULL;
		req->n_forks = 0;
	}
	return CAI_OK;
}

/*
 * Finished requests leave the batch for the retired list: their events' text points into them
 * until the next step frees them.
 */
static void
engine_retire_finished(cai_engine *engine)
{
	for (int i = engine->n_running - 1; i >= 0; i--)
	{
		cai_request *req = engine->running[i];

		if (req->state != REQUEST_FINISHED)
			continue;
		running_remove(engine, i);
		req->next = engine->retired;
		engine->retired = req;
	}
}

cai_status
cai_engine_step(cai_engine *engine, const cai_event **events_out, int *n_events_out,
				cai_error *err)
{
	int			n_events = 0;
	int			n_batch;
	cai_status	st;
	double		t0 = cai_now_seconds();
	double		t_forward;
	cai_request *req;

	*events_out = engine->events;
	*n_events_out = 0;

	/* requests reported last step are forgotten now (their event text pointed into them) */
	while ((req = engine->retired) != NULL)
	{
		engine->retired = req->next;
		request_free(req);
	}

	engine_admit_waiting(engine);
	n_batch = engine_plan_batch(engine);
	if (n_batch == 0)
		return CAI_OK;

	/* one forward over the ragged batch */
	t_forward = cai_now_seconds();
	st = cai_model_forward(engine->model, engine->forward, engine->kv, engine->batch, n_batch,
						   engine->logits, false, err);
	if (st != CAI_OK)
	{
		engine_fail_batch(engine, n_batch, err, &n_events);
		*n_events_out = n_events;
		return st;
	}
	if ((st = engine_take_batch_tokens(engine, n_batch, &n_events, err)) != CAI_OK)
		return st;
	{
		int			n_tokens = 0;

		for (int b = 0; b < n_batch; b++)
			n_tokens += engine->batch[b].n_tokens;
		cai_step_cost_observe(&engine->step_cost, n_tokens, cai_now_seconds() - t_forward);
	}
	engine_retire_finished(engine);

	engine->stats.steps++;
	engine->stats.step_sequences += n_batch;
	engine->stats.busy_seconds += cai_now_seconds() - t0;
	*n_events_out = n_events;
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Stats, cache, scoring
 * ------------------------------------------------------------------------------------------- */

/*
 * Positions whose KV the running sequences hold, each block counted once: n samples of one
 * prompt share its full blocks, and sequences may share cached prefix blocks, so summing each
 * sequence's positions would count that memory once per sharer.  Falls back to that sum if the
 * block map cannot be allocated.
 */
static uint64_t
engine_kv_tokens_held(const cai_engine *engine)
{
	int			n_blocks = cai_kv_pool_n_blocks(engine->kv);
	uint8_t    *seen = calloc(((size_t) n_blocks + 7) / 8, 1);
	uint64_t	held = 0;

	for (int i = 0; i < engine->n_running; i++)
	{
		const cai_request *req = engine->running[i];

		for (int b = 0; b * CAI_KV_BLOCK_TOKENS < req->n_computed && b < req->n_blocks; b++)
		{
			int32_t		id = req->block_table[b];
			int			filled = req->n_computed - b * CAI_KV_BLOCK_TOKENS;

			if (seen && id >= 0 && id < n_blocks)
			{
				if (seen[id / 8] & (1u << (id % 8)))
					continue;
				seen[id / 8] |= (uint8_t) (1u << (id % 8));
			}
			held += (uint64_t) (filled < CAI_KV_BLOCK_TOKENS ? filled : CAI_KV_BLOCK_TOKENS);
		}
	}
	free(seen);
	return held;
}

void
cai_engine_get_stats(const cai_engine *engine, cai_engine_stats *stats)
{
	cai_prefix_cache_stats cs;
	const cai_backend *be = cai_forward_ctx_backend(engine->forward);

	*stats = engine->stats;
	stats->running = engine->n_running;
	stats->waiting = engine->n_waiting;
	cai_prefix_cache_get_stats(engine->cache, &cs);
	stats->cache_evictions = cs.evictions;
	stats->cache_blocks = cs.blocks;
	stats->cache_bytes = cs.bytes;
	stats->cache_budget_bytes = cs.budget_bytes;
	stats->disk_hit_tokens = cs.disk_hit_tokens;
	if (engine->disk)
	{
		cai_kv_disk_stats ds;

		cai_kv_disk_get_stats(engine->disk, &ds);
		stats->disk_hits = ds.hits;
		stats->disk_bytes_read = ds.bytes_read;
		stats->disk_bytes_written = ds.bytes_written;
		stats->disk_writes_dropped = ds.writes_dropped;
		stats->disk_evictions = ds.evictions;
		stats->disk_files = ds.files;
		stats->disk_bytes = ds.bytes;
		stats->disk_budget_bytes = ds.budget_bytes;
	}
	stats->kv_blocks_total = cai_kv_pool_n_blocks(engine->kv);
	stats->kv_blocks_free = cai_kv_pool_n_free(engine->kv);
	stats->kv_bytes_total = cai_kv_pool_bytes(engine->kv);
	stats->kv_bytes_used = cai_kv_pool_bytes_in_use(engine->kv);
	stats->gemm_fallbacks = be->ops->gemm_fallbacks ? be->ops->gemm_fallbacks(be) : 0;
	stats->kv_tokens_held = engine_kv_tokens_held(engine);
}

void
cai_engine_cache_reset(cai_engine *engine)
{
	cai_prefix_cache_reset(engine->cache);
	if (engine->disk)
		cai_kv_disk_reset(engine->disk);
}

int
cai_engine_cache_forget(cai_engine *engine, uint64_t owner)
{
	return cai_prefix_cache_forget_owner(engine->cache, owner);
}

void
cai_engine_pin_step_cost(cai_engine *engine, double fixed_seconds, double token_seconds)
{
	cai_step_cost_pin(&engine->step_cost, fixed_seconds, token_seconds);
}

void
cai_engine_cache_flush(cai_engine *engine)
{
	if (engine->disk)
		cai_kv_disk_flush(engine->disk);
}

cai_status
cai_engine_embed(cai_engine *engine, const int32_t *tokens, int n, bool float_reference,
				 float *out, cai_error *err)
{
	const cai_config *c = &engine->model->cfg;
	int			need = (n + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
	int32_t    *blocks;
	float	   *row;
	cai_batch_seq seq;
	cai_status	st;

	if (n <= 0 || n > engine->context_length)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"embedding length %d must be between 1 and the context (%d)",
						n, engine->context_length);
	if ((st = engine_check_embed(engine, n, err)) != CAI_OK)
		return st;
	if (engine->n_running > 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "a direct embedding needs an idle engine");
	if (cai_kv_pool_n_free(engine->kv) < need)
		cai_prefix_cache_reclaim(engine->cache, need);
	if (cai_kv_pool_n_free(engine->kv) < need)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "not enough free KV blocks to embed %d tokens", n);
	blocks = malloc((size_t) need * sizeof(int32_t));
	row = malloc((size_t) c->n_vocab * sizeof(float));
	if (!blocks || !row)
	{
		free(blocks);
		free(row);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory embedding");
	}
	/* every block with its window part: the text is one chunk */
	for (int i = 0; i < need; i++)
		if ((blocks[i] = cai_kv_block_alloc(engine->kv)) < 0)
		{
			while (--i >= 0)
				cai_kv_block_unref(engine->kv, blocks[i]);
			free(blocks);
			free(row);
			return cai_fail(err, CAI_ERR_NO_MEMORY, "not enough free KV blocks to embed %d tokens",
							n);
		}
	seq = (cai_batch_seq) {
		.tokens = tokens,
		.n_tokens = n,
		.pos = 0,
		.block_table = blocks,
		.n_blocks = need,
		.logits = CAI_LOGITS_EMBED,
	};
	st = cai_model_forward(engine->model, engine->forward, engine->kv, &seq, 1, row,
						   float_reference, err);
	if (st == CAI_OK)
		memcpy(out, row, sizeof(float) * (size_t) c->d_model);
	for (int i = 0; i < need; i++)
		cai_kv_block_unref(engine->kv, blocks[i]);
	free(blocks);
	free(row);
	return st;
}

cai_status
cai_engine_score(cai_engine *engine, const int32_t *tokens, int n, bool float_reference,
				 float *logits, cai_error *err)
{
	int			n_vocab = engine->model->cfg.n_vocab;
	int			need = (n + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
	int			chunk_max = engine->params.max_step_tokens;
	int			quota;
	int			dropped = 0;
	int32_t    *blocks;
	cai_status	st = CAI_OK;

	if (n <= 0 || n > engine->context_length)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"score length %d must be between 1 and the context (%d)",
						n, engine->context_length);
	if (float_reference && !engine->model->has_float_reference)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"the float reference path needs the model loaded with load_float_reference");
	if (engine->n_running > 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "scoring needs an idle engine");
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= n_vocab)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "token %d is outside the vocabulary",
							tokens[i]);

	blocks = malloc((size_t) need * sizeof(int32_t));
	if (!blocks)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory scoring");
	/* windowed KV is kept for a window behind each chunk, as a request's is */
	quota = engine->kv_window > 0 ? engine_window_quota(engine, need) : 0;
	if (cai_kv_pool_n_free(engine->kv) < need)
		cai_prefix_cache_reclaim(engine->cache, need);
	while (window_parts_short(engine, quota) &&
		   cai_prefix_cache_reclaim(engine->cache, cai_kv_pool_n_free(engine->kv) + 1) > 0)
		;
	if (cai_kv_pool_n_free(engine->kv) < need || window_parts_short(engine, quota))
	{
		free(blocks);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "not enough free KV blocks to score %d tokens", n);
	}
	for (int i = 0; i < need; i++)
		blocks[i] = engine->kv_window > 0 ? cai_kv_block_alloc_without_window(engine->kv)
			: cai_kv_block_alloc(engine->kv);

	for (int pos = 0; pos < n && st == CAI_OK; pos += chunk_max)
	{
		int			chunk = n - pos < chunk_max ? n - pos : chunk_max;
		cai_batch_seq seq = {
			.tokens = tokens + pos,
			.n_tokens = chunk,
			.pos = pos,
			.block_table = blocks,
			.n_blocks = need,
			.logits = CAI_LOGITS_ALL,
		};

		if (engine->kv_window > 0)
			for (int b = block_of(pos); b <= block_of(pos + chunk - 1); b++)
				cai_kv_block_add_window(engine->kv, blocks[b]);
		st = cai_model_forward(engine->model, engine->forward, engine->kv, &seq, 1,
							   logits + (size_t) pos * n_vocab, float_reference, err);
		if (engine->kv_window > 0)
			for (; dropped < block_of(window_start(engine, pos + chunk)); dropped++)
				cai_kv_block_drop_window(engine->kv, blocks[dropped]);
	}
	for (int i = 0; i < need; i++)
		cai_kv_block_unref(engine->kv, blocks[i]);
	free(blocks);
	return st;
}
