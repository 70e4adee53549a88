/*
 * memory.cu — device and page-locked host memory, copies, the KV block transfers between the
 * host prefix cache and the device pool (their own stream, ordered by events), CUDA graphs of the
 * decode step, device timers, seeded random fills and the copy-bandwidth probe.
 *
 * Ordering of KV transfers:
 *   upload   (host cache -> device blocks, a cached prefix coming back): runs on the copy stream
 *            right away, overlapping whatever compute is in flight; the compute stream is then
 *            made to wait for it, so the next kernel enqueued sees the blocks.  The engine only
 *            hands out device blocks that no queued kernel still reads (it frees a block after the
 *            step that used it has returned its results), so the copy needs no wait before it.
 *   download (new device blocks -> host cache): waits for the compute enqueued so far (which
 *            wrote the blocks), then copies; the host may read the blocks once the transfer's
 *            ticket is done.  Compute goes on meanwhile.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

extern "C" cai_status
cai_cuda_malloc(cai_cuda_ctx *ctx, size_t bytes, const char *what, void **out_dev, cai_error *err)
{
	cudaError_t rc;
	size_t		free_b = 0,
				total_b = 0;

	*out_dev = NULL;
	if (ctx->capturing)
		return cuda_fail(err, CAI_ERR_INTERNAL, "allocating %s while a cuda graph is captured",
						 what);
	if (bytes == 0)
		bytes = 1;
	rc = cudaMalloc(out_dev, bytes);
	if (rc == cudaSuccess)
		return CAI_OK;
	*out_dev = NULL;
	cudaGetLastError();
	if (rc == cudaErrorMemoryAllocation)
	{
		if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
			cudaGetLastError();
		return cuda_fail(err, CAI_ERR_NO_MEMORY,
						 "out of device memory allocating %s: %zu bytes wanted, %zu of %zu free on %s",
						 what, bytes, free_b, total_b, ctx->prop.name);
	}
	return cuda_fail_rt(err, rc, what);
}

extern "C" void
cai_cuda_free(cai_cuda_ctx *ctx, void *ptr_dev)
{
	if (ptr_dev)
		cudaFree(ptr_dev);
}

extern "C" cai_status
cai_cuda_host_alloc(cai_cuda_ctx *ctx, size_t bytes, const char *what, void **out, cai_error *err)
{
	cudaError_t rc;

	*out = NULL;
	rc = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable);
	if (rc == cudaSuccess)
		return CAI_OK;
	*out = NULL;
	cudaGetLastError();
	return cuda_fail(err, CAI_ERR_NO_MEMORY,
					 "out of page-locked host memory allocating %s (%zu bytes): %s", what, bytes,
					 cudaGetErrorString(rc));
}

extern "C" void
cai_cuda_host_free(cai_cuda_ctx *ctx, void *ptr)
{
	if (ptr)
		cudaFreeHost(ptr);
}

extern "C" cai_status
cai_cuda_host_register(cai_cuda_ctx *ctx, void *ptr, size_t bytes, cai_error *err)
{
	cudaError_t rc = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);

	if (rc == cudaSuccess)
		return CAI_OK;
	cudaGetLastError();
	return cuda_fail(err, rc == cudaErrorMemoryAllocation ? CAI_ERR_NO_MEMORY : CAI_ERR_BACKEND,
					 "could not page-lock %zu bytes of host memory: %s", bytes,
					 cudaGetErrorString(rc));
}

extern "C" void
cai_cuda_host_unregister(cai_cuda_ctx *ctx, void *ptr)
{
	if (ptr && cudaHostUnregister(ptr) != cudaSuccess)
		cudaGetLastError();
}

extern "C" cai_status
cai_cuda_upload(cai_cuda_ctx *ctx, void *dst_dev, const void *src, size_t bytes, cai_error *err)
{
	if (bytes == 0)
		return CAI_OK;
	CUDA_CHECK(cudaMemcpyAsync(dst_dev, src, bytes, cudaMemcpyHostToDevice, ctx->stream), err,
			   "an upload");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_download(cai_cuda_ctx *ctx, void *dst, const void *src_dev, size_t bytes, cai_error *err)
{
	if (bytes == 0)
		return CAI_OK;
	CUDA_CHECK(cudaMemcpyAsync(dst, src_dev, bytes, cudaMemcpyDeviceToHost, ctx->stream), err,
			   "a download");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_memset(cai_cuda_ctx *ctx, void *dst_dev, int value, size_t bytes, cai_error *err)
{
	if (bytes == 0)
		return CAI_OK;
	CUDA_CHECK(cudaMemsetAsync(dst_dev, value, bytes, ctx->stream), err, "a memset");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_copy_device(cai_cuda_ctx *ctx, void *dst_dev, const void *src_dev, size_t bytes,
					 cai_error *err)
{
	if (bytes == 0)
		return CAI_OK;
	CUDA_CHECK(cudaMemcpyAsync(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, ctx->stream),
			   err, "a device copy");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_upload_sync(cai_cuda_ctx *ctx, void *dst_dev, const void *src, size_t bytes,
					 cai_error *err)
{
	if (bytes == 0)
		return CAI_OK;
	CUDA_CHECK(cudaMemcpyAsync(dst_dev, src, bytes, cudaMemcpyHostToDevice, ctx->stream), err,
			   "an upload");
	CUDA_CHECK(cudaStreamSynchronize(ctx->stream), err, "an upload");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Seeded random fills
 * ------------------------------------------------------------------------------------------- */

