/*
 * calibrate.c — the int8 path's weights: the rotations it applies (cai_model_make_rotation),
 * and the calibrated conversion of the layers and the head (cai_convert_layers): a float
 * forward over a calibration text measures each GEMM input, from which the smoothing factors
 * (SmoothQuant) and, optionally, the rounding metrics (GPTQ rounding) follow.
 */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "quant.h"
#include "util.h"

/*
 * A power-of-two part this long is rotated as independent blocks without the mix (which costs
 * n_mix multiply-adds per value).  Measured on SmolLM2-135M (d_model 576 = 64 x 9, d_ff 1536 =
 * 512 x 3), KL of the int8 path over the first 2048 GPL-3 tokens: every width mixed 0.00391,
 * d_ff as blocks of 512 0.00393, d_model also as blocks of 64 0.00411 (top-1 96.6%, 96.3%,
 * 96.2%), while the mix of 9 more than doubles the time of a d_model rotation.
 */
#define ROTATION_BLOCK_ENOUGH 64

/*
 * The rotation of vectors of n values (backend.h's cai_rotation): n_pow2 the largest power of
 * two dividing n, and the n / n_pow2 chunks mixed by the discrete Hartley transform,
 * M[a][b] = cos(2 pi ab/m) + sin(2 pi ab/m), which is sqrt(m) times an orthogonal matrix for
 * every m (and symmetric, so R is its own inverse).  With chunks of ROTATION_BLOCK_ENOUGH or
 * more, or more than CAI_ROTATION_MAX_MIX chunks, the rotation covers n_pow2 values and a
 * vector is rotated as separate blocks.
 */
bool
cai_model_make_rotation(cai_model *m, int n, cai_rotation *r)
{
	int			p = 1;
	int			mix;
	float	   *t;

	while (n % (2 * p) == 0)
		p *= 2;
	mix = n / p;
	if (mix > CAI_ROTATION_MAX_MIX || p >= ROTATION_BLOCK_ENOUGH)
	{
		n = p;
		mix = 1;
	}
	t = cai_model_alloc(m, (size_t) mix * mix * sizeof(float));
	if (!t)
		return false;
	for (int a = 0; a < mix; a++)
		for (int b = 0; b < mix; b++)
		{
			double		theta = 2.0 * M_PI * (double) ((a * b) % mix) / (double) mix;

			t[a * mix + b] = (float) (cos(theta) + sin(theta));
		}
	r->n = n;
	r->n_pow2 = p;
	r->n_mix = mix;
	r->mix = t;
	r->norm = (float) (1.0 / sqrt((double) n));
	return true;
}

/* ---------------------------------------------------------------------------------------------
 * Calibrated conversion of the layers (SmoothQuant, then rotations)
 * ------------------------------------------------------------------------------------------- */

/*
 * Rotations.  Per-token (and per-row) int8 quantization loses the most on vectors whose energy
 * sits in a few channels, as LLM activations' does: the scale follows the outliers and the other
 * channels get few levels.  An orthogonal R that mixes every channel into many others (Hadamard
 * transforms of 64 or more values, backend.h's cai_rotation) makes the vector close to
 * Gaussian, its maximum a few standard deviations (QuaRot, Ashkboos et al. 2024).  Since
 * (R x) . (R w) = x . w, the int8 path rotates each GEMM input at run time (the backend's rotate
 * op, fused with the per-token quantization) and stores each weight row rotated by the same R:
 *   - attention, FFN and LM head inputs: rmsnorm with the smoothed norm weight, then rot_model;
 *     rows R (w * s);
 *   - the down projection's input: silu(g) * u / s_down, then rot_ff; rows R (w * s_down);
 *   - values: Wv's rows are mixed per head by rot_head at load, so every head of the attention
 *     output arrives rotated (attention is linear in V) and Wo's columns are rotated per head to
 *     match — nothing to do at run time, and the int8 V cache holds rotated values too;
 *   - queries and keys: each head rotated by rot_head after RoPE (which R does not commute
 *     with), leaving their dot products as they were, for the int8 K cache and query.
 * The smoothing stays, before the rotation: it shrinks the outlier channels before R spreads
 * them, and it makes the weights' rounding error smallest where the activations are largest
 * (AWQ's observation), which rotating alone does not do.  The residual stream is not rotated,
 * so the embedding is a plain requantization; the head gets its own smoothed, rotated copy.
 *
 * Measured on SmolLM2-135M-Instruct (Q4_1) with `cai eval` over the first 2048 tokens of the
 * GPL-3 text, KL(float || int8) of each source alone (everything else float), smoothing only ->
 * smoothing and rotation: weights 0.0059 -> 0.0020; QKV input 0.0024 -> 0.0002; Wo input
 * 0.0004 -> 0.0002; gate/up input 0.0023 -> 0.0005; down input 0.0083 -> 0.0004; LM head input
 * 0.0072 -> 0.0002; int8 KV 0.0015 -> 0.0004; int8 queries 0.0005 -> 0.0001.  All together:
 * KL 0.029 -> 0.0041, top-1 agreement 90.3% -> 96.2%, perplexity +2.9% -> +0.6%; over the
 * whole text KL 0.0325 -> 0.0048, 89.7% -> 95.8%, +2.6% -> +0.55%.  The weights' part is about
 * half of what is left and does not shrink with finer activation scales: per-channel int8
 * requantization of the Q4_1 weights alone, everything else float, agrees on 96.8% over the
 * whole text (KL 0.0023; per matrix kind, per-group scales and 9-bit ablations in docs/numerics.md,
 * "int8 fidelity"), and the activations alone on 97.05%.
 */

