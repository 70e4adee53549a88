/*
 * fuzz_weight_cache.c — a weights cache file (src/backend/weight_cache.h) of any bytes: its
 * parser, then the CPU backend's import of prepared weights from it (backend/cpu/weight_io.c),
 * then the GEMMs over what was imported.
 *
 * Input: the file's bytes.  The key the parser expects is read from where the header keeps it
 * (bytes 16..24), so that the fuzzer gets past the key check; the checksum is verified by one
 * parse and skipped by another, which lets mutated files reach the table and the import.
 *
 * What must hold: a parse that verifies the checksum succeeds only where the one that does not
 * succeeds too; a refusal says why; every section of an accepted file lies inside it, after the
 * header, 64-byte aligned; the import of an int8 matrix (4 x 32) and then of a block matrix
 * (k 256: 5 rows of Q4_K over 3 of Q6_K) either refuses or gives weights over which the int8
 * and block GEMMs read only the file's bytes (AddressSanitizer checks every read of the copy)
 * and the row decoder works; an imported block matrix has its type's format flags (the kernel
 * is chosen by the type: finding-q6k-* are files whose flags say another format).
 */
#include "fuzz_common.h"		/* first: it defines _GNU_SOURCE */

#include "cpu/cpu_weight.h"
#include "cpu/gemm.h"
#include "cpu/gemm_blocks.h"
#include "weight_cache.h"

#define N_TOK 2
#define BLOCK_K 256

/* Runs both GEMMs over imported weights with fixed activations. */
static void
run_gemms(const cai_weight *i8, const cai_weight *blocks)
{
	static float x[N_TOK * BLOCK_K];
	int8_t		xq[N_TOK * BLOCK_K];
	float		xs[N_TOK * (BLOCK_K / 32)];
	int16_t		xsum[N_TOK * (BLOCK_K / 32)];
	float		out[N_TOK * 8];
	float		row[BLOCK_K];

	for (int i = 0; i < N_TOK * BLOCK_K; i++)
		x[i] = (float) ((i * 37) % 19) - 9.0f;
	if (i8)
	{
		cai_quantize_act_i8(x, N_TOK, i8->m.k, xq, xs);
		cai_gemm_i8(NULL, xq, xs, N_TOK, &i8->m, NULL, out, 8, false);
	}
	if (blocks)
	{
		cai_quantize_act_blocks(x, N_TOK, BLOCK_K, CAI_KQUANT_BLOCKS, xq, xs, xsum);
		for (int p = 0; p < blocks->n_parts; p++)
		{
			const cai_cpu_bmatrix *m = &blocks->parts[p];

			cai_gemm_blocks_portable(xq, xs, xsum, CAI_KQUANT_BLOCKS, N_TOK, m, m->n_out, NULL,
									 out, 8, false);
			cai_gemm_blocks(NULL, xq, xs, xsum, CAI_KQUANT_BLOCKS, N_TOK, m, m->n_out, NULL, out,
							8, false);
			for (int o = 0; o < m->n_out; o++)
				cai_cpu_bmatrix_row(m, o, row);
		}
	}
}

/* The prepared weights the fuzzer's files are read as. */
static void
import_and_run(const cai_wcache_view *v)
{
	static const cai_qmatrix i8_shape = {.n_out = 4, .k = 32};
	static const cai_bmatrix block_shape = {
		.n_out = 8, .k = BLOCK_K, .n_parts = 2,
		.part = {{GGML_TYPE_Q4_K, 5, NULL}, {GGML_TYPE_Q6_K, 3, NULL}},
	};
	const cai_qmatrix *i8s[1] = {&i8_shape};
	const cai_bmatrix *bs[1] = {&block_shape};
	cai_weight *w[1] = {NULL},
			   *b[1] = {NULL};
	uint32_t	cursor = 0;
	cai_error	err;

	if (cai_cpu_import_weights(v, &cursor, i8s, NULL, 1, w, &err) != CAI_OK)
		FUZZ_CHECK(err.message[0] != '\0');
	else if (cai_cpu_import_weights(v, &cursor, NULL, bs, 1, b, &err) != CAI_OK)
	{
		FUZZ_CHECK(err.message[0] != '\0');
		run_gemms(w[0], NULL);
	}
	else
	{
		FUZZ_CHECK(b[0]->n_parts == 2 && b[0]->parts[0].n_out == 5 && b[0]->parts[1].n_out == 3);
		/* the kernels follow the type: flags of another format must never get this far */
		FUZZ_CHECK(cai_cpu_bmatrix_layout_matches(&b[0]->parts[0]) &&
				   cai_cpu_bmatrix_layout_matches(&b[0]->parts[1]));
		run_gemms(w[0], b[0]);
	}
	/* imported weights are the mapping's: only the structs are freed */
	free(w[0]);
	free(b[0]);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t    *copy = NULL;
	uint64_t	key = 0;
	cai_wcache_view v;
	cai_error	err;
	cai_status	checked,
				st;

	/* exactly size bytes (any read past them is AddressSanitizer's), 64-byte aligned */
	if (posix_memalign((void **) &copy, 64, size ? size : 1) != 0)
		return 0;
	memcpy(copy, data, size);
	if (size >= 24)
		memcpy(&key, data + 16, sizeof(key));
	checked = cai_wcache_parse(copy, size, key, true, &v, &err);
	FUZZ_CHECK(checked == CAI_OK || err.message[0] != '\0');
	st = cai_wcache_parse(copy, size, key, false, &v, &err);
	FUZZ_CHECK(checked != CAI_OK || st == CAI_OK);
	if (st == CAI_OK)
	{
		uint64_t	end = CAI_WCACHE_HEADER_BYTES;
		uint8_t		touch = 0;

		for (uint32_t i = 0; i < v.n_sections; i++)
		{
			const cai_wcache_entry *e = &v.table[i];

			FUZZ_CHECK(e->offset >= end && e->offset % CAI_WCACHE_ALIGN == 0);
			FUZZ_CHECK(e->offset <= size && e->bytes <= size - e->offset);
			if (e->bytes)
				touch ^= copy[e->offset] ^ copy[e->offset + e->bytes - 1];
			end = e->offset + e->bytes;
		}
		(void) touch;
		import_and_run(&v);
	}
	else
		FUZZ_CHECK(err.message[0] != '\0');
	free(copy);
	return 0;
}
