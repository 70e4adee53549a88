/*
 * synth_model.h — writes complete model GGUFs (llama, qwen2, qwen3 or gemma3 layout) with seeded
 * random weights and a small gpt2-style byte-level BPE vocabulary with ChatML special tokens,
 * so the suite can test loading, tokenization and inference on shapes no small real model has
 * (tiny ones), and the benchmarks can run models of real sizes (synth_presets.h's shapes).
 *
 * Metadata keys, tensor names and shapes are exactly those llama.cpp writes (checked against
 * SmolLM2-135M-Instruct).  The vocabulary mirrors SmolLM2's ordering:
 *   ids 0..2     "<|endoftext|>", "<|im_start|>", "<|im_end|>"   (token_type 3, CONTROL)
 *   ids 3..258   the 256 byte tokens in GPT-2 byte-to-unicode order: the printable bytes
 *                '!'..'~', '¡'..'¬', '®'..'ÿ' as themselves, then the other bytes 0x00.., each
 *                as U+0100 + k (so ' ' is "Ġ" and '\n' is "Ċ")      (token_type 1, NORMAL)
 *   ids 259..    one token per merge, in merge-rank order            (token_type 1)
 * bos = <|im_start|> (1), eos = <|im_end|> (2), unknown = <|endoftext|> (0), padding = 2, as
 * the real SmolLM2-Instruct file has them.
 */
#ifndef CAI_SYNTH_MODEL_H
#define CAI_SYNTH_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "gguf.h"

#define SYNTH_TOKEN_ENDOFTEXT 0
#define SYNTH_TOKEN_IM_START 1
#define SYNTH_TOKEN_IM_END 2
#define SYNTH_FIRST_BYTE_TOKEN 3
#define SYNTH_FIRST_MERGE_TOKEN (SYNTH_FIRST_BYTE_TOKEN + 256)

typedef struct synth_model_config
{
	const char *arch;			/* "llama", "qwen2" (adds q/k/v biases), "qwen3" (no biases,
								 * per-head q/k norms attn_q_norm/attn_k_norm) or "gemma3"
								 * (q/k norms, post_attention_norm and post_ffw_norm in every
								 * layer, {arch}.attention.sliding_window; llama.cpp makes every
								 * 6th layer global) */
	int			sliding_window;	/* gemma3: the local layers' window in tokens */
	bool		qkv_bias;		/* q/k/v biases whatever the architecture (qwen2 always) */
	const char *name;			/* general.name */
	int			n_layers;
	int			d_model;
	int			n_heads;
	int			n_kv_heads;
	int			head_dim;		/* 0: d_model / n_heads; else also writes key/value_length */
	int			d_ff;
	int			context_length;
	ggml_type	weight_type;	/* the 2-D projection matrices (and output.weight) */
	ggml_type	embd_type;		/* token_embd.weight */
	bool		tied_embeddings;	/* no output.weight: the head reuses token_embd */
	uint64_t	seed;
	float		rope_base;
	float		rms_eps;
	const char *tokenizer_pre;	/* tokenizer.ggml.pre */
	const char *chat_template;	/* NULL: SmolLM2's ChatML template */
	bool		add_bos;		/* tokenizer.ggml.add_bos_token (SmolLM2: false; Gemma, Llama: true) */
	float		rope_scaling_factor;	/* > 0: linear RoPE scaling by this factor */

	/*
	 * Llama 3.1 RoPE scaling (llama3_factor > 0): writes rope_freqs.weight, the per-frequency
	 * divisors llama.cpp's converter computes from these (synth_model_llama3_rope_factors).
	 */
	float		llama3_factor;	/* 8 (Llama 3.1) or 32 (Llama 3.2) */
	float		llama3_low_freq_factor;	/* 1 */
	float		llama3_high_freq_factor;	/* 4 */
	int			llama3_original_context;	/* 8192 */

	/*
	 * The vocabulary.  vocab_from NULL: the built-in one described above; else the byte-level
	 * BPE tokenizer (tokens, token types, merges, special ids) of that GGUF file, so that text
	 * tokenizes as the real model does.  n_vocab > 0 pads either to that many tokens, as real
	 * vocabularies are larger: the extra tokens are ordinary pseudo-words ("Ġbaxo", "tepi")
	 * that no merge reaches, each distinct from every other token.
	 */
	const char *vocab_from;
	int			n_vocab;

	/*
	 * Embedding models: pooling_type >= 0 writes {arch}.pooling_type (llama.cpp's numbering:
	 * 0 none, 1 mean, 2 cls, 3 last); non_causal writes {arch}.attention.causal = false.
	 */
	int			pooling_type;	/* -1: no key (synth_model_default_config) */
	bool		non_causal;
} synth_model_config;

/*
 * A small llama: 2 layers, d_model 64, 4 heads / 2 KV heads (head_dim 16), d_ff 128, context
 * 256, F32 weights, tied embeddings, seed 1, rope base 10000, eps 1e-5, pre "smollm".
 */
void		synth_model_default_config(synth_model_config *cfg);

/*
 * The Llama 3 per-frequency RoPE divisors for n_rot rotated dimensions (n_rot / 2 values), as
 * llama.cpp's converter computes them: frequency i is base^(-2i / n_rot), its wavelength
 * 2 pi / freq; wavelengths below original_context / high_freq_factor keep factor 1, those above
 * original_context / low_freq_factor get factor, and the ones between blend smoothly:
 * 1 / ((1 - s) / factor + s), s = (original_context / wavelength - low) / (high - low).
 */
void		synth_model_llama3_rope_factors(const synth_model_config *cfg, int n_rot, float *out);

/* Number of tokens in the built-in synthetic vocabulary (a multiple of 4). */
int			synth_model_n_vocab(void);

/* Copies token i's text (UTF-8, NUL-terminated) into buf; its length, or -1 (bad i, short buf). */
int			synth_model_token(int i, char *buf, size_t cap);

/* Number of merges and merge i as "left right". */
int			synth_model_n_merges(void);
const char *synth_model_merge(int i);

/*
 * Writes the model.  Fails with CAI_ERR_INVALID_ARGUMENT when the shapes do not fit the config
 * (n_heads not dividing d_model, a row length that is not a whole number of blocks of the chosen
 * type, ...), CAI_ERR_IO when the file cannot be written.
 */
cai_status	synth_model_write(const char *path, const synth_model_config *cfg, cai_error *err);

/* Same, to a malloc'd buffer (*data; free() it). */
cai_status	synth_model_write_buffer(const synth_model_config *cfg, uint8_t **data, size_t *size,
									 cai_error *err);

#endif							/* CAI_SYNTH_MODEL_H */
