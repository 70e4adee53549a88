/*
 * ops.c — the CPU backend's per-token kernels (see ops.h for the determinism rules).
 *
 * The loops that matter are written over eight-lane vectors and built for AVX2 and for
 * baseline x86-64 with target_clones; GCC picks the clone at load time.  AVX2 without FMA is
 * deliberate: no multiply-add contraction can happen, so the clones agree bit for bit.
 */
#include "ops.h"

#include <math.h>

#include "kv.h"
#include "rope.h"
#include "util.h"

/* Rounds to nearest even for |v| < 2^22 with two float additions (vectorizes everywhere). */
#define ROUND_MAGIC 12582912.0f

void
cai_op_dequant_row(const int8_t *q, float scale, int d, float *x)
{
	for (int i = 0; i < d; i++)
		x[i] = (float) q[i] * scale;
}

/* Sum of squares with the eight-partial-sum rule. */
CAI_CLONES static float
sum_squares(const float *x, int n)
{
	cai_v8f		acc = cai_v8f_set1(0.0f);
	float		tail = 0.0f;
	int			i;

	for (i = 0; i + 8 <= n; i += 8)
	{
		cai_v8f		v = cai_v8f_load(x + i);

		acc = acc + v * v;
	}
	for (; i < n; i++)
		tail = tail + x[i] * x[i];
	return cai_v8f_sum(&acc) + tail;
}

void
cai_op_rmsnorm_row(const float *x, const float *w, int d, float eps, float *out)
{
	float		ms = sum_squares(x, d) / (float) d;
	float		inv = 1.0f / sqrtf(ms + eps);

	for (int i = 0; i < d; i++)
		out[i] = (x[i] * inv) * w[i];
}

CAI_CLONES void
cai_op_swiglu_row(const float *gate, const float *up, int n, float *out)
{
	int			i;

	for (i = 0; i + 8 <= n; i += 8)
	{
		cai_v8f		g = cai_v8f_load(gate + i);
		cai_v8f		ng = -g;
		cai_v8f		e = cai_v8f_exp(&ng);

		cai_v8f_store(out + i, g / (cai_v8f_set1(1.0f) + e) * cai_v8f_load(up + i));
	}
	if (i < n)
	{
		/* the tail goes through the same vector code, padded with zeros */
		float		gb[8] = {0},
					ub[8] = {0},
					ob[8];
		cai_v8f		g,
					ng,
					e;

		memcpy(gb, gate + i, (size_t) (n - i) * sizeof(float));
		memcpy(ub, up + i, (size_t) (n - i) * sizeof(float));
		g = cai_v8f_load(gb);
		ng = -g;
		e = cai_v8f_exp(&ng);
		cai_v8f_store(ob, g / (cai_v8f_set1(1.0f) + e) * cai_v8f_load(ub));
		memcpy(out + i, ob, (size_t) (n - i) * sizeof(float));
	}
}

void
cai_op_rope_angles(const cai_rope_params *rp, int pos, float *cs)
{
	cai_rope_angles(rp, pos, cs);
}

void
cai_op_rope_row(const cai_rope_params *rp, const float *cs, float *x, int n_heads,
				int head_dim)
{
	int			half = rp->n_rot / 2;

	for (int h = 0; h < n_heads; h++)
	{
		float	   *xh = x + (size_t) h * head_dim;

		if (rp->neox)
		{
			for (int i = 0; i < half; i++)
			{
				float		c = cs[2 * i],
							s = cs[2 * i + 1];
				float		x0 = xh[i],
							x1 = xh[i + half];

				xh[i] = x0 * c - x1 * s;
				xh[i + half] = x0 * s + x1 * c;
			}
		}
		else
		{
			for (int i = 0; i < half; i++)
			{
				float		c = cs[2 * i],
							s = cs[2 * i + 1];
				float		x0 = xh[2 * i],
							x1 = xh[2 * i + 1];

				xh[2 * i] = x0 * c - x1 * s;
				xh[2 * i + 1] = x0 * s + x1 * c;
			}
		}
	}
}

/*
 * x's lanes in the order of the eight constant indices: GCC's and clang's builtins differ (the
 * sanitizer builds for fuzzing use clang).
 */
#if defined(__clang__)
#define V8F_SHUFFLE(x, ...) __builtin_shufflevector((x), (x), __VA_ARGS__)
#else
#define V8F_SHUFFLE(x, ...) __builtin_shuffle((x), (cai_v8i) {__VA_ARGS__})
#endif

