/*
 * bench_gpu.c — decode and prefill throughput of the CUDA kernels on synthetic int8 models,
 * each beside its roofline.
 *
 * Usage: bench_gpu [--quick] [--model smollm2|1b|8b|all] [--context N] [--device N] [--json FILE]
 *
 * Models are llama-shaped with seeded random int8 weights generated on the device (no file):
 *   smollm2  SmolLM2-135M: d 576, 30 layers, 9/3 heads of 64, d_ff 1536, vocab 49152
 *   1b       Llama-3.2-1B: d 2048, 16 layers, 32/8 heads of 64, d_ff 8192, vocab 128256
 *   8b       Llama-3-8B:   d 4096, 32 layers, 32/8 heads of 128, d_ff 14336, vocab 128256
 * The forward is the engine's int8 forward, kernel for kernel (forward.c's sequence of backend
 * operations): embedding, per layer RMSNorm, rotation+quantize, QKV GEMM, RoPE, rotation of the
 * q and k heads, KV write, attention, quantize, output GEMM into the residual, RMSNorm,
 * rotation+quantize, gate/up GEMM, SwiGLU, rotation+quantize, down GEMM into the residual;
 * final norm, rotation+quantize, LM head, argmax.  The rotations are the ones calibrate.c
 * chooses for these widths (cai_model_make_rotation); the LM head is its own matrix, as the
 * engine's int8 path keeps a smoothed and rotated copy even when the embeddings are tied.
 *
 * Decode: B sequences of `context` cached positions each (the KV pool is filled with random
 * int8 and positive scales) take one token; the step is captured once as a CUDA graph and
 * replayed; tokens/s = B / median step time.  Prefill: one prompt of 2048 tokens from position
 * 0, one forward, tokens/s = 2048 / median time.
 *
 * Rooflines, from two ceilings measured first on the same device: HBM bandwidth (a streaming
 * copy kernel; bytes read + written per second) and the int8 GEMM rate (an 8192^3 cuBLASLt GEMM).
 * decode floor = max(bytes moved / bandwidth, int8 ops / rate), bytes = every weight once plus
 * every cached K/V byte (values and scales) once; prefill floor = max(weights / bandwidth,
 * (GEMM ops + causal attention ops) / rate).  The table prints measured, roofline and their ratio.
 * A last row per model times the engine's int8 GEMM path alone at large M (the prefill's 2048
 * tokens through the gate/up matrix) against the measured int8 rate.  Then the file's block
 * weights beside int8 on the same matrix (random Q4_0 and Q4_K blocks, repacked as the backend
 * does): the batch-1 GEMV as weight bytes read per second against half the copy bandwidth (a
 * copy reads and writes), and the 2048-token GEMM as TOPS.  --json writes every row.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"

typedef struct shape
{
	const char *name;
	int			d;
	int			n_layers;
	int			n_heads;
	int			n_kv_heads;
	int			head_dim;
	int			d_ff;
	int			vocab;
} shape;

static const shape SHAPES[] = {
	{"smollm2-135m", 576, 30, 9, 3, 64, 1536, 49152},
	{"llama-1b", 2048, 16, 32, 8, 64, 8192, 128256},
	{"llama-8b", 4096, 32, 32, 8, 128, 14336, 128256},
};

#define PREFILL_TOKENS 2048
#define MAX_BATCH 256

typedef struct layer
{
	cai_cuda_qmatrix wqkv,
				wo,
				w_gate_up,
				w_down;
	float	   *attn_norm,
			   *ffn_norm;
} layer;

typedef struct bench_model
{
	shape		s;
	cai_cuda_qmatrix embd,
				lm_head;
	float	   *out_norm;
	cai_cuda_rotation rot_model,	/* d wide */
				rot_ff,			/* d_ff wide */
				rot_head;		/* head_dim wide */
	layer	   *layers;
	double		weight_bytes;
	double		matmul_params;	/* multiply-adds per token in the GEMMs */
	cai_cuda_kv kv;
	float	   *rope;			/* [n_pos, head_dim] */
	int			n_pos;
	/* activations for up to max_tokens rows */
	int			max_tokens;
	float	   *x,
			   *xn,				/* a norm's or SwiGLU's output, rotated in place */
			   *qkv,
			   *att,
			   *gate_up,
			   *cs,
			   *logits;
	int8_t	   *xq;
	float	   *xs;
	int32_t    *next;
} bench_model;

static cai_cuda_ctx *ctx;
static cai_error err;

#define TRY(call) \
	do { \
		if ((call) != CAI_OK) \
		{ \
			fprintf(stderr, "bench_gpu: %s\n", err.message); \
			return false; \
		} \
	} while (0)

static bool
alloc_f32(float **p, size_t n, const char *what)
{
	TRY(cai_cuda_malloc(ctx, n * sizeof(float), what, (void **) p, &err));
	return true;
}

