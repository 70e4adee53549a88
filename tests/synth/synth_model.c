/*
 * synth_model.c — the synthetic-model generator (see synth_model.h).
 *
 * Weights come from a splitmix64 stream seeded per tensor by (config seed, tensor name), so a
 * tensor's values do not change when other tensors are added or removed (a 3-layer model
 * shares its first two layers with the 2-layer one of the same seed).  Scales keep activations
 * near unit size: projections have std 0.5/sqrt(fan_in), embeddings 2/sqrt(d_model) (logits of
 * a tied head then spread over a few units, so greedy choices are clear-cut), norm weights
 * 1 + 0.1 N(0,1) and qwen2 biases 0.1 N(0,1).
 */
#include "synth_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "quant.h"
#include "util.h"

/*
 * The merges, in rank order.  The first eight are SmolLM2's own first eight; the rest make
 * common English pieces ("Ġthe", "ing", "Hello", "Ġworld") so that tokenizer tests see
 * multi-level merges.  Every part is a byte token or an earlier merge's result (checked by
 * the unit tests).  Their count (65) makes the vocabulary 3 + 256 + 65 = 324, a multiple of 4.
 */
static const char *const merge_table[] = {
	"Ġ t", "Ġ a", "i n", "h e", "Ġ Ġ", "r e", "o n", "e r",
	"Ġt he", "a t", "Ġ s", "Ġ o", "e n", "Ġ c", "e s", "Ġ w",
	"n d", "i t", "o r", "i s", "a l", "Ġ p", "in g", "Ġ f",
	"a n", "e d", "Ġ b", "o u", "a r", "Ġ in", "Ġo f", "Ġ m",
	"Ġa nd", "i on", "i c", "Ġ d", "Ġt o", "ĠĠ ĠĠ", "l e", "r o",
	"a s", "en t", "Ġ h", "Ġt h", "c t", "Ġ e", "Ġ re", "e l",
	"l l", "Ġ l", "h i", "Ġh e", "l o", "Ġ n", "Ċ Ċ", "l d",
	"Ġw or", "Ġwor ld", "he ll", "hell o", "H e", "He ll", "Hell o", "Ġ y",
	"Ġy ou",
};

#define N_MERGES ((int) (sizeof(merge_table) / sizeof(merge_table[0])))
#define N_SPECIAL 3
#define N_VOCAB (N_SPECIAL + 256 + N_MERGES)

static const char *const special_tokens[N_SPECIAL] = {
	"<|endoftext|>", "<|im_start|>", "<|im_end|>"
};

/* SmolLM2-135M-Instruct's chat template, as its GGUF stores it. */
static const char default_chat_template[] =
"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
"{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
"<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
"'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
"{% endif %}";

/*
 * The 256 byte tokens as UTF-8 (GPT-2's bytes_to_unicode): byte token k (0..255) in vocabulary
 * order.  Printable bytes map to themselves, the 68 others in increasing order to U+0100 + n.
 */
static void
byte_token(int k, char *out)
{
	int			b;				/* the byte */
	unsigned	cp;				/* its code point */

	/* printable runs: '!'..'~' (94), '¡'..'¬' (12), '®'..'ÿ' (82): 188 in all */
	if (k < 94)
		b = 0x21 + k, cp = (unsigned) b;
	else if (k < 106)
		b = 0xa1 + (k - 94), cp = (unsigned) b;
	else if (k < 188)
		b = 0xae + (k - 106), cp = (unsigned) b;
	else
	{
		int			n = k - 188;	/* n-th non-printable byte */

		/* bytes 0x00-0x20 (33), 0x7f-0xa0 (34), 0xad (1) */
		if (n < 33)
			b = n;
		else if (n < 67)
			b = 0x7f + (n - 33);
		else
			b = 0xad;
		cp = 0x100 + (unsigned) n;
	}
	(void) b;
	if (cp < 0x80)
	{
		out[0] = (char) cp;
		out[1] = '\0';
	}
	else
	{
		out[0] = (char) (0xc0 | (cp >> 6));
		out[1] = (char) (0x80 | (cp & 0x3f));
		out[2] = '\0';
	}
}