/*
 * A butterfly of span h inside a vector: x[l] + x[l ^ h] in lanes without bit h, and
 * x[l ^ h] - x[l] in lanes with it, computed as x[l] * sign + x[l ^ h] (sign -1 or 1, exact:
 * -a + b is b - a); the lanes of x ^ h are given as eight constant indices.
 */
#define HADAMARD_LANES(x, sign, ...) \
	do { \
		cai_v8f		y_ = V8F_SHUFFLE((x), __VA_ARGS__); \
		(x) = (x) * (sign) + y_; \
	} while (0)

/* Butterflies of span 1, 2, 4 inside one eight-float vector, by lane shuffles. */
#define HADAMARD_IN_LANES(v) \
	do { \
		const cai_v8f sign1_ = {1, -1, 1, -1, 1, -1, 1, -1}; \
		const cai_v8f sign2_ = {1, 1, -1, -1, 1, 1, -1, -1}; \
		const cai_v8f sign4_ = {1, 1, 1, 1, -1, -1, -1, -1}; \
		HADAMARD_LANES((v), sign1_, 1, 0, 3, 2, 5, 4, 7, 6); \
		HADAMARD_LANES((v), sign2_, 2, 3, 0, 1, 6, 7, 4, 5); \
		HADAMARD_LANES((v), sign4_, 4, 5, 6, 7, 0, 1, 2, 3); \
	} while (0)

/* Butterflies of spans 1, 2, 4 (in units of vectors) across eight vectors v[0..7]. */
#define HADAMARD_ACROSS(v) \
	do { \
		for (int span_ = 1; span_ < 8; span_ *= 2) \
			for (int k_ = 0; k_ < 8; k_++) \
				if ((k_ & span_) == 0) \
				{ \
					cai_v8f		a_ = (v)[k_]; \
					cai_v8f		b_ = (v)[k_ + span_]; \
					(v)[k_] = a_ + b_; \
					(v)[k_ + span_] = a_ - b_; \
				} \
	} while (0)

/*
 * The Walsh-Hadamard butterflies of one chunk of p floats (p a power of two), stages of growing
 * span h, then (scale not NULL) every value times *scale.  The pairs of a stage are independent,
 * so any grouping gives the values the one-at-a-time loop gives: each 64-float block gets its
 * six first stages in registers (spans 1, 2, 4 by lane shuffles, 8, 16, 32 across its eight
 * vectors), the larger spans go three at a time on eight vectors h apart, the stages left over
 * one at a time; the scale is applied when the last stage stores.  Chunks shorter than 64 run
 * the plain loops.
 */
CAI_CLONES static void
hadamard_chunk(float *z, int p, const float *scale)
{
	int			h;

	if (p >= 64)
	{
		bool		last = p == 64;
		cai_v8f		v[8];

		for (int i = 0; i < p; i += 64)
		{
			for (int k = 0; k < 8; k++)
			{
				v[k] = cai_v8f_load(z + i + 8 * k);
				HADAMARD_IN_LANES(v[k]);
			}
			HADAMARD_ACROSS(v);
			for (int k = 0; k < 8; k++)
			{
				if (last && scale)
					v[k] = v[k] * cai_v8f_set1(*scale);
				cai_v8f_store(z + i + 8 * k, v[k]);
			}
		}
		for (h = 64; h * 8 <= p; h *= 8)
		{
			last = h * 8 == p;
			for (int i = 0; i < p; i += 8 * h)
				for (int j = i; j < i + h; j += 8)
				{
					for (int k = 0; k < 8; k++)
						v[k] = cai_v8f_load(z + j + k * h);
					HADAMARD_ACROSS(v);
					for (int k = 0; k < 8; k++)
					{
						if (last && scale)
							v[k] = v[k] * cai_v8f_set1(*scale);
						cai_v8f_store(z + j + k * h, v[k]);
					}
				}
		}
		for (; h < p; h *= 2)
		{
			last = h * 2 == p;
			for (int i = 0; i < p; i += 2 * h)
				for (int j = i; j < i + h; j += 8)
				{
					cai_v8f		a = cai_v8f_load(z + j);
					cai_v8f		b = cai_v8f_load(z + j + h);
					cai_v8f		sum = a + b;
					cai_v8f		diff = a - b;

					if (last && scale)
					{
						sum = sum * cai_v8f_set1(*scale);
						diff = diff * cai_v8f_set1(*scale);
					}
					cai_v8f_store(z + j, sum);
					cai_v8f_store(z + j + h, diff);
				}
		}
		return;
	}
	for (h = 1; h < p; h *= 2)
		for (int i = 0; i < p; i += 2 * h)
			for (int j = i; j < i + h; j++)
			{
				float		a = z[j],
							b = z[j + h];

				z[j] = a + b;
				z[j + h] = a - b;
			}
	if (scale)
		for (int j = 0; j < p; j++)
			z[j] = z[j] * *scale;
}