static bool
random_matrix(cai_cuda_qmatrix *m, int n_out, int k, uint64_t seed, bench_model *bm)
{
	TRY(cai_cuda_qmatrix_random(ctx, n_out, k, seed, "weights", m, &err));
	bm->weight_bytes += (double) n_out * k + (double) n_out * sizeof(float);
	return true;
}

/*
 * calibrate.c's rotation of vectors of n values (cai_model_make_rotation): n_pow2 the largest
 * power of two dividing n; chunks of 64 or more, or more than 64 chunks, are rotated as separate blocks of
 * n_pow2; otherwise the chunks are mixed by the discrete Hartley table, uploaded here.
 */
static bool
make_rotation(int n, cai_cuda_rotation *r)
{
	int			p = 1;
	int			mix;

	while (n % (2 * p) == 0)
		p *= 2;
	mix = n / p;
	if (mix > 64 || p >= 64)
	{
		n = p;
		mix = 1;
	}
	r->n = n;
	r->n_pow2 = p;
	r->n_mix = mix;
	r->norm = (float) (1.0 / sqrt((double) n));
	r->mix_dev = NULL;
	if (mix > 1)
	{
		float		t[64 * 64];
		void	   *dev = NULL;

		for (int a = 0; a < mix; a++)
			for (int b = 0; b < mix; b++)
			{
				double		theta = 2.0 * M_PI * (double) ((a * b) % mix) / (double) mix;

				t[a * mix + b] = (float) (cos(theta) + sin(theta));
			}
		TRY(cai_cuda_malloc(ctx, (size_t) mix * mix * sizeof(float), "a mix table", &dev, &err));
		r->mix_dev = dev;
		TRY(cai_cuda_upload_sync(ctx, dev, t, (size_t) mix * mix * sizeof(float), &err));
	}
	return true;
}

