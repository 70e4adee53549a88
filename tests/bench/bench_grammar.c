/*
 * bench_grammar.c — the cost of JSON-schema-constrained decoding (src/structured/grammar.h): schema
 * compile time, vocabulary index build time, and the mask (cai_grammar_state_allowed) and
 * accept (cai_grammar_state_accept) time per token along random valid generations.
 *
 * Not part of the Makefile; build and run by hand from the repository root:
 *
 *   make build/libcai.a
 *   gcc -O2 -std=gnu11 -pthread -Isrc/common -Isrc/gguf -Isrc/text \
 *       -Isrc/structured -Itests/unit -Itests/synth -o /tmp/bench_grammar \
 *       tests/bench/bench_grammar.c tests/synth/gguf_writer.c tests/synth/synth_model.c \
 *       build/libcai.a -lxxhash -lm -ldl
 *   /tmp/bench_grammar [model.gguf [generations [cases.json]]]
 *
 * The tokenizer is the model's (default models/SmolLM2-135M-Instruct.Q4_1.gguf, `make model`);
 * without one, the synthetic model's byte-level BPE vocabulary (a few hundred tokens, so the
 * figures then say little).  End tokens: EOS and <|im_end|>.
 *
 * A generation picks uniformly among the allowed tokens (an end token as soon as one is
 * allowed), at most 400 tokens; so strings run long (a closing quote is a small fraction of the
 * vocabulary) and numbers take many digits: about the worst case for masks inside strings.
 * Every mask is also checked: never empty before the value is complete.
 * With cases.json (tests/json_schema/cases.json: an array of {"name", "prompt", "schema"}), the
 * compile time of each of its schemas is printed too, and their total.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "grammar.h"
#include "json.h"
#include "synth_model.h"
#include "tokenizer.h"
#include "tokenizer_fixtures.h"

#define MAX_STEPS 400

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t
rng(void)
{
	uint64_t	x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static char large_enum[16384];
static char many_properties[16384];

static struct
{
	const char *name;
	const char *schema;			/* NULL: the any-object grammar */
}			schemas[] = {
	{"free string", "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}},\"required\":[\"text\"]}"},
	{"enums", "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\",\"dark red\"]},"
	 "\"size\":{\"enum\":[\"S\",\"M\",\"L\",\"XL\"]},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"color\",\"size\",\"ok\"]}"},
	{"nested objects", "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{"
	 "\"name\":{\"type\":\"string\",\"maxLength\":20},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
	 "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":30},"
	 "\"zip\":{\"type\":\"string\",\"minLength\":5,\"maxLength\":5}},\"required\":[\"city\"]}},"
	 "\"required\":[\"name\",\"age\",\"address\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":10},"
	 "\"maxItems\":3}},\"required\":[\"user\",\"tags\"]}"},
	{"bounded numbers", "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":100},"
	 "\"b\":{\"type\":\"number\",\"exclusiveMinimum\":-2.5,\"maximum\":1e6},\"c\":{\"type\":\"array\",\"items\":"
	 "{\"type\":\"number\"},\"minItems\":2,\"maxItems\":5}},\"required\":[\"a\",\"b\",\"c\"]}"},
	{"anyOf", "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":8},{\"type\":\"integer\"},"
	 "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"maxLength\":8},\"v\":{\"type\":\"null\"}},"
	 "\"required\":[\"k\"]},{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}},\"required\":[\"k\"]}]},"
	 "\"minItems\":1,\"maxItems\":6}"},
	{"json_object", NULL},
	{"enum of 300", large_enum},
	{"60 properties", many_properties},
};
#define N_SCHEMAS ((int) (sizeof(schemas) / sizeof(schemas[0])))

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return x < y ? -1 : x > y;
}