/*
 * y = R x (backend.h's cai_rotation): the butterflies of every chunk, then, for each column j
 * of the chunks, the mix of the n_mix chunk values in c' order, eight columns at a time (chunks
 * shorter than eight one column at a time, with the same expressions).
 */
CAI_CLONES void
cai_op_rotate_vec(const cai_rotation *rot, float *x)
{
	const int	p = rot->n_pow2;
	const int	m = rot->n_mix;
	const float *mix = rot->mix;
	const float norm = rot->norm;

	for (int c = 0; c < m; c++)
		hadamard_chunk(x + (size_t) c * p, p, m == 1 ? &norm : NULL);
	if (m == 1)
		return;
	if (p >= 8)
	{
		/*
		 * a tile of up to 32 columns at a time, every output of the tile at once: the sums
		 * of different outputs and columns are independent, each runs in c' order
		 */
		cai_v8f		acc[CAI_ROTATION_MAX_MIX][4];
		const int	tile = p >= 32 ? 4 : 1;

		for (int j0 = 0; j0 < p; j0 += 8 * tile)
		{
			for (int c = 0; c < m; c++)
			{
				cai_v8f		w = cai_v8f_set1(mix[(size_t) c * m]);

				for (int v = 0; v < tile; v++)
					acc[c][v] = w * cai_v8f_load(x + j0 + 8 * v);
			}
			for (int c2 = 1; c2 < m; c2++)
			{
				const float *z = x + (size_t) c2 * p + j0;

				for (int c = 0; c < m; c++)
				{
					cai_v8f		w = cai_v8f_set1(mix[(size_t) c * m + c2]);

					for (int v = 0; v < tile; v++)
						acc[c][v] = acc[c][v] + w * cai_v8f_load(z + 8 * v);
				}
			}
			for (int c = 0; c < m; c++)
				for (int v = 0; v < tile; v++)
					cai_v8f_store(x + (size_t) c * p + j0 + 8 * v, acc[c][v] * cai_v8f_set1(norm));
		}
		return;
	}
	for (int j = 0; j < p; j++)
	{
		float		z[CAI_ROTATION_MAX_MIX];

		for (int c = 0; c < m; c++)
			z[c] = x[(size_t) c * p + j];
		for (int c = 0; c < m; c++)
		{
			const float *mc = mix + (size_t) c * m;
			float		acc = mc[0] * z[0];

			for (int c2 = 1; c2 < m; c2++)
				acc = acc + mc[c2] * z[c2];
			x[(size_t) c * p + j] = acc * norm;
		}
	}
}

