/*
 * gen_corpus.c — writes the hand-made seeds of the fuzz corpora: tiny synthetic models and
 * other GGUF images for fuzz_gguf (a fuzzer does not find a loadable model by itself), and for
 * the structured targets a few inputs in their formats (see each target's header comment), so
 * that a run starts from meaningful text, stop strings, vocabularies and conversations.  What
 * the runs find on top is merged into the same directories (tests/fuzz/README.md).
 *
 *   build/fuzz/gen_corpus tests/fuzz/corpus     (make fuzz-seeds)
 */
#include "fuzz_common.h"	/* first: it defines _GNU_SOURCE */

#include <errno.h>
#include <sys/stat.h>

#include "gguf_writer.h"
#include "quant.h"
#include "cpu/cpu_weight.h"
#include "weight_cache.h"
#include "fuzz_kv_disk.h"

/* ---- output ----------------------------------------------------------------------------- */

static const char *out_dir;

static void
write_seed(const char *target, const char *name, const void *data, size_t size)
{
	char		path[512];
	FILE	   *f;

	snprintf(path, sizeof(path), "%s/%s", out_dir, target);
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
	{
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
	{
		perror(path);
		exit(1);
	}
	printf("%-60s %6zu bytes\n", path, size);
}

/* An input under construction, in the carving order of fuzz_common.h's readers. */
typedef struct seed
{
	uint8_t		b[12288];
	size_t		n;
} seed;

static void
put_u8(seed *s, unsigned v)
{
	FUZZ_CHECK(s->n < sizeof(s->b));
	s->b[s->n++] = (uint8_t) v;
}

static void
put_u16(seed *s, unsigned v)
{
	put_u8(s, v & 0xFF);
	put_u8(s, (v >> 8) & 0xFF);
}

static void
put_bytes(seed *s, const void *p, size_t n)
{
	FUZZ_CHECK(s->n + n <= sizeof(s->b));
	memcpy(s->b + s->n, p, n);
	s->n += n;
}

/* A fuzz_chunk of at most max bytes: its length in one byte (two when max > 255), then it. */
static void
put_chunk(seed *s, size_t max, const char *text)
{
	size_t		n = strlen(text);

	FUZZ_CHECK(n <= max);
	if (max > 255)
		put_u16(s, (unsigned) n);
	else
		put_u8(s, (unsigned) n);
	put_bytes(s, text, n);
}

static void
write_input(const char *target, const char *name, const seed *s)
{
	write_seed(target, name, s->b, s->n);
}

/* ---- fuzz_gguf: GGUF images ------------------------------------------------------------- */

static void
model_seed(const char *name, synth_model_config *cfg)
{
	uint8_t    *data;
	size_t		size;
	cai_error	err;

	if (synth_model_write_buffer(cfg, &data, &size, &err) != CAI_OK)
	{
		fprintf(stderr, "%s: %s\n", name, err.message);
		exit(1);
	}
	FUZZ_CHECK(size <= 65536);	/* FUZZ_MAX_LEN_fuzz_gguf */
	write_seed("fuzz_gguf", name, data, size);
	free(data);
}

static void
writer_seed(const char *name, gguf_writer *w)
{
	uint8_t    *data;
	size_t		size;

	FUZZ_CHECK(w && gguf_writer_write_buffer(w, &data, &size));
	gguf_writer_free(w);
	write_seed("fuzz_gguf", name, data, size);
	free(data);
}

static void
gguf_seeds(void)
{
	static const char llama3_template[] =
		"{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
		"{{ m['content'] | trim }}<|eot_id|>{% endfor %}";
	/* small llamas and a qwen2: each weight format the loader converts, tied and untied */
	static const struct
	{
		const char *name;
		const char *arch;
		int			n_heads,
					n_kv_heads,
					head_dim,
					d_ff;
		ggml_type	weight_type,
					embd_type;
		bool		tied;
		const char *pre;
		const char *chat_template;
	}			models[] = {
		{"llama-q8_0.gguf", "llama", 4, 2, 0, 64, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, true, "smollm", NULL},
		{"llama-q4-keylength.gguf", "llama", 2, 1, 32, 64, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, true,
		"llama-bpe", llama3_template},
		{"qwen2-f16-untied.gguf", "qwen2", 2, 1, 0, 32, GGML_TYPE_F16, GGML_TYPE_BF16, false, "qwen2",
		NULL},
	};

	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
	{
		synth_model_config cfg;

		synth_model_default_config(&cfg);
		cfg.arch = models[i].arch;
		cfg.n_layers = 1;
		cfg.d_model = 32;
		cfg.n_heads = models[i].n_heads;
		cfg.n_kv_heads = models[i].n_kv_heads;
		cfg.head_dim = models[i].head_dim;	/* not 0: written as key/value_length */
		cfg.d_ff = models[i].d_ff;
		cfg.weight_type = models[i].weight_type;
		cfg.embd_type = models[i].embd_type;
		cfg.tied_embeddings = models[i].tied;
		cfg.tokenizer_pre = models[i].pre;
		cfg.chat_template = models[i].chat_template;
		model_seed(models[i].name, &cfg);
	}

	/* a tensor of every type the engine reads, and metadata of every value type */
	{
		gguf_writer *w = gguf_writer_new();
		static const ggml_type types[] = {
			GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
			GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K
		};
		/* bytes read as arrays of every fixed-size value type: extremes, NaN, bools of 0xFF */
		static const uint8_t pattern[16] = {
			0xFF, 0xFF, 0xFF, 0x7F, 0x00, 0x00, 0xC0, 0x7F, 0x01, 0x00, 0x00, 0x80, 0xFF, 0x00,
			0x00, 0x00
		};
		static const struct
		{
			gguf_value_type type;
			size_t		size;
		}			value_types[] = {
			{GGUF_TYPE_UINT8, 1}, {GGUF_TYPE_INT8, 1}, {GGUF_TYPE_UINT16, 2}, {GGUF_TYPE_INT16, 2},
			{GGUF_TYPE_UINT32, 4}, {GGUF_TYPE_INT32, 4}, {GGUF_TYPE_FLOAT32, 4}, {GGUF_TYPE_BOOL, 1},
			{GGUF_TYPE_UINT64, 8}, {GGUF_TYPE_INT64, 8}, {GGUF_TYPE_FLOAT64, 8},
		};
		static const char *const strs[] = {"", "a", "\xE2\x96\x81"};
		static const size_t str_lens[] = {0, 1, 3};
		float		x[512];

		for (int i = 0; i < 512; i++)
			x[i] = (float) ((i * 37) % 101 - 50) / 7.0f;
		gguf_writer_set_alignment(w, 64);
		gguf_writer_add_str(w, "general.architecture", "llama");
		gguf_writer_add_str_len(w, "t.str", "a\0b", 3);
		gguf_writer_add_arr_str_len(w, "t.arr_str", strs, str_lens, 3);
		for (size_t i = 0; i < sizeof(value_types) / sizeof(value_types[0]); i++)
		{
			char		key[32];

			snprintf(key, sizeof(key), "t.arr_%s", gguf_value_type_name(value_types[i].type));
			gguf_writer_add_arr(w, key, value_types[i].type, pattern,
								sizeof(pattern) / value_types[i].size);
		}
		for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		{
			int64_t		ne[2] = {256, 2};
			char		name[32];

			snprintf(name, sizeof(name), "tensor.%s", ggml_type_name(types[i]));
			gguf_writer_add_tensor_f32(w, name, 2, ne, types[i], x);
		}
		writer_seed("tensor-zoo.gguf", w);
	}

	/* tokenizers alone (the loader stops at the missing configuration) */
	{
		int			n = synth_model_n_merges();
		const char **merges = malloc(sizeof(char *) * n);
		static const char *const user[] = {"<tool_call>", "  "};

		FUZZ_CHECK(merges != NULL);
		for (int k = 0; k < n; k++)
			merges[k] = synth_model_merge(k);
		writer_seed("tokenizer-bpe.gguf",
					fixture_bpe_writer("smollm", fuzz_controls, FUZZ_N_CONTROLS, merges, n, user,
									   2, 1, 2, false));
		free(merges);
		writer_seed("tokenizer-spm.gguf", fixture_spm_writer(true, fuzz_controls, FUZZ_N_CONTROLS));
	}
}

/* ---- the structured targets ------------------------------------------------------------- */

static const char *const sample_texts[] = {
	"Hello world! It's 2024, and I'm testing 12345 tokens.\n\n  indented\ttab\r\n",
	"<|im_start|>user\nWhat is <|im_end|> doing here?<|im_end|>\n<|im_start|>assistant\n",
	"h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 \xE2\x96\x81the and world",
	"bad utf-8: \xFF\xFE \xC3 \xE2\x82 \xF0\x9F\x98 \xED\xA0\x80 \xC0\xAF end",
};

static void
tokenizer_seeds(void)
{
	for (int t = 0; t < FUZZ_N_TOKENIZERS; t++)
		for (size_t i = 0; i < sizeof(sample_texts) / sizeof(sample_texts[0]); i++)
		{
			seed		s = {.n = 0};
			char		name[32];

			put_u8(&s, (unsigned) t | (i % 2 ? 8 : 0) | (i == 3 ? 16 : 0));
			put_chunk(&s, 4096, sample_texts[i]);
			for (int k = 0; k < 40; k++)	/* ids, some of them byte tokens */
				put_u16(&s, (unsigned) (k * 37 + i * 11));
			snprintf(name, sizeof(name), "seed-%d-%zu", t, i);
			write_input("fuzz_tokenizer", name, &s);
		}
}

static void
reply_text_seeds(void)
{
	static const char *const stops[][3] = {
		{"\n\n", "llo", NULL}, {"\xE2\x96\x81", "world", NULL}, {"\x80", "\xF0\x9F", "<|im_end|>"},
	};

	for (size_t i = 0; i < sizeof(stops) / sizeof(stops[0]); i++)
		for (int t = 0; t < 2; t++)
		{
			seed		s = {.n = 0};
			char		name[32];
			int			n_stop = 0;
			const char *text = sample_texts[(i + t) % 4];

			while (n_stop < 3 && stops[i][n_stop])
				n_stop++;
			put_u8(&s, t ? FUZZ_N_BPE : 0);
			put_u8(&s, n_stop);
			for (int k = 0; k < n_stop; k++)
				put_chunk(&s, 24, stops[i][k]);
			/* the text one byte token at a time, with a take after every third */
			for (size_t k = 0; text[k]; k++)
			{
				unsigned	b = (unsigned char) text[k];

				put_u8(&s, 1);
				/* BPE: byte b is token FUZZ_N_CONTROLS + b; SentencePiece: <0xNN> is 3 + b */
				put_u16(&s, (t ? 3 + b : FUZZ_N_CONTROLS + b) + 4);
				if (k % 3 == 2)
					put_u8(&s, 0);
			}
			snprintf(name, sizeof(name), "seed-%zu-%d", i, t);
			write_input("fuzz_reply_text", name, &s);
		}
}

static void
chat_template_seeds(void)
{
	static const char *const jinjas[] = {
		"{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}<|im_start|>",
		"<|start_header_id|>{{ role }}<|end_header_id|>",
		"<start_of_turn>user",
		"<|user|>\n{{ content }}</s>",
		"[INST] <<SYS>>",
		"",
	};

	for (size_t i = 0; i < sizeof(jinjas) / sizeof(jinjas[0]); i++)
	{
		seed		s = {.n = 0};
		char		name[32];

		put_u8(&s, 1 | (i % 2 ? 2 : 0) | (unsigned) (i << 5));	/* gen prompt, truncate, tokenizer */
		put_u8(&s, (unsigned) i % 5);
		put_chunk(&s, 1024, jinjas[i]);
		put_chunk(&s, 16, "gemma3");
		put_chunk(&s, 16, "chatml");
		put_u16(&s, i % 3 ? 40 : 0);
		put_u8(&s, 4);			/* 1 + 4 messages */
		for (int m = 0; m < 5; m++)
		{
			put_u8(&s, m == 0 ? 0 : 1 + (m + 1) % 2);
			put_u8(&s, m == 2 ? 1 | (5 << 2) : 0);	/* stored ids, or content */
			put_chunk(&s, 256, sample_texts[(m + i) % 4]);
			if (m == 2)
				for (int k = 0; k < 24; k++)
					put_u16(&s, (unsigned) (k * 13 + 2));
		}
		snprintf(name, sizeof(name), "seed-%zu", i);
		write_input("fuzz_chat_template", name, &s);
	}
}

static void
prefix_cache_seeds(void)
{
	seed		s = {.n = 0};

	put_u8(&s, 23);				/* pool blocks - 1 */
	put_u8(&s, 16);				/* budget in blocks */
	put_u8(&s, 0);
	put_u16(&s, 7);				/* fingerprint */
	put_u16(&s, 0);
	for (int round = 0; round < 3; round++)
		for (unsigned seq = 0; seq < 3; seq++)
		{
			put_u8(&s, (seq << 4) | 0);	/* start: block, max blocks, alphabet, salt, n tokens */
			put_u8(&s, 0);
			put_u8(&s, 8);
			put_u8(&s, 1);
			put_u8(&s, seq % 2);
			put_u8(&s, 16 * (seq + 2) + round);
			for (unsigned k = 0; k < 16 * (seq + 2) + round; k++)
				put_u8(&s, k < 20 ? 0 : k);
			put_u8(&s, (seq << 4) | 3);	/* insert: block, all blocks */
			put_u8(&s, 0);
			put_u8(&s, 0);
			put_u8(&s, (seq << 4) | 6);	/* pin */
			put_u8(&s, seq);
			put_u8(&s, (seq << 4) | 5);	/* release */
			put_u8(&s, 0);
		}
	put_u8(&s, 8);				/* reclaim */
	put_u8(&s, 0);
	put_u8(&s, 10);
	put_u8(&s, 10 | 16);		/* the weak hash */
	put_u8(&s, 0);
	put_u8(&s, 11);				/* bad calls: block ids 6 and -61, token 5 */
	put_u8(&s, 0);
	put_u8(&s, 70);
	put_u8(&s, 3);
	put_u8(&s, 5);
	put_u8(&s, 9);				/* reset */
	put_u8(&s, 0);
	write_input("fuzz_prefix_cache", "seed-0", &s);
}

static void
tokenizer_load_seeds(void)
{
	static const char *const words[] = {
		"<|im_start|>", "<|im_end|>", "he", "ll", "hello", "\xC4\xA0w", "<s>", "", "he",
		"\xE2\x96\x81he", "<tool>", "  ",
	};
	static const uint8_t types[] = {3, 3, 1, 1, 1, 1, 3, 1, 1, 1, 4, 4};

	for (int model = 0; model < 2; model++)
	{
		seed		s = {.n = 0};
		int			n = (int) (sizeof(words) / sizeof(words[0]));
		char		name[32];

		put_u8(&s, model);		/* gpt2, llama */
		put_u8(&s, model ? 8 : 0);	/* pre: smollm, or none */
		put_u8(&s, 1);			/* the 256 byte tokens; types, scores and merges right */
		put_u16(&s, (unsigned) n);
		for (int i = 0; i < n; i++)
		{
			put_u8(&s, types[i] | 8);
			put_chunk(&s, 48, words[i]);
			put_u8(&s, (unsigned) i);	/* score -i */
		}
		put_u8(&s, 4);			/* merges: "h e", "l l", "he ll", "hell o" by token index */
		{
			static const int pairs[][2] = {{'h', 'e'}, {'l', 'l'}, {258, 259}, {260, 'o'}};

			for (int i = 0; i < 4; i++)
			{
				put_u8(&s, 0);
				put_u16(&s, (unsigned) pairs[i][0]);
				put_u16(&s, (unsigned) pairs[i][1]);
			}
		}
		for (int k = 0; k < 3; k++)	/* bos, eos, unk: the first three words */
		{
			put_u8(&s, 1);
			put_u16(&s, 256 + k);
		}
		put_u8(&s, 1 | 4);		/* add_bos true */
		put_u8(&s, model ? 1 | 4 : 0);	/* add_space_prefix */
		put_chunk(&s, 512, model ? "<start_of_turn>" : "<|im_start|>");
		put_bytes(&s, sample_texts[model], strlen(sample_texts[model]));
		snprintf(name, sizeof(name), "seed-%d", model);
		write_input("fuzz_tokenizer_load", name, &s);
	}
}

/* fuzz_model_shapes: configurations (see its header for the bytes), some with patches */
static void
model_shapes_seeds(void)
{
	static const uint8_t configs[][13] = {
		/* flags, weight type, embd type, layers, heads, kv, head_dim/8, d_model, d_ff, rope, ctx, seed */
		{0, 0, 0, 0, 3, 1, 0, 7, 15, 0x10, 0x27, 64, 1},	/* llama f32, 4 heads / 2 kv, d 32 */
		{1 | 2, 3, 3, 1, 1, 0, 2, 1, 3, 0x10, 0x27, 64, 2},	/* qwen2 q8_0 untied, head 16 */
		{8, 4, 5, 0, 3, 2, 3, 2, 1, 0x00, 0x01, 255, 3},	/* q4_0/q4_1, 4 heads of 24, GPTQ */
		{16 | 4, 1, 2, 1, 7, 3, 0, 15, 0, 0xff, 0xff, 8, 4},	/* f16/bf16, 8 heads, float reference */
		{0, 6, 8, 0, 3, 1, 8, 0, 1, 0x10, 0x27, 64, 5},	/* q4_k/q6_k, 4 heads of 64, d 256 */
	};
	for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++)
	{
		seed		s = {.n = 0};
		char		name[32];

		put_bytes(&s, configs[i], sizeof(configs[i]));
		if (i % 2)
			for (unsigned k = 0; k < 6; k++)	/* special values in a few tensors */
			{
				put_u8(&s, k * 3);
				put_u16(&s, k * 101);
				put_u8(&s, k);
			}
		snprintf(name, sizeof(name), "seed-%zu", i);
		write_input("fuzz_model_shapes", name, &s);
	}
}