/* Vocabulary size: specials, byte tokens, one token per merge. */
int
synth_model_n_vocab(void)
{
	return N_VOCAB;
}

/* The merge table's accessors. */
int
synth_model_n_merges(void)
{
	return N_MERGES;
}

const char *
synth_model_merge(int i)
{
	return i >= 0 && i < N_MERGES ? merge_table[i] : NULL;
}

/* Copies token i's text into buf (see synth_model.h for the id layout). */
int
synth_model_token(int i, char *buf, size_t cap)
{
	char		tmp[64];
	size_t		len;

	if (i < 0 || i >= N_VOCAB || !buf || cap == 0)
		return -1;
	if (i < N_SPECIAL)
		snprintf(tmp, sizeof(tmp), "%s", special_tokens[i]);
	else if (i < SYNTH_FIRST_MERGE_TOKEN)
		byte_token(i - SYNTH_FIRST_BYTE_TOKEN, tmp);
	else
	{
		/* the merge's two parts joined (a merge has exactly one space, between its parts) */
		const char *m = merge_table[i - SYNTH_FIRST_MERGE_TOKEN];
		size_t		o = 0;

		for (const char *p = m; *p && o + 1 < sizeof(tmp); p++)
		{
			if (*p != ' ')
				tmp[o++] = *p;
		}
		tmp[o] = '\0';
	}
	len = strlen(tmp);
	if (len + 1 > cap)
		return -1;
	memcpy(buf, tmp, len + 1);
	return (int) len;
}

/* The small llama described in synth_model.h. */
void
synth_model_default_config(synth_model_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->arch = "llama";
	cfg->name = "synthetic";
	cfg->n_layers = 2;
	cfg->d_model = 64;
	cfg->n_heads = 4;
	cfg->n_kv_heads = 2;
	cfg->head_dim = 0;
	cfg->d_ff = 128;
	cfg->context_length = 256;
	cfg->weight_type = GGML_TYPE_F32;
	cfg->embd_type = GGML_TYPE_F32;
	cfg->tied_embeddings = true;
	cfg->seed = 1;
	cfg->rope_base = 10000.0f;
	cfg->rms_eps = 1e-5f;
	cfg->tokenizer_pre = "smollm";
	cfg->chat_template = NULL;
	cfg->pooling_type = -1;
}

/* ---- deterministic random numbers ------------------------------------------------------- */

typedef struct synth_rng
{
	uint64_t	state;
} synth_rng;

