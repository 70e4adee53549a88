/*
 * ops.h — the CPU backend's per-token kernels: embedding, RMSNorm, RoPE, SwiGLU, the fast
 * exponential, the activation rotation and the KV cache's int8 quantization.
 *
 * Each kernel works on whole token rows and computes every output element with a sequence of
 * float operations that depends only on the row's own inputs and the row width, never on how
 * many rows are processed together or by which thread; backend_cpu.c parallelizes over rows.
 * Reductions use eight partial sums (element i goes to partial i % 8) combined by one fixed
 * tree, then the tail.  Kernels are built twice (AVX2 and baseline x86-64) and chosen at run
 * time; neither uses fused multiply-add, so both give bit-identical results.
 */
#ifndef CAI_CPU_OPS_H
#define CAI_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"

/* ---------------------------------------------------------------------------------------------
 * Eight-lane float vectors (GNU C vector extensions: two SSE or one AVX register)
 * ------------------------------------------------------------------------------------------- */

/*
 * GCC warns that returning a 32-byte vector without AVX changes the ABI; these helpers are
 * always inlined, so there is no ABI.  The warning fires where they are used, hence no pop.
 * Vectors are never passed by value (that draws an unsilenceable note): stores are a macro
 * and the other helpers take pointers.
 */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float cai_v8f __attribute__((vector_size(32)));
typedef int32_t cai_v8i __attribute__((vector_size(32)));
typedef int8_t cai_v8b __attribute__((vector_size(8)));
typedef int8_t cai_v32b __attribute__((vector_size(32)));

#define CAI_ALWAYS_INLINE static inline __attribute__((always_inline))

CAI_ALWAYS_INLINE cai_v8f
cai_v8f_load(const float *p)
{
	cai_v8f		v;

	memcpy(&v, p, sizeof(v));
	return v;
}

#define cai_v8f_store(p, v) \
	do { \
		cai_v8f		cai_v8f_store_tmp_ = (v); \
		memcpy((p), &cai_v8f_store_tmp_, sizeof(cai_v8f)); \
	} while (0)

CAI_ALWAYS_INLINE cai_v8f
cai_v8f_set1(float x)
{
	return (cai_v8f) {x, x, x, x, x, x, x, x};
}

/* Lane-wise max/min by comparison masks (C has no vector ?:). */
CAI_ALWAYS_INLINE cai_v8f
cai_v8f_max(const cai_v8f *a, const cai_v8f *b)
{
	cai_v8i		m = *a > *b;

	return (cai_v8f) (((cai_v8i) * a & m) | ((cai_v8i) * b & ~m));
}

CAI_ALWAYS_INLINE cai_v8f
cai_v8f_min(const cai_v8f *a, const cai_v8f *b)
{
	cai_v8i		m = *a < *b;

	return (cai_v8f) (((cai_v8i) * a & m) | ((cai_v8i) * b & ~m));
}