static bool
model_create(bench_model *bm, const shape *s, int context)
{
	int			q_dim = s->n_heads * s->head_dim;
	int			kv_dim = s->n_kv_heads * s->head_dim;
	int			width;
	size_t		part,
				layer_bytes;
	int			blocks_per_seq;
	uint64_t	seed = 1;

	memset(bm, 0, sizeof(*bm));
	bm->s = *s;
	bm->layers = calloc((size_t) s->n_layers, sizeof(layer));
	if (!bm->layers)
		return false;
	if (!random_matrix(&bm->embd, s->vocab, s->d, seed++, bm))
		return false;
	if (!random_matrix(&bm->lm_head, s->vocab, s->d, seed++, bm) ||
		!make_rotation(s->d, &bm->rot_model) || !make_rotation(s->d_ff, &bm->rot_ff) ||
		!make_rotation(s->head_dim, &bm->rot_head))
		return false;
	if (!alloc_f32(&bm->out_norm, s->d, "norms"))
		return false;
	TRY(cai_cuda_fill_random_f32(ctx, bm->out_norm, s->d, 0.9f, 1.1f, seed++, &err));
	for (int l = 0; l < s->n_layers; l++)
	{
		layer	   *L = &bm->layers[l];

		if (!random_matrix(&L->wqkv, q_dim + 2 * kv_dim, s->d, seed++, bm) ||
			!random_matrix(&L->wo, s->d, q_dim, seed++, bm) ||
			!random_matrix(&L->w_gate_up, 2 * s->d_ff, s->d, seed++, bm) ||
			!random_matrix(&L->w_down, s->d, s->d_ff, seed++, bm) ||
			!alloc_f32(&L->attn_norm, s->d, "norms") || !alloc_f32(&L->ffn_norm, s->d, "norms"))
			return false;
		TRY(cai_cuda_fill_random_f32(ctx, L->attn_norm, s->d, 0.9f, 1.1f, seed++, &err));
		TRY(cai_cuda_fill_random_f32(ctx, L->ffn_norm, s->d, 0.9f, 1.1f, seed++, &err));
	}
	bm->matmul_params = (double) s->n_layers *
		((double) (q_dim + 2 * kv_dim) * s->d + (double) s->d * q_dim + 3.0 * s->d_ff * s->d) +
		(double) s->vocab * s->d;

	/* the KV pool: MAX_BATCH sequences of context + 1 positions, or one prefill */
	part = (size_t) 16 * s->n_kv_heads * (2 * (size_t) s->head_dim + 2 * sizeof(float));
	layer_bytes = (part + 63) & ~(size_t) 63;
	blocks_per_seq = (context + 1 + 15) / 16;
	bm->kv.n_blocks = MAX_BATCH * blocks_per_seq;
	if (bm->kv.n_blocks < (PREFILL_TOKENS + 15) / 16)
		bm->kv.n_blocks = (PREFILL_TOKENS + 15) / 16;
	bm->kv.layer_bytes = layer_bytes;
	bm->kv.block_bytes = layer_bytes * s->n_layers;
	bm->kv.n_kv_heads = s->n_kv_heads;
	bm->kv.head_dim = s->head_dim;
	TRY(cai_cuda_malloc(ctx, (size_t) bm->kv.n_blocks * bm->kv.block_bytes, "the kv cache",
						(void **) &bm->kv.pool_dev, &err));
	/*
	 * Random bytes that are also valid scales: positive floats in [0.001, 0.02] everywhere (the
	 * int8 values are then those floats' bytes, which is as good as any other data).
	 */
	TRY(cai_cuda_fill_random_f32(ctx, (float *) bm->kv.pool_dev,
								 (size_t) bm->kv.n_blocks * bm->kv.block_bytes / sizeof(float),
								 0.001f, 0.02f, seed++, &err));

	bm->n_pos = (context + 1 > PREFILL_TOKENS ? context + 1 : PREFILL_TOKENS);
	if (!alloc_f32(&bm->rope, (size_t) bm->n_pos * s->head_dim, "the rope table"))
		return false;
	TRY(cai_cuda_rope_table(ctx, bm->rope, bm->n_pos, s->head_dim, 500000.0, 1.0, &err));

	bm->max_tokens = PREFILL_TOKENS > MAX_BATCH ? PREFILL_TOKENS : MAX_BATCH;
	width = s->d_ff > q_dim ? s->d_ff : q_dim;
	if (s->d > width)
		width = s->d;
	if (!alloc_f32(&bm->x, (size_t) bm->max_tokens * s->d, "activations") ||
		!alloc_f32(&bm->xn, (size_t) bm->max_tokens * width, "activations") ||
		!alloc_f32(&bm->qkv, (size_t) bm->max_tokens * (q_dim + 2 * kv_dim), "activations") ||
		!alloc_f32(&bm->att, (size_t) bm->max_tokens * q_dim, "activations") ||
		!alloc_f32(&bm->gate_up, (size_t) bm->max_tokens * 2 * s->d_ff, "activations") ||
		!alloc_f32(&bm->cs, (size_t) bm->max_tokens * s->head_dim, "activations") ||
		!alloc_f32(&bm->logits, (size_t) MAX_BATCH * s->vocab, "logits") ||
		!alloc_f32(&bm->xs, (size_t) bm->max_tokens, "activations"))
		return false;
	TRY(cai_cuda_malloc(ctx, (size_t) bm->max_tokens * width, "activations", (void **) &bm->xq,
						&err));
	TRY(cai_cuda_malloc(ctx, (size_t) MAX_BATCH * sizeof(int32_t), "tokens", (void **) &bm->next,
						&err));
	TRY(cai_cuda_step_reserve(ctx, bm->max_tokens, MAX_BATCH,
							  blocks_per_seq > (PREFILL_TOKENS + 15) / 16 ?
							  blocks_per_seq : (PREFILL_TOKENS + 15) / 16,
							  s->n_heads, s->n_kv_heads, s->head_dim, &err));
	TRY(cai_cuda_sync(ctx, &err));
	return true;
}

static void
model_free(bench_model *bm)
{
	cai_cuda_sync(ctx, &err);
	cai_cuda_graph_reset(ctx);
	cai_cuda_qmatrix_free(ctx, &bm->lm_head);
	cai_cuda_qmatrix_free(ctx, &bm->embd);
	cai_cuda_free(ctx, (void *) bm->rot_model.mix_dev);
	cai_cuda_free(ctx, (void *) bm->rot_ff.mix_dev);
	cai_cuda_free(ctx, (void *) bm->rot_head.mix_dev);
	for (int l = 0; bm->layers && l < bm->s.n_layers; l++)
	{
		cai_cuda_qmatrix_free(ctx, &bm->layers[l].wqkv);
		cai_cuda_qmatrix_free(ctx, &bm->layers[l].wo);
		cai_cuda_qmatrix_free(ctx, &bm->layers[l].w_gate_up);
		cai_cuda_qmatrix_free(ctx, &bm->layers[l].w_down);
		cai_cuda_free(ctx, bm->layers[l].attn_norm);
		cai_cuda_free(ctx, bm->layers[l].ffn_norm);
	}
	free(bm->layers);
	cai_cuda_free(ctx, bm->out_norm);
	cai_cuda_free(ctx, bm->kv.pool_dev);
	cai_cuda_free(ctx, bm->rope);
	cai_cuda_free(ctx, bm->x);
	cai_cuda_free(ctx, bm->xn);
	cai_cuda_free(ctx, bm->qkv);
	cai_cuda_free(ctx, bm->att);
	cai_cuda_free(ctx, bm->gate_up);
	cai_cuda_free(ctx, bm->cs);
	cai_cuda_free(ctx, bm->logits);
	cai_cuda_free(ctx, bm->xq);
	cai_cuda_free(ctx, bm->xs);
	cai_cuda_free(ctx, bm->next);
	memset(bm, 0, sizeof(*bm));
}

