/*
 * test_quant.c — ggml block formats and the int8 row quantizer.
 *
 * Every dequantizer is checked against values the test computes itself, element by element,
 * from the published block layout (an element index -> byte and bit formula, not the decoder's
 * loop structure), on blocks built from chosen field values: fp16 scales of both signs, negative
 * mins, every nibble position, 6-bit K-quant scales above 15 (so that their packed high bits
 * matter).  Vectors from the `gguf` Python package's dequantizer (test_quant_vectors.h) check
 * the same decoders against an implementation written by others.  Round trips through the
 * writer's quantizers check the error bounds it documents.
 */
#include <stdint.h>
#include <stdlib.h>

#include "test.h"
#include "gguf_writer.h"
#include "quant.h"
#include "test_quant_vectors.h"
#include "util.h"

/* A small deterministic generator for the tests' random bytes and floats. */
static uint64_t
test_rng(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static float
test_uniform(uint64_t *s, float lo, float hi)
{
	return lo + (hi - lo) * (float) ((test_rng(s) >> 40) * (1.0 / 16777216.0));
}

static void
put_half(uint8_t *p, float f)
{
	uint16_t	h = cai_fp32_to_fp16(f);

	memcpy(p, &h, 2);
}

static float
get_half(const uint8_t *p)
{
	uint16_t	h;

	memcpy(&h, p, 2);
	return cai_fp16_to_fp32(h);
}

/* Sets bit field [shift, shift + width) of *byte to v. */
static void
set_bits(uint8_t *byte, int shift, int width, unsigned v)
{
	unsigned	mask = ((1u << width) - 1) << shift;

	*byte = (uint8_t) ((*byte & ~mask) | ((v << shift) & mask));
}

TEST(quant_block_sizes)
{
	/* sizes from ggml's block structs */
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_F32), 4);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_F16), 2);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_BF16), 2);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q4_0), 18);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q4_1), 20);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q5_0), 22);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q5_1), 24);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q8_0), 34);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q8_1), 36);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q2_K), 84);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q3_K), 110);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q4_K), 144);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q5_K), 176);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q6_K), 210);
	CHECK_EQ_INT(ggml_type_block_bytes(GGML_TYPE_Q8_K), 292);
	CHECK_EQ_INT(ggml_type_block_elems(GGML_TYPE_Q4_0), 32);
	CHECK_EQ_INT(ggml_type_block_elems(GGML_TYPE_Q6_K), 256);
	CHECK_EQ_INT(ggml_type_block_elems(GGML_TYPE_F16), 1);
	CHECK_EQ_INT(ggml_type_block_elems((ggml_type) 4), 0);		/* removed Q4_2 */
	CHECK_EQ_INT(ggml_type_block_bytes((ggml_type) 99), 0);
	CHECK(strcmp(ggml_type_name(GGML_TYPE_Q4_K), "q4_k") == 0);
	CHECK(strcmp(ggml_type_name(GGML_TYPE_BF16), "bf16") == 0);
	CHECK(strcmp(ggml_type_name((ggml_type) 99), "unknown") == 0);
	CHECK(ggml_type_can_dequantize(GGML_TYPE_Q5_K));
	CHECK(ggml_type_can_dequantize(GGML_TYPE_Q5_0));
	CHECK(ggml_type_can_dequantize(GGML_TYPE_Q5_1));
	CHECK(!ggml_type_can_dequantize(GGML_TYPE_Q8_1));
	CHECK(!ggml_type_can_dequantize(GGML_TYPE_Q2_K));
}

TEST(quant_row_bytes)
{
	size_t		n;

	CHECK(ggml_row_bytes(GGML_TYPE_Q4_1, 576, &n));
	CHECK_EQ_INT(n, 18 * 20);
	CHECK(ggml_row_bytes(GGML_TYPE_Q6_K, 512, &n));
	CHECK_EQ_INT(n, 420);
	CHECK(ggml_row_bytes(GGML_TYPE_F32, 0, &n));
	CHECK_EQ_INT(n, 0);
	CHECK(!ggml_row_bytes(GGML_TYPE_Q4_0, 33, &n));		/* partial block */
	CHECK(!ggml_row_bytes(GGML_TYPE_Q4_K, 128, &n));
	CHECK(!ggml_row_bytes(GGML_TYPE_F32, -4, &n));
	CHECK(!ggml_row_bytes((ggml_type) 5, 32, &n));
	/* 2^62 F32 elements: 2^64 bytes overflows */
	CHECK(!ggml_row_bytes(GGML_TYPE_F32, INT64_C(1) << 62, &n));
	CHECK(ggml_row_bytes(GGML_TYPE_F32, INT64_C(1) << 60, &n));
}

