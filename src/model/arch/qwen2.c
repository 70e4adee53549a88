/*
 * qwen2.c — Qwen2 and Qwen2.5: Llama's block with q/k/v biases in every layer and NeoX RoPE
 * (rotating the two halves of each head).
 */
#include "arch.h"

const cai_arch_desc cai_arch_qwen2 = {
	.name = "qwen2",
	.keys = &cai_arch_keys_std,
	.tensors = &cai_arch_tensors_std,
	.norm = CAI_NORM_PRE,
	.activation = CAI_ACT_SWIGLU,
	.rope = {.style = CAI_ROPE_NEOX, .base = 10000.0f},
	.attention = {.window_period = 0, .scale = 0.0f},
	.qkv_bias = CAI_QKV_BIAS_REQUIRED,
};