/*
 * One forward over the planned step: T rows; logits for the last row of each of the n_seqs
 * sequences (decode: every row).  Everything is enqueued; nothing waits.
 */
static bool
forward(bench_model *bm, const cai_cuda_step_meta *meta, int T, bool logits_all_rows)
{
	const shape *s = &bm->s;
	int			q_dim = s->n_heads * s->head_dim;
	int			kv_dim = s->n_kv_heads * s->head_dim;
	int			qkv_w = q_dim + 2 * kv_dim;
	int			R = logits_all_rows ? T : 1;
	int			nv_model = s->d / bm->rot_model.n;
	int			nv_ff = s->d_ff / bm->rot_ff.n;
	int			nv_head = (s->n_heads + s->n_kv_heads) * s->head_dim / bm->rot_head.n;
	cai_cuda_epilogue acc = {NULL, true, CAI_CUDA_ACT_NONE, NULL, NULL};

	TRY(cai_cuda_embed_i8(ctx, &bm->embd, meta->tokens_dev, T, bm->x, &err));
	TRY(cai_cuda_rope_gather(ctx, bm->rope, bm->n_pos, s->head_dim, meta->positions_dev, T,
							 bm->cs, &err));
	for (int l = 0; l < s->n_layers; l++)
	{
		layer	   *L = &bm->layers[l];

		TRY(cai_cuda_rmsnorm(ctx, bm->x, L->attn_norm, T, s->d, 1e-5f, bm->xn, NULL, NULL, &err));
		TRY(cai_cuda_rotate(ctx, &bm->rot_model, bm->xn, s->d, T, nv_model, bm->xq, bm->xs,
							&err));
		TRY(cai_cuda_gemm_i8(ctx, bm->xq, bm->xs, T, &L->wqkv, bm->qkv, qkv_w, NULL, &err));
		TRY(cai_cuda_rope(ctx, bm->cs, bm->qkv, qkv_w, T, s->n_heads + s->n_kv_heads, s->head_dim,
						  s->head_dim, false, &err));
		TRY(cai_cuda_rotate(ctx, &bm->rot_head, bm->qkv, qkv_w, T, nv_head, NULL, NULL, &err));
		TRY(cai_cuda_kv_write(ctx, &bm->kv, l, meta, bm->qkv + q_dim, bm->qkv + q_dim + kv_dim,
							  qkv_w, NULL, &err));
		/* the score scale in base-2 units, 1/sqrt(head size) * log2(e) (backend.h) */
		TRY(cai_cuda_attention(ctx, &bm->kv, l, meta, bm->qkv, qkv_w, bm->att, q_dim, s->n_heads,
							   0, (1.0f / sqrtf((float) s->head_dim)) * 1.44269504088896341f, NULL,
							   &err));
		TRY(cai_cuda_quantize_act(ctx, bm->att, T, q_dim, q_dim, bm->xq, bm->xs, &err));
		TRY(cai_cuda_gemm_i8(ctx, bm->xq, bm->xs, T, &L->wo, bm->x, s->d, &acc, &err));
		TRY(cai_cuda_rmsnorm(ctx, bm->x, L->ffn_norm, T, s->d, 1e-5f, bm->xn, NULL, NULL, &err));
		TRY(cai_cuda_rotate(ctx, &bm->rot_model, bm->xn, s->d, T, nv_model, bm->xq, bm->xs,
							&err));
		TRY(cai_cuda_gemm_i8(ctx, bm->xq, bm->xs, T, &L->w_gate_up, bm->gate_up, 2 * s->d_ff, NULL,
							 &err));
		TRY(cai_cuda_swiglu(ctx, bm->gate_up, T, s->d_ff, bm->xn, NULL, NULL, &err));
		TRY(cai_cuda_rotate(ctx, &bm->rot_ff, bm->xn, s->d_ff, T, nv_ff, bm->xq, bm->xs, &err));
		TRY(cai_cuda_gemm_i8(ctx, bm->xq, bm->xs, T, &L->w_down, bm->x, s->d, &acc, &err));
	}
	/* prefill: the last row only */
	TRY(cai_cuda_rmsnorm(ctx, bm->x + (size_t) (T - R) * s->d, bm->out_norm, R, s->d, 1e-5f,
						 bm->xn, NULL, NULL, &err));
	TRY(cai_cuda_rotate(ctx, &bm->rot_model, bm->xn, s->d, R, nv_model, bm->xq, bm->xs, &err));
	TRY(cai_cuda_gemm_i8(ctx, bm->xq, bm->xs, R, &bm->lm_head, bm->logits, s->vocab, NULL, &err));
	TRY(cai_cuda_argmax(ctx, bm->logits, R, s->vocab, s->vocab, bm->next, &err));
	return true;
}

