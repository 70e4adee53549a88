/*
 * fuzz_json_schema.c — the JSON parser (json.c) and the JSON Schema compiler (json_schema.c)
 * on arbitrary bytes, then the compiled matcher (json_matcher.c) byte by byte.
 *
 * Input: the schema text, all of it.  Checks:
 *  - json_parse: a failure has a message naming a byte offset within the input; a success
 *    serializes to text that parses again and serializes to the same bytes;
 *  - cai_grammar_from_schema: CAI_OK, or CAI_ERR_INVALID_ARGUMENT with a message (never a
 *    crash, whatever the nesting, $ref web or number);
 *  - for a compiled schema, a walk of random bytes the matcher takes (seeded by the input):
 *    from every state some byte is taken until the value is complete (no dead ends), and the
 *    text, once complete, parses, is valid under the schema (json_validate.h), holds no
 *    \u0000 and keeps the whitespace and digit limits (for half the inputs, by the seed, a
 *    compact grammar's: one space at most, after ':' or ',').
 *
 * Built by tests/fuzz/fuzz.mk like every tests/fuzz/fuzz_*.c; by hand from the repository root:
 *
 *   clang -g -O1 -std=gnu11 -pthread -fsanitize=fuzzer,address,undefined \
 *       -fno-sanitize-recover=undefined -Isrc/common -Isrc/gguf -Isrc/text -Isrc/structured -Isrc/backend \
 *       -Itests/synth -Itests/unit \
 *       -Itests/fuzz -o build/fuzz/fuzz_json_schema tests/fuzz/fuzz_json_schema.c \
 *       src/structured/json.c src/structured/json_matcher.c src/structured/json_schema.c \
 *       src/structured/token_mask.c src/text/tokenizer.c src/gguf/gguf.c src/gguf/quant.c \
 *       src/text/unicode.c src/text/unicode_tables.c src/common/util.c \
 *       tests/synth/gguf_writer.c tests/synth/synth_model.c -lxxhash -lm
 *   build/fuzz/fuzz_json_schema -dict=tests/fuzz/fuzz_json_schema.dict tests/fuzz/corpus/fuzz_json_schema
 */
#include "fuzz_common.h"

#include "grammar.h"
#include "grammar_fixtures.h"
#include "json.h"
#include "json_matcher.h"

#define RANDOM_BYTES 48			/* then the walk heads for the end */
#define MAX_BYTES 400

static void
check_parser(const uint8_t *data, size_t size)
{
	json_doc   *doc = NULL,
			   *again = NULL;
	cai_error	err;
	cai_status	st = json_parse((const char *) data, size, 0, &doc, &err);
	cai_buf	a = {0},
				b = {0};

	if (st != CAI_OK)
	{
		const char *at = strstr(err.message, "at byte ");

		FUZZ_CHECK(st == CAI_ERR_INVALID_ARGUMENT || st == CAI_ERR_UNSUPPORTED ||
				   st == CAI_ERR_NO_MEMORY);
		FUZZ_CHECK(doc == NULL);
		FUZZ_CHECK(st == CAI_ERR_NO_MEMORY || (at && strtoull(at + 8, NULL, 10) <= size));
		return;
	}
	FUZZ_CHECK(json_serialize(json_doc_root(doc), &a));
	FUZZ_CHECK(json_parse(a.data, a.len, 0, &again, &err) == CAI_OK);
	FUZZ_CHECK(json_serialize(json_doc_root(again), &b));
	FUZZ_CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
	cai_buf_free(&a);
	cai_buf_free(&b);
	json_doc_free(doc);
	json_doc_free(again);
}

static uint64_t
next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* The first byte, in an order given by the rng, that the set at buf[off..) takes; -1: none. */
static int
some_byte(const cai_grammar *g, cai_buf *buf, size_t off, int n, uint64_t *rng, int *n_out)
{
	/* an odd stride visits all 256 bytes */
	unsigned	start = (unsigned) next_rand(rng) & 255,
				stride = ((unsigned) next_rand(rng) & 254) | 1;
	size_t		end = buf->len;

	for (unsigned i = 0; i < 256; i++)
	{
		int			b = (int) ((start + i * stride) & 255);
		int			m = gm_feed(g, buf, off, n, (uint8_t) b);

		FUZZ_CHECK(m >= 0);
		if (m > 0)
		{
			*n_out = m;
			return b;
		}
		buf->len = end;
	}
	return -1;
}