TEST(quant_dequant_f32_f16_bf16)
{
	float		f32[3] = {1.5f, -0.0f, 3.25e-7f};
	/* fp16 bit patterns and their exact values */
	uint16_t	f16[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x3555, 0x8400};
	float		f16_expect[6] = {1.0f, -2.0f, 65504.0f, 5.9604644775390625e-8f,
	0.333251953125f, -6.103515625e-05f};
	uint16_t	bf16[3] = {0x3f80, 0xc049, 0x0000};
	float		bf16_expect[3] = {1.0f, -3.140625f, 0.0f};
	float		out[6];
	cai_error	err;

	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_F32, f32, out, 3, &err), CAI_OK);
	for (int i = 0; i < 3; i++)
		CHECK(out[i] == f32[i]);
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_F16, f16, out, 6, &err), CAI_OK);
	for (int i = 0; i < 6; i++)
		CHECK_MSG(out[i] == f16_expect[i], "f16 %d: %g != %g", i, out[i], f16_expect[i]);
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_BF16, bf16, out, 3, &err), CAI_OK);
	for (int i = 0; i < 3; i++)
		CHECK(out[i] == bf16_expect[i]);
}

TEST(quant_dequant_q8_0)
{
	uint8_t		blocks[2 * 34];
	float		out[64];
	cai_error	err;

	/* block 0: d = 0.25, q = -128..; block 1: d = -1.5, q = 127 - 3j */
	put_half(blocks, 0.25f);
	put_half(blocks + 34, -1.5f);
	for (int j = 0; j < 32; j++)
	{
		blocks[2 + j] = (uint8_t) (int8_t) (-128 + 8 * j);
		blocks[36 + j] = (uint8_t) (int8_t) (127 - 3 * j);
	}
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q8_0, blocks, out, 64, &err), CAI_OK);
	for (int j = 0; j < 32; j++)
	{
		CHECK(out[j] == 0.25f * (float) (-128 + 8 * j));
		CHECK(out[32 + j] == -1.5f * (float) (127 - 3 * j));
	}
}

TEST(quant_dequant_q4_0)
{
	uint8_t		blocks[2 * 18];
	float		out[64];
	cai_error	err;

	/* every nibble value appears in both the low (elements 0..15) and high (16..31) halves */
	put_half(blocks, -1.5f);
	put_half(blocks + 18, 0.0078125f);
	for (int j = 0; j < 16; j++)
	{
		blocks[2 + j] = (uint8_t) (j | ((15 - j) << 4));
		blocks[20 + j] = (uint8_t) (((j * 7) & 15) | (((j * 5 + 3) & 15) << 4));
	}
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q4_0, blocks, out, 64, &err), CAI_OK);
	for (int e = 0; e < 32; e++)
	{
		int			q0 = e < 16 ? e : 15 - (e - 16);
		int			q1 = e < 16 ? (e * 7) & 15 : ((e - 16) * 5 + 3) & 15;

		CHECK_MSG(out[e] == -1.5f * (float) (q0 - 8), "block 0 element %d", e);
		CHECK_MSG(out[32 + e] == 0.0078125f * (float) (q1 - 8), "block 1 element %d", e);
	}
}

