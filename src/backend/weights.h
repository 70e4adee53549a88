/*
 * weights.h — the model's int8 matrices as conversion produces them, and the handle a backend
 * gives back for the copy it keeps in its own layout.
 *
 * Loading (model_load.c, calibrate.c) writes every int8 matrix row-major: one output channel per
 * row, with a float scale per channel.  That is the one layout all backends start from; none of
 * them reads it at run time.  A forward context asks its backend to prepare each GEMM operand
 * once (backend.h's prepare_i8): the CPU packs its panels (cpu/gemm.h), the CUDA backend uploads
 * the rows to the device.  The forward then passes only the backend's handles, so no backend
 * ever sees, or has to undo, another backend's layout.
 */
#ifndef CAI_WEIGHTS_H
#define CAI_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

/* An int8 matrix [n_out, k], row-major, values in [-127, 127], a scale per row. */
typedef struct cai_qmatrix
{
	int			n_out;			/* rows: output channels */
	int			k;				/* columns: input features */
	const int8_t *q;			/* n_out * k bytes */
	const float *scale;			/* [n_out] */
} cai_qmatrix;

/* Rows [row0, row0 + n) of m, sharing its memory. */
static inline cai_qmatrix
cai_qmatrix_rows(const cai_qmatrix *m, int row0, int n)
{
	cai_qmatrix v;

	v.n_out = n;
	v.k = m->k;
	v.q = m->q + (size_t) row0 * m->k;
	v.scale = m->scale + row0;
	return v;
}

/*
 * A matrix kept in the file's own block format (Q4_K, Q6_K, Q8_0, ...: quant.h's
 * cai_block_levels): up to three source tensors stacked by rows (Q, K and V of one layer, say,
 * which a Q4_K_M file may hold in different formats), their bytes in the model's mapping of the
 * file.  Backends repack it once (backend.h's prepare_blocks); nothing is requantized.
 */
#define CAI_BMATRIX_MAX_PARTS 3

typedef struct cai_bmatrix_part
{
	ggml_type	type;
	int			rows;
	const void *data;			/* rows * ggml_row_bytes(type, k) bytes */
} cai_bmatrix_part;

typedef struct cai_bmatrix
{
	int			n_out;			/* the parts' rows together */
	int			k;
	int			n_parts;
	cai_bmatrix_part part[CAI_BMATRIX_MAX_PARTS];
} cai_bmatrix;

/*
 * A GEMM operand as one backend holds it; each backend defines the struct (cpu/backend_cpu.c,
 * src/backend/cuda/backend_cuda.c) and frees its weights with itself.
 */
typedef struct cai_weight cai_weight;

#endif							/* CAI_WEIGHTS_H */