static int
compare_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return x < y ? -1 : x > y;
}

/* Plans B sequences: sequence b owns blocks [b * bps, (b + 1) * bps), takes n_new tokens at pos. */
static bool
plan(bench_model *bm, int B, int pos, int n_new, int bps, bool for_graph,
	 const cai_cuda_step_meta **meta)
{
	cai_cuda_seq_desc *descs = calloc((size_t) B, sizeof(cai_cuda_seq_desc));
	int32_t    *tables = malloc((size_t) B * bps * sizeof(int32_t));
	int32_t    *tokens = malloc((size_t) B * n_new * sizeof(int32_t));
	bool		ok = descs && tables && tokens;

	for (int b = 0; ok && b < B; b++)
	{
		for (int i = 0; i < bps; i++)
			tables[(size_t) b * bps + i] = b * bps + i;
		for (int i = 0; i < n_new; i++)
			tokens[(size_t) b * n_new + i] = (b * 7919 + i * 104729) % bm->s.vocab;
		descs[b].n_new = n_new;
		descs[b].pos = pos;
		descs[b].block_table = tables + (size_t) b * bps;
		descs[b].n_blocks = bps;
	}
	if (ok && cai_cuda_step_plan(ctx, descs, B, tokens, B * n_new, bm->s.n_heads, bm->s.n_kv_heads,
								 bm->s.head_dim, for_graph, meta, &err) != CAI_OK)
	{
		fprintf(stderr, "bench_gpu: %s\n", err.message);
		ok = false;
	}
	free(descs);
	free(tables);
	free(tokens);
	return ok;
}

typedef struct result
{
	double		measured;		/* tokens/s (ops/s for a GEMM row) */
	double		roofline;		/* tokens/s (the measured int8 rate for a GEMM row) */
} result;

/* Every row printed, for --json. */
#define MAX_ROWS 64

typedef struct report_row
{
	const char *model;
	char		workload[32];
	const char *unit;
	bool		ok;
	result		res;
} report_row;

static report_row rows[MAX_ROWS];
static int	n_rows;

static void
report(const char *model, const char *workload, const char *unit, bool ok, const result *res)
{
	if (ok)
		printf("%-14s %-12s %14.0f %14.0f %7.0f%%\n", model, workload, res->measured,
			   res->roofline, 100.0 * res->measured / res->roofline);
	else
		printf("%-14s %-12s %14s\n", model, workload, "failed");
	fflush(stdout);
	if (n_rows < MAX_ROWS)
	{
		report_row *r = &rows[n_rows++];

		r->model = model;
		snprintf(r->workload, sizeof(r->workload), "%s", workload);
		r->unit = unit;
		r->ok = ok;
		r->res = ok ? *res : (result) {0, 0};
	}
}

static bool
write_json(const char *path, const cai_cuda_device_info *info, double bw, double peak, int context)
{
	FILE	   *f = fopen(path, "w");

	if (!f)
	{
		perror(path);
		return false;
	}
	fprintf(f, "{\"device\": \"%s\", \"compute_capability\": \"%d.%d\", \"sms\": %d,\n"
			" \"copy_bandwidth_bytes_per_s\": %.6g, \"int8_gemm_ops_per_s\": %.6g,\n"
			" \"decode_context\": %d, \"prefill_tokens\": %d,\n \"rows\": [",
			info->name, info->cc_major, info->cc_minor, info->sm_count, bw, peak, context,
			PREFILL_TOKENS);
	for (int i = 0; i < n_rows; i++)
		fprintf(f, "%s\n  {\"model\": \"%s\", \"workload\": \"%s\", \"unit\": \"%s\", "
				"\"ok\": %s, \"measured\": %.6g, \"roofline\": %.6g, \"ratio\": %.4f}",
				i ? "," : "", rows[i].model, rows[i].workload, rows[i].unit,
				rows[i].ok ? "true" : "false", rows[i].res.measured, rows[i].res.roofline,
				rows[i].ok ? rows[i].res.measured / rows[i].res.roofline : 0.0);
	fprintf(f, "\n]}\n");
	return fclose(f) == 0;
}

