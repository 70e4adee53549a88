/*
 * blocks_pack.c — the file's block weights repacked on the host into cai_cuda_bmatrix's layout
 * (cuda_kernels.h), before one upload.
 *
 * Its own decoder of GGUF's block formats: libcai_cuda.so links nothing of libcai (the engine's
 * quant.c stays on its side of the loader).  Every scale becomes a float here, once: d * sc for
 * K-quants (an fp16 times a 6-bit integer, exact in float) and the min likewise, so that the
 * kernels' inner loops read a float pair per block of 32 and decode nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"
#include "gguf.h"

#define PACK_BLK 32

/* An fp16 (IEEE binary16) as float, exactly. */
static float
half_to_float(const uint8_t *p)
{
	uint16_t	h = (uint16_t) (p[0] | (p[1] << 8));
	int			sign = h >> 15,
				exp = (h >> 10) & 31,
				man = h & 1023;
	float		v;

	if (exp == 0)
		v = ldexpf((float) man, -24);
	else if (exp == 31)
		v = man ? NAN : INFINITY;
	else
		v = ldexpf((float) (man | 1024), exp - 25);
	return sign ? -v : v;
}

/* Q4_K's and Q5_K's 6-bit scale and min of sub-block j (ggml's packing of 12 bytes). */
static void
k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4)
	{
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	}
	else
	{
		*sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
		*m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

/* One block of 32 of one row: 32 levels and a scale pair, in the file's meaning. */
typedef struct sub_block
{
	int			lv[PACK_BLK];
	float		s0;
	float		s1;
} sub_block;

/* Elements per source block, its bytes, and whether its levels are nibbles (or split16). */
static bool
type_shape(int type, int *elems, int *bytes, bool *nibble, bool *split16)
{
	*nibble = false;
	*split16 = false;
	*elems = 32;
	switch (type)
	{
		case GGML_TYPE_Q4_0:
			*bytes = 18;
			*nibble = true;
			return true;
		case GGML_TYPE_Q4_1:
			*bytes = 20;
			*nibble = true;
			return true;
		case GGML_TYPE_Q5_0:
			*bytes = 22;
			return true;
		case GGML_TYPE_Q5_1:
			*bytes = 24;
			return true;
		case GGML_TYPE_Q8_0:
			*bytes = 34;
			return true;
		case GGML_TYPE_Q4_K:
			*elems = 256;
			*bytes = 144;
			*nibble = true;
			return true;
		case GGML_TYPE_Q5_K:
			*elems = 256;
			*bytes = 176;
			return true;
		case GGML_TYPE_Q6_K:
			*elems = 256;
			*bytes = 210;
			*split16 = true;
			return true;
		default:
			return false;
	}
}

/* Sub-block j (of 32) of a 32-element block of a legacy format at p. */
static void
decode_small(int type, const uint8_t *p, sub_block *o)
{
	float		d = half_to_float(p);
	uint32_t	qh = 0;

	if (type == GGML_TYPE_Q8_0)
	{
		for (int i = 0; i < 32; i++)
			o->lv[i] = (int8_t) p[2 + i];
		o->s0 = d;
		o->s1 = 0.0f;
		return;
	}
	if (type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1)
	{
		const uint8_t *h = p + (type == GGML_TYPE_Q5_0 ? 2 : 4);

		qh = (uint32_t) h[0] | ((uint32_t) h[1] << 8) | ((uint32_t) h[2] << 16) |
			((uint32_t) h[3] << 24);
	}
	{
		const uint8_t *qs = p + (type == GGML_TYPE_Q4_0 ? 2 : type == GGML_TYPE_Q4_1 ? 4 :
								 type == GGML_TYPE_Q5_0 ? 6 : 8);
		bool		five = type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1;
		bool		centred = type == GGML_TYPE_Q5_0;

		for (int j = 0; j < 16; j++)
		{
			int			a = qs[j] & 15,
						b = qs[j] >> 4;

			if (five)
			{
				a |= ((qh >> j) & 1) << 4;
				b |= ((qh >> (j + 16)) & 1) << 4;
			}
			o->lv[j] = centred ? a - 16 : a;
			o->lv[j + 16] = centred ? b - 16 : b;
		}
		o->s0 = d;
		/* Q4_0: x = d * (q - 8), a min of -8 d (exact: a power of two times d) */
		o->s1 = type == GGML_TYPE_Q4_0 ? -8.0f * d :
			(type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1) ? half_to_float(p + 2) : 0.0f;
	}
}

/* Sub-block j (0..7) of a K-quant super-block at p; x = s0 * q - min, stored as s0 * q + s1. */
static void
decode_k(int type, const uint8_t *p, int j, sub_block *o)
{
	if (type == GGML_TYPE_Q6_K)
	{
		const uint8_t *ql = p + 64 * (j / 4),
				   *qh = p + 128 + 32 * (j / 4);
		const int8_t *sc = (const int8_t *) (p + 192) + 8 * (j / 4);
		float		d = half_to_float(p + 208);
		int			part = j % 4;	/* of the 128 elements of a half: l, l + 32, + 64, + 96 */

		for (int l = 0; l < 32; l++)
		{
			int			lo = part & 1 ? ql[l + 32] : ql[l];
			int			nib = part < 2 ? lo & 15 : lo >> 4;

			o->lv[l] = (nib | (((qh[l] >> (2 * part)) & 3) << 4)) - 32;
		}
		o->s0 = d * (float) sc[2 * part];
		o->s1 = d * (float) sc[2 * part + 1];
		return;
	}
	{
		float		d = half_to_float(p),
					dmin = half_to_float(p + 2);
		int			sc,
					m;
		bool		q5 = type == GGML_TYPE_Q5_K;
		const uint8_t *qs = p + (q5 ? 48 : 16) + 32 * (j / 2);

		k_scale_min(p + 4, j, &sc, &m);
		for (int l = 0; l < 32; l++)
		{
			int			v = j % 2 ? qs[l] >> 4 : qs[l] & 15;

			if (q5)
				v |= ((p[16 + l] >> j) & 1) << 4;
			o->lv[l] = v;
		}
		o->s0 = d * (float) sc;
		o->s1 = -(dmin * (float) m);
	}
}

/* Stores one decoded block of 32 at block index bi of m's arrays. */
static void
store_sub(cai_cuda_bmatrix_host *m, size_t bi, const sub_block *sb)
{
	if (m->nibble)
	{
		uint8_t    *q = m->q + bi * 16;

		for (int j = 0; j < 16; j++)
			q[j] = (uint8_t) ((sb->lv[j] & 15) | ((sb->lv[j + 16] & 15) << 4));
	}
	else
	{
		int8_t	   *q = (int8_t *) m->q + bi * 32;

		for (int j = 0; j < 32; j++)
			q[j] = (int8_t) sb->lv[j];
	}
	m->sc[2 * bi] = sb->s0;
	m->sc[2 * bi + 1] = sb->s1;
}

cai_status
cai_cuda_bmatrix_pack(int type, const void *data, int rows, int k, cai_cuda_bmatrix_host *out,
					  cai_error *err)
{
	int			elems,
				bytes;
	bool		nibble,
				split16;
	size_t		nb;

	memset(out, 0, sizeof(*out));
	if (!type_shape(type, &elems, &bytes, &nibble, &split16))
		return cai_cuda_fail(err, CAI_ERR_UNSUPPORTED, "the cuda backend cannot multiply weights of type %d",
						 type);
	if (rows <= 0 || k <= 0 || k % elems != 0)
		return cai_cuda_fail(err, CAI_ERR_FORMAT, "a block matrix of %d rows of %d is not whole blocks of %d",
						 rows, k, elems);
	nb = (size_t) k / PACK_BLK;
	out->n_out = rows;
	out->k = k;
	out->nibble = nibble;
	out->split16 = split16;
	out->act_group = elems / PACK_BLK;
	out->q_bytes = (size_t) rows * nb * (nibble ? 16 : 32);
	out->sc_bytes = (size_t) rows * nb * 2 * sizeof(float);
	out->source_bytes = (size_t) rows * (k / elems) * bytes;
	out->q = malloc(out->q_bytes);
	out->sc = malloc(out->sc_bytes);
	if (!out->q || !out->sc)
	{
		cai_cuda_bmatrix_host_free(out);
		return cai_cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory repacking the weights");
	}
	for (int r = 0; r < rows; r++)
	{
		const uint8_t *row = (const uint8_t *) data + (size_t) r * (k / elems) * bytes;

		for (size_t b = 0; b < nb; b++)
		{
			sub_block	sb;
			size_t		bi = (size_t) r * nb + b;

			if (elems == 32)
				decode_small(type, row + b * bytes, &sb);
			else
				decode_k(type, row + (b / 8) * bytes, (int) (b % 8), &sb);
			if (!isfinite(sb.s0) || !isfinite(sb.s1))
			{
				cai_cuda_bmatrix_host_free(out);
				return cai_cuda_fail(err, CAI_ERR_FORMAT,
								 "row %d of a block matrix has a scale that is not a finite number", r);
			}
			store_sub(out, bi, &sb);
		}
	}
	return CAI_OK;
}

void
cai_cuda_bmatrix_host_free(cai_cuda_bmatrix_host *m)
{
	free(m->q);
	free(m->sc);
	m->q = NULL;
	m->sc = NULL;
}