/* splitmix64: a full-period 64-bit generator whose output is well mixed from any seed. */
static uint64_t
rng_next(synth_rng *r)
{
	uint64_t	z = (r->state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so that the logarithm below is finite. */
static double
rng_uniform(synth_rng *r)
{
	return ((double) (rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller, one value per call). */
static double
rng_normal(synth_rng *r)
{
	double		u1 = rng_uniform(r);
	double		u2 = rng_uniform(r);

	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* A stream for one tensor: the config seed mixed with the tensor's name. */
static void
rng_for_tensor(synth_rng *r, uint64_t seed, const char *name)
{
	uint64_t	h = 0xcbf29ce484222325ULL;

	for (const char *p = name; *p; p++)
	{
		h ^= (uint8_t) *p;
		h *= 0x100000001b3ULL;
	}
	r->state = seed ^ h;
	(void) rng_next(r);
}

/* ---- the model -------------------------------------------------------------------------- */

/* A tensor's generator state: its own stream and scale. */
typedef struct random_tensor
{
	synth_rng	r;
	double		mean;
	double		std;
} random_tensor;

static void
random_tensor_gen(void *state, float *x, int64_t n)
{
	random_tensor *t = state;

	for (int64_t i = 0; i < n; i++)
		x[i] = (float) (t->mean + t->std * rng_normal(&t->r));
}

/*
 * Adds one tensor of values mean + std * N(0, 1), generated when the file is written (so that
 * a model of billions of weights never sits in memory whole).
 */
static bool
add_random_tensor(gguf_writer *w, const synth_model_config *cfg, const char *name,
				  int64_t ne0, int64_t ne1, ggml_type type, double mean, double std)
{
	int64_t		ne[2] = {ne0, ne1};
	random_tensor t;

	rng_for_tensor(&t.r, cfg->seed, name);
	t.mean = mean;
	t.std = std;
	gguf_writer_add_tensor_gen(w, name, ne1 > 1 ? 2 : 1, ne, type, random_tensor_gen,
							   &t, sizeof(t));
	return true;
}

/* llama.cpp's general.file_type (LLAMA_FTYPE_*) for the weight type, as converters write it. */
static uint32_t
file_type_of(ggml_type t)
{
	switch (t)
	{
		case GGML_TYPE_F32:
			return 0;
		case GGML_TYPE_F16:
			return 1;
		case GGML_TYPE_Q4_0:
			return 2;
		case GGML_TYPE_Q4_1:
			return 3;
		case GGML_TYPE_Q8_0:
			return 7;
		case GGML_TYPE_Q4_K:
			return 15;			/* Q4_K_M */
		case GGML_TYPE_Q5_K:
			return 17;			/* Q5_K_M */
		case GGML_TYPE_Q6_K:
			return 18;
		case GGML_TYPE_BF16:
			return 32;
		default:
			return 0;
	}
}

/* True when rows of ne0 elements are whole blocks of type. */
static bool
row_fits(ggml_type type, int64_t ne0)
{
	int64_t		block = ggml_type_block_elems(type);

	return block > 0 && ne0 % block == 0;
}

/* Checks the config; fills *head_dim. */
static cai_status
check_config(const synth_model_config *cfg, int *head_dim, cai_error *err)
{
	static const ggml_type ok_types[] = {
		GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
		GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K
	};
	bool		wt_ok = false;
	bool		et_ok = false;

	if (!cfg->arch || (strcmp(cfg->arch, "llama") != 0 && strcmp(cfg->arch, "qwen2") != 0 &&
					   strcmp(cfg->arch, "qwen3") != 0 && strcmp(cfg->arch, "gemma3") != 0))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"synth: arch must be llama, qwen2, qwen3 or gemma3");
	if (strcmp(cfg->arch, "gemma3") == 0 && cfg->sliding_window < 1)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "synth: gemma3 needs a sliding window");
	if (cfg->llama3_factor > 0.0f &&
		(cfg->llama3_original_context < 1 ||
		 !(cfg->llama3_high_freq_factor > cfg->llama3_low_freq_factor) ||
		 !(cfg->llama3_low_freq_factor > 0.0f)))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "synth: llama3 rope scaling out of range");
	if (cfg->n_layers < 1 || cfg->d_model < 1 || cfg->n_heads < 1 || cfg->n_kv_heads < 1 ||
		cfg->d_ff < 1 || cfg->context_length < 1 || cfg->head_dim < 0 ||
		cfg->d_model > 65536 || cfg->d_ff > 262144 || cfg->n_layers > 1024)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "synth: sizes out of range");
	if (cfg->n_heads % cfg->n_kv_heads != 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"synth: n_heads %d is not a multiple of n_kv_heads %d",
						cfg->n_heads, cfg->n_kv_heads);
	*head_dim = cfg->head_dim;
	if (*head_dim == 0)
	{
		if (cfg->d_model % cfg->n_heads != 0)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"synth: d_model %d is not a multiple of n_heads %d",
							cfg->d_model, cfg->n_heads);
		*head_dim = cfg->d_model / cfg->n_heads;
	}
	for (size_t i = 0; i < sizeof(ok_types) / sizeof(ok_types[0]); i++)
	{
		wt_ok |= cfg->weight_type == ok_types[i];
		et_ok |= cfg->embd_type == ok_types[i];
	}
	if (!wt_ok || !et_ok)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "synth: weight or embedding type has no quantizer");
	if (!row_fits(cfg->embd_type, cfg->d_model) ||
		!row_fits(cfg->weight_type, cfg->d_model) ||
		!row_fits(cfg->weight_type, (int64_t) cfg->n_heads * *head_dim) ||
		!row_fits(cfg->weight_type, cfg->d_ff))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"synth: row lengths (d_model %d, n_heads*head_dim %d, d_ff %d) are not whole %s blocks",
						cfg->d_model, cfg->n_heads * *head_dim, cfg->d_ff,
						ggml_type_name(cfg->weight_type));
	return CAI_OK;
}