static bool
bench_decode(bench_model *bm, int B, int context, int reps, double bw, double peak, result *out)
{
	const cai_cuda_step_meta *meta;
	cai_cuda_timer *timer = NULL;
	double	   *times = calloc((size_t) reps, sizeof(double));
	int			bps = (context + 1 + 15) / 16;
	double		kv_bytes_per_pos = (double) bm->kv.block_bytes / 16.0;
	double		bytes,
				ops,
				floor_s;
	bool		ok = false;

	if (!times || !plan(bm, B, context, 1, bps, true, &meta))
		goto done;
	/* warm-up outside the capture: algorithm choices and scratch sizes are settled here */
	if (!forward(bm, meta, B, true))
		goto done;
	if (cai_cuda_graph_begin(ctx, &err) != CAI_OK)
		goto fail;
	if (!forward(bm, meta, B, true))
	{
		cai_cuda_graph_abort(ctx);
		goto done;
	}
	if (cai_cuda_graph_end(ctx, B, &err) != CAI_OK ||
		cai_cuda_timer_create(ctx, &timer, &err) != CAI_OK)
		goto fail;
	for (int r = -3; r < reps; r++)
	{
		double		sec;

		if (cai_cuda_timer_start(ctx, timer, &err) != CAI_OK ||
			cai_cuda_graph_launch(ctx, B, &err) != CAI_OK ||
			cai_cuda_timer_stop(ctx, timer, &sec, &err) != CAI_OK)
			goto fail;
		if (r >= 0)
			times[r] = sec;
	}
	qsort(times, (size_t) reps, sizeof(double), compare_double);
	out->measured = B / times[reps / 2];
	bytes = bm->weight_bytes + (double) B * context * kv_bytes_per_pos;
	ops = 2.0 * bm->matmul_params * B;
	floor_s = fmax(bytes / bw, ops / peak);
	out->roofline = B / floor_s;
	ok = true;
	goto done;
fail:
	fprintf(stderr, "bench_gpu: %s\n", err.message);
done:
	cai_cuda_timer_free(timer);
	free(times);
	return ok;
}

static bool
bench_prefill(bench_model *bm, int reps, double bw, double peak, result *out)
{
	const shape *s = &bm->s;
	const cai_cuda_step_meta *meta;
	cai_cuda_timer *timer = NULL;
	double	   *times = calloc((size_t) reps, sizeof(double));
	int			P = PREFILL_TOKENS;
	double		ops,
				floor_s;
	bool		ok = false;

	if (!times || !plan(bm, 1, 0, P, (P + 15) / 16, false, &meta) ||
		cai_cuda_timer_create(ctx, &timer, &err) != CAI_OK)
		goto done;
	for (int r = -1; r < reps; r++)
	{
		double		sec;

		if (cai_cuda_timer_start(ctx, timer, &err) != CAI_OK)
			goto done;
		if (!forward(bm, meta, P, false))
			goto done;
		if (cai_cuda_timer_stop(ctx, timer, &sec, &err) != CAI_OK)
			goto done;
		if (r >= 0)
			times[r] = sec;
	}
	qsort(times, (size_t) reps, sizeof(double), compare_double);
	out->measured = P / times[reps / 2];
	/* GEMMs, plus QK^T and PV over the causal half: 2 * 2 * (P^2 / 2) * head_dim per head */
	ops = 2.0 * bm->matmul_params * P +
		2.0 * (double) P * P * s->head_dim * s->n_heads * s->n_layers;
	floor_s = fmax(bm->weight_bytes / bw, ops / peak);
	out->roofline = P / floor_s;
	ok = true;
done:
	cai_cuda_timer_free(timer);
	free(times);
	return ok;
}

/*
 * The file's block weights against int8: one GEMM of the gate/up matrix (2 d_ff x d) of a shape
 * at n_tok tokens, the int8 matrix (cai_cuda_gemm_i8) or a repacked block matrix of random
 * blocks (type a GGUF block type, 0 = int8), median device time of reps runs of 10 launches.
 */