static bool
set_complete(const cai_grammar *g, const cai_buf *buf, size_t off, int n)
{
	for (int i = 0; i < n; i++)
	{
		const gm_thread *t = (const gm_thread *) (buf->data + off);

		if (gm_thread_complete(g, t))
			return true;
		off += gm_thread_bytes(t);
	}
	return false;
}

/* Random bytes the matcher takes, then closing bytes where they are taken, to the end. */
static void
walk_bytes(const cai_grammar *g, const char *schema, size_t schema_len, uint64_t seed)
{
	static const char closers[] = "\"}]0";
	cai_buf		buf = {0};
	size_t		off = 0;
	int			n = 1;
	char		text[MAX_BYTES];
	size_t		len = 0;
	uint64_t	rng = seed | 1;
	char	   *schema_z = malloc(schema_len + 1);
	char		problem_buf[CAI_ERROR_MESSAGE_SIZE];
	const char *problem;

	FUZZ_CHECK(schema_z != NULL);
	memcpy(schema_z, schema, schema_len);
	schema_z[schema_len] = '\0';
	FUZZ_CHECK(gm_start(g, g->root, &buf));
	while (len < MAX_BYTES)
	{
		size_t		next = buf.len;
		int			m = 0,
					b = -1;

		/* a complete value sometimes ends here (a number could still grow) */
		if (set_complete(g, &buf, off, n) && (len >= RANDOM_BYTES || next_rand(&rng) % 4 == 0))
			break;
		if (len >= RANDOM_BYTES)
			for (const char *c = closers; *c && b < 0; c++)
			{
				m = gm_feed(g, &buf, off, n, (uint8_t) *c);
				FUZZ_CHECK(m >= 0);
				if (m > 0)
					b = (unsigned char) *c;
			}
		if (b < 0)
			b = some_byte(g, &buf, off, n, &rng, &m);
		/* no dead ends: an incomplete value always takes some byte */
		if (b < 0)
		{
			if (!set_complete(g, &buf, off, n))
				fprintf(stderr, "dead end after %zu bytes: %.*s\n", len, (int) len, text);
			FUZZ_CHECK(set_complete(g, &buf, off, n));
			break;
		}
		text[len++] = (char) b;
		memmove(buf.data, buf.data + next, buf.len - next);
		buf.len -= next;
		off = 0;
		n = m;
	}
	if (set_complete(g, &buf, off, n))
	{
		problem = fixture_reply_problem(schema_z, text, len, problem_buf, sizeof(problem_buf));
		if (problem)
			fprintf(stderr, "\"%.*s\" %s\n", (int) len, text, problem);
		FUZZ_CHECK(problem == NULL);
		FUZZ_CHECK(g->whitespace != CAI_JSON_WS_COMPACT || jv_compact_ws(text, len));
	}
	free(schema_z);
	cai_buf_free(&buf);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cai_grammar *g = NULL;
	cai_error	err;
	cai_status	st;
	uint64_t	seed = 1469598103934665603ull;

	check_parser(data, size);
	st = cai_grammar_from_schema((const char *) data, size, &g, &err);
	if (st != CAI_OK)
	{
		FUZZ_CHECK(st == CAI_ERR_INVALID_ARGUMENT || st == CAI_ERR_NO_MEMORY);
		FUZZ_CHECK(g == NULL && err.message[0] != '\0');
		return 0;
	}
	FUZZ_CHECK(g->max_frames >= 2 && g->max_frames <= GM_MAX_FRAMES);
	FUZZ_CHECK(g->max_threads >= 1 && g->max_threads <= GM_MAX_THREADS);
	for (size_t i = 0; i < size; i++)
		seed = (seed ^ data[i]) * 1099511628211ull;
	cai_grammar_set_whitespace(g, (seed >> 17) & 1 ? CAI_JSON_WS_COMPACT : CAI_JSON_WS_FREE);
	walk_bytes(g, (const char *) data, size, seed);
	cai_grammar_free(g);
	return 0;
}
