/*
 * qwen3.c — Qwen3 (dense): Llama's pre-norm SwiGLU block with NeoX RoPE like Qwen2, but no
 * q/k/v biases; instead every query and key head is RMS-normalized with its own learned weights
 * (attn_q_norm, attn_k_norm, head_dim long, the model's rms epsilon) after the projection and
 * before RoPE.  The head size is its own key (attention.key_length: 128 for every size, which
 * need not be embedding_length / head_count).
 */
#include "arch.h"

const cai_arch_desc cai_arch_qwen3 = {
	.name = "qwen3",
	.keys = &cai_arch_keys_std,
	.tensors = &cai_arch_tensors_qk_norm,
	.norm = CAI_NORM_PRE,
	.activation = CAI_ACT_SWIGLU,
	.rope = {.style = CAI_ROPE_NEOX, .base = 1000000.0f},
	.attention = {.window_period = 0, .scale = 0.0f},
	.qkv_bias = CAI_QKV_BIAS_NONE,
};