TEST(quant_dequant_q4_1)
{
	uint8_t		blocks[2 * 20];
	float		out[64];
	cai_error	err;

	put_half(blocks, 0.5f);
	put_half(blocks + 2, -3.25f);		/* a negative min */
	put_half(blocks + 20, -0.125f);
	put_half(blocks + 22, 100.0f);
	for (int j = 0; j < 16; j++)
	{
		blocks[4 + j] = (uint8_t) (j | ((15 - j) << 4));
		blocks[24 + j] = (uint8_t) (((j + 9) & 15) | ((j * 3 & 15) << 4));
	}
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q4_1, blocks, out, 64, &err), CAI_OK);
	for (int e = 0; e < 32; e++)
	{
		int			q0 = e < 16 ? e : 31 - e;
		int			q1 = e < 16 ? (e + 9) & 15 : ((e - 16) * 3) & 15;

		CHECK_MSG(out[e] == 0.5f * (float) q0 - 3.25f, "block 0 element %d", e);
		CHECK_MSG(out[32 + e] == -0.125f * (float) q1 + 100.0f, "block 1 element %d", e);
	}
}

/*
 * Q5_0 and Q5_1 blocks by hand: qh = 0x80000001 (little-endian bytes 01 00 00 80) sets the
 * 5th bit of element 0 (low nibble of qs[0]) and element 31 (high nibble of qs[15]) only.
 * qs[j] = j | (15 - j) << 4, so element e < 16 holds e and element e >= 16 holds 31 - e.
 */
static int
q5_hand_value(int e)
{
	int			low4 = e < 16 ? e : 31 - e;

	return low4 + ((e == 0 || e == 31) ? 16 : 0);
}

TEST(quant_dequant_q5_0)
{
	uint8_t		blocks[2 * 22] = {0};
	float		out[64];
	cai_error	err;

	put_half(blocks, 0.5f);
	blocks[2] = 0x01;
	blocks[5] = 0x80;
	for (int j = 0; j < 16; j++)
		blocks[6 + j] = (uint8_t) (j | ((15 - j) << 4));
	/* block 1: every 5th bit set, all nibbles 0xf: every value 31 - 16 = 15 */
	put_half(blocks + 22, -2.0f);
	memset(blocks + 24, 0xff, 4 + 16);
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q5_0, blocks, out, 64, &err), CAI_OK);
	/* a few values spelled out: element 0 = (0 | 16) - 16, element 1 = 1 - 16, 31 = 16 + 0 */
	CHECK(out[0] == 0.0f);
	CHECK(out[1] == -7.5f);
	CHECK(out[16] == 0.5f * (15 - 16));
	CHECK(out[31] == 0.0f);
	for (int e = 0; e < 32; e++)
	{
		CHECK_MSG(out[e] == 0.5f * (float) (q5_hand_value(e) - 16), "block 0 element %d", e);
		CHECK_MSG(out[32 + e] == -30.0f, "block 1 element %d", e);
	}
}

TEST(quant_dequant_q5_1)
{
	uint8_t		blocks[2 * 24] = {0};
	float		out[64];
	cai_error	err;

	put_half(blocks, 0.25f);
	put_half(blocks + 2, -1.0f);
	blocks[4] = 0x01;
	blocks[7] = 0x80;
	for (int j = 0; j < 16; j++)
		blocks[8 + j] = (uint8_t) (j | ((15 - j) << 4));
	/* block 1: qh bit 16 only (element 16 = high nibble of qs[0]), nibbles zero */
	put_half(blocks + 24, 2.0f);
	put_half(blocks + 26, 3.0f);
	blocks[28 + 2] = 0x01;
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q5_1, blocks, out, 64, &err), CAI_OK);
	CHECK(out[0] == 3.0f);		/* 16 * 0.25 - 1 */
	CHECK(out[31] == 3.0f);
	CHECK(out[5] == 0.25f);		/* 5 * 0.25 - 1 */
	for (int e = 0; e < 32; e++)
	{
		CHECK_MSG(out[e] == 0.25f * (float) q5_hand_value(e) - 1.0f, "block 0 element %d", e);
		CHECK_MSG(out[32 + e] == (e == 16 ? 35.0f : 3.0f), "block 1 element %d", e);
	}
}

/*
 * K-quant scale packing written from the format's description, bit field by bit field:
 * sub-blocks 0-3: scale in bits 0-5 of byte s, min in bits 0-5 of byte s+4;
 * sub-blocks 4-7: scale low 4 bits in bits 0-3 of byte s+4, min low 4 bits in bits 4-7 of
 * byte s+4, scale high 2 bits in bits 6-7 of byte s-4, min high 2 bits in bits 6-7 of byte s.
 */
