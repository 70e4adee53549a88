/*
 * weight_io.c — the CPU backend's prepared weights written to a weights cache and mapped back
 * (backend.h's export_weights / import_weights, weight_cache.h).
 *
 * Each weight is written generically: a descriptor section with the struct's scalar fields
 * (int64 each), then its memory as blobs, with every pointer stored as an offset into its blob
 * (-1 for NULL).  So the export does not know how the kernels arrange their bytes: a change of
 * arrangement raises CAI_QMATRIX_LAYOUT_VERSION or CAI_BLOCK_LAYOUT_VERSION (refusing the old
 * files by their key), and only a change of the structs' fields touches this file, which the
 * static assertions below point to.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_weight.h"
#include "quant.h"
#include "util.h"
#include "weight_cache.h"

_Static_assert(sizeof(cai_cpu_qmatrix) == 32,
			   "cai_cpu_qmatrix changed: update its export below and CAI_QMATRIX_LAYOUT_VERSION");
_Static_assert(sizeof(cai_cpu_bmatrix) == 80,
			   "cai_cpu_bmatrix changed: update its export below and CAI_BLOCK_LAYOUT_VERSION");

#define TAG(a, b, c, d) ((uint32_t) (a) | (uint32_t) (b) << 8 | (uint32_t) (c) << 16 | (uint32_t) (d) << 24)
#define TAG_I8_DESC TAG('I', '8', 'd', 's')
#define TAG_I8_Q TAG('I', '8', 'q', ' ')
#define TAG_I8_SCALE TAG('I', '8', 's', 'c')
#define TAG_BLOCKS_DESC TAG('B', 'K', 'd', 's')
#define TAG_BLOCKS_MEM TAG('B', 'K', 'm', 'm')

/* A block matrix's fields: 10 scalars, then 5 pointer offsets (q, d, dmin, sc, m). */
#define BLOCK_FIELDS 15

uint32_t
cai_backend_cpu_weights_layout(void)
{
	return (uint32_t) CAI_QMATRIX_LAYOUT_VERSION << 16 | (uint32_t) CAI_BLOCK_LAYOUT_VERSION;
}

static int64_t
offset_in(const void *base, const void *p)
{
	return p ? (int64_t) ((const uint8_t *) p - (const uint8_t *) base) : -1;
}

static cai_status
export_i8(const cai_weight *w, struct cai_wcache_writer *out, cai_error *err)
{
	const int64_t desc[3] = {w->m.n_out, w->m.k, w->m.packed};
	cai_status	st;

	if ((st = cai_wcache_add(out, TAG_I8_DESC, desc, sizeof(desc), err)) != CAI_OK ||
		(st = cai_wcache_add(out, TAG_I8_Q, w->m.q, (size_t) w->m.n_out * w->m.k, err)) != CAI_OK)
		return st;
	return cai_wcache_add(out, TAG_I8_SCALE, w->m.scale, (size_t) w->m.n_out * sizeof(float), err);
}

static cai_status
export_blocks(const cai_weight *w, struct cai_wcache_writer *out, cai_error *err)
{
	int64_t		desc[1 + CAI_BMATRIX_MAX_PARTS * BLOCK_FIELDS];
	cai_status	st;

	desc[0] = w->n_parts;
	for (int i = 0; i < w->n_parts; i++)
	{
		const cai_cpu_bmatrix *p = &w->parts[i];
		int64_t    *f = desc + 1 + i * BLOCK_FIELDS;

		f[0] = p->n_out;
		f[1] = p->k;
		f[2] = p->n_groups;
		f[3] = p->type;
		f[4] = p->nibble;
		f[5] = p->k_quant;
		f[6] = p->has_min;
		f[7] = p->split16;
		f[8] = p->zero;
		f[9] = (int64_t) p->bytes;
		f[10] = offset_in(p->mem, p->q);
		f[11] = offset_in(p->mem, p->d);
		f[12] = offset_in(p->mem, p->dmin);
		f[13] = offset_in(p->mem, p->sc);
		f[14] = offset_in(p->mem, p->m);
	}
	st = cai_wcache_add(out, TAG_BLOCKS_DESC, desc,
						(size_t) (1 + w->n_parts * BLOCK_FIELDS) * sizeof(int64_t), err);
	for (int i = 0; i < w->n_parts && st == CAI_OK; i++)
		st = cai_wcache_add(out, TAG_BLOCKS_MEM, w->parts[i].mem, w->parts[i].bytes, err);
	return st;
}