/* The vocabulary a model is written with (see synth_model_config.vocab_from and n_vocab). */
typedef struct synth_vocab
{
	int			n;
	char	  **tokens;			/* NUL-terminated copies */
	int32_t    *types;
	int			n_merges;
	char	  **merges;
	uint32_t	bos;
	uint32_t	eos;
	uint32_t	unk;
	uint32_t	pad;
} synth_vocab;

static void
vocab_free(synth_vocab *v)
{
	for (int i = 0; v->tokens && i < v->n; i++)
		free(v->tokens[i]);
	for (int i = 0; v->merges && i < v->n_merges; i++)
		free(v->merges[i]);
	free(v->tokens);
	free(v->types);
	free(v->merges);
	memset(v, 0, sizeof(*v));
}

static char *
copy_str(const char *p, size_t len)
{
	char	   *s = malloc(len + 1);

	if (s)
	{
		memcpy(s, p, len);
		s[len] = '\0';
	}
	return s;
}

/* Room for cap tokens (cap >= v->n). */
static bool
vocab_reserve(synth_vocab *v, int cap)
{
	char	  **t = realloc(v->tokens, (size_t) cap * sizeof(char *));
	int32_t    *ty;

	if (!t)
		return false;
	v->tokens = t;
	ty = realloc(v->types, (size_t) cap * sizeof(int32_t));
	if (!ty)
		return false;
	v->types = ty;
	return true;
}

/* The built-in vocabulary. */
static cai_status
vocab_builtin(synth_vocab *v, cai_error *err)
{
	if (!vocab_reserve(v, N_VOCAB) ||
		!(v->merges = calloc(N_MERGES, sizeof(char *))))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	for (; v->n < N_VOCAB; v->n++)
	{
		char		buf[64];
		int			len = synth_model_token(v->n, buf, sizeof(buf));

		if (len < 0 || !(v->tokens[v->n] = copy_str(buf, (size_t) len)))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
		v->types[v->n] = v->n < N_SPECIAL ? 3 : 1;
	}
	for (; v->n_merges < N_MERGES; v->n_merges++)
	{
		const char *m = merge_table[v->n_merges];

		if (!(v->merges[v->n_merges] = copy_str(m, strlen(m))))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	}
	v->bos = SYNTH_TOKEN_IM_START;
	v->eos = SYNTH_TOKEN_IM_END;
	v->unk = SYNTH_TOKEN_ENDOFTEXT;
	v->pad = SYNTH_TOKEN_IM_END;
	return CAI_OK;
}

/* Copies a string array of the file into fresh NUL-terminated strings. */
static bool
copy_str_array(const gguf_kv *kv, char **out, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
	{
		gguf_str	s;

		if (!gguf_arr_get_str(kv, i, &s) || !(out[i] = copy_str(s.ptr, (size_t) s.len)))
			return false;
	}
	return true;
}