static void
build_k_scales(const int *sc, const int *m, uint8_t *bytes)
{
	memset(bytes, 0, 12);
	for (int s = 0; s < 8; s++)
	{
		if (s < 4)
		{
			set_bits(&bytes[s], 0, 6, (unsigned) sc[s]);
			set_bits(&bytes[s + 4], 0, 6, (unsigned) m[s]);
		}
		else
		{
			set_bits(&bytes[s + 4], 0, 4, (unsigned) sc[s] & 15);
			set_bits(&bytes[s + 4], 4, 4, (unsigned) m[s] & 15);
			set_bits(&bytes[s - 4], 6, 2, (unsigned) sc[s] >> 4);
			set_bits(&bytes[s], 6, 2, (unsigned) m[s] >> 4);
		}
	}
}

/* Fills the Q4_K/Q5_K header of a block at p and returns d, dmin. */
static void
build_k_header(uint8_t *p, float d, float dmin, const int *sc, const int *m)
{
	put_half(p, d);
	put_half(p + 2, dmin);
	build_k_scales(sc, m, p + 4);
}

TEST(quant_dequant_q4_k)
{
	/* scales and mins up to 63 (high bits set) with varied patterns */
	const int	sc[2][8] = {{1, 17, 63, 32, 5, 48, 33, 63}, {63, 0, 16, 31, 47, 2, 60, 15}};
	const int	m[2][8] = {{0, 63, 20, 7, 59, 1, 36, 16}, {12, 48, 63, 0, 17, 33, 5, 62}};
	const float d[2] = {0.01171875f, -0.25f};
	const float dmin[2] = {0.0234375f, 0.5f};
	uint8_t		blocks[2 * 144];
	float		out[512];
	uint64_t	rs = 12345;
	cai_error	err;

	for (int b = 0; b < 2; b++)
	{
		uint8_t    *p = blocks + 144 * b;

		build_k_header(p, d[b], dmin[b], sc[b], m[b]);
		for (int i = 0; i < 128; i++)
			p[16 + i] = (uint8_t) test_rng(&rs);
	}
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q4_K, blocks, out, 512, &err), CAI_OK);
	for (int b = 0; b < 2; b++)
	{
		const uint8_t *qs = blocks + 144 * b + 16;

		for (int e = 0; e < 256; e++)
		{
			int			s = e / 32;		/* sub-block */
			int			byte = 32 * (e / 64) + e % 32;
			int			q = (s % 2 == 0) ? (qs[byte] & 15) : (qs[byte] >> 4);
			float		expect = d[b] * (float) sc[b][s] * (float) q - dmin[b] * (float) m[b][s];

			CHECK_MSG(fabsf(out[256 * b + e] - expect) <= 1e-6f * (1.0f + fabsf(expect)),
					  "block %d element %d: %g != %g", b, e, out[256 * b + e], expect);
		}
	}
}

TEST(quant_dequant_q5_k)
{
	const int	sc[8] = {63, 16, 1, 40, 32, 17, 0, 55};
	const int	m[8] = {5, 0, 63, 18, 49, 31, 62, 16};
	const float d = -0.0625f;
	const float dmin = 0.001953125f;
	uint8_t		block[176];
	float		out[256];
	uint64_t	rs = 777;
	cai_error	err;

	build_k_header(block, d, dmin, sc, m);
	for (int i = 16; i < 176; i++)
		block[i] = (uint8_t) test_rng(&rs);
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q5_K, block, out, 256, &err), CAI_OK);
	for (int e = 0; e < 256; e++)
	{
		const uint8_t *qh = block + 16;
		const uint8_t *qs = block + 48;
		int			s = e / 32;
		int			l = e % 32;
		int			byte = 32 * (e / 64) + l;
		int			low = (s % 2 == 0) ? (qs[byte] & 15) : (qs[byte] >> 4);
		int			high = (qh[l] >> s) & 1;	/* sub-block s uses bit s of qh[l] */
		float		expect = d * (float) sc[s] * (float) (low + 16 * high) - dmin * (float) m[s];

		CHECK_MSG(fabsf(out[e] - expect) <= 1e-6f * (1.0f + fabsf(expect)),
				  "element %d: %g != %g", e, out[e], expect);
	}
}

