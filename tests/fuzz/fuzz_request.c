/*
 * fuzz_request.c — what the engine process does with a request payload (src/common/wire.h):
 * decoding and validation (src/serve/request_decode.c), then, for a generation, the engine's
 * own checks at submit and a few steps, on a small synthetic model.
 *
 * Input: a mode byte.  Even: the rest is a raw payload, after a kind byte and a context-length
 * byte.  3 mod 4: an EMBED payload is built from the input (a fuzzed count of fuzzed texts,
 * the count sometimes wrong), and each text is embedded by the engine.  1 mod 4: a payload is built from the input with the wire writer — the generation block
 * with fuzzed floats (NaN and infinities included), seeds, flags, stop strings and response
 * format, then chat turns with fuzzed roles, contents and stored token ids (in and out of the
 * vocabulary) or a completion prompt — so that the fuzzer gets past the format checks into
 * prompt building, truncation and submission.
 * Invariants:
 *  - decoding never crashes, and an error has a status the worker maps and a message;
 *  - a decoded generation has a prompt of at least one id, every id in the vocabulary, no longer
 *    than the context allows, and sampling options within their ranges;
 *  - the engine accepts it or refuses it with a message, and runs it to its end or its cancel
 *    without crashing; the pool has every block back afterwards;
 *  - a decoded embedding has 1 .. CAI_EMBED_MAX_TEXTS texts of at least one id each, all in
 *    the vocabulary; each text the engine accepts ends in one event with a vector of norm 1
 *    (or 0).
 */
#include "fuzz_common.h"

#include <math.h>

#include "request_decode.h"
#include "wire.h"

#define FUZZ_CONTEXT 256

static cai_model *model;
static cai_engine *engine;
static int	n_vocab;

static void
setup(void)
{
	synth_model_config cfg;
	uint8_t    *image;
	size_t		size;
	cai_model_params mp;
	cai_engine_params ep;
	cai_error	err;

	synth_model_default_config(&cfg);
	cfg.context_length = FUZZ_CONTEXT;
	FUZZ_CHECK(synth_model_write_buffer(&cfg, &image, &size, &err) == CAI_OK);
	cai_model_params_default(&mp);
	mp.n_threads = 1;
	FUZZ_CHECK(fuzz_model_load(image, size, &mp, &model, &err) == CAI_OK);
	free(image);
	cai_engine_params_default(&ep);
	ep.device = "cpu";
	ep.n_threads = 1;
	ep.max_running = 2;
	ep.max_step_tokens = 64;
	ep.context_length = FUZZ_CONTEXT;
	ep.max_queue = 4;
	ep.host_cache_bytes = 1 << 18;
	FUZZ_CHECK(cai_engine_create(model, &ep, &engine, &err) == CAI_OK);
	{
		cai_model_info info;

		cai_model_get_info(model, &info);
		n_vocab = info.n_vocab;
	}
}

static float
fuzz_float(fuzz_input *in)
{
	static const float specials[] = {0.0f, -0.0f, 1.0f, 0.5f, 2.0f, 100.0f, 1e-40f, 1e30f,
		INFINITY, -INFINITY, NAN, -1.0f, 0.9999999f, 1.0000001f};
	uint8_t		pick = fuzz_u8(in);

	if (pick < 2 * (sizeof(specials) / sizeof(specials[0])))
		return specials[pick / 2];
	return (float) (fuzz_u16(in)) / 1000.0f;
}

