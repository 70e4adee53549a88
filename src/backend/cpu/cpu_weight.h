/*
 * cpu_weight.h — the CPU backend's GEMM operand (backend_cpu.c prepares and frees it,
 * weight_io.c exports it to a weights cache and imports it back).
 */
#ifndef CAI_CPU_WEIGHT_H
#define CAI_CPU_WEIGHT_H

#include <stdbool.h>

#include "backend.h"
#include "gemm.h"
#include "gemm_blocks.h"

/*
 * A GEMM operand: the model's row-major int8 matrix copied and packed into panels (gemm.h), or
 * a block matrix's parts repacked (gemm_blocks.h), stacked by rows.
 */
struct cai_weight
{
	cai_cpu_qmatrix m;
	int			n_parts;
	cai_cpu_bmatrix parts[CAI_BMATRIX_MAX_PARTS];
	bool		mapped;			/* its memory is a weights cache's mapping: not freed */
};

/* backend.h's export_weights and import_weights for the CPU (weight_io.c). */
cai_status	cai_cpu_export_weights(const cai_weight *const *w, int n,
								   struct cai_wcache_writer *out, cai_error *err);
cai_status	cai_cpu_import_weights(const struct cai_wcache_view *in, uint32_t *cursor,
								   const cai_qmatrix *const *i8, const cai_bmatrix *const *blocks,
								   int n, cai_weight **made, cai_error *err);

#endif							/* CAI_CPU_WEIGHT_H */