TEST(quant_dequant_q6_k)
{
	uint8_t		blocks[2 * 210];
	float		out[512];
	uint64_t	rs = 4242;
	const float d[2] = {0.0009765625f, -0.5f};
	cai_error	err;

	for (int b = 0; b < 2; b++)
	{
		uint8_t    *p = blocks + 210 * b;

		for (int i = 0; i < 192; i++)
			p[i] = (uint8_t) test_rng(&rs);
		for (int s = 0; s < 16; s++)
			p[192 + s] = (uint8_t) (int8_t) (s % 2 ? -(s * 8) - 1 : s * 8 + 1);	/* +-, incl. -121 */
		put_half(p + 208, d[b]);
	}
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q6_K, blocks, out, 512, &err), CAI_OK);
	for (int b = 0; b < 2; b++)
	{
		const uint8_t *ql = blocks + 210 * b;
		const uint8_t *qh = ql + 128;
		const int8_t *sc = (const int8_t *) (ql + 192);

		for (int e = 0; e < 256; e++)
		{
			int			h = e / 128;		/* which half */
			int			k = (e % 128) / 32; /* which 32-element quarter of the half */
			int			l = e % 32;
			int			low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
			int			high = (qh[32 * h + l] >> (2 * k)) & 3;
			float		expect = d[b] * (float) sc[e / 16] * (float) ((low | (high << 4)) - 32);

			CHECK_MSG(fabsf(out[256 * b + e] - expect) <= 1e-6f * (1.0f + fabsf(expect)),
					  "block %d element %d: %g != %g", b, e, out[256 * b + e], expect);
		}
	}
}

TEST(quant_dequant_errors)
{
	uint8_t		block[210] = {0};
	float		out[256];
	cai_error	err;

	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q8_1, block, out, 32, &err), CAI_ERR_UNSUPPORTED);
	CHECK(strstr(err.message, "q8_1") != NULL);
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q3_K, block, out, 256, &err), CAI_ERR_UNSUPPORTED);
	CHECK_EQ_INT(cai_dequantize_row((ggml_type) 77, block, out, 32, &err), CAI_ERR_UNSUPPORTED);
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q4_0, block, out, 48, &err),
				 CAI_ERR_INVALID_ARGUMENT);
	CHECK(err.message[0] != '\0');
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q6_K, block, out, 128, &err),
				 CAI_ERR_INVALID_ARGUMENT);
}

/* Blocks and expected floats produced by the gguf Python package (see the header). */
TEST(quant_dequant_matches_gguf_py)
{
	for (size_t v = 0; v < sizeof(quant_vectors) / sizeof(quant_vectors[0]); v++)
	{
		const quant_vector *qv = &quant_vectors[v];
		float	   *out = malloc((size_t) qv->n * sizeof(float));
		cai_error	err;
		int			bad = 0;

		CHECK(out != NULL);
		if (!out)
			return;
		CHECK_EQ_INT(cai_dequantize_row(qv->type, qv->bytes, out, qv->n, &err), CAI_OK);
		for (int i = 0; i < qv->n; i++)
		{
			/* the reference computes in float32 too; allow an ulp-level difference */
			if (!(fabsf(out[i] - qv->expect[i]) <= 1e-6f * (1.0f + fabsf(qv->expect[i]))))
			{
				if (bad++ < 3)
					fprintf(stderr, "    %s element %d: %g != %g\n",
							ggml_type_name(qv->type), i, out[i], qv->expect[i]);
			}
		}
		CHECK_MSG(bad == 0, "%s: %d elements differ from gguf-py", ggml_type_name(qv->type), bad);
		free(out);
	}
}

/* Random data with a few outliers and a constant block, n a multiple of 256. */
static void
random_row(float *x, int n, uint64_t seed)
{
	uint64_t	s = seed;

	for (int i = 0; i < n; i++)
		x[i] = test_uniform(&s, -1.0f, 1.0f) * (i % 97 == 0 ? 8.0f : 1.0f);
	for (int i = 64; i < 96; i++)
		x[i] = 0.75f;			/* a constant block (Q4_1's d = 0) */
	for (int i = 256; i < 288; i++)
		x[i] = 0.0f;			/* an all-zero block */
}

