/*
 * arch.h — model architecture descriptions: what a GGUF architecture's file holds and how its
 * transformer differs from the generic one the engine runs.
 *
 * One short file per architecture (arch/llama.c, arch/qwen2.c, arch/qwen3.c, arch/gemma3.c)
 * fills a cai_arch_desc; the loader (model_load.c) and the forward (forward.c) read the
 * description instead of testing the architecture's name.  A description is plain data: no code, no model internals.
 */
#ifndef CAI_ARCH_H
#define CAI_ARCH_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Metadata keys, each the part after "{general.architecture}." (llama.cpp's convention).  A
 * NULL optional key means the architecture never sets it and its default applies.
 */
typedef struct cai_arch_keys
{
	const char *block_count;		/* required */
	const char *embedding_length;	/* required */
	const char *feed_forward_length;	/* required */
	const char *head_count;			/* required */
	const char *head_count_kv;		/* default: head_count */
	const char *context_length;		/* default: 2048 */
	const char *rope_freq_base;		/* default: cai_arch_rope.base */
	const char *rms_norm_eps;		/* required */
	const char *key_length;			/* default: embedding_length / head_count */
	const char *value_length;		/* default: key_length (must equal it) */
	const char *rope_dimension_count;	/* default: the head size */
	const char *rope_scaling_type;	/* "none" or "linear" */
	const char *rope_scaling_factor;	/* required with linear scaling */
	const char *rope_scale_linear;	/* the older spelling of a linear factor */
} cai_arch_keys;

/*
 * Tensor names.  Global tensors by full name; per-layer ones by the part after "blk.N.".
 * NULL: the architecture has no such tensor.
 */
typedef struct cai_arch_tensors
{
	const char *token_embd;
	const char *output;				/* absent in the file: the head is tied to token_embd */
	const char *output_norm;
	const char *rope_freqs;			/* optional per-frequency divisors */
	const char *attn_norm;
	const char *attn_q;
	const char *attn_k;
	const char *attn_v;
	const char *attn_output;
	const char *attn_q_bias;
	const char *attn_k_bias;
	const char *attn_v_bias;
	const char *attn_output_bias;	/* not applied: a file that has it is refused */
	/*
	 * Per-head RMSNorm weights [head_dim] of the queries and keys, applied to every head after
	 * the projection and before RoPE (Qwen3, Gemma 3).  An architecture that names them needs
	 * them in every layer.
	 */
	const char *attn_q_norm;
	const char *attn_k_norm;
	const char *attn_post_norm;		/* with CAI_NORM_SANDWICH: the attention output's norm */
	const char *ffn_norm;
	const char *ffn_gate;
	const char *ffn_up;
	const char *ffn_down;
	const char *ffn_post_norm;		/* with CAI_NORM_SANDWICH: the FFN output's norm */
} cai_arch_tensors;

/*
 * The keys and tensor names most GGUF architectures share (llama.cpp's LLM_KV / LLM_TENSOR);
 * _qk_norm: the same tensors plus the per-head query/key norms; _gemma3: those plus the
 * post-attention and post-FFN norms.
 */
extern const cai_arch_keys cai_arch_keys_std;
extern const cai_arch_tensors cai_arch_tensors_std;
extern const cai_arch_tensors cai_arch_tensors_qk_norm;
extern const cai_arch_tensors cai_arch_tensors_gemma3;

/* Where the RMS norms sit. */
typedef enum cai_arch_norm
{
	CAI_NORM_PRE = 0,			/* before attention and before the FFN: x += f(norm(x)) */
	CAI_NORM_SANDWICH			/* also on each sublayer's output: x += norm'(f(norm(x))) */
} cai_arch_norm;

/* The FFN: down(act(gate(x)) * up(x)). */
typedef enum cai_arch_activation
{
	CAI_ACT_SWIGLU = 0,			/* act = silu */
	CAI_ACT_GEGLU				/* act = gelu, tanh approximation */
} cai_arch_activation;

/* Which dimensions RoPE rotates together. */
typedef enum cai_arch_rope_style
{
	CAI_ROPE_NORMAL = 0,		/* (2i, 2i+1): llama, whose GGUF Q/K rows were permuted for it */
	CAI_ROPE_NEOX				/* (i, i + n_rot/2) */
} cai_arch_rope_style;

/* Q/K/V projection biases. */
typedef enum cai_arch_qkv_bias
{
	CAI_QKV_BIAS_OPTIONAL = 0,	/* used when the file has them (all three, in every layer) */
	CAI_QKV_BIAS_REQUIRED,
	CAI_QKV_BIAS_NONE			/* never: a file that has them is refused */
} cai_arch_qkv_bias;

/*
 * RoPE.  Every layer uses the file's base and scaling, unless base_windowed > 0: then the
 * sliding-window layers rotate with that fixed base and no scaling (Gemma 3 trains its local
 * layers at base 10000 and stretches only its global ones).
 */
typedef struct cai_arch_rope
{
	cai_arch_rope_style style;
	float		base;			/* when the file gives no rope_freq_base */
	float		base_windowed;	/* 0: windowed layers rotate like the others */
} cai_arch_rope;

/*
 * Per-layer attention.  Every layer attends globally and owns its KV unless:
 *   - window_period > 0: layer l attends over a sliding window of window_key's value
 *     (required then) unless l % window_period == window_period - 1 (a global layer);
 *   - shared_kv_layers_key names a count N > 0 in the file: the last N layers compute no K/V
 *     and read the KV of the last earlier layer of the same kind (windowed or global).
 * The engine also takes windows and KV sources set on a loaded config directly
 * (cai_config_update_kv_sharing), which is how synthetic test models exercise them.
 */
typedef struct cai_arch_attention
{
	const char *window_key;		/* key suffix of the window length in tokens */
	int			window_period;	/* 0: no windowed layers */
	const char *shared_kv_layers_key;	/* key suffix, or NULL: every layer owns its KV */
	float		scale;			/* q.k multiplier; 0: 1/sqrt(head size) */
} cai_arch_attention;

typedef struct cai_arch_desc
{
	const char *name;			/* general.architecture */
	const cai_arch_keys *keys;
	const cai_arch_tensors *tensors;
	cai_arch_norm norm;
	cai_arch_activation activation;
	cai_arch_rope rope;
	cai_arch_attention attention;
	cai_arch_qkv_bias qkv_bias;
	bool		embed_scale_sqrt_d;	/* token embeddings are multiplied by sqrt(d_model) */
} cai_arch_desc;

/* The architectures the engine runs, by general.architecture; NULL when unknown. */
const cai_arch_desc *cai_arch_find(const char *name);

/* Writes their names, ", "-separated, for messages ("llama, qwen2"). */
void		cai_arch_list(char *buf, size_t size);

extern const cai_arch_desc cai_arch_llama;
extern const cai_arch_desc cai_arch_qwen2;
extern const cai_arch_desc cai_arch_qwen3;
extern const cai_arch_desc cai_arch_gemma3;

#endif							/* CAI_ARCH_H */