cai_status
cai_cpu_export_weights(const cai_weight *const *w, int n, struct cai_wcache_writer *out,
					   cai_error *err)
{
	cai_status	st = CAI_OK;

	for (int i = 0; i < n && st == CAI_OK; i++)
		st = w[i]->n_parts > 0 ? export_blocks(w[i], out, err) : export_i8(w[i], out, err);
	return st;
}

/* An int8 matrix of shape src from its three sections. */
static cai_status
import_i8(const cai_wcache_view *in, uint32_t *cursor, const cai_qmatrix *src, cai_weight *w,
		  cai_error *err)
{
	const void *desc,
			   *q,
			   *scale;
	size_t		desc_bytes,
				q_bytes,
				scale_bytes;
	int64_t		f[3];
	cai_status	st;

	if ((st = cai_wcache_next(in, cursor, TAG_I8_DESC, &desc, &desc_bytes, err)) != CAI_OK ||
		(st = cai_wcache_next(in, cursor, TAG_I8_Q, &q, &q_bytes, err)) != CAI_OK ||
		(st = cai_wcache_next(in, cursor, TAG_I8_SCALE, &scale, &scale_bytes, err)) != CAI_OK)
		return st;
	if (desc_bytes != sizeof(f))
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache: an int8 descriptor of %zu bytes",
						desc_bytes);
	memcpy(f, desc, sizeof(f));
	if (f[0] != src->n_out || f[1] != src->k || (f[2] != 0 && f[2] != 1) ||
		q_bytes != (size_t) src->n_out * src->k || scale_bytes != (size_t) src->n_out * sizeof(float))
		return cai_fail(err, CAI_ERR_FORMAT,
						"weights cache: an int8 matrix of %lld x %lld, expected %d x %d",
						(long long) f[0], (long long) f[1], src->n_out, src->k);
	w->m = (cai_cpu_qmatrix) {.n_out = src->n_out, .k = src->k, .q = q, .scale = scale,
	.packed = f[2] != 0};
	return CAI_OK;
}

/*
 * Where a stored offset points in a blob of bytes (NULL for -1, which only an array of no
 * extent may be); false unless extent bytes from there lie inside the blob.
 */
static bool
pointer_in(const uint8_t *blob, size_t bytes, int64_t off, bool required, size_t extent,
		   const void **out)
{
	*out = NULL;
	if (off == -1)
		return !required;
	/* the kernels' vector loads want each array where the packing puts it: 64-byte aligned */
	if (!required || off < 0 || (uint64_t) off > bytes || extent > bytes - (size_t) off ||
		off % 64 != 0)
		return false;
	*out = blob + off;
	return true;
}

/*
 * The bytes the kernels read from each array (q, d, dmin, sc, m) of a block matrix with fields
 * f, as gemm_blocks.h lays them out; 0 for an array the flags say it has not.  The import checks
 * a file's arrays against these, so that not even a file written wrong makes a kernel read past
 * its mapping (a layout change that forgets them makes every file refused, never misread).
 */
static void
block_extents(const int64_t *f, size_t extents[5])
{
	const size_t g = (size_t) (f[2] > 0 ? f[2] : 0);
	const size_t nb = (size_t) (f[1] > 0 ? f[1] : 0) / CAI_BLOCK_ELEMS;
	const bool	k_quant = f[5],
				has_min = f[6];

	extents[0] = g * nb * cai_cpu_bmatrix_block_bytes((ggml_type) f[3]);
	extents[1] = g * (k_quant ? nb / 8 : nb) * CAI_BLOCK_ROWS * sizeof(uint16_t);
	extents[2] = has_min ? extents[1] : 0;
	extents[3] = k_quant ? g * nb * CAI_BLOCK_ROWS * (f[7] ? 2 : 1) : 0;
	extents[4] = k_quant && has_min ? g * nb * CAI_BLOCK_ROWS : 0;
}

