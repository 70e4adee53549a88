/*
 * gemma3.c — Google's Gemma 3 (text).  Its differences from Llama, all as data:
 *   - "sandwich" norms: RMSNorm before and after both attention and the FFN
 *     (post_attention_norm, post_ffw_norm); the GGUF converter already folded Gemma's (1 + w)
 *     into the weights, so every norm is the plain one;
 *   - per-head RMSNorm on queries and keys before RoPE (attn_q_norm, attn_k_norm);
 *   - a GeGLU FFN (gelu, tanh approximation);
 *   - token embeddings scaled by sqrt(d_model), the head tied to them;
 *   - five sliding-window layers to every global one (layer l global when l % 6 == 5), the
 *     window from {arch}.attention.sliding_window;
 *   - NeoX RoPE: global layers at the file's base (1e6) with its linear scaling, windowed
 *     layers at 1e4 unscaled.
 * The queries are scaled by 1/sqrt(head size) (query_pre_attn_scalar = head size for the
 * sizes up to 12B; 27B's differs and has no key of its own).
 */
#include "arch.h"

const cai_arch_desc cai_arch_gemma3 = {
	.name = "gemma3",
	.keys = &cai_arch_keys_std,
	.tensors = &cai_arch_tensors_gemma3,
	.norm = CAI_NORM_SANDWICH,
	.activation = CAI_ACT_GEGLU,
	.rope = {.style = CAI_ROPE_NEOX, .base = 1000000.0f, .base_windowed = 10000.0f},
	.attention = {.window_key = "attention.sliding_window", .window_period = 6, .scale = 0.0f},
	.qkv_bias = CAI_QKV_BIAS_OPTIONAL,
	.embed_scale_sqrt_d = true,
};
