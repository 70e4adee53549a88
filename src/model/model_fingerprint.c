/*
 * model_fingerprint.c — the model's identity for the prefix cache's and the weights cache's keys.
 */
#include "model_internal.h"

#include <string.h>
#include <xxhash.h>

#include "util.h"

static size_t
value_type_bytes(gguf_value_type t)
{
	switch (t)
	{
		case GGUF_TYPE_UINT8:
		case GGUF_TYPE_INT8:
		case GGUF_TYPE_BOOL:
			return 1;
		case GGUF_TYPE_UINT16:
		case GGUF_TYPE_INT16:
			return 2;
		case GGUF_TYPE_UINT32:
		case GGUF_TYPE_INT32:
		case GGUF_TYPE_FLOAT32:
			return 4;
		case GGUF_TYPE_UINT64:
		case GGUF_TYPE_INT64:
		case GGUF_TYPE_FLOAT64:
			return 8;
		default:
			return 0;
	}
}

/*
 * XXH3-64 over the architecture and config, every tensor's name, type, shape and bytes, and
 * the tokenizer's metadata: two files give the same hash only if they compute the same
 * function of the same tokens, which is what the prefix cache's keys must guarantee, and the
 * weights cache's too (a file with the same name, size and time but other bytes is another
 * model).  Runs before the weights are loaded, which the weights cache's key needs.
 */
cai_status
cai_model_content_hash(cai_model *m, cai_error *err)
{
	const gguf_file *f = m->gguf;
	const cai_config *c = &m->cfg;
	XXH3_state_t *state = XXH3_createState();
	int32_t		ints[12];
	float		floats[4];

	if (!state)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory hashing the model");
	XXH3_64bits_reset_withSeed(state, 0x70675f636169ULL);	/* "pg_cai" */
	XXH3_64bits_update(state, c->arch_name, strlen(c->arch_name) + 1);
	ints[0] = c->n_layers;
	ints[1] = c->d_model;
	ints[2] = c->n_heads;
	ints[3] = c->n_kv_heads;
	ints[4] = c->head_dim;
	ints[5] = c->d_ff;
	ints[6] = c->n_vocab;
	ints[7] = c->context_length;
	ints[8] = c->n_rot;
	ints[9] = c->rope_neox;
	ints[10] = c->tied_embeddings;
	ints[11] = c->qkv_bias;
	floats[0] = c->norm_eps;
	floats[1] = c->rope_base;
	floats[2] = c->rope_freq_scale;
	floats[3] = 0.0f;
	XXH3_64bits_update(state, ints, sizeof(ints));
	XXH3_64bits_update(state, floats, sizeof(floats));
	for (int l = 0; l < c->n_layers; l++)
	{
		int32_t		lay[2] = {c->attn_window[l], c->kv_source[l]};

		XXH3_64bits_update(state, lay, sizeof(lay));
	}
	for (uint64_t i = 0; i < f->n_tensors; i++)
	{
		const gguf_tensor *t = &f->tensors[i];
		int64_t		shape[GGUF_MAX_DIMS + 1];

		XXH3_64bits_update(state, t->name.ptr, t->name.len);
		for (int d = 0; d < GGUF_MAX_DIMS; d++)
			shape[d] = t->ne[d];
		shape[GGUF_MAX_DIMS] = t->type;
		XXH3_64bits_update(state, shape, sizeof(shape));
		XXH3_64bits_update(state, t->data, t->nbytes);
		/*
		 * reading the file does not keep it resident: a model whose weights come from a
		 * weights cache never reads these pages again, and the others fault them back in from
		 * the page cache as they convert
		 */
		if (f->map)
			cai_unmap_pages(t->data, t->nbytes);
	}
	for (uint64_t i = 0; i < f->n_kv; i++)
	{
		const gguf_kv *kv = &f->kv[i];
		uint32_t	type = kv->type;

		if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10) != 0)
			continue;
		XXH3_64bits_update(state, kv->key.ptr, kv->key.len);
		XXH3_64bits_update(state, &type, sizeof(type));
		if (kv->type == GGUF_TYPE_STRING)
			XXH3_64bits_update(state, kv->v.str.ptr, kv->v.str.len);
		else if (kv->type == GGUF_TYPE_ARRAY)
		{
			uint32_t	et = kv->v.arr.elem_type;

			XXH3_64bits_update(state, &et, sizeof(et));
			XXH3_64bits_update(state, &kv->v.arr.n, sizeof(kv->v.arr.n));
			if (kv->v.arr.elem_type == GGUF_TYPE_STRING && kv->v.arr.strs)
			{
				for (uint64_t j = 0; j < kv->v.arr.n; j++)
				{
					XXH3_64bits_update(state, &kv->v.arr.strs[j].len, sizeof(uint64_t));
					XXH3_64bits_update(state, kv->v.arr.strs[j].ptr, kv->v.arr.strs[j].len);
				}
			}
			else if (value_type_bytes(kv->v.arr.elem_type) && kv->v.arr.data)
				XXH3_64bits_update(state, kv->v.arr.data,
								   kv->v.arr.n * value_type_bytes(kv->v.arr.elem_type));
		}
		else
			XXH3_64bits_update(state, &kv->v, sizeof(kv->v.u64));
	}
	m->content_hash = XXH3_64bits_digest(state);
	XXH3_freeState(state);
	return CAI_OK;
}

/*
 * Raised with every change to the numbers a forward computes (an activation's quantization, a
 * kernel's order of operations): the prefix cache's disk tier outlives the engine, and KV that
 * an older build wrote would continue a conversation with other tokens than recomputing it.
 */
#define NUMERICS_REVISION 2

/* The content hash with the options that change the model's numbers (the prefix cache's seed). */
cai_status
cai_model_fingerprint(cai_model *m, cai_error *err)
{
	/* the int8 path's numerics options, and the file's own formats, give other results */
	uint8_t		numerics[5] = {m->gptq_rounding, m->two_digit_activations, m->file_weights,
	m->superblock_activations, NUMERICS_REVISION};

	(void) err;
	m->fingerprint = XXH3_64bits_withSeed(numerics, sizeof(numerics), m->content_hash);
	return CAI_OK;
}