static cai_tokenizer *
synthetic_tokenizer(void)
{
	int			n = synth_model_n_merges();
	const char **merges = malloc(sizeof(char *) * n);
	static const char *const controls[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
	cai_tokenizer *tok;

	for (int k = 0; k < n; k++)
		merges[k] = synth_model_merge(k);
	tok = fixture_bpe("smollm", controls, 3, merges, n, NULL, 0, 1, 2, false);
	free(merges);
	return tok;
}

/* Compile time of every schema in a test-set file (an array of objects with a "schema"). */
static int
time_case_file(const char *path)
{
	FILE	   *f = fopen(path, "rb");
	char	   *text;
	long		len;
	json_doc   *doc;
	const json_value *root;
	cai_error	err;
	double		total_us = 0,
				max_us = 0;
	int			reps = 50;

	if (!f || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
	{
		fprintf(stderr, "%s: cannot read\n", path);
		return 1;
	}
	text = malloc(len);
	if (fread(text, 1, len, f) != (size_t) len || json_parse(text, len, 0, &doc, &err) != CAI_OK)
	{
		fprintf(stderr, "%s: not JSON\n", path);
		return 1;
	}
	fclose(f);
	root = json_doc_root(doc);
	if (root->type != JSON_ARRAY)
	{
		fprintf(stderr, "%s: not an array of cases\n", path);
		return 1;
	}
	printf("\n%-28s %10s\n", "test-set schema", "compile us");
	for (size_t i = 0; i < root->u.array.n; i++)
	{
		const json_value *c = root->u.array.items[i];
		const json_value *name = json_object_get(c, "name");
		const json_value *schema = json_object_get(c, "schema");
		cai_buf		buf = {0};
		cai_grammar *g = NULL;
		double		t0,
					us;

		if (!schema || !json_serialize(schema, &buf))
			return 1;
		t0 = now();
		for (int r = 0; r < reps; r++)
		{
			cai_grammar_free(g);
			g = NULL;
			if (cai_grammar_from_schema(buf.data, buf.len, &g, &err) != CAI_OK)
			{
				fprintf(stderr, "case %zu: %s\n", i, err.message);
				return 1;
			}
		}
		us = (now() - t0) / reps * 1e6;
		total_us += us;
		if (us > max_us)
			max_us = us;
		printf("%-28.*s %10.1f\n", name && name->type == JSON_STRING ? (int) name->u.string.len : 1,
			   name && name->type == JSON_STRING ? name->u.string.bytes : "?", us);
		cai_grammar_free(g);
		cai_buf_free(&buf);
	}
	printf("%zu schemas: %.1f us in all, %.1f us on average, %.1f us at most\n",
		   root->u.array.n, total_us, total_us / root->u.array.n, max_us);
	json_doc_free(doc);
	free(text);
	return 0;
}

int
main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	int			generations = argc > 2 ? atoi(argv[2]) : 20;
	gguf_file  *file = NULL;
	cai_tokenizer *tok = NULL;
	cai_token_index *ix;
	cai_error	err;
	int32_t		ends[2];
	int			n_ends = 0;
	double		t0;
	uint64_t   *bits;
	int			words;

	/* 300 names sharing prefixes; 60 optional properties of assorted types */
	{
		int			n = snprintf(large_enum, sizeof(large_enum), "{\"enum\":[");

		for (int i = 0; i < 300; i++)
			n += snprintf(large_enum + n, sizeof(large_enum) - n, "%s\"%s %s %d\"", i ? "," : "",
						  i % 3 ? "United" : "Republic of", i % 2 ? "States" : "Kingdom", i);
		snprintf(large_enum + n, sizeof(large_enum) - n, "]}");
		n = snprintf(many_properties, sizeof(many_properties), "{\"type\":\"object\",\"properties\":{");
		for (int i = 0; i < 60; i++)
			n += snprintf(many_properties + n, sizeof(many_properties) - n, "%s\"field_%d\":{\"type\":\"%s\"%s}",
						  i ? "," : "", i, i % 3 == 0 ? "string" : i % 3 == 1 ? "integer" : "boolean",
						  i % 3 == 0 ? ",\"maxLength\":12" : "");
		snprintf(many_properties + n, sizeof(many_properties) - n, "}}");
	}
	if (gguf_open(path, &file, &err) == CAI_OK && cai_tokenizer_load(file, &tok, &err) == CAI_OK)
		printf("tokenizer: %s, %d tokens\n", path, cai_tokenizer_n_vocab(tok));
	else
	{
		tok = synthetic_tokenizer();
		printf("tokenizer: synthetic (no %s), %d tokens\n", path, cai_tokenizer_n_vocab(tok));
	}
	ends[n_ends++] = cai_tokenizer_eos(tok);
	if (cai_tokenizer_find(tok, "<|im_end|>") >= 0 && cai_tokenizer_find(tok, "<|im_end|>") != ends[0])
		ends[n_ends++] = cai_tokenizer_find(tok, "<|im_end|>");

	t0 = now();
	if (cai_token_index_create(tok, ends, n_ends, &ix, &err) != CAI_OK)
	{
		fprintf(stderr, "index: %s\n", err.message);
		return 1;
	}
	printf("index build: %.1f ms\n\n", (now() - t0) * 1e3);
	words = cai_token_index_mask_words(ix);
	bits = malloc(words * sizeof(uint64_t));

	printf("%-16s %10s %7s %9s %9s %9s %9s %9s\n", "schema", "compile us", "tokens", "mask avg",
		   "mask p50", "mask p99", "mask max", "accept");
	for (int s = 0; s < N_SCHEMAS; s++)
	{
		cai_grammar *g = NULL;
		double		compile_us;
		double	   *mask_us = malloc(sizeof(double) * MAX_STEPS * generations);
		double		accept_total = 0,
					mask_total = 0;
		int			n_tokens = 0;
		int			reps = 200;

		t0 = now();
		for (int r = 0; r < reps; r++)
		{
			cai_grammar_free(g);
			if ((schemas[s].schema ? cai_grammar_from_schema(schemas[s].schema, strlen(schemas[s].schema), &g, &err) :
				 cai_grammar_any_object(&g, &err)) != CAI_OK)
			{
				fprintf(stderr, "%s: %s\n", schemas[s].name, err.message);
				return 1;
			}
		}
		compile_us = (now() - t0) / reps * 1e6;

		for (int gen = 0; gen < generations; gen++)
		{
			cai_grammar_state *st;

			if (cai_grammar_state_create(g, ix, &st, &err) != CAI_OK)
				return 1;
			for (int step = 0; step < MAX_STEPS; step++)
			{
				int32_t		allowed[64];
				int			n_allowed = 0,
							total = 0;
				int32_t		pick = -1;
				double		t1 = now(),
							t2;

				cai_grammar_state_allowed(st, bits);
				t2 = now();
				mask_us[n_tokens] = (t2 - t1) * 1e6;
				mask_total += t2 - t1;
				/* reservoir-sample one allowed token; an end token when there is one */
				for (int w = 0; w < words; w++)
					for (uint64_t b = bits[w]; b; b &= b - 1)
					{
						int32_t		id = w * 64 + __builtin_ctzll(b);

						total++;
						if (n_allowed < 64)
							allowed[n_allowed++] = id;
						else if (rng() % total < 64)
							allowed[rng() % 64] = id;
					}
				for (int e = 0; e < n_ends; e++)
					if (bits[ends[e] / 64] >> (ends[e] % 64) & 1)
						pick = ends[e];
				if (total == 0)
				{
					fprintf(stderr, "%s: empty mask at step %d\n", schemas[s].name, step);
					return 1;
				}
				if (pick < 0)
					pick = allowed[rng() % n_allowed];
				n_tokens++;
				t1 = now();
				if (!cai_grammar_state_accept(st, pick))
				{
					fprintf(stderr, "%s: allowed token %d refused\n", schemas[s].name, pick);
					return 1;
				}
				accept_total += now() - t1;
				if (pick == ends[0] || (n_ends > 1 && pick == ends[1]))
					break;
			}
			cai_grammar_state_free(st);
		}
		qsort(mask_us, n_tokens, sizeof(double), cmp_double);
		printf("%-16s %10.1f %7d %7.1fus %7.1fus %7.1fus %7.1fus %7.2fus\n", schemas[s].name,
			   compile_us, n_tokens, mask_total / n_tokens * 1e6, mask_us[n_tokens / 2],
			   mask_us[(int) (n_tokens * 0.99)], mask_us[n_tokens - 1], accept_total / n_tokens * 1e6);
		free(mask_us);
		cai_grammar_free(g);
	}
	free(bits);
	cai_token_index_free(ix);
	cai_tokenizer_free(tok);
	if (file)
		gguf_close(file);
	return argc > 3 ? time_case_file(argv[3]) : 0;
}