/* The fixed reduction tree of the eight partial sums. */
CAI_ALWAYS_INLINE float
cai_v8f_sum(const cai_v8f *v)
{
	cai_v8f		a = *v;

	return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/*
 * exp(x) for x in [-87, 88] (clamped outside), relative error about 2e-7: x = n ln2 + r with
 * |r| <= ln2/2 (n rounded to nearest by the 1.5 * 2^23 trick), e^r by its degree-6 Taylor
 * polynomial, 2^n put into the exponent bits.  Pure lane-wise float arithmetic, so a value's
 * result never depends on its lane or its neighbours, nor on the width of the vector:
 * CAI_DEFINE_VEXP(name, VF, VI) defines `VF name(const VF *px)` for any float vector type VF
 * with its int32 vector type VI (cai_v8f_exp below), and every width gives every lane the same
 * bits.  The clamps select by comparison masks like cai_v8f_max/min (a NaN becomes -87).
 * (The attention's softmax has an exp2 of its own: cpu/attention.h.)
 */
#define CAI_EXP_LO (-87.0f)
#define CAI_EXP_HI 88.0f
#define CAI_EXP_LOG2E 1.44269504088896341f
#define CAI_EXP_LN2_HI 0.693145751953125f	/* ln2's high part: n * it is exact */
#define CAI_EXP_LN2_LO 1.428606765330187e-06f
/* the Taylor coefficients, highest degree first */
#define CAI_EXP_C6 (1.0f / 720.0f)
#define CAI_EXP_C5 (1.0f / 120.0f)
#define CAI_EXP_C4 (1.0f / 24.0f)
#define CAI_EXP_C3 (1.0f / 6.0f)
#define CAI_EXP_C2 0.5f
/*
 * x (a float vector VF, int vector VI) clamped to [lo, hi] lane by lane by comparison masks: a
 * NaN becomes lo.
 */
#define CAI_VCLAMP(VF, VI, x, lo, hi) \
	do { \
		VI			m_ = (x) > (lo); \
\
		(x) = (VF) (((VI) (x) & m_) | ((VI) (lo) & ~m_)); \
		m_ = (x) < (hi); \
		(x) = (VF) (((VI) (x) & m_) | ((VI) (hi) & ~m_)); \
	} while (0)

/*
 * The exp's frame: clamp x, n = x log2(e) rounded, then CAI_VEXP_POLY makes p = e^(x - n ln2)
 * from x and n (each multiply and add rounded), and the result is p * 2^n.
 */
#define CAI_DEFINE_VEXP(NAME, VF, VI) \
CAI_ALWAYS_INLINE VF \
NAME(const VF *px) \
{ \
	const VF	zero = {0}; \
	const VF	magic = zero + 12582912.0f; \
	const VF	lo = zero + CAI_EXP_LO; \
	const VF	hi = zero + CAI_EXP_HI; \
	VF			x = *px, \
				n, \
				p; \
	VI			bits; \
\
	CAI_VCLAMP(VF, VI, x, lo, hi); \
	n = (x * CAI_EXP_LOG2E + magic) - magic; \
	CAI_VEXP_POLY(VF, x, n, p); \
	bits = (__builtin_convertvector(n, VI) + 127) << 23; \
	return p * (VF) bits; \
}

#define CAI_VEXP_POLY(VF, x, n, p) \
	do { \
		VF			r_ = x - n * CAI_EXP_LN2_HI; \
\
		r_ = r_ - n * CAI_EXP_LN2_LO; \
		p = zero + CAI_EXP_C6; \
		p = p * r_ + CAI_EXP_C5; \
		p = p * r_ + CAI_EXP_C4; \
		p = p * r_ + CAI_EXP_C3; \
		p = p * r_ + CAI_EXP_C2; \
		p = p * r_ + 1.0f; \
		p = p * r_ + 1.0f; \
	} while (0)

CAI_DEFINE_VEXP(cai_v8f_exp, cai_v8f, cai_v8i)

/* ---------------------------------------------------------------------------------------------
 * Row kernels (one token row each unless stated)
 * ------------------------------------------------------------------------------------------- */

/* x[i] = q[i] * scale: one int8 embedding row. */
void		cai_op_dequant_row(const int8_t *q, float scale, int d, float *x);

/* out = x / sqrt(mean(x^2) + eps) * w. */
void		cai_op_rmsnorm_row(const float *x, const float *w, int d, float eps, float *out);

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). */
void		cai_op_swiglu_row(const float *gate, const float *up, int n, float *out);

/* out[i] = gelu(gate[i]) * up[i], gelu's tanh approximation (exp-based, like silu's). */
void		cai_op_geglu_row(const float *gate, const float *up, int n, float *out);

/* x += y / sqrt(mean(y^2) + eps) * w: a sublayer's output normed, then added residually. */
void		cai_op_rmsnorm_add_row(const float *y, const float *w, int d, float eps, float *x);

/* cos/sin table of one position: cs[2i] = cos(theta_i), cs[2i+1] = sin(theta_i). */
void		cai_op_rope_angles(const cai_rope_params *rp, int pos, float *cs);

/* Rotates n_heads heads of one token row in place. */
void		cai_op_rope_row(const cai_rope_params *rp, const float *cs, float *x, int n_heads,
							int head_dim);

/* y = R x in place for one vector of rot->n floats (backend.h's cai_rotation, in its order). */
void		cai_op_rotate_vec(const cai_rotation *rot, float *x);

/*
 * Symmetric int8 quantization of one vector (a key or value head): *scale = max|x| / 127,
 * q = x * (127 / max|x|) clamped to [-127, 127] and rounded to nearest even, the rule of
 * cai_quantize_act_i8.  An all-zero (or subnormal) vector gives scale 0 and zeros.
 */
void		cai_op_quantize_vec_i8(const float *x, int n, int8_t *q, float *scale);

/*
 * Two-digit keys (kv.h): q as cai_op_quantize_vec_i8 gives it, and the second digit
 * q2 = round-to-even((v - q) * 254) in [-127, 127], where v = x * (127 / max|x|) clamped as for q
 * (v - q is exact: |v - q| <= 1/2 and q is v's nearest integer).  *scale = (max|x| / 127) / 254,
 * the unit of 254 q + q2.  An all-zero (or subnormal) vector gives scale 0 and zeros.
 */
void		cai_op_quantize_vec_two_digits(const float *x, int n, int8_t *q, int8_t *q2,
										   float *scale);

#endif							/* CAI_CPU_OPS_H */