/*
 * Migration strength: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) moves that much of an input
 * channel's range from the activation (quantized per token at run time) to the weight column
 * (quantized per output row at load).  Measured on SmolLM2-135M-Instruct: without rotation,
 * alpha 0.4 to 0.6 gave the best agreement (0.5 is the SmoothQuant paper's default and the
 * middle of that plateau); with rotation, alpha 0.35 or 0.65 at any single site moves the
 * total KL above by less than 10%, in either direction.
 */
#define SMOOTH_ALPHA 0.5

/*
 * Calibration.  A float forward over the calibration text gives each GEMM input's statistics:
 * per-channel maxima over its first SMOOTHING_TOKENS tokens for the smoothing, and over all
 * CALIBRATION_TOKENS the second moment H that GPTQ rounding needs (see
 * "GPTQ rounding"; without it the forward stops at SMOOTHING_TOKENS).  Measured on
 * SmolLM2-135M-Instruct (whole GPL-3 text, GPTQ rounding): maxima over 512 tokens
 * instead of 64 smooth more (larger maxima) and lose (KL 0.00426 -> 0.00451).
 */
#define SMOOTHING_TOKENS 64
#define CALIBRATION_TOKENS 512

/*
 * The calibration text: prose of several kinds, numbers, code, SQL, chat turns and a little
 * French, German and Spanish, so that the channels a model uses for each show up in the
 * statistics.  It begins with the short text the smoothing was tuned on.
 */
static const char calibration_text[] =
	"The history of science is full of surprises. In 1905 a young patent clerk in Bern "
	"wrote four papers that changed physics, and water still boils at 100 degrees at sea "
	"level. The capital of France is Paris.\n"
	"def add(a, b):\n"
	"    return a + b\n"
	"User: could you summarise this briefly, please?\n"
	"Assistant: Of course! Here it is.\n"
	"\n"
	"On the morning the river froze, the ferryman walked across it for the first time in "
	"forty years. He had carried teachers, soldiers, brides and goats from one bank to the "
	"other, and now the ice carried him. Halfway over he stopped, listened to the long "
	"creak under his boots, and laughed at how small the distance really was.\n"
	"\n"
	"How a refrigerator works: a pump compresses a gas until it is hot, the heat leaves "
	"through the coils at the back, and the cooled fluid expands inside the box, where it "
	"takes heat from the food. Nothing is destroyed; heat is only moved from one place to "
	"another, which is why the kitchen gets a little warmer while the milk stays cold.\n"
	"\n"
	"Recipe for a simple tomato soup (serves 4):\n"
	"1. Soften one chopped onion and two cloves of garlic in olive oil for 8 minutes.\n"
	"2. Add 800 g of tomatoes, 500 ml of stock, salt and a pinch of sugar.\n"
	"3. Simmer for 20 minutes, blend until smooth, and finish with basil.\n"
	"\n"
	"Dear Ms. Okafor,\n"
	"Thank you for your letter of 14 March. We have reviewed the invoice (no. 2023-0417) "
	"and agree that the second delivery arrived late. A credit of $125.50 will appear on "
	"your next statement. Please let us know if there is anything else we can do.\n"
	"Kind regards,\n"
	"Tomasz Nowak, Customer Service\n"
	"\n"
	"SELECT name, count(*) AS orders FROM customers JOIN orders USING (customer_id) WHERE "
	"created_at > now() - interval '30 days' GROUP BY name ORDER BY orders DESC LIMIT 10;\n"
	"\n"
	"User: What is the difference between weather and climate?\n"
	"Assistant: Weather is what happens in the atmosphere over hours or days: rain this "
	"afternoon, a warm week in May. Climate is the pattern of weather over decades in a "
	"region, such as the average summer temperature or how often droughts occur. A single "
	"cold day says little about the climate.\n"
	"User: Thanks! And why is the sky blue?\n"
	"Assistant: Sunlight contains every colour. Air molecules scatter short wavelengths, "
	"like blue, much more than long ones, like red, so blue light reaches your eyes from "
	"every direction of the sky.\n"
	"\n"
	"for (int i = 0; i < n; i++) {\n"
	"    if (values[i] > best) best = values[i];\n"
	"}\n"
	"printf(\"maximum: %d\\n\", best);\n"
	"\n"
	"The committee met on Tuesday and approved the budget by seven votes to two. Members "
	"raised concerns about the cost of repairing the old library, estimated at 2.4 million "
	"euros, but agreed that the building should remain open while the work is carried out "
	"in stages.\n"
	"\n"
	"Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. Plants, "
	"algae and some bacteria do it, and almost every food chain on Earth begins with them. "
	"A large oak can release enough oxygen in a season for several people to breathe.\n"
	"\n"
	"Il pleuvait depuis trois jours quand elle a enfin ouvert la lettre. Das Wetter war "
	"schlecht, aber wir sind trotzdem gegangen. El tren sale a las nueve y media.\n"
	"\n"
	"Tips for a job interview: read about the company beforehand, prepare two or three "
	"questions of your own, arrive ten minutes early, and answer with concrete examples "
	"from your experience rather than general claims.\n"
	"\n"
	"In mathematics, a prime number has exactly two divisors, one and itself. The first "
	"few are 2, 3, 5, 7, 11 and 13. Euclid proved more than two thousand years ago that "
	"there are infinitely many of them: multiply any finite list of primes together, add "
	"one, and the result has a prime factor missing from the list.\n"
	"\n"
	"User: Write a haiku about autumn.\n"
	"Assistant: Red leaves on the path,\n"
	"a cold wind counts them slowly,\n"
	"the year exhales gold.\n"
	"\n"
	"import json\n"
	"with open(\"config.json\") as f:\n"
	"    settings = json.load(f)\n"
	"print(settings.get(\"timeout\", 30))\n"
	"\n"
	"She looked at the map again. The road they needed was not on it, or perhaps it was "
	"the thin grey line that wandered off the edge of the paper near the lake. \"We'll ask "
	"at the next village,\" he said, although neither of them had seen a village for an "
	"hour.\n"
	"\n"
	"Terms of use: by creating an account you agree not to share your password, not to "
	"upload content that you do not have the right to distribute, and to tell us promptly "
	"if you believe your account has been used without your permission.\n";