/* The tokenizer of another (byte-level BPE) GGUF file. */
static cai_status
vocab_from_file(synth_vocab *v, const char *path, cai_error *err)
{
	gguf_file  *f;
	const gguf_kv *tk;
	const gguf_kv *ty;
	const gguf_kv *mg;
	char		model[32];
	cai_status	st = gguf_open(path, &f, err);

	if (st != CAI_OK)
		return st;
	tk = gguf_find_kv(f, "tokenizer.ggml.tokens");
	ty = gguf_find_kv(f, "tokenizer.ggml.token_type");
	mg = gguf_find_kv(f, "tokenizer.ggml.merges");
	if (!gguf_get_cstr(f, "tokenizer.ggml.model", model, sizeof(model)) ||
		strcmp(model, "gpt2") != 0 || !tk || tk->type != GGUF_TYPE_ARRAY ||
		tk->v.arr.elem_type != GGUF_TYPE_STRING || tk->v.arr.n < N_SPECIAL ||
		tk->v.arr.n > (1 << 22) || !mg || mg->type != GGUF_TYPE_ARRAY ||
		mg->v.arr.elem_type != GGUF_TYPE_STRING || mg->v.arr.n > (1 << 22))
	{
		gguf_close(f);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"synth: \"%s\" has no byte-level BPE (gpt2) tokenizer", path);
	}
	if (!vocab_reserve(v, (int) tk->v.arr.n) ||
		!(v->merges = calloc(mg->v.arr.n ? mg->v.arr.n : 1, sizeof(char *))))
	{
		gguf_close(f);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	}
	/* NULL first, so that vocab_free after a partial copy frees exactly what was copied */
	memset(v->tokens, 0, tk->v.arr.n * sizeof(char *));
	v->n = (int) tk->v.arr.n;
	v->n_merges = (int) mg->v.arr.n;
	if (!copy_str_array(tk, v->tokens, tk->v.arr.n) ||
		!copy_str_array(mg, v->merges, mg->v.arr.n))
		st = cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	for (int i = 0; st == CAI_OK && i < v->n; i++)
	{
		int64_t		t = 1;

		if (ty && ty->type == GGUF_TYPE_ARRAY && ty->v.arr.n == tk->v.arr.n)
			(void) gguf_arr_get_i64(ty, (uint64_t) i, &t);
		v->types[i] = (int32_t) t;
	}
	v->bos = SYNTH_TOKEN_IM_START;
	v->eos = SYNTH_TOKEN_IM_END;
	v->unk = SYNTH_TOKEN_ENDOFTEXT;
	v->pad = SYNTH_TOKEN_IM_END;
	(void) gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &v->bos);
	(void) gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &v->eos);
	(void) gguf_get_u32(f, "tokenizer.ggml.unknown_token_id", &v->unk);
	(void) gguf_get_u32(f, "tokenizer.ggml.padding_token_id", &v->pad);
	gguf_close(f);
	return st;
}

/* FNV-1a of a C string, for the padding's set of taken token texts. */
static uint64_t
str_hash(const char *s)
{
	uint64_t	h = 0xcbf29ce484222325ULL;

	for (; *s; s++)
	{
		h ^= (uint8_t) *s;
		h *= 0x100000001b3ULL;
	}
	return h;
}

/* Inserts s into the open-addressing set (cap a power of two); false if already there. */
static bool
set_insert(const char **set, size_t cap, const char *s)
{
	for (size_t i = str_hash(s) & (cap - 1);; i = (i + 1) & (cap - 1))
	{
		if (!set[i])
		{
			set[i] = s;
			return true;
		}
		if (strcmp(set[i], s) == 0)
			return false;
	}
}

/*
 * Pseudo-word k: two or more consonant-vowel syllables (k in base 100), every other one with
 * the leading-space mark "Ġ", as about half a real vocabulary's words have it.
 */
static void
pseudo_word(uint64_t k, char *out)
{
	static const char consonants[] = "bcdfghjklmnprstvwxyz";
	static const char vowels[] = "aeiou";
	size_t		o = 0;
	uint64_t	rest = k >> 1;
	int			syllables = 0;

	if (k & 1)
	{
		memcpy(out, "\xc4\xa0", 2);	/* Ġ */
		o = 2;
	}
	while (syllables < 2 || rest > 0)
	{
		out[o++] = consonants[(rest % 100) / 5];
		out[o++] = vowels[(rest % 100) % 5];
		rest /= 100;
		syllables++;
	}
	out[o] = '\0';
}