CAI_CLONES void
cai_op_quantize_vec_i8(const float *x, int n, int8_t *q, float *scale)
{
	const cai_v8i abs_mask = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,
	0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
	const cai_v8f lo = cai_v8f_set1(-127.0f);
	const cai_v8f hi = cai_v8f_set1(127.0f);
	const cai_v8f magic = cai_v8f_set1(ROUND_MAGIC);
	cai_v8f		vmax = cai_v8f_set1(0.0f);
	cai_v8b		bytes;
	float		amax = 0.0f;
	float		inv;
	int			i;

	/* max |x|: exact in any order */
	for (i = 0; i + 8 <= n; i += 8)
	{
		cai_v8f		a = (cai_v8f) ((cai_v8i) cai_v8f_load(x + i) & abs_mask);

		vmax = cai_v8f_max(&vmax, &a);
	}
	for (int k = 0; k < 8; k++)
		amax = vmax[k] > amax ? vmax[k] : amax;
	for (; i < n; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;

	inv = 127.0f / amax;
	if (!(amax > 0.0f) || isinf(inv))
	{
		*scale = 0.0f;
		memset(q, 0, (size_t) n);
		return;
	}
	*scale = amax / 127.0f;

	/* q = round-to-even(clamp(x * inv)): the same float operations for every element */
	for (i = 0; i + 8 <= n; i += 8)
	{
		cai_v8f		v = cai_v8f_load(x + i) * cai_v8f_set1(inv);
		cai_v8i		r;

		v = cai_v8f_max(&v, &lo);
		v = cai_v8f_min(&v, &hi);
		v = (v + magic) - magic;
		r = __builtin_convertvector(v, cai_v8i);
		/* each int's low byte (the value: it lies in [-127, 127]), gathered by one shuffle */
		bytes = __builtin_shufflevector((cai_v32b) r, (cai_v32b) r, 0, 4, 8, 12, 16, 20, 24, 28);
		memcpy(q + i, &bytes, sizeof(bytes));
	}
	for (; i < n; i++)
	{
		float		v = x[i] * inv;

		v = v > -127.0f ? v : -127.0f;
		v = v < 127.0f ? v : 127.0f;
		v = (v + ROUND_MAGIC) - ROUND_MAGIC;
		q[i] = (int8_t) (int) v;
	}
}

void
cai_op_quantize_vec_two_digits(const float *x, int n, int8_t *q, int8_t *q2, float *scale)
{
	float		amax = 0.0f;
	float		inv;

	for (int i = 0; i < n; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	inv = 127.0f / amax;
	if (!(amax > 0.0f) || isinf(inv))
	{
		*scale = 0.0f;
		memset(q, 0, (size_t) n);
		memset(q2, 0, (size_t) n);
		return;
	}
	*scale = (amax / 127.0f) / (float) CAI_KV_KEY_DIGIT_BASE;
	for (int i = 0; i < n; i++)
	{
		float		v = x[i] * inv;
		float		r;

		v = v > -127.0f ? v : -127.0f;
		v = v < 127.0f ? v : 127.0f;
		r = (v + ROUND_MAGIC) - ROUND_MAGIC;
		q[i] = (int8_t) (int) r;
		q2[i] = (int8_t) (int) (((v - r) * (float) CAI_KV_KEY_DIGIT_BASE + ROUND_MAGIC) - ROUND_MAGIC);
	}
}

/*
 * GELU's tanh approximation, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), written as
 * g * sigmoid(z) with z = 2 sqrt(2/pi) (g + 0.044715 g^3) (the same function: 0.5 (1 + tanh(y))
 * = sigmoid(2y)), so that it goes through SwiGLU's exp and division, vector for vector.
 */
#define GELU_C1 1.5957691216057308f		/* 2 sqrt(2/pi) */
#define GELU_C3 0.07135481627159786f	/* 2 sqrt(2/pi) 0.044715 */

/* Inlined into each clone of the row function; vectors pass by pointer, as cai_v8f_exp's do. */
CAI_ALWAYS_INLINE cai_v8f
geglu_v8(const cai_v8f *pg, const cai_v8f *pu)
{
	cai_v8f		g = *pg;
	cai_v8f		nz = -(g * (cai_v8f_set1(GELU_C1) + cai_v8f_set1(GELU_C3) * (g * g)));
	cai_v8f		e = cai_v8f_exp(&nz);

	return g / (cai_v8f_set1(1.0f) + e) * *pu;
}

CAI_CLONES void
cai_op_geglu_row(const float *gate, const float *up, int n, float *out)
{
	int			i;

	for (i = 0; i + 8 <= n; i += 8)
	{
		cai_v8f		g = cai_v8f_load(gate + i),
					u = cai_v8f_load(up + i);

		cai_v8f_store(out + i, geglu_v8(&g, &u));
	}
	if (i < n)
	{
		/* the tail goes through the same vector code, padded with zeros */
		float		gb[8] = {0},
					ub[8] = {0},
					ob[8];
		cai_v8f		g,
					u;

		memcpy(gb, gate + i, (size_t) (n - i) * sizeof(float));
		memcpy(ub, up + i, (size_t) (n - i) * sizeof(float));
		g = cai_v8f_load(gb);
		u = cai_v8f_load(ub);
		cai_v8f_store(ob, geglu_v8(&g, &u));
		memcpy(out + i, ob, (size_t) (n - i) * sizeof(float));
	}
}

void
cai_op_rmsnorm_add_row(const float *y, const float *w, int d, float eps, float *x)
{
	float		ms = sum_squares(y, d) / (float) d;
	float		inv = 1.0f / sqrtf(ms + eps);

	for (int i = 0; i < d; i++)
		x[i] = x[i] + (y[i] * inv) * w[i];
}
