/*
 * synth_presets.c — the golden models' shapes (see synth_presets.h).
 *
 * Small enough to keep each golden tiny (48 positions x 324 logits), large enough that every
 * architecture's features show: grouped-query attention (4 query heads per 2 KV heads), two
 * layers, an untied head.  F32 weights: both engines then read
 * the same values and differ only in arithmetic order.
 */
#include "synth_presets.h"

#include <string.h>

static const char *const names[] = {"llama", "llama3", "qwen2", "qwen3", "gemma3"};

#define N_PRESETS ((int) (sizeof(names) / sizeof(names[0])))

const char *
synth_preset_name(int i)
{
	return i >= 0 && i < N_PRESETS ? names[i] : NULL;
}

bool
synth_preset_config(const char *name, synth_model_config *cfg)
{
	synth_model_default_config(cfg);
	cfg->n_layers = 2;
	cfg->d_model = 64;
	cfg->n_heads = 4;
	cfg->n_kv_heads = 2;
	cfg->d_ff = 128;
	cfg->context_length = 256;
	cfg->weight_type = GGML_TYPE_F32;
	cfg->embd_type = GGML_TYPE_F32;
	/*
	 * an untied head: with the embedding as head, the residual stream's copy of the input
	 * token makes that token every position's top-1, whatever attention did
	 */
	cfg->tied_embeddings = false;
	if (strcmp(name, "llama") == 0)
	{
		cfg->name = "golden-llama";
		cfg->seed = 101;
	}
	else if (strcmp(name, "llama3") == 0)
	{
		/*
		 * Llama 3.1's RoPE scaling at its own constants (factor 8, low 1, high 4, original
		 * context 8192) and base 500000; head size 64 puts a dozen frequencies past the low
		 * wavelength (divided by 8) and several in the blended band.
		 */
		cfg->name = "golden-llama3";
		cfg->seed = 102;
		cfg->d_model = 128;
		cfg->n_heads = 2;
		cfg->n_kv_heads = 1;
		cfg->head_dim = 64;
		cfg->rope_base = 500000.0f;
		cfg->llama3_factor = 8.0f;
		cfg->llama3_low_freq_factor = 1.0f;
		cfg->llama3_high_freq_factor = 4.0f;
		cfg->llama3_original_context = 8192;
		cfg->tokenizer_pre = "llama-bpe";
	}
	else if (strcmp(name, "qwen2") == 0)
	{
		cfg->arch = "qwen2";
		cfg->name = "golden-qwen2";
		cfg->seed = 103;
		cfg->rope_base = 1000000.0f;
		cfg->rms_eps = 1e-6f;
		cfg->tokenizer_pre = "qwen2";
	}
	else if (strcmp(name, "qwen3") == 0)
	{
		/* head size 32 from its own key: q width 128 against d_model 64, as Qwen3 does */
		cfg->arch = "qwen3";
		cfg->name = "golden-qwen3";
		cfg->seed = 104;
		cfg->head_dim = 32;
		cfg->rope_base = 1000000.0f;
		cfg->rms_eps = 1e-6f;
		cfg->tokenizer_pre = "qwen2";
	}
	else if (strcmp(name, "qwen3-embed") == 0 || strcmp(name, "gemma3-embed") == 0)
	{
		/*
		 * Embedding models' shapes, outside the golden list: Qwen3-Embedding pools the last
		 * token of causal attention; EmbeddingGemma-like models attend both ways and pool the
		 * mean (their windows wider than any text the tests embed)
		 */
		bool		gemma = name[0] == 'g';

		cfg->arch = gemma ? "gemma3" : "qwen3";
		cfg->name = gemma ? "embed-gemma3" : "embed-qwen3";
		cfg->seed = gemma ? 107 : 106;
		cfg->n_layers = gemma ? 6 : 2;
		cfg->n_kv_heads = gemma ? 1 : 2;
		cfg->head_dim = 32;
		cfg->sliding_window = 128;
		cfg->rope_base = 1000000.0f;
		cfg->rms_eps = 1e-6f;
		cfg->tokenizer_pre = gemma ? "default" : "qwen2";
		cfg->pooling_type = gemma ? 1 : 3;
		cfg->non_causal = gemma;
	}
	else if (strcmp(name, "gemma3") == 0)
	{
		/*
		 * Gemma 3's shape: multi-query attention, q/k norms, post-attention and post-FFN norms,
		 * six layers so that five local ones (window 8, well inside the 48 tokens) precede the
		 * global sixth; key length 32 of its own
		 */
		cfg->arch = "gemma3";
		cfg->name = "golden-gemma3";
		cfg->seed = 105;
		cfg->n_layers = 6;
		cfg->n_kv_heads = 1;
		cfg->head_dim = 32;
		cfg->sliding_window = 8;
		cfg->rope_base = 1000000.0f;
		cfg->rms_eps = 1e-6f;
		cfg->tokenizer_pre = "default";
	}
	else
		return false;
	return true;
}