/* Pads the vocabulary to n tokens with pseudo-words no other token spells. */
static cai_status
vocab_pad(synth_vocab *v, int n, cai_error *err)
{
	size_t		cap = 1;
	const char **set;
	cai_status	st = CAI_OK;

	if (n <= v->n)
		return CAI_OK;
	while (cap < 2 * (size_t) n)
		cap <<= 1;
	set = calloc(cap, sizeof(char *));
	if (!set || !vocab_reserve(v, n))
	{
		free(set);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	}
	for (int i = 0; i < v->n; i++)
		(void) set_insert(set, cap, v->tokens[i]);
	for (uint64_t k = 0; v->n < n && st == CAI_OK; k++)
	{
		char		word[64];

		pseudo_word(k, word);
		if (!(v->tokens[v->n] = copy_str(word, strlen(word))))
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
		else if (!set_insert(set, cap, v->tokens[v->n]))
			free(v->tokens[v->n]);
		else
			v->types[v->n++] = 1;
	}
	free(set);
	return st;
}

/* The vocabulary the config asks for. */
static cai_status
vocab_build(const synth_model_config *cfg, synth_vocab *v, cai_error *err)
{
	cai_status	st;

	memset(v, 0, sizeof(*v));
	st = cfg->vocab_from ? vocab_from_file(v, cfg->vocab_from, err) : vocab_builtin(v, err);
	if (st == CAI_OK && cfg->n_vocab > 0 && cfg->n_vocab < v->n)
		st = cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
					  "synth: n_vocab %d is below the tokenizer's %d tokens", cfg->n_vocab, v->n);
	if (st == CAI_OK && cfg->n_vocab > (1 << 22))
		st = cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "synth: n_vocab %d is too large",
					  cfg->n_vocab);
	if (st == CAI_OK)
		st = vocab_pad(v, cfg->n_vocab, err);
	if (st != CAI_OK)
		vocab_free(v);
	return st;
}

/* Adds the tokenizer metadata. */
static void
add_tokenizer(gguf_writer *w, const synth_model_config *cfg, const synth_vocab *v)
{
	gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", false);
	gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", cfg->add_bos);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
	gguf_writer_add_str(w, "tokenizer.ggml.pre",
						cfg->tokenizer_pre ? cfg->tokenizer_pre : "smollm");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *) v->tokens,
							(uint64_t) v->n);
	gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types,
						(uint64_t) v->n);
	gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *) v->merges,
							(uint64_t) v->n_merges);
	gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", v->bos);
	gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", v->eos);
	gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", v->unk);
	gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", v->pad);
	gguf_writer_add_str(w, "tokenizer.chat_template",
						cfg->chat_template ? cfg->chat_template : default_chat_template);
}

/*
 * The Llama 3 RoPE divisors (see synth_model.h).  The converter works in float32 tensors; this
 * takes the frequency in float32 and the rest in double, which can differ in a factor's last bit
 * (immaterial: both the engine and llama.cpp read the factors from the written file).
 */
void
synth_model_llama3_rope_factors(const synth_model_config *cfg, int n_rot, float *out)
{
	double		factor = cfg->llama3_factor;
	double		low = cfg->llama3_low_freq_factor;
	double		high = cfg->llama3_high_freq_factor;
	double		old_ctx = cfg->llama3_original_context;
	double		low_wavelen = old_ctx / low;
	double		high_wavelen = old_ctx / high;

	for (int i = 0; i < n_rot / 2; i++)
	{
		float		freq = (float) (1.0 / pow((double) cfg->rope_base, (double) (2 * i) / n_rot));
		double		wavelen = 2.0 * M_PI / (double) freq;

		if (wavelen < high_wavelen)
			out[i] = 1.0f;
		else if (wavelen > low_wavelen)
			out[i] = (float) factor;
		else
		{
			double		smooth = (old_ctx / wavelen - low) / (high - low);

			out[i] = (float) (1.0 / ((1.0 - smooth) / factor + smooth));
		}
	}
}

