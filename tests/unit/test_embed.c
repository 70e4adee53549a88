/*
 * test_embed.c — embeddings: pooling and normalization against a scalar reference, the
 * attention mask an embedded text gets (causal or both ways), and batch invariance (a text
 * embedded alone and among other requests gives the same bits), on the synthetic embedding
 * presets.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cai.h"
#include "model.h"
#include "synth_model.h"
#include "synth_presets.h"
#include "test.h"

/* A float in [-1, 1) from a 32-bit LCG state. */
static float
next_value(uint32_t *x)
{
	*x = *x * 1664525u + 1013904223u;
	return (float) ((*x >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The pooled, normalized vector the obvious way: per dimension, then divided by the norm. */
static void
reference_pool(const float *rows, int n, int d, cai_pooling pooling, double *out)
{
	double		norm = 0.0;

	for (int j = 0; j < d; j++)
	{
		double		v = 0.0;

		if (pooling == CAI_POOLING_MEAN)
		{
			for (int t = 0; t < n; t++)
				v += rows[t * d + j];
			v /= n;
		}
		else
			v = rows[(pooling == CAI_POOLING_CLS ? 0 : n - 1) * d + j];
		out[j] = v;
		norm += v * v;
	}
	for (int j = 0; j < d; j++)
		out[j] /= sqrt(norm);
}

TEST(embed_pooling_matches_reference)
{
	enum
	{
		N = 7, D = 48
	};
	const cai_pooling kinds[] = {CAI_POOLING_MEAN, CAI_POOLING_CLS, CAI_POOLING_LAST};
	float		rows[N * D];
	float		out[D];
	double		ref[D];
	uint32_t	x = 99;

	for (int i = 0; i < N * D; i++)
		rows[i] = next_value(&x) * (1 + i % 5);
	for (int k = 0; k < 3; k++)
	{
		double		norm = 0.0;

		cai_pool_embedding(rows, N, D, kinds[k], out);
		reference_pool(rows, N, D, kinds[k], ref);
		for (int j = 0; j < D; j++)
		{
			CHECK_NEAR(out[j], ref[j], 1e-6);
			norm += (double) out[j] * out[j];
		}
		CHECK_NEAR(norm, 1.0, 1e-5);
	}
	/* one row: every pooling is that row, normalized */
	cai_pool_embedding(rows, 1, D, CAI_POOLING_MEAN, out);
	reference_pool(rows, 1, D, CAI_POOLING_CLS, ref);
	for (int j = 0; j < D; j++)
		CHECK_NEAR(out[j], ref[j], 1e-6);
	/* a zero vector has no direction: it stays zero rather than NaN */
	memset(rows, 0, sizeof(rows));
	cai_pool_embedding(rows, N, D, CAI_POOLING_MEAN, out);
	for (int j = 0; j < D; j++)
		CHECK(out[j] == 0.0f);
}

/* The embedding preset's model, loaded with its float reference; NULL on failure. */
static cai_model *
load_preset(const char *preset)
{
	synth_model_config cfg;
	cai_model_params mp;
	cai_model  *model = NULL;
	cai_error	err;
	char		path[256];

	if (!synth_preset_config(preset, &cfg))
		return NULL;
	snprintf(path, sizeof(path), "/tmp/cai_test_embed_%s_%d.gguf", preset, (int) getpid());
	if (synth_model_write(path, &cfg, &err) != CAI_OK)
	{
		fprintf(stderr, "    synth_model_write: %s\n", err.message);
		return NULL;
	}
	cai_model_params_default(&mp);
	mp.n_threads = 2;
	mp.load_float_reference = true;
	if (cai_model_load(path, &mp, &model, &err) != CAI_OK)
		fprintf(stderr, "    cai_model_load: %s\n", err.message);
	unlink(path);
	return model;
}

static cai_engine *
embed_engine(cai_model *model, int step_tokens)
{
	cai_engine_params ep;
	cai_engine *engine = NULL;
	cai_error	err;

	cai_engine_params_default(&ep);
	ep.device = "cpu";
	ep.n_threads = 2;
	ep.max_running = 8;
	ep.max_step_tokens = step_tokens;
	ep.context_length = 256;
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
		fprintf(stderr, "    cai_engine_create: %s\n", err.message);
	return engine;
}

static void
make_text(int32_t *out, int n, uint32_t seed)
{
	uint32_t	x = seed * 2654435761u + 7u;

	for (int i = 0; i < n; i++)
	{
		x = x * 1664525u + 1013904223u;
		out[i] = SYNTH_FIRST_BYTE_TOKEN + (int32_t) ((x >> 8) % 300u);
	}
}

static double
cosine(const float *a, const float *b, int d)
{
	double		ab = 0,
				aa = 0,
				bb = 0;

	for (int j = 0; j < d; j++)
	{
		ab += (double) a[j] * b[j];
		aa += (double) a[j] * a[j];
		bb += (double) b[j] * b[j];
	}
	return ab / sqrt(aa * bb);
}

/*
 * The mask: with the first token pooled (cls), a causal text's vector is its first token's
 * alone, whatever follows; attending both ways, the tokens after it change it.
 */
TEST(embed_bidirectional_and_causal_masks)
{
	cai_model  *model = load_preset("gemma3-embed");
	cai_engine *engine;
	int32_t		a[12],
				b[12];
	float		va[64],
				vb[64];
	cai_error	err;

	CHECK(model != NULL);
	if (!model)
		return;
	CHECK(!model->cfg.causal);
	CHECK(model->cfg.pooling == CAI_POOLING_MEAN);
	engine = embed_engine(model, 256);
	CHECK(engine != NULL);
	make_text(a, 12, 1);
	memcpy(b, a, sizeof(b));
	b[11] = a[11] == 40 ? 41 : 40;	/* only the last token differs */
	model->cfg.pooling = CAI_POOLING_CLS;
	CHECK(cai_engine_embed(engine, a, 12, false, va, &err) == CAI_OK);
	CHECK(cai_engine_embed(engine, b, 12, false, vb, &err) == CAI_OK);
	CHECK_MSG(memcmp(va, vb, sizeof(va)) != 0, "both ways: the last token reaches the first");
	model->cfg.causal = true;
	CHECK(cai_engine_embed(engine, a, 12, false, va, &err) == CAI_OK);
	CHECK(cai_engine_embed(engine, b, 12, false, vb, &err) == CAI_OK);
	CHECK_MSG(memcmp(va, vb, sizeof(va)) == 0, "causal: the first token sees itself alone");
	/* and on the float path */
	CHECK(cai_engine_embed(engine, a, 12, true, va, &err) == CAI_OK);
	CHECK(cai_engine_embed(engine, b, 12, true, vb, &err) == CAI_OK);
	CHECK(memcmp(va, vb, sizeof(va)) == 0);
	model->cfg.causal = false;
	CHECK(cai_engine_embed(engine, a, 12, true, va, &err) == CAI_OK);
	CHECK(cai_engine_embed(engine, b, 12, true, vb, &err) == CAI_OK);
	CHECK(memcmp(va, vb, sizeof(va)) != 0);
	model->cfg.pooling = CAI_POOLING_MEAN;
	cai_engine_free(engine);
	cai_model_free(model);
}

/*
 * Batch invariance: texts embedded through submit/step, several per step and beside a
 * generation's prefill and decodes, give the bits each gives alone; the int8 vector is near
 * the float path's and has norm 1.
 */
static void
check_batched_equals_alone(const char *preset)
{
	enum
	{
		N_TEXTS = 6
	};
	static const int lengths[N_TEXTS] = {1, 5, 16, 17, 40, 64};
	cai_model  *model = load_preset(preset);
	cai_engine *engine;
	int32_t		texts[N_TEXTS][64];
	int32_t		chat[30];
	float		alone[N_TEXTS][64],
				batched[N_TEXTS][64],
				ref[64];
	bool		got[N_TEXTS] = {false};
	int			n_done = 0;
	bool		chat_done = false;
	cai_error	err;

	CHECK(model != NULL);
	if (!model)
		return;
	CHECK(model->cfg.d_model == 64);
	engine = embed_engine(model, 128);
	CHECK(engine != NULL);
	for (int t = 0; t < N_TEXTS; t++)
	{
		double		norm = 0;

		make_text(texts[t], lengths[t], 10 + t);
		CHECK(cai_engine_embed(engine, texts[t], lengths[t], false, alone[t], &err) == CAI_OK);
		CHECK(cai_engine_embed(engine, texts[t], lengths[t], true, ref, &err) == CAI_OK);
		CHECK_MSG(cosine(alone[t], ref, 64) > 0.99, "%s text %d: int8 against float %.5f",
				  preset, t, cosine(alone[t], ref, 64));
		for (int j = 0; j < 64; j++)
			norm += (double) alone[t][j] * alone[t][j];
		CHECK_NEAR(norm, 1.0, 1e-5);
	}

	/* a generation first, then the texts: they share steps with its prefill and decodes */
	make_text(chat, 30, 99);
	{
		cai_request_params rp;
		uint64_t	id;

		memset(&rp, 0, sizeof(rp));
		rp.prompt = chat;
		rp.n_prompt = 30;
		cai_sampling_params_default(&rp.sampling);
		rp.sampling.max_tokens = 8;
		rp.sampling.ignore_eos = true;
		rp.user_data = (void *) (intptr_t) -1;
		CHECK(cai_engine_submit(engine, &rp, &id, &err) == CAI_OK);
		for (int t = 0; t < N_TEXTS; t++)
		{
			rp.prompt = texts[t];
			rp.n_prompt = lengths[t];
			rp.embed = true;
			rp.user_data = (void *) (intptr_t) t;
			CHECK(cai_engine_submit(engine, &rp, &id, &err) == CAI_OK);
		}
	}
	for (int steps = 0; steps < 100 && (n_done < N_TEXTS || !chat_done); steps++)
	{
		const cai_event *ev;
		int			n_ev;

		CHECK(cai_engine_step(engine, &ev, &n_ev, &err) == CAI_OK);
		for (int i = 0; i < n_ev; i++)
		{
			int			t = (int) (intptr_t) ev[i].user_data;

			if (t < 0)
			{
				CHECK(ev[i].embedding == NULL);
				chat_done |= ev[i].finish != CAI_FINISH_NONE;
				continue;
			}
			CHECK(ev[i].finish == CAI_FINISH_STOP);
			CHECK(ev[i].embedding != NULL && ev[i].n_embedding == 64);
			CHECK(!got[t]);
			CHECK_EQ_INT(ev[i].usage.prompt_tokens, lengths[t]);
			CHECK_EQ_INT(ev[i].usage.completion_tokens, 0);
			if (ev[i].embedding)
				memcpy(batched[t], ev[i].embedding, sizeof(batched[t]));
			got[t] = true;
			n_done++;
		}
	}
	CHECK_EQ_INT(n_done, N_TEXTS);
	CHECK(chat_done);
	for (int t = 0; t < N_TEXTS; t++)
		CHECK_MSG(memcmp(alone[t], batched[t], sizeof(alone[t])) == 0,
				  "%s text %d (%d tokens): batched differs from alone", preset, t, lengths[t]);
	CHECK(!cai_engine_has_work(engine));
	cai_engine_free(engine);
	cai_model_free(model);
}

TEST(embed_batched_equals_alone_qwen3)
{
	check_batched_equals_alone("qwen3-embed");
}

TEST(embed_batched_equals_alone_gemma3)
{
	check_batched_equals_alone("gemma3-embed");
}

/* What an embed request may not be: longer than a step, or on a model without a pooling. */
TEST(embed_refusals)
{
	cai_model  *model = load_preset("qwen3-embed");
	cai_engine *engine;
	int32_t		text[40];
	float		v[64];
	cai_request_params rp;
	uint64_t	id;
	cai_error	err;

	CHECK(model != NULL);
	if (!model)
		return;
	CHECK(model->cfg.pooling == CAI_POOLING_LAST && model->cfg.causal);
	engine = embed_engine(model, 32);
	make_text(text, 40, 3);
	memset(&rp, 0, sizeof(rp));
	rp.prompt = text;
	rp.n_prompt = 40;
	rp.embed = true;
	cai_sampling_params_default(&rp.sampling);
	CHECK(cai_engine_submit(engine, &rp, &id, &err) == CAI_ERR_CONTEXT_FULL);
	CHECK(strstr(err.message, "32 tokens") != NULL);
	CHECK(cai_engine_embed(engine, text, 40, false, v, &err) == CAI_ERR_CONTEXT_FULL);
	model->cfg.pooling = CAI_POOLING_NONE;
	rp.n_prompt = 8;
	CHECK(cai_engine_submit(engine, &rp, &id, &err) == CAI_ERR_UNSUPPORTED);
	CHECK(strstr(err.message, "pooling (none)") != NULL);
	model->cfg.pooling = CAI_POOLING_LAST;
	CHECK(cai_engine_submit(engine, &rp, &id, &err) == CAI_OK);
	CHECK(cai_engine_cancel(engine, id) == CAI_OK);
	CHECK(!cai_engine_has_work(engine));
	cai_engine_free(engine);
	cai_model_free(model);
}