static bool
time_gate_up(const shape *s, int type, int n_tok, int reps, double *seconds, double *weight_bytes)
{
	const int	n_out = 2 * s->d_ff,
				k = s->d;
	const int	elems = type == 12 ? 256 : 32,
				bsize = type == 12 ? 144 : 18;	/* Q4_K or Q4_0 */
	cai_cuda_qmatrix qm = {0};
	cai_cuda_bmatrix bmx = {0};
	cai_cuda_bmatrix_host h = {0};
	int8_t	   *xq = NULL;
	float	   *xs = NULL,
			   *out = NULL;
	int16_t    *xsum = NULL;
	uint8_t    *blocks = NULL;
	cai_cuda_timer *timer = NULL;
	double	   *times = calloc((size_t) reps, sizeof(double));
	bool		ok = false;

	if (!times ||
		cai_cuda_malloc(ctx, (size_t) n_tok * k, "x", (void **) &xq, &err) != CAI_OK ||
		cai_cuda_malloc(ctx, (size_t) n_tok * k / 8, "xs", (void **) &xs, &err) != CAI_OK ||
		cai_cuda_malloc(ctx, (size_t) n_tok * k / 16, "xsum", (void **) &xsum, &err) != CAI_OK ||
		cai_cuda_malloc(ctx, (size_t) n_tok * n_out * sizeof(float), "out", (void **) &out,
						&err) != CAI_OK ||
		cai_cuda_fill_random_i8(ctx, xq, (size_t) n_tok * k, 5, &err) != CAI_OK ||
		cai_cuda_fill_random_f32(ctx, xs, (size_t) n_tok * k / 32, 1e-3f, 1e-2f, 6, &err) != CAI_OK ||
		cai_cuda_memset(ctx, xsum, 0, (size_t) n_tok * k / 16, &err) != CAI_OK)
		goto fail;
	if (type == 0)
	{
		if (cai_cuda_qmatrix_random(ctx, n_out, k, 7, "weights", &qm, &err) != CAI_OK)
			goto fail;
		*weight_bytes = (double) n_out * k + (double) n_out * sizeof(float);
	}
	else
	{
		size_t		n_bytes = (size_t) n_out * (k / elems) * bsize;
		uint64_t	st = 88172645463325252ull;

		if (!(blocks = malloc(n_bytes)))
			goto done;
		for (size_t i = 0; i < n_bytes; i++)
		{
			st ^= st << 13, st ^= st >> 7, st ^= st << 17;
			blocks[i] = (uint8_t) st;
		}
		/* finite scales: fp16 0x2e66 (about 0.1) as d, and as dmin (K-quants) */
		for (size_t b = 0; b < n_bytes / bsize; b++)
		{
			blocks[b * bsize] = 0x66, blocks[b * bsize + 1] = 0x2e;
			if (type == 12)
				blocks[b * bsize + 2] = 0x66, blocks[b * bsize + 3] = 0x2e;
		}
		if (cai_cuda_bmatrix_pack(type, blocks, n_out, k, &h, &err) != CAI_OK ||
			cai_cuda_bmatrix_upload(ctx, &h, "block weights", &bmx, &err) != CAI_OK)
			goto fail;
		*weight_bytes = (double) h.q_bytes + (double) h.sc_bytes;
	}
	if (cai_cuda_timer_create(ctx, &timer, &err) != CAI_OK)
		goto fail;
	for (int r = -2; r < reps; r++)
	{
		double		sec;

		if (cai_cuda_timer_start(ctx, timer, &err) != CAI_OK)
			goto fail;
		for (int i = 0; i < 10; i++)
			if ((type == 0 ?
				 cai_cuda_gemm_i8(ctx, xq, xs, n_tok, &qm, out, n_out, NULL, &err) :
				 cai_cuda_gemm_blocks(ctx, xq, xs, xsum, n_tok, &bmx, n_out, NULL, out, n_out,
									  false, CAI_CUDA_BLOCKS_AUTO, &err)) != CAI_OK)
				goto fail;
		if (cai_cuda_timer_stop(ctx, timer, &sec, &err) != CAI_OK)
			goto fail;
		if (r >= 0)
			times[r] = sec / 10;
	}
	qsort(times, (size_t) reps, sizeof(double), compare_double);
	*seconds = times[reps / 2];
	ok = true;
	goto done;
fail:
	fprintf(stderr, "bench_gpu: %s\n", err.message);
done:
	cai_cuda_timer_free(timer);
	cai_cuda_qmatrix_free(ctx, &qm);
	cai_cuda_bmatrix_free(ctx, &bmx);
	cai_cuda_bmatrix_host_free(&h);
	cai_cuda_free(ctx, xq);
	cai_cuda_free(ctx, xs);
	cai_cuda_free(ctx, xsum);
	cai_cuda_free(ctx, out);
	free(blocks);
	free(times);
	return ok;
}

/*
 * Rows of the block GEMMs beside int8's, on the gate/up matrix: batch-1 GEMV as weight bytes
 * streamed per second against the copy bandwidth, and the prefill's 2048 tokens as TOPS
 * against the measured int8 rate.
 */
static void
bench_block_rows(const shape *s, int reps, double bw, double peak)
{
	static const struct
	{
		int			type;
		const char *name;
	}			kinds[] = {{0, "int8"}, {2, "q4_0"}, {12, "q4_k"}};

	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
	{
		char		label[32];
		double		sec = 0.0,
					bytes = 0.0;
		result		res;
		bool		ok = time_gate_up(s, kinds[i].type, 1, reps, &sec, &bytes);

		snprintf(label, sizeof(label), "%s gemv b1", kinds[i].name);
		res.measured = ok ? bytes / sec / 1e9 : 0;
		res.roofline = bw / 2 / 1e9;	/* a copy reads and writes: its read rate is half */
		report(s->name, label, "weight GB/s", ok, &res);
		if (kinds[i].type == 0)
			continue;
		ok = time_gate_up(s, kinds[i].type, PREFILL_TOKENS, reps, &sec, &bytes);
		snprintf(label, sizeof(label), "%s gemm TOPS", kinds[i].name);
		res.measured = ok ? 2.0 * PREFILL_TOKENS * 2.0 * s->d_ff * s->d / sec / 1e12 : 0;
		res.roofline = peak / 1e12;
		report(s->name, label, "int8 TOPS", ok, &res);
	}
}