/* A payload built from the input: a generation (CHAT or COMPLETE) that mostly parses. */
static uint32_t
build_generation(fuzz_input *in, cai_wbuf *w)
{
	cai_wire_generation g;
	cai_logit_bias bias[4];
	char	   *stops[CAI_MAX_STOP_STRINGS] = {0};
	char	   *schema = NULL;
	uint32_t	kind = fuzz_bool(in) ? CAI_REQUEST_CHAT : CAI_REQUEST_COMPLETE;

	cai_wire_generation_init(&g);
	g.temperature = fuzz_float(in);
	g.top_p = fuzz_float(in);
	g.top_k = (int32_t) (fuzz_u16(in)) - 8;
	g.seed = fuzz_u32(in);
	g.max_tokens = (int32_t) (fuzz_u8(in)) - 4;
	g.truncate = fuzz_bool(in);
	g.ignore_eos = fuzz_bool(in);
	g.use_cache = fuzz_bool(in);
	g.cache_salt = fuzz_u8(in);
	g.n_stop = fuzz_u8(in) % (CAI_MAX_STOP_STRINGS + 1);
	for (int i = 0; i < g.n_stop; i++)
	{
		size_t		len;

		stops[i] = fuzz_chunk(in, 16, &len);
		g.stop[i] = stops[i];
	}
	g.response_format = fuzz_u8(in) % 4 == 0 ? CAI_RESPONSE_JSON_OBJECT : CAI_RESPONSE_TEXT;
	if (fuzz_u8(in) % 4 == 0)
	{
		size_t		len;

		schema = fuzz_chunk(in, 200, &len);
		g.response_format = CAI_RESPONSE_JSON_SCHEMA;
		g.schema = schema;
	}
	g.json_whitespace = fuzz_bool(in) ? CAI_JSON_WS_COMPACT : CAI_JSON_WS_FREE;
	/* penalties and logprobs: in and out of range, NaN included (fuzz_float) */
	g.repetition_penalty = fuzz_bool(in) ? 1.0f : fuzz_float(in);
	g.presence_penalty = fuzz_bool(in) ? 0.0f : fuzz_float(in);
	g.frequency_penalty = fuzz_bool(in) ? 0.0f : fuzz_float(in);
	g.min_p = fuzz_bool(in) ? 0.0f : fuzz_float(in);
	g.logprobs = fuzz_bool(in);
	g.top_logprobs = (int32_t) (fuzz_u8(in) % 32) - 4;
	g.n_logit_bias = fuzz_u8(in) % 5;	/* at most 4: bias[] */
	for (int i = 0; i < g.n_logit_bias; i++)
	{
		/* ids around and beyond the vocabulary, negative ones too */
		bias[i].token = (int32_t) fuzz_u32(in) % 70000 - 100;
		bias[i].bias = fuzz_float(in);
	}
	g.logit_bias = bias;
	/* parallel samples: mostly in range, sometimes 0, negative or past the limit */
	g.n_samples = (int32_t) (fuzz_u8(in) % (CAI_N_SAMPLES_MAX + 4)) - 1;
	cai_wire_put_generation(w, &g);
	for (int i = 0; i < g.n_stop; i++)
		free(stops[i]);
	free(schema);

	if (kind == CAI_REQUEST_COMPLETE)
	{
		size_t		len;
		char	   *prompt = fuzz_chunk(in, 300, &len);

		cai_put_text(w, prompt, len);
		free(prompt);
		return kind;
	}
	{
		int			n = fuzz_u8(in) % 6;

		cai_put_i32(w, n);
		for (int t = 0; t < n; t++)
		{
			size_t		len;
			char	   *content = fuzz_chunk(in, 120, &len);
			int			role = (int) (fuzz_u8(in) % 4);
			int			n_ids = fuzz_bool(in) ? (int) (fuzz_u8(in) % 24) : -1;
			int32_t		ids[24];

			for (int k = 0; k < n_ids; k++)
				ids[k] = (int32_t) (fuzz_u16(in) % (n_vocab + 8)) - 2;
			cai_wire_put_turn(w, role, content, len, n_ids >= 0 ? ids : NULL, n_ids);
			free(content);
		}
	}
	return kind;
}

static void
check_decoded(const cai_decoded_request *d, int context_length)
{
	const cai_sampling_params *sp = &d->params.sampling;

	if (d->kind == CAI_REQUEST_DETOKENIZE)
		for (int i = 0; i < d->n_ids; i++)
			FUZZ_CHECK(d->ids[i] >= 0 && d->ids[i] < n_vocab);
	if (d->kind == CAI_REQUEST_EMBED)
	{
		FUZZ_CHECK(d->n_texts >= 1 && d->n_texts <= CAI_EMBED_MAX_TEXTS);
		for (int t = 0; t < d->n_texts; t++)
		{
			FUZZ_CHECK(d->text_n_ids[t] >= 1);
			for (int i = 0; i < d->text_n_ids[t]; i++)
				FUZZ_CHECK(d->text_ids[t][i] >= 0 && d->text_ids[t][i] < n_vocab);
		}
	}
	if (d->kind != CAI_REQUEST_CHAT && d->kind != CAI_REQUEST_COMPLETE)
		return;
	FUZZ_CHECK(d->params.prompt != NULL && d->params.n_prompt >= 1);
	FUZZ_CHECK(d->params.n_prompt <= context_length - 1);
	for (int i = 0; i < d->params.n_prompt; i++)
		FUZZ_CHECK(d->params.prompt[i] >= 0 && d->params.prompt[i] < n_vocab);
	FUZZ_CHECK(sp->temperature >= 0.0f && sp->top_p > 0.0f && sp->top_p <= 1.0f);
	FUZZ_CHECK(sp->top_k >= 0 && sp->max_tokens >= 1);
	FUZZ_CHECK(sp->n_samples >= 1 && sp->n_samples <= CAI_N_SAMPLES_MAX);
	for (int i = 0; i < sp->n_stop; i++)
		FUZZ_CHECK(sp->stop[i] != NULL && sp->stop[i][0] != '\0');
	for (int i = 0; i < d->n_user_tokens; i++)
		FUZZ_CHECK(d->user_tokens[i] >= 0 && d->user_tokens[i] < n_vocab);
}