TEST(quant_roundtrip_simple_formats)
{
	enum
	{
		N = 1024
	};
	float		x[N];
	float		y[N];
	uint8_t		buf[N * 2];
	cai_error	err;

	random_row(x, N, 99);

	/* Q8_0: error <= d/2 */
	CHECK(gguf_quantize(GGML_TYPE_Q8_0, x, N, buf));
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q8_0, buf, y, N, &err), CAI_OK);
	for (int i = 0; i < N; i++)
	{
		float		d = fabsf(get_half(buf + 34 * (i / 32)));

		CHECK_MSG(fabsf(x[i] - y[i]) <= 0.5f * d * 1.0001f, "q8_0 element %d: %g vs %g", i, x[i], y[i]);
	}

	/* Q4_0: error <= |d| (the opposite extreme saturates at 7) */
	CHECK(gguf_quantize(GGML_TYPE_Q4_0, x, N, buf));
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q4_0, buf, y, N, &err), CAI_OK);
	for (int i = 0; i < N; i++)
	{
		float		d = fabsf(get_half(buf + 18 * (i / 32)));

		CHECK_MSG(fabsf(x[i] - y[i]) <= d * 1.0001f, "q4_0 element %d: %g vs %g", i, x[i], y[i]);
	}

	/* Q4_1: error <= d/2 plus the fp16 rounding of the minimum */
	CHECK(gguf_quantize(GGML_TYPE_Q4_1, x, N, buf));
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q4_1, buf, y, N, &err), CAI_OK);
	for (int i = 0; i < N; i++)
	{
		float		d = fabsf(get_half(buf + 20 * (i / 32)));
		float		m = get_half(buf + 20 * (i / 32) + 2);

		CHECK_MSG(fabsf(x[i] - y[i]) <= 0.5f * d * 1.0001f + fabsf(m) * 0.0005f + 1e-7f,
				  "q4_1 element %d: %g vs %g", i, x[i], y[i]);
	}
	/* the constant and zero blocks come back exactly (to fp16 precision) */
	CHECK_NEAR(y[70], 0.75f, 1e-6);
	CHECK(y[260] == 0.0f);

	/* F16 and BF16 to their precision */
	CHECK(gguf_quantize(GGML_TYPE_F16, x, N, buf));
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_F16, buf, y, N, &err), CAI_OK);
	for (int i = 0; i < N; i++)
		CHECK(fabsf(x[i] - y[i]) <= fabsf(x[i]) * 0x1p-11f + 1e-7f);
	CHECK(gguf_quantize(GGML_TYPE_BF16, x, N, buf));
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_BF16, buf, y, N, &err), CAI_OK);
	for (int i = 0; i < N; i++)
		CHECK(fabsf(x[i] - y[i]) <= fabsf(x[i]) * 0x1p-8f);
}