int
main(int argc, char **argv)
{
	const char *which = "all";
	const char *json_path = NULL;
	bool		quick = false;
	int			context = 512;
	int			device = 0;
	static const int batches[] = {1, 16, 64, 256};
	char		why[256];
	cai_cuda_device_info info;
	double		bw = 0.0,
				gemm_s = 0.0,
				peak;
	int			reps;

	for (int i = 1; i < argc; i++)
	{
		if (strcmp(argv[i], "--quick") == 0)
			quick = true;
		else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
			which = argv[++i];
		else if (strcmp(argv[i], "--context") == 0 && i + 1 < argc)
			context = atoi(argv[++i]);
		else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
			device = atoi(argv[++i]);
		else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
			json_path = argv[++i];
		else
		{
			fprintf(stderr, "usage: bench_gpu [--quick] [--model smollm2|1b|8b|all] "
					"[--context N] [--device N] [--json FILE]\n");
			return 2;
		}
	}
	if (context < 1 || context > 32768)
	{
		fprintf(stderr, "bench_gpu: --context must be 1..32768\n");
		return 2;
	}
	if (cai_cuda_device_count(why, sizeof(why)) <= 0)
	{
		printf("bench_gpu: no CUDA device is present (%s); nothing measured\n", why);
		return 0;
	}
	if (cai_cuda_ctx_create(device, &ctx, &err) != CAI_OK)
	{
		fprintf(stderr, "bench_gpu: %s\n", err.message);
		return 1;
	}
	reps = quick ? 5 : 20;
	cai_cuda_get_device_info(ctx, &info);
	printf("device: %s (cc %d.%d, %d SMs, %.1f GiB)\n", info.name, info.cc_major, info.cc_minor,
		   info.sm_count, info.total_bytes / 1073741824.0);
	if (cai_cuda_measure_copy_bandwidth(ctx, (size_t) 1 << 30, reps, &bw, &err) != CAI_OK ||
		cai_cuda_measure_gemm_i8(ctx, 8192, 8192, 8192, reps, &gemm_s, &err) != CAI_OK)
	{
		fprintf(stderr, "bench_gpu: %s\n", err.message);
		cai_cuda_ctx_free(ctx);
		return 1;
	}
	peak = 2.0 * 8192.0 * 8192.0 * 8192.0 / gemm_s;
	printf("measured ceilings: copy bandwidth %.0f GB/s, int8 GEMM %.0f TOPS (8192^3)\n",
		   bw / 1e9, peak / 1e12);
	printf("decode at %d cached positions per sequence; prefill of %d tokens\n\n", context,
		   PREFILL_TOKENS);
	printf("%-14s %-12s %14s %14s %8s\n", "model", "workload", "measured", "roofline", "ratio");
	printf("(tokens/s; the gemm row: int8 TOPS of M=%d through the gate/up matrix)\n",
		   PREFILL_TOKENS);

	for (size_t m = 0; m < sizeof(SHAPES) / sizeof(SHAPES[0]); m++)
	{
		bench_model bm;
		result		res;

		if (strcmp(which, "all") != 0 && !strstr(SHAPES[m].name, which))
			continue;
		if (!model_create(&bm, &SHAPES[m], context))
		{
			fprintf(stderr, "bench_gpu: %s does not fit on this device\n", SHAPES[m].name);
			model_free(&bm);
			continue;
		}
		for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++)
		{
			char		label[32];
			bool		ok;

			snprintf(label, sizeof(label), "decode b=%d", batches[b]);
			ok = bench_decode(&bm, batches[b], context, reps, bw, peak, &res);
			report(SHAPES[m].name, label, "tokens/s", ok, &res);
		}
		report(SHAPES[m].name, "prefill", "tokens/s",
			   bench_prefill(&bm, quick ? 3 : 10, bw, peak, &res), &res);
		{
			double		gemm_m_s = 0.0;
			bool		ok = cai_cuda_measure_gemm_i8(ctx, 2 * SHAPES[m].d_ff,
													  PREFILL_TOKENS, SHAPES[m].d, reps, &gemm_m_s,
													  &err) == CAI_OK;

			if (!ok)
				fprintf(stderr, "bench_gpu: %s\n", err.message);
			res.measured = ok ? 2.0 * PREFILL_TOKENS * 2.0 * SHAPES[m].d_ff * SHAPES[m].d /
				gemm_m_s / 1e12 : 0;
			res.roofline = peak / 1e12;
			report(SHAPES[m].name, "gemm TOPS", "int8 TOPS", ok, &res);
		}
		bench_block_rows(&SHAPES[m], reps, bw, peak);
		model_free(&bm);
	}
	if (json_path && !write_json(json_path, &info, bw, peak, context))
	{
		cai_cuda_ctx_free(ctx);
		return 1;
	}
	cai_cuda_ctx_free(ctx);
	return 0;
}
