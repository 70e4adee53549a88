/*
 * ops.c — the CPU backend's per-token kernels (see ops.h for the determinism rules).
 *
 * The loops that matter are written over eight-lane vectors and built for AVX2 and for
 * baseline x86-64 with target_clones; GCC picks the clone at load time.  AVX2 without FMA is
 * deliberate: no multiply-add contraction can happen, so the clones agree bit for bit.
 */
#include "ops.h"

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CAI_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CAI_CLONES
#endif

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
	int			half = rp->n_rot / 2;

	for (int i = 0; i < half; i++)
	{
		/* double precision: positions reach 1e5 and the angle must stay accurate */
		double		inv_freq = pow((double) rp->base, -2.0 * i / (double) rp->n_rot);
		double		theta = (double) pos * (double) rp->freq_scale * inv_freq;

		if (rp->freq_factors)
			theta /= (double) rp->freq_factors[i];
		cs[2 * i] = (float) cos(theta);
		cs[2 * i + 1] = (float) sin(theta);
	}
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

CAI_CLONES void
cai_op_quantize_vec_i8(const float *x, int n, int8_t *q, float *scale)
{
	const cai_v8i abs_mask = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,
	0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
	const cai_v8f lo = cai_v8f_set1(-127.0f);
	const cai_v8f hi = cai_v8f_set1(127.0f);
	const cai_v8f magic = cai_v8f_set1(ROUND_MAGIC);
	cai_v8f		vmax = cai_v8f_set1(0.0f);
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
		for (int k = 0; k < 8; k++)
			q[i + k] = (int8_t) r[k];
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