/* K-quants: the writer's quantizers keep every value within its sub-block's grid. */
TEST(quant_roundtrip_k_formats)
{
	enum
	{
		N = 1024
	};
	float		x[N];
	float		y[N];
	uint8_t		buf[N];
	cai_error	err;
	double		sq_x = 0,
				sq_q4k = 0,
				sq_q6k = 0;

	random_row(x, N, 7);

	CHECK(gguf_quantize(GGML_TYPE_Q4_K, x, N, buf));
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q4_K, buf, y, N, &err), CAI_OK);
	for (int i = 0; i < N; i++)
	{
		const uint8_t *b = buf + 144 * (i / 256);
		int			s = (i % 256) / 32;
		int			sc = s < 4 ? (b[4 + s] & 63) : ((b[4 + s + 4] & 15) | ((b[4 + s - 4] >> 6) << 4));
		float		step = fabsf(get_half(b)) * (float) sc;

		CHECK_MSG(fabsf(x[i] - y[i]) <= 0.5f * step * 1.001f + 1e-6f,
				  "q4_k element %d: %g vs %g (step %g)", i, x[i], y[i], step);
		sq_q4k += (x[i] - y[i]) * (x[i] - y[i]);
		sq_x += x[i] * x[i];
	}

	CHECK(gguf_quantize(GGML_TYPE_Q5_K, x, N, buf));
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q5_K, buf, y, N, &err), CAI_OK);
	for (int i = 0; i < N; i++)
	{
		const uint8_t *b = buf + 176 * (i / 256);
		int			s = (i % 256) / 32;
		int			sc = s < 4 ? (b[4 + s] & 63) : ((b[4 + s + 4] & 15) | ((b[4 + s - 4] >> 6) << 4));
		float		step = fabsf(get_half(b)) * (float) sc;

		CHECK_MSG(fabsf(x[i] - y[i]) <= 0.5f * step * 1.001f + 1e-6f,
				  "q5_k element %d: %g vs %g (step %g)", i, x[i], y[i], step);
	}

	CHECK(gguf_quantize(GGML_TYPE_Q6_K, x, N, buf));
	CHECK_EQ_INT(cai_dequantize_row(GGML_TYPE_Q6_K, buf, y, N, &err), CAI_OK);
	for (int i = 0; i < N; i++)
	{
		const uint8_t *b = buf + 210 * (i / 256);
		float		step = fabsf(get_half(b + 208) * (float) (int8_t) b[192 + (i % 256) / 16]);

		/* half a step, or a whole one where the +32 end saturates at 31 */
		CHECK_MSG(fabsf(x[i] - y[i]) <= step * 1.001f + 1e-6f,
				  "q6_k element %d: %g vs %g (step %g)", i, x[i], y[i], step);
		sq_q6k += (x[i] - y[i]) * (x[i] - y[i]);
	}
	/* and the bounds are not vacuous: relative RMS errors of a 4-bit and a 6-bit format */

	CHECK(sqrt(sq_q4k / sq_x) < 0.15);
	CHECK(sqrt(sq_q6k / sq_x) < 0.04);
}

TEST(quant_row_i8)
{
	enum
	{
		N = 300
	};
	float		x[N];
	int8_t		q[N];
	float		scale;
	uint64_t	s = 5;
	float		amax = 0.0f;
	bool		saw_127 = false;

	for (int i = 0; i < N; i++)
	{
		x[i] = test_uniform(&s, -3.0f, 2.0f);
		amax = fmaxf(amax, fabsf(x[i]));
	}
	cai_quantize_row_i8(x, N, q, &scale);
	CHECK_NEAR(scale, amax / 127.0f, 1e-9);
	for (int i = 0; i < N; i++)
	{
		CHECK(q[i] >= -127 && q[i] <= 127);
		CHECK_MSG(fabsf((float) q[i] * scale - x[i]) <= 0.5f * scale * 1.0001f,
				  "element %d: %d * %g vs %g", i, q[i], scale, x[i]);
		if (fabsf(x[i]) == amax)
			saw_127 = abs(q[i]) == 127;
	}
	CHECK(saw_127);

	/* rounding: halves go away from zero (scale is exactly 1 here) */
	{
		float		h[7] = {127.0f, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 0.49f};
		int8_t		hq[7];
		int			expect[7] = {127, 1, -1, 2, 3, -3, 0};

		cai_quantize_row_i8(h, 7, hq, &scale);
		CHECK(scale == 1.0f);
		for (int i = 0; i < 7; i++)
			CHECK_EQ_INT(hq[i], expect[i]);
	}

	/* a zero row: scale 0, all zeros; a negative extreme maps to -127, never -128 */
	{
		float		z[5] = {0};
		int8_t		zq[5] = {1, 1, 1, 1, 1};
		float		neg[3] = {-4.0f, 1.0f, 2.0f};
		int8_t		nq[3];

		cai_quantize_row_i8(z, 5, zq, &scale);
		CHECK(scale == 0.0f);
		for (int i = 0; i < 5; i++)
			CHECK_EQ_INT(zq[i], 0);
		cai_quantize_row_i8(neg, 3, nq, &scale);
		CHECK_EQ_INT(nq[0], -127);
		CHECK_EQ_INT(nq[1], 32);	/* 31.75 */
		CHECK_EQ_INT(nq[2], 64);	/* 63.5 rounds away from zero */
	}
}