/* Submits a decoded generation and steps it to its end (short ones) or cancels it. */
static void
run_in_engine(cai_decoded_request *d)
{
	uint64_t	id;
	cai_error	err;
	cai_status	st;
	int			free_before = 0;
	cai_engine_stats stats;

	cai_engine_cache_reset(engine);
	cai_engine_get_stats(engine, &stats);
	free_before = stats.kv_blocks_free;
	st = cai_engine_submit(engine, &d->params, &id, &err);
	d->params.grammar = NULL;	/* the engine's now, submitted or not */
	if (st != CAI_OK)
	{
		FUZZ_CHECK(err.message[0] != '\0');
		return;
	}
	if (d->params.sampling.max_tokens > 12)
		FUZZ_CHECK(cai_engine_cancel(engine, id) == CAI_OK);
	for (int steps = 0; cai_engine_has_work(engine); steps++)
	{
		const cai_event *events;
		int			n_events;

		FUZZ_CHECK(steps < 64);
		FUZZ_CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
		for (int e = 0; e < n_events; e++)
			FUZZ_CHECK(events[e].text != NULL && events[e].request_id == id &&
					   events[e].sample >= 0 &&
					   events[e].sample < d->params.sampling.n_samples);
	}
	cai_engine_cache_reset(engine);
	cai_engine_get_stats(engine, &stats);
	FUZZ_CHECK(stats.kv_blocks_free == free_before);
}

/* An EMBED payload: a count (sometimes not the texts' number) and fuzzed texts. */
static uint32_t
build_embed(fuzz_input *in, cai_wbuf *w)
{
	int			n = fuzz_u8(in) % 6;
	int			claimed = fuzz_u8(in) < 16 ? n + 1 : n;

	cai_put_i32(w, claimed);
	for (int i = 0; i < n; i++)
	{
		size_t		len;
		char	   *text = fuzz_chunk(in, 80, &len);

		cai_put_text(w, text ? text : "", text ? len : 0);
		free(text);
	}
	return CAI_REQUEST_EMBED;
}

/* Embeds each decoded text through submit and step; every block comes back. */
static void
run_embeddings(const cai_decoded_request *d)
{
	cai_engine_stats stats;
	int			free_before;
	int			submitted = 0,
				done = 0;
	cai_error	err;

	cai_engine_cache_reset(engine);
	cai_engine_get_stats(engine, &stats);
	free_before = stats.kv_blocks_free;
	for (int t = 0; t < d->n_texts; t++)
	{
		cai_request_params rp;
		uint64_t	id;

		memset(&rp, 0, sizeof(rp));
		rp.prompt = d->text_ids[t];
		rp.n_prompt = d->text_n_ids[t];
		rp.embed = true;
		cai_sampling_params_default(&rp.sampling);
		if (cai_engine_submit(engine, &rp, &id, &err) == CAI_OK)
			submitted++;
		else
			FUZZ_CHECK(err.message[0] != '\0');
	}
	for (int steps = 0; cai_engine_has_work(engine); steps++)
	{
		const cai_event *events;
		int			n_events;

		FUZZ_CHECK(steps < 64);
		FUZZ_CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
		for (int e = 0; e < n_events; e++)
		{
			double		norm = 0.0;

			FUZZ_CHECK(events[e].finish == CAI_FINISH_STOP && events[e].embedding != NULL);
			for (int j = 0; j < events[e].n_embedding; j++)
				norm += (double) events[e].embedding[j] * events[e].embedding[j];
			FUZZ_CHECK(norm == 0.0 || fabs(norm - 1.0) < 1e-3);
			done++;
		}
	}
	FUZZ_CHECK(done == submitted);
	cai_engine_get_stats(engine, &stats);
	FUZZ_CHECK(stats.kv_blocks_free == free_before);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	uint8_t		mode;
	uint32_t	kind;
	int			context_length;
	cai_wbuf	w;
	cai_decoded_request d;
	cai_error	err;
	cai_status	st;

	if (!model)
		setup();
	mode = fuzz_u8(&in);
	context_length = 16 + fuzz_u8(&in) % (FUZZ_CONTEXT - 15);
	cai_wbuf_init(&w, NULL);
	if (mode % 2 == 0)
	{
		kind = fuzz_u8(&in) % 8;
		cai_put_bytes(&w, in.p, in.n);
	}
	else if (mode % 4 == 3)
		kind = build_embed(&in, &w);
	else
		kind = build_generation(&in, &w);
	FUZZ_CHECK(!w.failed);

	st = cai_request_decode(model, context_length, kind, w.data, w.len, &d, &err);
	if (st != CAI_OK)
	{
		FUZZ_CHECK(st == CAI_ERR_INTERNAL || st == CAI_ERR_INVALID_ARGUMENT ||
				   st == CAI_ERR_CONTEXT_FULL || st == CAI_ERR_NO_MEMORY);
		FUZZ_CHECK(err.message[0] != '\0');
	}
	else
	{
		check_decoded(&d, context_length);
		if ((d.kind == CAI_REQUEST_CHAT || d.kind == CAI_REQUEST_COMPLETE) &&
			d.params.n_prompt <= FUZZ_CONTEXT - 1)
			run_in_engine(&d);
		if (d.kind == CAI_REQUEST_EMBED)
			run_embeddings(&d);
		cai_decoded_request_free(&d);
	}
	cai_wbuf_free(&w);
	return 0;
}
