/*
 * llama.c — Llama (and the models converted as "llama": SmolLM2, Mistral without a window).
 * Pre-norm SwiGLU blocks, global attention, RoPE on adjacent pairs (the converter permuted
 * the Q/K rows for it); q/k/v biases when the file has them, as llama.cpp allows.
 */
#include "arch.h"

const cai_arch_desc cai_arch_llama = {
	.name = "llama",
	.keys = &cai_arch_keys_std,
	.tensors = &cai_arch_tensors_std,
	.norm = CAI_NORM_PRE,
	.activation = CAI_ACT_SWIGLU,
	.rope = {.style = CAI_ROPE_NORMAL, .base = 10000.0f},
	.attention = {.window_period = 0, .scale = 0.0f},
	.qkv_bias = CAI_QKV_BIAS_OPTIONAL,
};