/*
 * fuzz_block_weights: type index, rows - 1, k byte, GEMM rows - 1, tokens - 1, flags, scale
 * exponent + 40, the tensor's blocks, activations, biases (see its header comment).  Random
 * levels with small finite scales, one tensor with a NaN or infinite scale in a late block, a
 * k that is not whole K-quant blocks, and a type without a kernel.
 */
static void
block_weights_seeds(void)
{
	/* the target's type order; its d and dmin offsets */
	static const struct
	{
		ggml_type	type;
		int			d,
					dmin;
	}			types[] = {
		{GGML_TYPE_Q4_0, 0, -1}, {GGML_TYPE_Q4_1, 0, 2}, {GGML_TYPE_Q5_0, 0, -1},
		{GGML_TYPE_Q5_1, 0, 2}, {GGML_TYPE_Q8_0, 0, -1}, {GGML_TYPE_Q4_K, 0, 2},
		{GGML_TYPE_Q5_K, 0, 2}, {GGML_TYPE_Q6_K, 208, -1},
	};
	static const uint16_t bad_halves[] = {0x7e00, 0x7c00, 0xfc00};
	uint32_t	r = 12345;

	for (int i = 0; i < 8; i++)
		for (int variant = 0; variant < 2; variant++)
		{
			const ggml_type type = types[i].type;
			const int	per = (int) ggml_type_block_elems(type);
			const int	rows = variant ? 11 : 3;
			const int	n_tok = variant ? 5 : 1;
			const int	k = per == 256 ? 256 : 64;
			const size_t bb = ggml_type_block_bytes(type);
			const int	n_blocks = rows * (k / per);
			uint8_t		t[11 * 2 * 210];
			char		name[32];
			seed		s = {.n = 0};

			put_u8(&s, (unsigned) i);
			put_u8(&s, (unsigned) rows - 1);
			put_u8(&s, per == 256 ? 0 : 1);	/* k: one block of 256, or two of 32 */
			put_u8(&s, (unsigned) (variant ? 8 : 2));	/* GEMM rows - 1 */
			put_u8(&s, (unsigned) n_tok - 1);
			put_u8(&s, variant ? 7 : 0);	/* bias, accumulate, pool */
			put_u8(&s, 40 - 7);	/* activations int8 x 2^-7 */
			for (size_t b = 0; b < (size_t) n_blocks * bb; b++)
			{
				r = r * 1664525u + 1013904223u;
				t[b] = (uint8_t) (r >> 24);
			}
			for (int b = 0; b < n_blocks; b++)
			{
				uint16_t	d = cai_fp32_to_fp16(0.001f * (float) (1 + b % 17));
				uint16_t	m = cai_fp32_to_fp16(-0.002f * (float) (b % 5));

				memcpy(t + b * bb + types[i].d, &d, 2);
				if (types[i].dmin >= 0)
					memcpy(t + b * bb + types[i].dmin, &m, 2);
			}
			put_bytes(&s, t, (size_t) n_blocks * bb);
			for (int a = 0; a < n_tok * k + rows; a++)
				put_u8(&s, (unsigned) (a * 37 + 11) & 0xff);
			snprintf(name, sizeof(name), "seed-%s-%d", ggml_type_name(type), variant);
			write_input("fuzz_block_weights", name, &s);

			/* the same with a NaN or infinite scale in the last row */
			{
				const int	at = types[i].dmin >= 0 && variant ? types[i].dmin : types[i].d;
				const uint16_t h = bad_halves[(i + variant) % 3];

				memcpy(s.b + 7 + (size_t) (n_blocks - 1) * bb + at, &h, 2);
				snprintf(name, sizeof(name), "seed-%s-%d-bad-scale", ggml_type_name(type), variant);
				write_input("fuzz_block_weights", name, &s);
			}
		}
	{
		seed		s = {.n = 0};

		put_bytes(&s, "\x05\x00\x81\x00\x00\x00\x28", 7);	/* Q4_K, k = 64 */
		write_input("fuzz_block_weights", "seed-not-whole-blocks", &s);
		s.n = 0;
		put_bytes(&s, "\x09\x00\x00\x00\x00\x00\x28", 7);	/* f16 */
		write_input("fuzz_block_weights", "seed-unsupported", &s);
	}
}

