/*
 * test_arch.c — architecture descriptions: the table, and the per-layer attention a
 * description's pattern gives (sliding windows, trailing layers sharing an earlier layer's KV).
 */
#include <string.h>

#include "arch/arch.h"
#include "model_internal.h"
#include "test.h"

#define N_LAYERS 12

typedef struct layer_config
{
	cai_config	c;
	int			window[N_LAYERS];
	int			source[N_LAYERS];
	int			index[N_LAYERS];
} layer_config;

static void
layer_config_init(layer_config *lc, int n_layers)
{
	memset(lc, 0, sizeof(*lc));
	lc->c.n_layers = n_layers;
	lc->c.attn_window = lc->window;
	lc->c.kv_source = lc->source;
	lc->c.kv_index = lc->index;
}

TEST(arch_table)
{
	char		list[64];

	CHECK(cai_arch_find("llama") == &cai_arch_llama);
	CHECK(cai_arch_find("qwen2") == &cai_arch_qwen2);
	CHECK(cai_arch_find("qwen3") == &cai_arch_qwen3);
	CHECK(cai_arch_find("gpt9") == NULL);
	cai_arch_list(list, sizeof(list));
	CHECK(strcmp(list, "llama, qwen2, qwen3, gemma3") == 0);
	CHECK(cai_arch_find("gemma3") == &cai_arch_gemma3);
	cai_arch_list(list, 8);
	CHECK(strlen(list) == 7);
	CHECK(cai_arch_llama.rope.style == CAI_ROPE_NORMAL);
	CHECK(cai_arch_qwen2.rope.style == CAI_ROPE_NEOX);
	CHECK(cai_arch_qwen2.qkv_bias == CAI_QKV_BIAS_REQUIRED);
	CHECK(cai_arch_qwen2.tensors->attn_q_norm == NULL);
	/* qwen3: NeoX RoPE, no biases, per-head q/k norms */
	CHECK(cai_arch_qwen3.rope.style == CAI_ROPE_NEOX);
	CHECK(cai_arch_qwen3.qkv_bias == CAI_QKV_BIAS_NONE);
	CHECK(strcmp(cai_arch_qwen3.tensors->attn_q_norm, "attn_q_norm.weight") == 0);
	CHECK(strcmp(cai_arch_qwen3.tensors->attn_k_norm, "attn_k_norm.weight") == 0);
	CHECK(cai_arch_llama.tensors->attn_q_norm == NULL);
	/* Gemma 3: every difference from llama is in its description */
	CHECK(cai_arch_gemma3.rope.style == CAI_ROPE_NEOX);
	CHECK(cai_arch_gemma3.rope.base_windowed == 10000.0f);
	CHECK(cai_arch_gemma3.norm == CAI_NORM_SANDWICH);
	CHECK(cai_arch_gemma3.activation == CAI_ACT_GEGLU);
	CHECK(cai_arch_gemma3.embed_scale_sqrt_d);
	CHECK(cai_arch_gemma3.attention.window_period == 6);
	CHECK(strcmp(cai_arch_gemma3.attention.window_key, "attention.sliding_window") == 0);
	CHECK(cai_arch_llama.norm == CAI_NORM_PRE && !cai_arch_llama.embed_scale_sqrt_d);
	CHECK(strcmp(cai_arch_gemma3.tensors->attn_q_norm, "attn_q_norm.weight") == 0);
	CHECK(strcmp(cai_arch_gemma3.tensors->ffn_post_norm, "post_ffw_norm.weight") == 0);
	CHECK(cai_arch_qwen3.tensors->attn_post_norm == NULL);
}

TEST(arch_layer_attention_global)
{
	layer_config lc;
	cai_error	err;

	layer_config_init(&lc, 4);
	CHECK_EQ_INT(cai_config_layer_attention(&lc.c, &cai_arch_llama.attention, 0, 0, &err), CAI_OK);
	for (int l = 0; l < 4; l++)
		CHECK(lc.window[l] == 0 && lc.source[l] == l && lc.index[l] == l);
	CHECK_EQ_INT(lc.c.n_kv_layers, 4);
}

/* Five windowed layers, then a global one (gemma3's pattern); the last four share KV. */
TEST(arch_layer_attention_windows_and_shared_kv)
{
	const cai_arch_attention a = {.window_key = "attention.sliding_window", .window_period = 6,
	.shared_kv_layers_key = "attention.shared_kv_layers"};
	layer_config lc;
	cai_error	err;

	layer_config_init(&lc, N_LAYERS);
	CHECK_EQ_INT(cai_config_layer_attention(&lc.c, &a, 512, 0, &err), CAI_OK);
	for (int l = 0; l < N_LAYERS; l++)
	{
		CHECK_EQ_INT(lc.window[l], l % 6 == 5 ? 0 : 512);
		CHECK_EQ_INT(lc.source[l], l);
	}
	CHECK_EQ_INT(lc.c.n_kv_layers, N_LAYERS);

	/* layers 8..11 read the last owning layer of their kind: 7 (windowed) or 5 (global) */
	layer_config_init(&lc, N_LAYERS);
	CHECK_EQ_INT(cai_config_layer_attention(&lc.c, &a, 512, 4, &err), CAI_OK);
	CHECK_EQ_INT(lc.source[7], 7);
	CHECK_EQ_INT(lc.source[8], 7);
	CHECK_EQ_INT(lc.source[9], 7);
	CHECK_EQ_INT(lc.source[10], 7);
	CHECK_EQ_INT(lc.source[11], 5);
	CHECK_EQ_INT(lc.index[11], lc.index[5]);
	CHECK_EQ_INT(lc.index[8], lc.index[7]);
	CHECK_EQ_INT(lc.c.n_kv_layers, 8);

	/* no earlier layer of the same kind, a bad window, too many shared layers */
	layer_config_init(&lc, 6);
	CHECK_EQ_INT(cai_config_layer_attention(&lc.c, &a, 512, 1, &err), CAI_ERR_FORMAT);
	layer_config_init(&lc, N_LAYERS);
	CHECK_EQ_INT(cai_config_layer_attention(&lc.c, &a, 0, 0, &err), CAI_ERR_FORMAT);
	layer_config_init(&lc, N_LAYERS);
	CHECK_EQ_INT(cai_config_layer_attention(&lc.c, &a, 512, N_LAYERS, &err), CAI_ERR_FORMAT);
}
