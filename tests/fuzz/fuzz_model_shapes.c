/*
 * fuzz_model_shapes.c — the model loader over well-formed models of fuzzed shapes and hostile
 * weight values.  fuzz_gguf mutates bytes, which mostly breaks a file's consistency; here the
 * input picks a configuration (architecture, layers, heads and KV heads, head size, widths,
 * weight and embedding types, tied head, RoPE base, epsilon) that the synthetic model writer
 * turns into a complete GGUF, then patches tensor data with special values (Inf, NaN, the
 * largest finite values, denormals, as f32 and f16, which also hits quantized blocks' scales).
 * The loader converts, calibrates (a float forward over every layer), smooths, rotates and
 * requantizes whatever it gets, with GPTQ rounding or the float reference for some
 * inputs.
 *
 * Input: 13 configuration bytes, then patches of 4 bytes (tensor, position, kind).  Invariants:
 * a configuration the writer accepts either loads or fails with a status and a message (never a
 * sanitizer report); a model that loads reports the shapes it was written with, and works as
 * fuzz_use_model expects.
 */
#include "fuzz_common.h"	/* first: it defines _GNU_SOURCE */

#include "gguf.h"
#include "quant.h"

static const ggml_type types[] = {
	GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
	GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K
};
#define N_TYPES ((int) (sizeof(types) / sizeof(types[0])))

/* Writes one special value at tensor data byte pos (aligned down to the value's size). */
static void
patch(uint8_t *data, size_t nbytes, size_t pos, uint8_t kind)
{
	static const float f32[] = {
		__builtin_inff(), -__builtin_inff(), __builtin_nanf(""), 3.4028235e38f, 1e-45f, -0.0f
	};
	static const uint16_t f16[] = {0x7C00, 0xFC00, 0x7E00, 0x7BFF, 0x0001, 0x8000};

	if (kind & 1)
	{
		pos &= ~(size_t) 3;
		if (pos + 4 <= nbytes)
			memcpy(data + pos, &f32[(kind >> 1) % 6], 4);
	}
	else
	{
		pos &= ~(size_t) 1;
		if (pos + 2 <= nbytes)
			memcpy(data + pos, &f16[(kind >> 1) % 6], 2);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	synth_model_config cfg;
	cai_model_params params;
	uint8_t		flags = fuzz_u8(&in);
	uint8_t    *image = NULL;
	size_t		image_size;
	cai_model  *model = NULL;
	cai_error	err;
	cai_status	st;
	int			unit;
	int			divisors[8];
	int			n_div = 0;

	synth_model_default_config(&cfg);
	cfg.arch = (flags & 1) ? "qwen2" : "llama";
	cfg.tied_embeddings = flags & 2;
	cfg.weight_type = types[fuzz_u8(&in) % N_TYPES];
	cfg.embd_type = types[fuzz_u8(&in) % N_TYPES];
	cfg.n_layers = 1 + fuzz_u8(&in) % 2;
	cfg.n_heads = 1 + fuzz_u8(&in) % 8;
	for (int d = 1; d <= cfg.n_heads; d++)
		if (cfg.n_heads % d == 0)
			divisors[n_div++] = d;
	cfg.n_kv_heads = divisors[fuzz_u8(&in) % n_div];
	cfg.head_dim = 8 * (fuzz_u8(&in) % 9);	/* 0: d_model / n_heads */
	/* widths in whole blocks of the types (blocks are 1, 32 or 256 values), and of 4 */
	unit = (int) ggml_type_block_elems(cfg.weight_type);
	if (ggml_type_block_elems(cfg.embd_type) > unit)
		unit = (int) ggml_type_block_elems(cfg.embd_type);
	if (unit < 4)
		unit = 4;
	cfg.d_model = unit * (1 + fuzz_u8(&in) % (unit >= 256 ? 1 : 128 / unit));
	cfg.d_ff = unit * (1 + fuzz_u8(&in) % (unit >= 256 ? 1 : 256 / unit));
	if (unit >= 256)
		cfg.n_layers = 1;		/* K-quant widths are slow enough in one layer */
	cfg.rope_base = (float) (1 + fuzz_u16(&in));
	cfg.rms_eps = (flags & 4) ? 1e-30f : 1e-5f;
	cfg.context_length = 1 + fuzz_u8(&in);
	cfg.seed = fuzz_u8(&in);
	if (synth_model_write_buffer(&cfg, &image, &image_size, &err) != CAI_OK)
	{
		/* a shape the writer refuses (a width not in whole blocks, say) */
		if (getenv("FUZZ_VERBOSE"))
			fprintf(stderr, "writer: %s\n", err.message);
		return 0;
	}

	/* the patches, into tensor data only (the file stays well-formed) */
	{
		gguf_file  *f;

		FUZZ_CHECK(gguf_open_memory(image, image_size, &f, &err) == CAI_OK);
		while (in.n >= 4)
		{
			const gguf_tensor *t = &f->tensors[fuzz_u8(&in) % f->n_tensors];
			size_t		pos = fuzz_u16(&in) * (t->nbytes / 65536 + 1) % t->nbytes;

			patch(image + ((const uint8_t *) t->data - image), t->nbytes, pos, fuzz_u8(&in));
		}
		gguf_close(f);
	}

	cai_model_params_default(&params);
	params.n_threads = 1;
	/* (K-quant widths make GPTQ rounding take seconds under the sanitizers) */
	params.rounding = (flags & 8) && unit < 256 ? CAI_ROUNDING_GPTQ : CAI_ROUNDING_NEAREST;
	params.load_float_reference = flags & 16;
	params.activations = flags & 32 ? CAI_ACTIVATIONS_TWO_DIGIT : CAI_ACTIVATIONS_INT8;
	st = fuzz_model_load(image, image_size, &params, &model, &err);
	FUZZ_CHECK((st == CAI_OK) == (model != NULL));
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "model load: %s\n", st == CAI_OK ? "ok" : err.message);
	if (st == CAI_OK)
	{
		cai_model_info info;

		cai_model_get_info(model, &info);
		FUZZ_CHECK(info.n_layers == cfg.n_layers && info.d_model == cfg.d_model &&
				   info.n_heads == cfg.n_heads && info.n_kv_heads == cfg.n_kv_heads &&
				   info.d_ff == cfg.d_ff && info.n_vocab == synth_model_n_vocab());
		FUZZ_CHECK(info.head_dim == (cfg.head_dim ? cfg.head_dim : cfg.d_model / cfg.n_heads));
		fuzz_use_model(model);
		cai_model_free(model);
	}
	else
		FUZZ_CHECK(err.status == st && err.message[0] != '\0');
	free(image);
	return 0;
}