/*
 * fuzz_weight_cache: a whole cache file as the CPU backend writes it (an int8 4 x 32 matrix, a
 * block matrix of 5 Q4_K rows over 3 Q6_K rows, k 256, with finite scales), and one with no
 * sections.
 */
static void
weight_cache_seeds(void)
{
	uint8_t		q4k[5 * 144],
				q6k[3 * 210];
	int8_t		q[4 * 32];
	float		scale[4] = {0.5f, 1.0f, 0.25f, 2.0f};
	cai_weight	i8,
				blocks;
	const cai_weight *list[2] = {&i8, &blocks};
	const char *names[2] = {"seed-int8-and-blocks", "seed-empty"};
	char		path[256];
	cai_wcache_writer *w;
	cai_error	err;

	memset(&i8, 0, sizeof(i8));
	memset(&blocks, 0, sizeof(blocks));
	for (size_t i = 0; i < sizeof(q4k); i++)
		q4k[i] = (uint8_t) (i * 29 + 7);
	for (size_t i = 0; i < sizeof(q6k); i++)
		q6k[i] = (uint8_t) (i * 13 + 3);
	for (int r = 0; r < 5; r++)
	{
		/* d = 1/64, dmin = 1/128 (fp16): finite, as the repacking requires */
		q4k[r * 144 + 0] = 0x00, q4k[r * 144 + 1] = 0x24;
		q4k[r * 144 + 2] = 0x00, q4k[r * 144 + 3] = 0x20;
	}
	for (int r = 0; r < 3; r++)
		q6k[r * 210 + 208] = 0x00, q6k[r * 210 + 209] = 0x24;
	for (int i = 0; i < 4 * 32; i++)
		q[i] = (int8_t) ((i * 11) % 255 - 127);
	i8.m = (cai_cpu_qmatrix) {.n_out = 4, .k = 32, .q = q, .scale = scale};
	blocks.n_parts = 2;
	if (!cai_cpu_qmatrix_pack(&i8.m) ||
		cai_cpu_bmatrix_pack(GGML_TYPE_Q4_K, q4k, 5, 256, &blocks.parts[0], &err) != CAI_OK ||
		cai_cpu_bmatrix_pack(GGML_TYPE_Q6_K, q6k, 3, 256, &blocks.parts[1], &err) != CAI_OK)
	{
		fprintf(stderr, "weight cache seeds: could not pack\n");
		exit(1);
	}
	for (int seed = 0; seed < 2; seed++)
	{
		uint8_t		buf[16384];
		FILE	   *f;
		size_t		n;

		snprintf(path, sizeof(path), "/tmp/cai_gen_corpus_%d.caiw", (int) getpid());
		if (cai_wcache_writer_open(path, 0x5eed0000 + seed, &w, &err) != CAI_OK ||
			(seed == 0 && cai_cpu_export_weights(list, 2, w, &err) != CAI_OK) ||
			cai_wcache_writer_commit(w, &err) != CAI_OK || !(f = fopen(path, "rb")))
		{
			fprintf(stderr, "weight cache seeds: %s\n", err.message);
			exit(1);
		}
		n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		unlink(path);
		write_seed("fuzz_weight_cache", names[seed], buf, n);
	}
	/* the int8 matrix was packed in place in q: only the block matrices own memory */
	cai_cpu_bmatrix_free(&blocks.parts[0]);
	cai_cpu_bmatrix_free(&blocks.parts[1]);
}