/* SplitMix64's finalizer: a good 64-bit mix of (seed, index), so every element is independent. */
static __device__ __forceinline__ uint64_t
mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static __global__ void
fill_random_i8_kernel(int8_t *dst, size_t n, uint64_t seed)
{
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
		 i += (size_t) gridDim.x * blockDim.x)
		dst[i] = (int8_t) ((int) (mix64(seed ^ (i * 0x2545f4914f6cdd1dull)) % 255u) - 127);
}

static __global__ void
fill_random_f32_kernel(float *dst, size_t n, float lo, float hi, uint64_t seed)
{
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
		 i += (size_t) gridDim.x * blockDim.x)
	{
		float		u = (float) (mix64(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 40) * (1.0f / 16777216.0f);

		dst[i] = lo + (hi - lo) * u;
	}
}

/* A grid-stride launch size: enough blocks to fill the device, no more than the work needs. */
static int
grid_for(const cai_cuda_ctx *ctx, size_t n, int threads)
{
	size_t		want = (n + threads - 1) / threads;
	size_t		cap = (size_t) ctx->prop.multiProcessorCount * 8;

	if (want > cap)
		want = cap;
	return want > 0 ? (int) want : 1;
}

extern "C" cai_status
cai_cuda_fill_random_i8(cai_cuda_ctx *ctx, int8_t *dst_dev, size_t n, uint64_t seed,
						cai_error *err)
{
	if (n == 0)
		return CAI_OK;
	fill_random_i8_kernel<<<grid_for(ctx, n, 256), 256, 0, ctx->stream>>>(dst_dev, n, seed);
	CUDA_CHECK_LAUNCH(err, "fill_random_i8");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_fill_random_f32(cai_cuda_ctx *ctx, float *dst_dev, size_t n, float lo, float hi,
						 uint64_t seed, cai_error *err)
{
	if (n == 0)
		return CAI_OK;
	fill_random_f32_kernel<<<grid_for(ctx, n, 256), 256, 0, ctx->stream>>>(dst_dev, n, lo, hi,
																		   seed);
	CUDA_CHECK_LAUNCH(err, "fill_random_f32");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * KV block transfers
 * ------------------------------------------------------------------------------------------- */

/* Records the completion event of a transfer on the copy stream and hands out its ticket. */
static cai_status
xfer_record(cai_cuda_ctx *ctx, uint64_t *ticket, cai_error *err)
{
	uint64_t	t = ctx->xfer_issued + 1;

	/* the ring slot is reused: the ticket that had it must be known complete first */
	if (t > CUDA_XFER_EVENTS && ctx->xfer_completed < t - CUDA_XFER_EVENTS)
	{
		CUDA_CHECK(cudaEventSynchronize(ctx->xfer_events[(t - CUDA_XFER_EVENTS) % CUDA_XFER_EVENTS]),
				   err, "a kv transfer");
		ctx->xfer_completed = t - CUDA_XFER_EVENTS;
	}
	CUDA_CHECK(cudaEventRecord(ctx->xfer_events[t % CUDA_XFER_EVENTS], ctx->copy_stream), err,
			   "a kv transfer");
	ctx->xfer_issued = t;
	if (ticket)
		*ticket = t;
	return CAI_OK;
}

/*
 * Copies n blocks between host addresses and device block ids on the copy stream, merging runs
 * of blocks that are adjacent on both sides into one copy.
 */
static cai_status
copy_blocks(cai_cuda_ctx *ctx, uint8_t *pool_dev, size_t block_bytes, const int32_t *dev_blocks,
			const void *const *host_blocks, int n, bool to_device, cai_error *err)
{
	int			i = 0;

	while (i < n)
	{
		int			run = 1;
		uint8_t    *dev;
		uint8_t    *host = (uint8_t *) host_blocks[i];

		if (dev_blocks[i] < 0)
			return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "negative device kv block id %d",
							 (int) dev_blocks[i]);
		while (i + run < n && dev_blocks[i + run] == dev_blocks[i] + run &&
			   (const uint8_t *) host_blocks[i + run] == host + (size_t) run * block_bytes)
			run++;
		dev = pool_dev + (size_t) dev_blocks[i] * block_bytes;
		if (to_device)
			CUDA_CHECK(cudaMemcpyAsync(dev, host, (size_t) run * block_bytes,
									   cudaMemcpyHostToDevice, ctx->copy_stream),
					   err, "a kv block upload");
		else
			CUDA_CHECK(cudaMemcpyAsync(host, dev, (size_t) run * block_bytes,
									   cudaMemcpyDeviceToHost, ctx->copy_stream),
					   err, "a kv block download");
		i += run;
	}
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_kv_upload_blocks(cai_cuda_ctx *ctx, uint8_t *pool_dev, size_t block_bytes,
						  const int32_t *dev_blocks, const void *const *host_blocks, int n_blocks,
						  uint64_t *ticket, cai_error *err)
{
	cai_status	st;

	if (ticket)
		*ticket = 0;
	if (n_blocks <= 0)
		return CAI_OK;
	if (ctx->capturing)
		return cuda_fail(err, CAI_ERR_INTERNAL, "kv uploads cannot be captured in a cuda graph");
	st = copy_blocks(ctx, pool_dev, block_bytes, dev_blocks, host_blocks, n_blocks, true, err);
	if (st != CAI_OK)
		return st;
	st = xfer_record(ctx, ticket, err);
	if (st != CAI_OK)
		return st;
	/* the compute stream's next kernel must see the uploaded blocks */
	CUDA_CHECK(cudaEventRecord(ctx->copy_mark, ctx->copy_stream), err, "a kv block upload");
	CUDA_CHECK(cudaStreamWaitEvent(ctx->stream, ctx->copy_mark, 0), err, "a kv block upload");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_kv_download_blocks(cai_cuda_ctx *ctx, const uint8_t *pool_dev, size_t block_bytes,
							const int32_t *dev_blocks, void *const *host_blocks, int n_blocks,
							uint64_t *ticket, cai_error *err)
{
	cai_status	st;

	if (ticket)
		*ticket = 0;
	if (n_blocks <= 0)
		return CAI_OK;
	if (ctx->capturing)
		return cuda_fail(err, CAI_ERR_INTERNAL, "kv downloads cannot be captured in a cuda graph");
	/* the blocks were written by compute work enqueued before this call */
	CUDA_CHECK(cudaEventRecord(ctx->compute_mark, ctx->stream), err, "a kv block download");
	CUDA_CHECK(cudaStreamWaitEvent(ctx->copy_stream, ctx->compute_mark, 0), err,
			   "a kv block download");
	st = copy_blocks(ctx, (uint8_t *) pool_dev, block_bytes, dev_blocks,
					 (const void *const *) host_blocks, n_blocks, false, err);
	if (st != CAI_OK)
		return st;
	return xfer_record(ctx, ticket, err);
}

extern "C" bool
cai_cuda_transfer_done(cai_cuda_ctx *ctx, uint64_t ticket)
{
	if (ticket > ctx->xfer_issued)
		return false;
	/* the copy stream completes tickets in order: advance over the finished ones */
	while (ctx->xfer_completed < ticket)
	{
		uint64_t	next = ctx->xfer_completed + 1;
		cudaError_t rc = cudaEventQuery(ctx->xfer_events[next % CUDA_XFER_EVENTS]);

		if (rc == cudaErrorNotReady)
			return false;
		if (rc != cudaSuccess)
		{
			cudaGetLastError();
			return false;
		}
		ctx->xfer_completed = next;
	}
	return true;
}

extern "C" cai_status
cai_cuda_transfer_wait(cai_cuda_ctx *ctx, uint64_t ticket, cai_error *err)
{
	if (ticket <= ctx->xfer_completed)
		return CAI_OK;
	if (ticket > ctx->xfer_issued)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "unknown kv transfer ticket %llu",
						 (unsigned long long) ticket);
	CUDA_CHECK(cudaEventSynchronize(ctx->xfer_events[ticket % CUDA_XFER_EVENTS]), err,
			   "a kv transfer");
	ctx->xfer_completed = ticket;
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * CUDA graphs
 * ------------------------------------------------------------------------------------------- */

/* Batch-size buckets a decode step is padded to (small steps: powers of two, then steps of 64). */
extern "C" int
cai_cuda_graph_bucket(int n_tok)
{
	int			b = 1;

	if (n_tok <= 0)
		return 0;
	if (n_tok > 512)
		return 0;
	if (n_tok > 64)
		return (n_tok + 63) / 64 * 64;
	while (b < n_tok)
		b *= 2;
	return b;
}

extern "C" cai_status
cai_cuda_graph_begin(cai_cuda_ctx *ctx, cai_error *err)
{
	if (ctx->capturing)
		return cuda_fail(err, CAI_ERR_INTERNAL, "a cuda graph capture is already under way");
	/* thread-local: other threads' unrelated CUDA calls do not break this capture */
	CUDA_CHECK(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal), err,
			   "cudaStreamBeginCapture");
	ctx->capturing = true;
	ctx->capture_rows = 0;
	ctx->capture_segments = 0;
	ctx->capture_decode_tiles = false;
	return CAI_OK;
}

static int
graph_slot(const cai_cuda_ctx *ctx, int key)
{
	for (int i = 0; i < ctx->n_graphs; i++)
		if (ctx->graph_keys[i] == key)
			return i;
	return -1;
}

extern "C" cai_status
cai_cuda_graph_end(cai_cuda_ctx *ctx, int key, cai_error *err)
{
	cudaGraph_t graph = NULL;
	cudaGraphExec_t exec = NULL;
	cudaError_t rc;
	int			slot;

	if (!ctx->capturing)
		return cuda_fail(err, CAI_ERR_INTERNAL, "no cuda graph capture is under way");
	rc = cudaStreamEndCapture(ctx->stream, &graph);
	ctx->capturing = false;
	if (rc != cudaSuccess)
	{
		if (graph)
			cudaGraphDestroy(graph);
		return cuda_fail_rt(err, rc, "cudaStreamEndCapture");
	}
	rc = cudaGraphInstantiate(&exec, graph, 0);
	cudaGraphDestroy(graph);
	if (rc != cudaSuccess)
		return cuda_fail_rt(err, rc, "cudaGraphInstantiate");

	slot = graph_slot(ctx, key);
	if (slot >= 0)
		cudaGraphExecDestroy(ctx->graph_exec[slot]);
	else if (ctx->n_graphs < CUDA_MAX_GRAPHS)
		slot = ctx->n_graphs++;
	else
	{
		/* full: drop the oldest (buckets in use are re-captured on demand) */
		cudaGraphExecDestroy(ctx->graph_exec[0]);
		memmove(&ctx->graph_keys[0], &ctx->graph_keys[1], sizeof(int) * (CUDA_MAX_GRAPHS - 1));
		memmove(&ctx->graph_exec[0], &ctx->graph_exec[1],
				sizeof(cudaGraphExec_t) * (CUDA_MAX_GRAPHS - 1));
		memmove(&ctx->graph_rows[0], &ctx->graph_rows[1], sizeof(int) * (CUDA_MAX_GRAPHS - 1));
		memmove(&ctx->graph_segments[0], &ctx->graph_segments[1],
				sizeof(int) * (CUDA_MAX_GRAPHS - 1));
		memmove(&ctx->graph_decode_tiles[0], &ctx->graph_decode_tiles[1],
				sizeof(bool) * (CUDA_MAX_GRAPHS - 1));
		slot = CUDA_MAX_GRAPHS - 1;
	}
	ctx->graph_keys[slot] = key;
	ctx->graph_exec[slot] = exec;
	ctx->graph_rows[slot] = ctx->capture_rows;
	ctx->graph_segments[slot] = ctx->capture_segments;
	ctx->graph_decode_tiles[slot] = ctx->capture_decode_tiles;
	return CAI_OK;
}

/*
 * Whether the stored graph can replay the current step plan: the same rows (its grids were sized
 * for them), and no more attention segments than its split attention was captured with (a row
 * reaching past them would lose its last segments), and tiles the decode attention kernel takes if
 * it ran that.  A graph that read no plan replays any.
 */
static bool
graph_covers_plan(const cai_cuda_ctx *ctx, int slot)
{
	return ctx->graph_rows[slot] == 0 ||
		(ctx->meta.n_tok == ctx->graph_rows[slot] &&
		 ctx->meta.max_segments <= ctx->graph_segments[slot] &&
		 (!ctx->graph_decode_tiles[slot] || ctx->meta.max_item_rows <= CUDA_DECODE_TILE_ROWS));
}

extern "C" void
cai_cuda_graph_abort(cai_cuda_ctx *ctx)
{
	cudaGraph_t graph = NULL;

	if (!ctx->capturing)
		return;
	if (cudaStreamEndCapture(ctx->stream, &graph) == cudaSuccess && graph)
		cudaGraphDestroy(graph);
	cudaGetLastError();
	ctx->capturing = false;
}

extern "C" bool
cai_cuda_graph_has(cai_cuda_ctx *ctx, int key)
{
	int			slot = graph_slot(ctx, key);

	return slot >= 0 && graph_covers_plan(ctx, slot);
}

extern "C" cai_status
cai_cuda_graph_launch(cai_cuda_ctx *ctx, int key, cai_error *err)
{
	int			slot = graph_slot(ctx, key);

	if (slot < 0)
		return cuda_fail(err, CAI_ERR_NOT_FOUND, "no cuda graph for batch bucket %d", key);
	if (!graph_covers_plan(ctx, slot))
		return cuda_fail(err, CAI_ERR_NOT_FOUND,
						 "the cuda graph for batch bucket %d was captured for a plan of %d rows and "
						 "%d attention segments, not %d rows and %d: capture it again", key,
						 ctx->graph_rows[slot], ctx->graph_segments[slot], ctx->meta.n_tok,
						 ctx->meta.max_segments);
	CUDA_CHECK(cudaGraphLaunch(ctx->graph_exec[slot], ctx->stream), err, "cudaGraphLaunch");
	return CAI_OK;
}

extern "C" void
cai_cuda_graph_reset(cai_cuda_ctx *ctx)
{
	for (int i = 0; i < ctx->n_graphs; i++)
		cudaGraphExecDestroy(ctx->graph_exec[i]);
	ctx->n_graphs = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Timers and the bandwidth probe
 * ------------------------------------------------------------------------------------------- */

struct cai_cuda_timer
{
	cudaEvent_t start;
	cudaEvent_t stop;
};

extern "C" cai_status
cai_cuda_timer_create(cai_cuda_ctx *ctx, cai_cuda_timer **out, cai_error *err)
{
	cai_cuda_timer *t = (cai_cuda_timer *) calloc(1, sizeof(*t));
	cudaError_t rc;

	*out = NULL;
	if (!t)
		return cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory allocating a timer");
	if ((rc = cudaEventCreate(&t->start)) != cudaSuccess ||
		(rc = cudaEventCreate(&t->stop)) != cudaSuccess)
	{
		cai_cuda_timer_free(t);
		return cuda_fail_rt(err, rc, "cudaEventCreate");
	}
	*out = t;
	return CAI_OK;
}

extern "C" void
cai_cuda_timer_free(cai_cuda_timer *timer)
{
	if (!timer)
		return;
	if (timer->start)
		cudaEventDestroy(timer->start);
	if (timer->stop)
		cudaEventDestroy(timer->stop);
	free(timer);
}

extern "C" cai_status
cai_cuda_timer_start(cai_cuda_ctx *ctx, cai_cuda_timer *timer, cai_error *err)
{
	CUDA_CHECK(cudaEventRecord(timer->start, ctx->stream), err, "a timer");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_timer_stop(cai_cuda_ctx *ctx, cai_cuda_timer *timer, double *seconds, cai_error *err)
{
	float		ms = 0.0f;

	CUDA_CHECK(cudaEventRecord(timer->stop, ctx->stream), err, "a timer");
	CUDA_CHECK(cudaEventSynchronize(timer->stop), err, "a timer");
	CUDA_CHECK(cudaEventElapsedTime(&ms, timer->start, timer->stop), err, "a timer");
	*seconds = ms * 1e-3;
	return CAI_OK;
}

/* A plain streaming copy, 16 bytes per thread per iteration, coalesced. */
static __global__ void
copy_kernel(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n)
{
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
		 i += (size_t) gridDim.x * blockDim.x)
		dst[i] = src[i];
}

static int
compare_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return x < y ? -1 : x > y;
}

extern "C" cai_status
cai_cuda_measure_copy_bandwidth(cai_cuda_ctx *ctx, size_t bytes, int reps, double *bytes_per_s,
								cai_error *err)
{
	void	   *a = NULL,
			   *b = NULL;
	double	   *times = NULL;
	cai_cuda_timer *timer = NULL;
	cai_status	st;
	size_t		n = bytes / sizeof(int4);
	int			grid = ctx->prop.multiProcessorCount * 4;

	*bytes_per_s = 0.0;
	if (reps < 1 || n == 0)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "bandwidth probe needs bytes and reps");
	times = (double *) calloc((size_t) reps, sizeof(double));
	if (!times)
		return cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory");
	if ((st = cai_cuda_malloc(ctx, n * sizeof(int4), "the bandwidth probe", &a, err)) != CAI_OK ||
		(st = cai_cuda_malloc(ctx, n * sizeof(int4), "the bandwidth probe", &b, err)) != CAI_OK ||
		(st = cai_cuda_timer_create(ctx, &timer, err)) != CAI_OK)
		goto done;
	/* never time zeros: fill the source with data */
	if ((st = cai_cuda_fill_random_i8(ctx, (int8_t *) a, n * sizeof(int4), 7, err)) != CAI_OK)
		goto done;
	for (int r = -2; r < reps; r++)
	{
		double		s;

		if ((st = cai_cuda_timer_start(ctx, timer, err)) != CAI_OK)
			goto done;
		copy_kernel<<<grid, 256, 0, ctx->stream>>>((const int4 *) a, (int4 *) b, n);
		if (cudaGetLastError() != cudaSuccess)
		{
			st = cuda_fail(err, CAI_ERR_BACKEND, "copy kernel launch failed");
			goto done;
		}
		if ((st = cai_cuda_timer_stop(ctx, timer, &s, err)) != CAI_OK)
			goto done;
		if (r >= 0)
			times[r] = s;		/* the first two are warm-up */
	}
	qsort(times, (size_t) reps, sizeof(double), compare_double);
	*bytes_per_s = 2.0 * (double) (n * sizeof(int4)) / times[reps / 2];
	st = CAI_OK;
done:
	cai_cuda_timer_free(timer);
	cai_cuda_free(ctx, a);
	cai_cuda_free(ctx, b);
	free(times);
	return st;
}