/*
 * The smoothing factors of one GEMM input: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) over the
 * calibration tokens (x_max) and the columns j of the consuming matrices (wmax), rounded to a
 * power of two so that folding it into weights and norms is exact.  Channels without signal
 * keep 1.
 */
static void
smoothing_factors_wmax(const float *x_max, int k, const float *wmax, float *s)
{
	for (int j = 0; j < k; j++)
	{
		double		v;
		int			e;

		if (!(x_max[j] > 0.0f) || !(wmax[j] > 0.0f) || !isfinite(x_max[j]))
		{
			s[j] = 1.0f;
			continue;
		}
		v = pow((double) x_max[j], SMOOTH_ALPHA) / pow((double) wmax[j], 1.0 - SMOOTH_ALPHA);
		e = (int) lrint(log2(v));
		e = e < -30 ? -30 : (e > 30 ? 30 : e);
		s[j] = ldexpf(1.0f, e);
	}
}

/* The same from the consuming matrices' columns (wmax: scratch of k floats). */
static void
smoothing_factors(const float *x_max, int k, const float *const *w, const int *w_rows, int n_w,
				  float *wmax, float *s)
{
	/* column maxima, walking the matrices row by row */
	for (int j = 0; j < k; j++)
		wmax[j] = 0.0f;
	for (int m = 0; m < n_w; m++)
		for (int r = 0; r < w_rows[m]; r++)
		{
			const float *row = w[m] + (size_t) r * k;

			for (int j = 0; j < k; j++)
			{
				float		a = fabsf(row[j]);

				wmax[j] = a > wmax[j] ? a : wmax[j];
			}
		}
	smoothing_factors_wmax(x_max, k, wmax, s);
}

/*
 * Rotates the rows of each head block of a [n_heads * hd, k] float matrix: W_h <- R W_h, i.e.
 * every column of the block is a vector rotated by rot (rot->n == hd, or hd split into blocks)
 * on the host backend be.  col: scratch of hd floats.
 */
static void
rotate_head_rows(cai_backend *be, float *w, int n_heads, int hd, int k, const cai_rotation *rot,
				 float *col)
{
	for (int h = 0; h < n_heads; h++)
	{
		float	   *block = w + (size_t) h * hd * k;

		for (int j = 0; j < k; j++)
		{
			for (int i = 0; i < hd; i++)
				col[i] = block[(size_t) i * k + j];
			be->ops->rotate(be, rot, col, hd, 1, hd / rot->n, NULL, NULL);
			for (int i = 0; i < hd; i++)
				block[(size_t) i * k + j] = col[i];
		}
	}
}

/*
 * GPTQ rounding.  Every matrix of the layers and the head is rounded to int8 along the
 * second moment H of the inputs it meets (rounding.h, GPTQ), measured over the calibration
 * tokens as the int8 path sees them (smoothed and rotated).  Measured on SmolLM2-135M-Instruct
 * over the whole GPL-3 text, against nearest rounding: KL(float || int8) 0.00478 -> 0.00426,
 * top-1 agreement 95.80% -> 96.27%, perplexity +0.55% -> +0.14%; load time on two cores
 * 0.9 s -> about 4 s (the calibration forward over 512 tokens instead of 64, H, the factors and
 * the rounding itself).  Auto (cai_model_params.rounding) takes it on a small model's int8 path,
 * with two-digit inputs (cai.h).  A better average does not make every greedy reply closer — the
 * regression suite's "What is the capital of France?" (with a system prompt) sits on a float
 * near-tie (logits 24.144 vs 24.049 for its first token); nearest rounding keeps the order (23.857
 * vs 23.832), GPTQ rounding flips it (24.073 vs 24.087) and the reply turns into French.
 *
 * Wide inputs get a block-diagonal metric (METRIC_BLOCK_MAX): on SmolLM2's down projection
 * (1536 inputs) blocks of 512 measured as well as the full H, for a ninth of the factoring
 * work, and the memory stays k * 512 floats for any width.  Damping: ROUNDING_DAMP times H's
 * mean diagonal; 0.1, 0.3 and 1 gave KL 0.00375, 0.00349 and 0.00361 (first 2048 tokens).
 */
#define METRIC_FULL_MAX 1024
#define METRIC_BLOCK_MAX 512
#define ROUNDING_DAMP 0.3

