/*
 * rope.h — the rotary angles of cai_rope_params (backend.h), written once for every backend: the
 * CPU computes them per token (cpu/ops.c), the CUDA backend precomputes its device table from them
 * on the host (src/backend/cuda/backend_cuda.c).  Both must produce the same floats, so both call this.
 *
 * theta_i(pos) = pos * freq_scale * base^(-2i/n_rot) / factor_i, i < n_rot/2, where base is the
 * layer's base (a windowed layer's own), freq_scale the linear scaling (1/factor, else 1) and
 * factor_i the Llama 3 frequency divisors (1 without them); cs[2i] = cos, cs[2i+1] = sin.
 * Double precision: positions reach 1e5 and the angle must stay accurate.  Inline, so the CUDA
 * backend's library, which links nothing of libcai, has the same code.
 */
#ifndef CAI_ROPE_H
#define CAI_ROPE_H

#include <math.h>

#include "backend.h"

static inline void
cai_rope_angles(const cai_rope_params *rp, int pos, float *cs)
{
	int			half = rp->n_rot / 2;

	for (int i = 0; i < half; i++)
	{
		double		inv_freq = pow((double) rp->base, -2.0 * i / (double) rp->n_rot);
		double		theta = (double) pos * (double) rp->freq_scale * inv_freq;

		if (rp->freq_factors)
			theta /= (double) rp->freq_factors[i];
		cs[2 * i] = (float) cos(theta);
		cs[2 * i + 1] = (float) sin(theta);
	}
}

#endif							/* CAI_ROPE_H */
