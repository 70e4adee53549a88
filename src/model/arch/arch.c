/*
 * arch.c — the table of architecture descriptions and the GGUF keys and tensor names most of
 * them share.
 */
#include "arch.h"

#include <stdio.h>
#include <string.h>

const cai_arch_keys cai_arch_keys_std = {
	.block_count = "block_count",
	.embedding_length = "embedding_length",
	.feed_forward_length = "feed_forward_length",
	.head_count = "attention.head_count",
	.head_count_kv = "attention.head_count_kv",
	.context_length = "context_length",
	.rope_freq_base = "rope.freq_base",
	.rms_norm_eps = "attention.layer_norm_rms_epsilon",
	.key_length = "attention.key_length",
	.value_length = "attention.value_length",
	.rope_dimension_count = "rope.dimension_count",
	.rope_scaling_type = "rope.scaling.type",
	.rope_scaling_factor = "rope.scaling.factor",
	.rope_scale_linear = "rope.scale_linear",
};

/* the names every table here shares */
#define STD_TENSORS \
	.token_embd = "token_embd.weight", \
	.output = "output.weight", \
	.output_norm = "output_norm.weight", \
	.rope_freqs = "rope_freqs.weight", \
	.attn_norm = "attn_norm.weight", \
	.attn_q = "attn_q.weight", \
	.attn_k = "attn_k.weight", \
	.attn_v = "attn_v.weight", \
	.attn_output = "attn_output.weight", \
	.attn_q_bias = "attn_q.bias", \
	.attn_k_bias = "attn_k.bias", \
	.attn_v_bias = "attn_v.bias", \
	.attn_output_bias = "attn_output.bias", \
	.ffn_norm = "ffn_norm.weight", \
	.ffn_gate = "ffn_gate.weight", \
	.ffn_up = "ffn_up.weight", \
	.ffn_down = "ffn_down.weight"

const cai_arch_tensors cai_arch_tensors_std = {
	STD_TENSORS,
};

const cai_arch_tensors cai_arch_tensors_qk_norm = {
	STD_TENSORS,
	.attn_q_norm = "attn_q_norm.weight",
	.attn_k_norm = "attn_k_norm.weight",
};

/* Gemma 3: the q/k norms and the sandwich norms around both sublayers */
const cai_arch_tensors cai_arch_tensors_gemma3 = {
	STD_TENSORS,
	.attn_q_norm = "attn_q_norm.weight",
	.attn_k_norm = "attn_k_norm.weight",
	.attn_post_norm = "post_attention_norm.weight",
	.ffn_post_norm = "post_ffw_norm.weight",
};

/* In the order messages list them. */
static const cai_arch_desc *const archs[] = {
	&cai_arch_llama,
	&cai_arch_qwen2,
	&cai_arch_qwen3,
	&cai_arch_gemma3,
};

#define N_ARCHS ((int) (sizeof(archs) / sizeof(archs[0])))

const cai_arch_desc *
cai_arch_find(const char *name)
{
	for (int i = 0; i < N_ARCHS; i++)
		if (strcmp(archs[i]->name, name) == 0)
			return archs[i];
	return NULL;
}

void
cai_arch_list(char *buf, size_t size)
{
	size_t		len = 0;

	if (size == 0)
		return;
	buf[0] = '\0';
	for (int i = 0; i < N_ARCHS && len < size; i++)
	{
		int			n = snprintf(buf + len, size - len, "%s%s", i ? ", " : "", archs[i]->name);

		if (n < 0)
			return;
		len += (size_t) n;
	}
}