/* The metric's block for k inputs: all of them, or the largest divisor of k within the cap. */
static int
metric_block(int k)
{
	if (k <= METRIC_FULL_MAX)
		return k;
	for (int b = METRIC_BLOCK_MAX; b > 1; b--)
		if (k % b == 0)
			return b;
	return 1;
}

/* The GEMM inputs of a layer; the head's input reuses SITE_ATTN's storage (same width). */
typedef enum gemm_site
{
	SITE_ATTN,					/* QKV input */
	SITE_WO,
	SITE_FFN,					/* gate/up input */
	SITE_DOWN,
	N_SITES
} gemm_site;

/* The metrics of one layer's GEMM inputs, with their storage. */
typedef struct site_metrics
{
	cai_rounding_metric rm[N_SITES];
	float	   *h[N_SITES];		/* each k * metric_block(k) floats */
	float	   *inv_diag[N_SITES];
	float	   *xt;				/* [k][T] scratch: one input's rows transposed */
	float	   *row;			/* [k] scratch */
} site_metrics;

static bool
site_metrics_alloc(site_metrics *sm, const int k[N_SITES], int T)
{
	int			kmax = 0;

	memset(sm, 0, sizeof(*sm));
	for (int i = 0; i < N_SITES; i++)
	{
		sm->h[i] = malloc((size_t) k[i] * metric_block(k[i]) * sizeof(float));
		sm->inv_diag[i] = malloc((size_t) k[i] * sizeof(float));
		kmax = k[i] > kmax ? k[i] : kmax;
		if (!sm->h[i] || !sm->inv_diag[i])
			return false;
	}
	sm->xt = malloc((size_t) kmax * T * sizeof(float));
	sm->row = malloc((size_t) kmax * sizeof(float));
	return sm->xt && sm->row;
}

static void
site_metrics_free(site_metrics *sm)
{
	for (int i = 0; i < N_SITES; i++)
	{
		free(sm->h[i]);
		free(sm->inv_diag[i]);
	}
	free(sm->xt);
	free(sm->row);
}

/*
 * The rounding metric of one GEMM input: H = sum_t x_t x_t^T over the calibration rows x [T][k]
 * as the int8 path sees them, each divided by s (when not NULL) and rotated by rot block by
 * block; its diagonal blocks made with one float GEMM each over the transposed rows, then
 * factored.  which: the storage slot in sm.  NULL when H cannot be factored (nearest rounding
 * then).
 */
static const cai_rounding_metric *
site_metric(cai_forward_ctx *ctx, cai_threadpool *pool, site_metrics *sm, gemm_site which,
			const float *x, int T, int k, const float *s, const cai_rotation *rot)
{
	cai_rounding_metric *rm = &sm->rm[which];
	const int	block = metric_block(k);
	float	   *h = sm->h[which];
	double		mean = 0.0;
	float		lambda;

	for (int t = 0; t < T; t++)
	{
		for (int i = 0; i < k; i++)
			sm->row[i] = x[(size_t) t * k + i] / (s ? s[i] : 1.0f);
		ctx->be->ops->rotate(ctx->be, rot, sm->row, k, 1, k / rot->n, NULL, NULL);
		for (int i = 0; i < k; i++)
			sm->xt[(size_t) i * T + t] = sm->row[i];
	}
	for (int b = 0; b < k; b += block)
	{
		float	   *hb = h + (size_t) b * block;
		const float *xb = sm->xt + (size_t) b * T;

		ctx->be->ops->gemm_f32(ctx->be, xb, block, T, xb, block, NULL, hb, block, false);
		for (int i = 0; i < block; i++)
			mean += hb[(size_t) i * block + i];
	}
	mean /= k;
	if (!(mean > 0.0) || !isfinite(mean))
		return NULL;
	lambda = (float) (ROUNDING_DAMP * mean);
	for (int b = 0; b < k; b += block)
		if (!cai_rounding_metric_factor(pool, h + (size_t) b * block, block, lambda,
										sm->inv_diag[which] + b))
			return NULL;
	rm->k = k;
	rm->block = block;
	rm->u = h;
	rm->inv_diag = sm->inv_diag[which];
	return rm;
}

/* Per-channel maxima of |activation| at the inputs of the int8 GEMMs, and the inputs themselves */
typedef struct cai_activation_stats
{
	float	   *attn_in;		/* [d_model] the attention norm's output (QKV input) */
	float	   *ffn_in;			/* [d_model] the FFN norm's output (gate/up input) */
	float	   *down_in;		/* [d_ff] the activation's output (down input) */
	int			max_rows;		/* the maxima cover the first max_rows rows */
	/* copies of the GEMM inputs themselves (all rows), [T][width] each, or NULL */
	float	   *attn_x;
	float	   *wo_x;
	float	   *ffn_x;
	float	   *down_x;
} cai_activation_stats;

/* Per-channel maxima of |x| over n_tok rows of width values, merged into max_abs. */
static void
record_max_abs(const float *x, int n_tok, int width, float *max_abs)
{
	for (int t = 0; t < n_tok; t++)
		for (int j = 0; j < width; j++)
		{
			float		a = fabsf(x[(size_t) t * width + j]);

			max_abs[j] = a > max_abs[j] ? a : max_abs[j];
		}
}

/*
 * The float layer's observer (cai_forward_observer): records each GEMM input's per-channel
 * maxima over its first max_rows rows (the output projection's input has no smoothing, so no
 * maxima) and copies the whole input where a copy is kept.
 */