/* Builds the whole model into a writer. */
static cai_status
build_model(gguf_writer *w, const synth_model_config *cfg, cai_error *err)
{
	const char *a = cfg->arch;
	char		key[128];
	int			head_dim = 0;
	int64_t		d = cfg->d_model;
	int64_t		q_dim;
	int64_t		kv_dim;
	cai_status	st;
	bool		qwen2;
	bool		qwen3;
	bool		gemma3;
	synth_vocab vocab;
	int64_t		n_vocab;

	st = check_config(cfg, &head_dim, err);
	if (st == CAI_OK)
		st = vocab_build(cfg, &vocab, err);
	if (st != CAI_OK)
		return st;
	n_vocab = vocab.n;
	q_dim = (int64_t) cfg->n_heads * head_dim;
	kv_dim = (int64_t) cfg->n_kv_heads * head_dim;
	qwen2 = strcmp(a, "qwen2") == 0;
	qwen3 = strcmp(a, "qwen3") == 0;
	gemma3 = strcmp(a, "gemma3") == 0;

#define ARCH_KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", a, suffix), key)
	gguf_writer_add_str(w, "general.architecture", a);
	gguf_writer_add_str(w, "general.type", "model");
	gguf_writer_add_str(w, "general.name", cfg->name ? cfg->name : "synthetic");
	gguf_writer_add_u32(w, ARCH_KEY("block_count"), (uint32_t) cfg->n_layers);
	gguf_writer_add_u32(w, ARCH_KEY("context_length"), (uint32_t) cfg->context_length);
	gguf_writer_add_u32(w, ARCH_KEY("embedding_length"), (uint32_t) cfg->d_model);
	gguf_writer_add_u32(w, ARCH_KEY("feed_forward_length"), (uint32_t) cfg->d_ff);
	gguf_writer_add_u32(w, ARCH_KEY("attention.head_count"), (uint32_t) cfg->n_heads);
	gguf_writer_add_u32(w, ARCH_KEY("attention.head_count_kv"), (uint32_t) cfg->n_kv_heads);
	gguf_writer_add_f32(w, ARCH_KEY("rope.freq_base"), cfg->rope_base);
	gguf_writer_add_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), cfg->rms_eps);
	gguf_writer_add_u32(w, "general.file_type", file_type_of(cfg->weight_type));
	gguf_writer_add_u32(w, ARCH_KEY("vocab_size"), (uint32_t) n_vocab);
	gguf_writer_add_u32(w, ARCH_KEY("rope.dimension_count"), (uint32_t) head_dim);
	if (gemma3)
		gguf_writer_add_u32(w, ARCH_KEY("attention.sliding_window"), (uint32_t) cfg->sliding_window);
	if (cfg->head_dim != 0)
	{
		gguf_writer_add_u32(w, ARCH_KEY("attention.key_length"), (uint32_t) head_dim);
		gguf_writer_add_u32(w, ARCH_KEY("attention.value_length"), (uint32_t) head_dim);
	}
	if (cfg->rope_scaling_factor > 0.0f)
	{
		gguf_writer_add_str(w, ARCH_KEY("rope.scaling.type"), "linear");
		gguf_writer_add_f32(w, ARCH_KEY("rope.scaling.factor"), cfg->rope_scaling_factor);
	}
	if (cfg->pooling_type >= 0)
		gguf_writer_add_u32(w, ARCH_KEY("pooling_type"), (uint32_t) cfg->pooling_type);
	if (cfg->non_causal)
		gguf_writer_add_bool(w, ARCH_KEY("attention.causal"), false);