void
synth_golden_tokens(int *tokens)
{
	/* a fixed linear congruential walk over the byte and merge tokens */
	unsigned	x = 12345u;

	for (int i = 0; i < SYNTH_GOLDEN_TOKENS; i++)
	{
		x = x * 1103515245u + 12345u;
		tokens[i] = SYNTH_FIRST_BYTE_TOKEN + (int) ((x >> 8) % (unsigned) (synth_model_n_vocab() -
																	  SYNTH_FIRST_BYTE_TOKEN));
	}
}

/* ---- real models' shapes (see synth_presets.h) ------------------------------------------ */

static const char *const shape_names[] = {"llama32-1b", "llama32-3b", "llama3-8b", "qwen3-4b"};

#define N_SHAPES ((int) (sizeof(shape_names) / sizeof(shape_names[0])))

const char *
synth_shape_name(int i)
{
	return i >= 0 && i < N_SHAPES ? shape_names[i] : NULL;
}

/* What the Llama 3 family shares: vocabulary, RoPE base, pre-tokenizer, a BOS. */
static void
llama3_family(synth_model_config *cfg)
{
	cfg->n_vocab = 128256;
	cfg->rope_base = 500000.0f;
	cfg->rms_eps = 1e-5f;
	cfg->tokenizer_pre = "llama-bpe";
	cfg->add_bos = true;
}

/* Llama 3.2's RoPE scaling (factor 32, low 1, high 4, original context 8192). */
static void
llama32_rope(synth_model_config *cfg)
{
	cfg->context_length = 131072;
	cfg->llama3_factor = 32.0f;
	cfg->llama3_low_freq_factor = 1.0f;
	cfg->llama3_high_freq_factor = 4.0f;
	cfg->llama3_original_context = 8192;
}

bool
synth_shape_config(const char *name, synth_model_config *cfg)
{
	synth_model_default_config(cfg);
	cfg->weight_type = GGML_TYPE_F16;
	cfg->embd_type = GGML_TYPE_F16;
	cfg->tied_embeddings = true;
	if (strcmp(name, "llama32-1b") == 0)
	{
		llama3_family(cfg);
		llama32_rope(cfg);
		cfg->name = "synthetic Llama-3.2-1B shape";
		cfg->seed = 1001;
		cfg->n_layers = 16;
		cfg->d_model = 2048;
		cfg->n_heads = 32;
		cfg->n_kv_heads = 8;
		cfg->d_ff = 8192;
	}
	else if (strcmp(name, "llama32-3b") == 0)
	{
		llama3_family(cfg);
		llama32_rope(cfg);
		cfg->name = "synthetic Llama-3.2-3B shape";
		cfg->seed = 1002;
		cfg->n_layers = 28;
		cfg->d_model = 3072;
		cfg->n_heads = 24;
		cfg->n_kv_heads = 8;
		cfg->d_ff = 8192;
	}
	else if (strcmp(name, "llama3-8b") == 0)
	{
		/* Llama 3 (not 3.1): no RoPE scaling, 8192 positions, its own output matrix */
		llama3_family(cfg);
		cfg->name = "synthetic Llama-3-8B shape";
		cfg->seed = 1003;
		cfg->context_length = 8192;
		cfg->n_layers = 32;
		cfg->d_model = 4096;
		cfg->n_heads = 32;
		cfg->n_kv_heads = 8;
		cfg->d_ff = 14336;
		cfg->tied_embeddings = false;
	}
	else if (strcmp(name, "qwen3-4b") == 0)
	{
		/* head size 128 of its own: q width 4096 against d_model 2560 */
		cfg->arch = "qwen3";
		cfg->name = "synthetic Qwen3-4B shape";
		cfg->seed = 1004;
		cfg->n_vocab = 151936;
		cfg->context_length = 40960;
		cfg->n_layers = 36;
		cfg->d_model = 2560;
		cfg->n_heads = 32;
		cfg->n_kv_heads = 8;
		cfg->head_dim = 128;
		cfg->d_ff = 9728;
		cfg->rope_base = 1000000.0f;
		cfg->rms_eps = 1e-6f;
		cfg->tokenizer_pre = "qwen2";
	}
	else
		return false;
	return true;
}