static void
record_gemm_input(void *arg, cai_forward_tap tap, const float *x, int n, int width)
{
	cai_activation_stats *stats = arg;
	float	   *max_abs = NULL;
	float	   *copy = NULL;

	switch (tap)
	{
		case CAI_TAP_ATTN_IN:
			max_abs = stats->attn_in;
			copy = stats->attn_x;
			break;
		case CAI_TAP_WO_IN:
			copy = stats->wo_x;
			break;
		case CAI_TAP_FFN_IN:
			max_abs = stats->ffn_in;
			copy = stats->ffn_x;
			break;
		case CAI_TAP_DOWN_IN:
			max_abs = stats->down_in;
			copy = stats->down_x;
			break;
	}
	if (max_abs)
		record_max_abs(x, n < stats->max_rows ? n : stats->max_rows, width, max_abs);
	if (copy)
		memcpy(copy, x, (size_t) n * width * sizeof(float));
}

/*
 * A conversion's state: the calibration tokens and their one-sequence float forward, what the
 * float layer's observer records, the smoothing factors and the scratch of one layer.
 */
typedef struct calibration
{
	cai_model  *m;
	cai_threadpool *pool;
	cai_convert_plan *plan;
	bool		fref;			/* the float reference is kept: convert from its copies */
	bool		gptq;	/* round along the inputs' metrics */
	int			T;				/* calibration tokens the forward runs over */
	cai_tokens	tokens;
	cai_forward_ctx *ctx;
	cai_kv_pool *kv;
	int32_t		table[(CALIBRATION_TOKENS + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS];
	cai_batch_layout batch;
	cai_activation_stats stats;
	float	   *s_attn,			/* [d_model] smoothing factors of each GEMM site's input */
			   *s_ffn,
			   *s_down,			/* [d_ff] */
			   *inv_down,		/* [d_ff] 1 / s_down */
			   *s_head,			/* [d_model] the LM head's */
			   *wmax;			/* column maxima scratch */
	float	   *tmp;			/* one layer's float weights when no reference is kept */
	float	   *wv_rot;			/* the V rows of a layer, rotated per head */
	float	   *col;			/* one head's column */
	site_metrics sm;
} calibration;

#define CALIBRATION_OOM(err) cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory calibrating the model")

/* The calibration tokens (in range of the vocabulary, at least 8) and every buffer. */
static cai_status
calibration_begin(calibration *cb, cai_error *err)
{
	const cai_config *c = &cb->m->cfg;
	const int	d = c->d_model;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	kv_dim = c->n_kv_heads * c->head_dim;
	const int	d_ff = c->d_ff;
	cai_activation_stats *stats = &cb->stats;
	size_t		tmp_floats = (size_t) (q_dim + 2 * kv_dim) * d + (size_t) d * q_dim + (size_t) 3 * d_ff * d;
	cai_status	st;

	if ((st = cai_tokenizer_encode(cb->m->tokenizer, calibration_text, strlen(calibration_text),
								   false, &cb->tokens, err)) != CAI_OK)
		return st;
	for (int i = 0; i < cb->tokens.n; i++)
		if (cb->tokens.ids[i] < 0 || cb->tokens.ids[i] >= c->n_vocab)
			cb->tokens.ids[i] = 0;
	while (cb->tokens.n < 8)	/* a vocabulary that makes few tokens: any ids do */
		if (!cai_tokens_push(&cb->tokens, cb->tokens.n % c->n_vocab))
			break;
	cb->T = cb->gptq ? CALIBRATION_TOKENS : SMOOTHING_TOKENS;
	cb->T = cb->tokens.n < cb->T ? cb->tokens.n : cb->T;
	stats->max_rows = SMOOTHING_TOKENS;

	stats->attn_in = malloc((size_t) d * sizeof(float));
	stats->ffn_in = malloc((size_t) d * sizeof(float));
	stats->down_in = malloc((size_t) d_ff * sizeof(float));
	cb->s_attn = malloc((size_t) d * sizeof(float));
	cb->s_ffn = malloc((size_t) d * sizeof(float));
	cb->s_down = malloc((size_t) d_ff * sizeof(float));
	cb->inv_down = malloc((size_t) d_ff * sizeof(float));
	cb->s_head = malloc((size_t) d * sizeof(float));
	cb->wmax = malloc((size_t) (d > d_ff ? d : d_ff) * sizeof(float));
	cb->wv_rot = malloc((size_t) kv_dim * d * sizeof(float));
	cb->col = malloc((size_t) c->head_dim * sizeof(float));
	if (!cb->fref)
		cb->tmp = malloc(tmp_floats * sizeof(float));
	if (!stats->attn_in || !stats->ffn_in || !stats->down_in || !cb->s_attn || !cb->s_ffn ||
		!cb->s_down || !cb->inv_down || !cb->s_head || !cb->wmax || !cb->wv_rot || !cb->col ||
		(!cb->fref && !cb->tmp))
		return CALIBRATION_OOM(err);
	if (cb->gptq)
	{
		const int	site_k[N_SITES] = {[SITE_ATTN] = d, [SITE_WO] = q_dim, [SITE_FFN] = d,
		[SITE_DOWN] = d_ff};
		const int	T = cb->T;

		stats->attn_x = malloc((size_t) T * d * sizeof(float));
		stats->wo_x = malloc((size_t) T * q_dim * sizeof(float));
		stats->ffn_x = malloc((size_t) T * d * sizeof(float));
		stats->down_x = malloc((size_t) T * d_ff * sizeof(float));
		if (!stats->attn_x || !stats->wo_x || !stats->ffn_x || !stats->down_x ||
			!site_metrics_alloc(&cb->sm, site_k, T))
			return CALIBRATION_OOM(err);
	}
	return CAI_OK;
}

/* A one-sequence float forward over the calibration tokens, up to the first layer's input. */
static cai_status
calibration_forward_begin(calibration *cb, const gguf_tensor *t_embd, cai_error *err)
{
	const cai_model *m = cb->m;
	const int	d = m->cfg.d_model;
	cai_kv_layout layout;
	cai_batch_seq seq;
	size_t		row_bytes;
	int			n_blocks,
				R;
	cai_status	st;

	if ((st = cai_forward_ctx_create(m, cb->pool, cb->T, cb->T, &cb->ctx, err)) != CAI_OK)
		return st;
	cai_model_kv_layout(m, &layout);
	n_blocks = (cb->T + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
	if ((st = cai_kv_pool_create(&layout, n_blocks, &cb->kv, err)) != CAI_OK)
		return st;
	for (int b = 0; b < n_blocks; b++)
		cb->table[b] = cai_kv_block_alloc(cb->kv);
	seq = (cai_batch_seq) {cb->tokens.ids, cb->T, 0, cb->table, n_blocks, CAI_LOGITS_NONE};
	if ((st = cai_forward_layout_batch(m, cb->ctx, cb->kv, &seq, 1, &cb->T, &R, err)) != CAI_OK ||
		(st = cai_forward_shadow_prepare(cb->ctx, cb->kv, &seq, 1, true, err)) != CAI_OK)
		return st;
	cai_forward_batch_from_ctx(cb->ctx, cb->T, 1, &cb->batch);
	if (!ggml_row_bytes(t_embd->type, d, &row_bytes))
		return cai_fail(err, CAI_ERR_INTERNAL, "embedding row size");
	for (int t = 0; t < cb->T; t++)
		if ((st = cai_dequantize_row(t_embd->type, (const uint8_t *) t_embd->data +
									 (size_t) cb->ctx->ids[t] * row_bytes,
									 cb->ctx->x + (size_t) t * d, d, err)) != CAI_OK)
			return st;
	cai_forward_prepare(m, cb->ctx, cb->T);
	return CAI_OK;
}

/* Layer l's float weights: dequantized into the reference copies, or into the scratch. */
static cai_status
layer_float_weights(calibration *cb, int l, const cai_layer_sources *ls, cai_error *err)
{
	const cai_config *c = &cb->m->cfg;
	const int	d = c->d_model;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	kv_dim = c->n_kv_heads * c->head_dim;
	const int	d_ff = c->d_ff;
	cai_layer_weights *w = &cb->m->layers[l];
	cai_convert_plan *plan = cb->plan;

	if (!cb->fref)
	{
		w->f_wq = cb->tmp;
		w->f_wk = w->f_wq + (size_t) q_dim * d;
		w->f_wv = w->f_wk + (size_t) kv_dim * d;
		w->f_wo = w->f_wv + (size_t) kv_dim * d;
		w->f_gate = w->f_wo + (size_t) d * q_dim;
		w->f_up = w->f_gate + (size_t) d_ff * d;
		w->f_down = w->f_up + (size_t) d_ff * d;
	}
	if (!cai_plan_rows(plan, ls->wq, NULL, d, q_dim, NULL, NULL, w->f_wq, NULL, NULL) ||
		!cai_plan_rows(plan, ls->wk, NULL, d, kv_dim, NULL, NULL, w->f_wk, NULL, NULL) ||
		!cai_plan_rows(plan, ls->wv, NULL, d, kv_dim, NULL, NULL, w->f_wv, NULL, NULL) ||
		!cai_plan_rows(plan, ls->wo, NULL, q_dim, d, NULL, NULL, w->f_wo, NULL, NULL) ||
		!cai_plan_rows(plan, ls->gate, NULL, d, d_ff, NULL, NULL, w->f_gate, NULL, NULL) ||
		!cai_plan_rows(plan, ls->up, NULL, d, d_ff, NULL, NULL, w->f_up, NULL, NULL) ||
		!cai_plan_rows(plan, ls->down, NULL, d_ff, d, NULL, NULL, w->f_down, NULL, NULL))
		return CALIBRATION_OOM(err);
	return cai_run_plan(cb->pool, plan, err);
}

/*
 * Layer l's smoothing factors from the maxima the float layer recorded, its int8 path's norms,
 * and (GPTQ) the rounding metrics of its four GEMM sites, in rm[SITE_*].
 */
static void
layer_smoothing(calibration *cb, int l, const cai_rounding_metric *rm[N_SITES])
{
	const cai_model *m = cb->m;
	const cai_config *c = &m->cfg;
	const int	d = c->d_model;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	kv_dim = c->n_kv_heads * c->head_dim;
	const int	d_ff = c->d_ff;
	cai_layer_weights *w = &cb->m->layers[l];
	const cai_activation_stats *stats = &cb->stats;
	const float *wa[3] = {w->f_wq, w->f_wk, w->f_wv};
	const int	ra[3] = {q_dim, kv_dim, kv_dim};
	const float *wb[2] = {w->f_gate, w->f_up};
	const int	rb[2] = {d_ff, d_ff};
	const float *wc[1] = {w->f_down};
	const int	rc[1] = {d};
	const int	T = cb->T;

	smoothing_factors(stats->attn_in, d, wa, ra, c->kv_source[l] == l ? 3 : 1, cb->wmax, cb->s_attn);
	smoothing_factors(stats->ffn_in, d, wb, rb, 2, cb->wmax, cb->s_ffn);
	smoothing_factors(stats->down_in, d_ff, wc, rc, 1, cb->wmax, cb->s_down);
	for (int j = 0; j < d; j++)
	{
		w->attn_norm_i8[j] = w->attn_norm[j] / cb->s_attn[j];
		w->ffn_norm_i8[j] = w->ffn_norm[j] / cb->s_ffn[j];
	}
	for (int j = 0; j < d_ff; j++)
		cb->inv_down[j] = 1.0f / cb->s_down[j];
	if (!cb->gptq)
		return;
	rm[SITE_ATTN] = site_metric(cb->ctx, cb->pool, &cb->sm, SITE_ATTN, stats->attn_x, T, d,
								cb->s_attn, &m->rot_model);
	rm[SITE_WO] = site_metric(cb->ctx, cb->pool, &cb->sm, SITE_WO, stats->wo_x, T, q_dim, NULL,
							  &m->rot_head);
	rm[SITE_FFN] = site_metric(cb->ctx, cb->pool, &cb->sm, SITE_FFN, stats->ffn_x, T, d,
							   cb->s_ffn, &m->rot_model);
	rm[SITE_DOWN] = site_metric(cb->ctx, cb->pool, &cb->sm, SITE_DOWN, stats->down_x, T, d_ff,
								cb->s_down, &m->rot_ff);
}

/*
 * Layer l's int8 matrices: columns times their input's smoothing factor, then rotated as the
 * input is at run time; up rows divided by the down input's factor.  The V rows (and their
 * biases) are rotated per head first, so that every head's attention output arrives rotated
 * (attention is linear in V) and the output projection's columns are rotated to match.
 */
static cai_status
layer_quantize(calibration *cb, int l, const cai_rounding_metric *const rm[N_SITES],
			   cai_error *err)
{
	const cai_model *m = cb->m;
	const cai_config *c = &m->cfg;
	const int	d = c->d_model;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	kv_dim = c->n_kv_heads * c->head_dim;
	const int	d_ff = c->d_ff;
	cai_layer_weights *w = &cb->m->layers[l];
	cai_convert_plan *plan = cb->plan;
	int8_t	   *qkv = (int8_t *) w->wqkv.q;
	float	   *qkv_scale = (float *) w->wqkv.scale;
	int8_t	   *gu = (int8_t *) w->w_gate_up.q;
	float	   *gu_scale = (float *) w->w_gate_up.scale;

	memcpy(cb->wv_rot, w->f_wv, (size_t) kv_dim * d * sizeof(float));
	rotate_head_rows(cb->ctx->be, cb->wv_rot, c->n_kv_heads, c->head_dim, d, &m->rot_head,
					 cb->col);
	if (w->bqkv)
	{
		memcpy(w->bqkv_i8, w->bqkv, (size_t) (q_dim + 2 * kv_dim) * sizeof(float));
		rotate_head_rows(cb->ctx->be, w->bqkv_i8 + q_dim + kv_dim, c->n_kv_heads, c->head_dim,
						 1, &m->rot_head, cb->col);
	}
	if (!cai_plan_rows_gptq(plan, NULL, w->f_wq, d, q_dim, qkv, qkv_scale, NULL,
							cb->s_attn, NULL, &m->rot_model, rm[SITE_ATTN], false) ||
		!cai_plan_rows_gptq(plan, NULL, w->f_wk, d, kv_dim, qkv + (size_t) q_dim * d,
							qkv_scale + q_dim, NULL, cb->s_attn, NULL, &m->rot_model,
							rm[SITE_ATTN], false) ||
		!cai_plan_rows_gptq(plan, NULL, cb->wv_rot, d, kv_dim,
							qkv + (size_t) (q_dim + kv_dim) * d,
							qkv_scale + q_dim + kv_dim, NULL, cb->s_attn, NULL,
							&m->rot_model, rm[SITE_ATTN], false) ||
		!cai_plan_rows_gptq(plan, NULL, w->f_wo, q_dim, d, (int8_t *) w->wo.q,
							(float *) w->wo.scale, NULL, NULL, NULL, &m->rot_head,
							rm[SITE_WO], false) ||
		!cai_plan_rows_gptq(plan, NULL, w->f_gate, d, d_ff, gu, gu_scale, NULL, cb->s_ffn,
							NULL, &m->rot_model, rm[SITE_FFN], false) ||
		!cai_plan_rows_gptq(plan, NULL, w->f_up, d, d_ff, gu + (size_t) d_ff * d,
							gu_scale + d_ff, NULL, cb->s_ffn, cb->inv_down, &m->rot_model,
							rm[SITE_FFN], false) ||
		!cai_plan_rows_gptq(plan, NULL, w->f_down, d_ff, d, (int8_t *) w->w_down.q,
							(float *) w->w_down.scale, NULL, cb->s_down, NULL, &m->rot_ff,
							rm[SITE_DOWN], false))
		return CALIBRATION_OOM(err);
	return cai_run_plan(cb->pool, plan, err);
}

/*
 * The LM head: its input is the final norm's output, smoothed against the head's columns and
 * rotated like the layers' inputs; the head (the embedding when tied) gets its own int8 copy.
 */
static cai_status
head_quantize(calibration *cb, const gguf_tensor *t_head, const float *head_wmax, cai_error *err)
{
	cai_model  *m = cb->m;
	const cai_config *c = &m->cfg;
	const int	d = c->d_model;
	cai_forward_ctx *ctx = cb->ctx;
	const cai_rounding_metric *rm = NULL;

	ctx->be->ops->rmsnorm(ctx->be, ctx->x, m->out_norm, cb->T, d, c->norm_eps, ctx->xn, NULL);
	memset(cb->stats.attn_in, 0, (size_t) d * sizeof(float));
	record_max_abs(ctx->xn, cb->T < cb->stats.max_rows ? cb->T : cb->stats.max_rows, d,
				   cb->stats.attn_in);
	smoothing_factors_wmax(cb->stats.attn_in, d, head_wmax, cb->s_head);
	for (int j = 0; j < d; j++)
		m->out_norm_i8[j] = m->out_norm[j] / cb->s_head[j];
	if (cb->gptq)
		rm = site_metric(ctx, cb->pool, &cb->sm, SITE_ATTN, ctx->xn, cb->T, d, cb->s_head,
						 &m->rot_model);
	if (!cai_plan_rows_gptq(cb->plan, t_head, NULL, d, c->n_vocab, (int8_t *) m->lm_head.q,
							(float *) m->lm_head.scale, NULL, cb->s_head, NULL,
							&m->rot_model, rm, false))
		return CALIBRATION_OOM(err);
	return cai_run_plan(cb->pool, cb->plan, err);
}

static void
calibration_end(calibration *cb)
{
	cai_kv_pool_free(cb->kv);
	cai_forward_ctx_free(cb->ctx);
	cai_tokens_free(&cb->tokens);
	free(cb->stats.attn_in);
	free(cb->stats.ffn_in);
	free(cb->stats.down_in);
	free(cb->stats.attn_x);
	free(cb->stats.wo_x);
	free(cb->stats.ffn_x);
	free(cb->stats.down_x);
	free(cb->s_attn);
	free(cb->s_ffn);
	free(cb->s_down);
	free(cb->inv_down);
	free(cb->s_head);
	free(cb->wmax);
	free(cb->wv_rot);
	free(cb->col);
	free(cb->tmp);
	site_metrics_free(&cb->sm);
}

/*
 * Converts every layer: dequantizes its matrices to float, runs the layer on the float path
 * over the calibration tokens (the float output of the previous layers) to record the maxima
 * of its GEMM inputs (and the inputs themselves, for the rounding metrics), derives the
 * smoothing factors, and quantizes the smoothed, rotated matrices to int8.  One layer's float
 * weights are alive at a time unless the float reference is kept.  gptq: round along the
 * inputs' metrics (see "GPTQ rounding") rather than to nearest.
 */
cai_status
cai_convert_layers(cai_model *m, cai_threadpool *pool, cai_convert_plan *plan,
				   const cai_layer_sources *src, const gguf_tensor *t_embd,
				   const gguf_tensor *t_head, const float *head_wmax, bool fref, bool gptq,
				   cai_error *err)
{
	calibration cb = {.m = m, .pool = pool, .plan = plan, .fref = fref,
	.gptq = gptq};
	const cai_forward_observer observer = {.tap = record_gemm_input, .arg = &cb.stats};
	const int	d = m->cfg.d_model;
	cai_status	st;

	cai_tokens_init(&cb.tokens);
	if ((st = calibration_begin(&cb, err)) != CAI_OK ||
		(st = calibration_forward_begin(&cb, t_embd, err)) != CAI_OK)
		goto done;
	/* the calibration's forward runs on the CPU backend: its rotate turns the planned rows */
	plan->rotate_on = cb.ctx->be;
	for (int l = 0; l < m->cfg.n_layers; l++)
	{
		cai_layer_weights *w = &m->layers[l];
		const cai_rounding_metric *rm[N_SITES] = {NULL};

		if ((st = layer_float_weights(&cb, l, &src[l], err)) != CAI_OK ||
			(st = cai_forward_bind_layer(cb.ctx, l, err)) != CAI_OK)
			goto done;
		/* the layer in float over the calibration tokens, recording its GEMM inputs */
		memset(cb.stats.attn_in, 0, (size_t) d * sizeof(float));
		memset(cb.stats.ffn_in, 0, (size_t) d * sizeof(float));
		memset(cb.stats.down_in, 0, (size_t) m->cfg.d_ff * sizeof(float));
		cai_forward_layer_float(m, cb.ctx, cb.kv, &cb.batch, l, &observer, NULL, 0);
		layer_smoothing(&cb, l, rm);
		if ((st = layer_quantize(&cb, l, rm, err)) != CAI_OK)
			goto done;
		if (!fref)
			w->f_wq = w->f_wk = w->f_wv = w->f_wo = w->f_gate = w->f_up = w->f_down = NULL;
	}
	st = head_quantize(&cb, t_head, head_wmax, err);

done:
	if (st != CAI_OK && !fref)
		for (int l = 0; l < m->cfg.n_layers; l++)
		{
			cai_layer_weights *w = &m->layers[l];

			w->f_wq = w->f_wk = w->f_wv = w->f_wo = w->f_gate = w->f_up = w->f_down = NULL;
		}
	plan->rotate_on = NULL;
	calibration_end(&cb);
	return st;
}