/* One part of a block matrix from its fields f and memory section, checked against src's part. */
static cai_status
import_block_part(const int64_t *f, const void *blob, size_t blob_bytes, const cai_bmatrix *src,
				  int i, cai_cpu_bmatrix *p, cai_error *err)
{
	const void *ptr[5];
	size_t		extents[5];

	for (int b = 4; b <= 7; b++)
		if (f[b] != 0 && f[b] != 1)
			return cai_fail(err, CAI_ERR_FORMAT, "weights cache: a block flag of %lld",
							(long long) f[b]);
	if (f[0] != src->part[i].rows || f[1] != src->k || f[3] != src->part[i].type ||
		f[2] != (f[0] + CAI_BLOCK_ROWS - 1) / CAI_BLOCK_ROWS || f[8] < -128 || f[8] > 127 ||
		f[9] < 0 || (uint64_t) f[9] != blob_bytes)
		return cai_fail(err, CAI_ERR_FORMAT,
						"weights cache: a block matrix of %lld x %lld (type %lld), expected %d x %d (%s)",
						(long long) f[0], (long long) f[1], (long long) f[3], src->part[i].rows,
						src->k, ggml_type_name(src->part[i].type));
	block_extents(f, extents);
	if ((f[5] && f[1] % 256 != 0) || (f[7] && !f[5]))
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache: block flags that do not fit k = %lld",
						(long long) f[1]);
	for (int j = 0; j < 5; j++)
		if (!pointer_in(blob, blob_bytes, f[10 + j], extents[j] > 0, extents[j], &ptr[j]))
			return cai_fail(err, CAI_ERR_FORMAT, "weights cache: a block array at offset %lld "
							"does not fit its %zu bytes", (long long) f[10 + j], extents[j]);
	*p = (cai_cpu_bmatrix) {
		.n_out = (int) f[0], .k = (int) f[1], .n_groups = (int) f[2], .type = (ggml_type) f[3],
		.nibble = f[4], .k_quant = f[5], .has_min = f[6], .split16 = f[7], .zero = (int8_t) f[8],
		.q = ptr[0], .d = ptr[1], .dmin = ptr[2], .sc = ptr[3], .m = ptr[4],
		.mem = NULL, .bytes = blob_bytes,
	};
	if (!cai_cpu_bmatrix_layout_matches(p))
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache: block flags that are not those of %s",
						ggml_type_name(src->part[i].type));
	return CAI_OK;
}

static cai_status
import_blocks(const cai_wcache_view *in, uint32_t *cursor, const cai_bmatrix *src, cai_weight *w,
			  cai_error *err)
{
	const void *desc;
	size_t		desc_bytes;
	int64_t		f[1 + CAI_BMATRIX_MAX_PARTS * BLOCK_FIELDS];
	cai_status	st;

	if ((st = cai_wcache_next(in, cursor, TAG_BLOCKS_DESC, &desc, &desc_bytes, err)) != CAI_OK)
		return st;
	if (desc_bytes != (size_t) (1 + src->n_parts * BLOCK_FIELDS) * sizeof(int64_t))
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache: a block descriptor of %zu bytes",
						desc_bytes);
	memcpy(f, desc, desc_bytes);
	if (f[0] != src->n_parts)
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache: %lld parts, expected %d",
						(long long) f[0], src->n_parts);
	for (int i = 0; i < src->n_parts; i++)
	{
		const void *blob;
		size_t		blob_bytes;

		if ((st = cai_wcache_next(in, cursor, TAG_BLOCKS_MEM, &blob, &blob_bytes, err)) != CAI_OK ||
			(st = import_block_part(f + 1 + i * BLOCK_FIELDS, blob, blob_bytes, src, i,
									&w->parts[i], err)) != CAI_OK)
			return st;
		w->n_parts = i + 1;
	}
	return CAI_OK;
}

cai_status
cai_cpu_import_weights(const struct cai_wcache_view *in, uint32_t *cursor,
					   const cai_qmatrix *const *i8, const cai_bmatrix *const *blocks, int n,
					   cai_weight **made, cai_error *err)
{
	cai_status	st = CAI_OK;

	for (int i = 0; i < n && st == CAI_OK; i++)
	{
		if (!(made[i] = calloc(1, sizeof(cai_weight))))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory mapping the weights");
		made[i]->mapped = true;
		st = i8 ? import_i8(in, cursor, i8[i], made[i], err) :
			import_blocks(in, cursor, blocks[i], made[i], err);
	}
	return st;
}
