/*
 * model_internal.h — what the files that build a model share (model.c, model_config.c,
 * model_load.c, model_fingerprint.c, calibrate.c); not part of the engine's interface.
 */
#ifndef CAI_MODEL_INTERNAL_H
#define CAI_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "convert.h"
#include "model.h"

/* An empty model with its allocation list; NULL when out of memory (model.c). */
cai_model  *cai_model_new(void);

/* 64-byte aligned memory freed with the model; NULL when out of memory (model.c). */
void	   *cai_model_alloc(cai_model *m, size_t bytes);

/* Fills m->cfg from the file's metadata and the architecture's description (model_config.c). */
cai_status	cai_model_read_config(cai_model *m, const char *path, cai_error *err);

/*
 * Sets c's attn_window and kv_source for its n_layers from the description's per-layer pattern,
 * the window length and the number of trailing layers that share an earlier layer's KV
 * (model_config.c).
 */
cai_status	cai_config_layer_attention(cai_config *c, const cai_arch_attention *a, uint32_t window,
									   uint32_t n_shared, cai_error *err);

/* m->content_hash: the config, the tensors and the tokenizer's metadata (model_fingerprint.c). */
cai_status	cai_model_content_hash(cai_model *m, cai_error *err);

/* m->fingerprint: the content hash with the numerics options the load chose. */
cai_status	cai_model_fingerprint(cai_model *m, cai_error *err);

/* The source tensors of one layer. */
typedef struct cai_layer_sources
{
	const gguf_tensor *attn_norm,
			   *wq,
			   *wk,
			   *wv,
			   *wo,
			   *bq,
			   *bk,
			   *bv,
			   *q_norm,
			   *k_norm,
			   *attn_post_norm,
			   *ffn_post_norm,
			   *ffn_norm,
			   *gate,
			   *up,
			   *down;
} cai_layer_sources;

/*
 * The rotation of vectors of n values the int8 path applies to a GEMM input of width n
 * (calibrate.c); false when out of memory.
 */
bool		cai_model_make_rotation(cai_model *m, int n, cai_rotation *r);

/*
 * Converts every layer and the LM head to the int8 path's calibrated, smoothed and rotated
 * weights (calibrate.c).  src: each layer's validated tensors; t_embd, t_head: the embedding
 * and the head's source (the embedding when tied); head_wmax: the head's column maxima.
 */
cai_status	cai_convert_layers(cai_model *m, cai_threadpool *pool, cai_convert_plan *plan,
							   const cai_layer_sources *src, const gguf_tensor *t_embd,
							   const gguf_tensor *t_head, const float *head_wmax, bool fref,
							   bool gptq, cai_error *err);

#endif							/* CAI_MODEL_INTERNAL_H */