/*
 * fuzz_kv_disk: block files the disk tier wrote itself (store + flush) for both layouts, one and
 * three blocks deep, with and without a window part, each under a few flag bytes (lookups that
 * match, take a window part or not, expect another salt or token); then damaged ones: torn
 * (truncated), renamed, a flipped KV byte, a flipped token, another magic, a token count that
 * is no whole block, a window flag the size does not match; and some with mode 1, where the file
 * replaces a sound stand-in between the open and the lookup.
 */
static void
kv_disk_seed(const char *name, uint8_t flags, uint8_t mode, uint8_t token, const uint8_t *file,
			 size_t n)
{
	uint8_t    *buf = malloc(n + 3);

	buf[0] = flags;
	buf[1] = mode;
	buf[2] = token;
	memcpy(buf + 3, file, n);
	write_seed("fuzz_kv_disk", name, buf, n + 3);
	free(buf);
}

static void
kv_disk_seeds(void)
{
	static const struct
	{
		const char *name;
		int			which;
		int			depth;
		bool		window;
		uint8_t		flags;
	}			files[] = {
		{"seed-one-layer-1", 0, 1, true, 0x00},
		{"seed-one-layer-3-salt", 0, 3, true, 0x20},
		{"seed-windowed-1-window", 1, 1, true, 0x02},
		{"seed-windowed-1-window-none-free", 1, 1, true, 0x0a},
		{"seed-windowed-3-no-window", 1, 3, false, 0x02},
		{"seed-windowed-3-window-not-taken", 1, 3, true, 0x00},
		{"seed-windowed-1-token", 1, 1, true, 0x32},
		{"seed-windowed-1-over-budget", 1, 1, true, 0x42},
	};
	char		sub[17];

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
	{
		size_t		n;
		uint8_t    *f = fuzz_kvd_make_file(files[i].which, files[i].depth, files[i].window,
										   0x1234567890abcdefULL + i, 0xfeedULL + i, i & 1,
										   (uint64_t) i * 3, (unsigned) i, &n, sub);

		kv_disk_seed(files[i].name, (uint8_t) (files[i].flags | files[i].which), 0, (uint8_t) (i * 5),
					 f, n);
		if (i == 4)
		{
			/* the damaged ones, from a file with three blocks of tokens and no window part */
			uint8_t    *d = malloc(n);
			uint32_t	v;

			kv_disk_seed("seed-damaged-torn", 0x03, 0, 0, f, n - 100);
			kv_disk_seed("seed-damaged-renamed", 0x83, 0, 0, f, n);
			memcpy(d, f, n);
			d[n - 1] ^= 0x40;
			kv_disk_seed("seed-damaged-kv-byte", 0x03, 0, 0, d, n);
			memcpy(d, f, n);
			d[FUZZ_KVD_HEADER_BYTES + 4 * 20] ^= 1;
			kv_disk_seed("seed-damaged-token", 0x03, 0, 0, d, n);
			kv_disk_seed("seed-damaged-token-checksum-fixed", 0x07, 0, 0, d, n);
			memcpy(d, f, n);
			d[3] = 'X';
			kv_disk_seed("seed-damaged-magic", 0x07, 0, 0, d, n);
			memcpy(d, f, n);
			v = 40;
			memcpy(d + FUZZ_KVD_OFF_N_PREFIX, &v, 4);
			kv_disk_seed("seed-damaged-partial-block", 0x07, 0, 0, d, n);
			memcpy(d, f, n);
			v = 1;
			memcpy(d + FUZZ_KVD_OFF_FLAGS, &v, 4);
			kv_disk_seed("seed-damaged-window-flag", 0x07, 0, 0, d, n);
			free(d);
		}
		/* files that replace a sound stand-in after the open: the lookup's checks alone */
		if (i == 0)
		{
			kv_disk_seed("seed-swapped-same-size", 0x04, 1, 0, f, n);
			kv_disk_seed("seed-swapped-renamed", 0x84, 1, 0, f, n);
			kv_disk_seed("seed-swapped-torn", 0x04, 1, 0, f, n - 1);
		}
		/* a block's file with its window part over one without: the tier counted the old size */
		if (i == 2)
			kv_disk_seed("finding-swapped-window-part", 0x03, 1, 0, f, n);
		free(f);
	}
}

int
main(int argc, char **argv)
{
	if (argc != 2)
	{
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	out_dir = argv[1];
	gguf_seeds();
	tokenizer_seeds();
	reply_text_seeds();
	chat_template_seeds();
	prefix_cache_seeds();
	tokenizer_load_seeds();
	model_shapes_seeds();
	block_weights_seeds();
	weight_cache_seeds();
	kv_disk_seeds();
	return 0;
}