#undef ARCH_KEY
	add_tokenizer(w, cfg, &vocab);
	vocab_free(&vocab);
	gguf_writer_add_u32(w, "general.quantization_version", 2);

	if (!add_random_tensor(w, cfg, "token_embd.weight", d, n_vocab, cfg->embd_type,
						   0.0, 2.0 / sqrt((double) d)))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	for (int l = 0; l < cfg->n_layers; l++)
	{
		struct
		{
			const char *suffix;
			int64_t		ne0;
			int64_t		ne1;
			bool		is_norm;
			bool		is_bias;
			bool		wanted;		/* by this architecture */
		}			parts[] = {
			{"attn_norm.weight", d, 1, true, false, true},
			{"attn_q.weight", d, q_dim, false, false, true},
			{"attn_k.weight", d, kv_dim, false, false, true},
			{"attn_v.weight", d, kv_dim, false, false, true},
			{"attn_q.bias", q_dim, 1, false, true, qwen2 || cfg->qkv_bias},
			{"attn_k.bias", kv_dim, 1, false, true, qwen2 || cfg->qkv_bias},
			{"attn_v.bias", kv_dim, 1, false, true, qwen2 || cfg->qkv_bias},
			{"attn_q_norm.weight", head_dim, 1, true, false, qwen3 || gemma3},
			{"attn_k_norm.weight", head_dim, 1, true, false, qwen3 || gemma3},
			{"attn_output.weight", q_dim, d, false, false, true},
			{"post_attention_norm.weight", d, 1, true, false, gemma3},
			{"ffn_norm.weight", d, 1, true, false, true},
			{"ffn_gate.weight", d, cfg->d_ff, false, false, true},
			{"ffn_up.weight", d, cfg->d_ff, false, false, true},
			{"ffn_down.weight", cfg->d_ff, d, false, false, true},
			{"post_ffw_norm.weight", d, 1, true, false, gemma3},
		};

		for (size_t p = 0; p < sizeof(parts) / sizeof(parts[0]); p++)
		{
			char		name[96];
			bool		ok;

			if (!parts[p].wanted)
				continue;
			snprintf(name, sizeof(name), "blk.%d.%s", l, parts[p].suffix);
			if (parts[p].is_norm)
				ok = add_random_tensor(w, cfg, name, parts[p].ne0, 1, GGML_TYPE_F32, 1.0, 0.1);
			else if (parts[p].is_bias)
				ok = add_random_tensor(w, cfg, name, parts[p].ne0, 1, GGML_TYPE_F32, 0.0, 0.1);
			else
				ok = add_random_tensor(w, cfg, name, parts[p].ne0, parts[p].ne1,
									   cfg->weight_type, 0.0,
									   0.5 / sqrt((double) parts[p].ne0));
			if (!ok)
				return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
		}
	}
	if (!add_random_tensor(w, cfg, "output_norm.weight", d, 1, GGML_TYPE_F32, 1.0, 0.1))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	if (cfg->llama3_factor > 0.0f)
	{
		float		factors[512];
		int64_t		ne[1] = {head_dim / 2};

		if (head_dim > 1024)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "synth: head size too large");
		synth_model_llama3_rope_factors(cfg, head_dim, factors);
		gguf_writer_add_tensor_f32(w, "rope_freqs.weight", 1, ne, GGML_TYPE_F32, factors);
	}
	if (!cfg->tied_embeddings &&
		!add_random_tensor(w, cfg, "output.weight", d, n_vocab, cfg->weight_type,
						   0.0, 2.0 / sqrt((double) d)))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	return CAI_OK;
}

/* Builds the model in memory; the image is malloc'd. */
cai_status
synth_model_write_buffer(const synth_model_config *cfg, uint8_t **data, size_t *size,
						 cai_error *err)
{
	gguf_writer *w = gguf_writer_new();
	cai_status	st;

	*data = NULL;
	*size = 0;
	if (!w)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	st = build_model(w, cfg, err);
	if (st == CAI_OK && !gguf_writer_write_buffer(w, data, size))
		st = cai_fail(err, CAI_ERR_INTERNAL, "synth: %s", gguf_writer_error(w));
	gguf_writer_free(w);
	return st;
}

/* Builds the model and streams it to path, a tensor at a time. */
cai_status
synth_model_write(const char *path, const synth_model_config *cfg, cai_error *err)
{
	gguf_writer *w = gguf_writer_new();
	cai_status	st;

	if (!w)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "synth: out of memory");
	st = build_model(w, cfg, err);
	if (st == CAI_OK && !gguf_writer_write_file(w, path))
		st = cai_fail(err, CAI_ERR_IO, "synth: %s", gguf_writer_error(w));
	gguf_writer_free(w);
	return st;
}
