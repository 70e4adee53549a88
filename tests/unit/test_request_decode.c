/*
 * test_request_decode.c — what a COMPLETE payload becomes: the prompt's token ids, with the
 * model's BOS first when its tokenizer asks for one, and the oldest text cut (never the BOS)
 * when the prompt is too long.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "request_decode.h"
#include "synth_model.h"
#include "test.h"
#include "wire.h"

static const char complete_text[] =
	"one two three four five six seven eight nine ten eleven twelve thirteen fourteen";

/* A synthetic model whose tokenizer does or does not ask for BOS on raw text. */
static cai_model *
load_model(bool add_bos, char *path, size_t path_size)
{
	synth_model_config cfg;
	cai_model_params mp;
	cai_model  *model = NULL;
	cai_error	err = {0};

	synth_model_default_config(&cfg);
	cfg.add_bos = add_bos;
	snprintf(path, path_size, "/tmp/cai_test_request_decode_%d_%d.gguf", (int) getpid(), add_bos);
	if (synth_model_write(path, &cfg, &err) != CAI_OK)
		return NULL;
	cai_model_params_default(&mp);
	mp.n_threads = 1;
	if (cai_model_load(path, &mp, &model, &err) != CAI_OK)
		model = NULL;
	unlink(path);
	return model;
}

/* Decodes a COMPLETE payload of complete_text with the given context (truncate on). */
static cai_status
decode(const cai_model *model, int context_length, int max_tokens, cai_decoded_request *out)
{
	cai_wire_generation g;
	cai_wbuf	w;
	cai_error	err = {0};
	cai_status	st;

	cai_wire_generation_init(&g);
	g.top_p = 1.0f;
	g.max_tokens = max_tokens;
	g.truncate = true;
	g.use_cache = true;
	cai_wbuf_init(&w, NULL);
	cai_wire_put_generation(&w, &g);
	cai_put_text(&w, complete_text, sizeof(complete_text) - 1);
	st = cai_request_decode(model, context_length, CAI_REQUEST_COMPLETE, w.data, w.len, out, &err);
	cai_wbuf_free(&w);
	return st;
}

TEST(complete_prompt_starts_with_bos_only_where_the_model_asks)
{
	for (int add_bos = 0; add_bos <= 1; add_bos++)
	{
		char		path[128];
		cai_model  *model = load_model(add_bos, path, sizeof(path));
		cai_model_info info;
		cai_decoded_request req;
		int32_t    *text_ids = NULL;
		int			n_text = 0;
		cai_error	err = {0};

		CHECK(model != NULL);
		if (!model)
			return;
		cai_model_get_info(model, &info);
		CHECK_EQ_INT(info.add_bos, add_bos);
		CHECK(info.bos_token >= 0);
		CHECK(cai_tokenize(model, complete_text, sizeof(complete_text) - 1, false, &text_ids,
						   &n_text, &err) == CAI_OK);
		CHECK(n_text > 8);

		/* room for everything: the text's ids, after the BOS where asked for */
		CHECK(decode(model, 256, 4, &req) == CAI_OK);
		CHECK_EQ_INT(req.params.n_prompt, n_text + add_bos);
		if (add_bos)
			CHECK_EQ_INT(req.params.prompt[0], info.bos_token);
		CHECK(memcmp(req.params.prompt + add_bos, text_ids, sizeof(int32_t) * n_text) == 0);
		cai_decoded_request_free(&req);

		/* too long: the newest text is kept and the BOS still leads */
		CHECK(decode(model, 8 + 4, 4, &req) == CAI_OK);
		CHECK_EQ_INT(req.params.n_prompt, 8);
		if (add_bos)
			CHECK_EQ_INT(req.params.prompt[0], info.bos_token);
		CHECK(memcmp(req.params.prompt + add_bos, text_ids + n_text - (8 - add_bos),
					 sizeof(int32_t) * (8 - add_bos)) == 0);
		cai_decoded_request_free(&req);

		cai_free(text_ids);
		cai_model_free(model);
	}
}

/*
 * The penalties, filters and logprobs survive the trip (appended fields of the generation
 * block), logit_bias copied out of the payload, and a value out of range is refused by name.
 */
TEST(generation_sampling_adjustments_round_trip)
{
	char		path[128];
	cai_model  *model = load_model(false, path, sizeof(path));
	cai_logit_bias bias[2] = {{3, -100.0f}, {7, 2.5f}};

	CHECK(model != NULL);
	if (!model)
		return;
	for (int bad = 0; bad <= 1; bad++)
	{
		cai_wire_generation g;
		cai_decoded_request req;
		cai_wbuf	w;
		cai_error	err = {0};
		cai_status	st;
		const cai_sampling_params *sp = &req.params.sampling;

		cai_wire_generation_init(&g);
		g.top_p = 1.0f;
		g.max_tokens = 4;
		g.presence_penalty = 0.5f;
		g.frequency_penalty = -1.5f;
		g.repetition_penalty = bad ? 0.0f : 1.25f;
		g.min_p = 0.05f;
		g.n_logit_bias = 2;
		g.logit_bias = bias;
		g.logprobs = true;
		g.top_logprobs = 5;
		cai_wbuf_init(&w, NULL);
		cai_wire_put_generation(&w, &g);
		cai_put_text(&w, "one two", 7);
		memset(&req, 0, sizeof(req));
		st = cai_request_decode(model, 256, CAI_REQUEST_COMPLETE, w.data, w.len, &req, &err);
		cai_wbuf_free(&w);
		if (bad)
		{
			CHECK_EQ_INT(st, CAI_ERR_INVALID_ARGUMENT);
			CHECK(strstr(err.message, "repetition_penalty must be greater than 0") != NULL);
		}
		else
		{
			CHECK_EQ_INT(st, CAI_OK);
			CHECK(sp->presence_penalty == 0.5f && sp->frequency_penalty == -1.5f);
			CHECK(sp->repetition_penalty == 1.25f && sp->min_p == 0.05f);
			CHECK(sp->logprobs && sp->top_logprobs == 5);
			CHECK_EQ_INT(sp->n_logit_bias, 2);
			CHECK(sp->logit_bias != NULL && sp->logit_bias != bias);
			if (sp->logit_bias)
				CHECK(sp->logit_bias[0].token == 3 && sp->logit_bias[0].bias == -100.0f &&
					  sp->logit_bias[1].token == 7 && sp->logit_bias[1].bias == 2.5f);
		}
		cai_decoded_request_free(&req);
	}

	/* a LOGPROBS message's numbers */
	{
		cai_token_logprobs lp = {-0.25f, 2, {9, 4}, {-0.25f, -2.0f}};
		cai_token_logprobs back;
		cai_wbuf	w;
		cai_reader	r;

		cai_wbuf_init(&w, NULL);
		cai_wire_put_logprobs(&w, &lp);
		cai_reader_init(&r, w.data, w.len);
		CHECK(cai_wire_get_logprobs(&r, &back));
		CHECK(back.logprob == -0.25f && back.n_top == 2 && back.top_token[1] == 4 &&
			  back.top_logprob[1] == -2.0f);
		cai_reader_init(&r, w.data, w.len - 1);
		CHECK(!cai_wire_get_logprobs(&r, &back));
		cai_wbuf_free(&w);
	}
	cai_model_free(model);
}
