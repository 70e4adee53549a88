/*
 * context.cu — devices, the context (streams, events, cuBLASLt handle and workspace), and the
 * translation of CUDA and cuBLASLt failures into a cai_status with a one-line message.
 *
 * A context belongs to one serving thread, like a cai_engine: it makes its device current when
 * it is created, and the engine calls it from the same thread afterwards.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

/* cuBLASLt's workspace: NVIDIA recommends 32 MiB on Hopper for its best kernels. */
#define LT_WORKSPACE_BYTES ((size_t) 32 << 20)

cai_status
cuda_fail(cai_error *err, cai_status status, const char *fmt, ...)
{
	va_list		ap;

	if (err)
	{
		err->status = status;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
	}
	return status;
}

cai_status
cuda_fail_rt(cai_error *err, cudaError_t code, const char *what)
{
	cai_status	status = CAI_ERR_BACKEND;

	if (code == cudaErrorMemoryAllocation)
		status = CAI_ERR_NO_MEMORY;
	return cuda_fail(err, status, "cuda error in %s: %s (%s)", what,
					 cudaGetErrorString(code), cudaGetErrorName(code));
}

/* cuBLAS status names, for messages. */
static const char *
lt_status_name(cublasStatus_t code)
{
	switch (code)
	{
		case CUBLAS_STATUS_SUCCESS:
			return "success";
		case CUBLAS_STATUS_NOT_INITIALIZED:
			return "not initialized";
		case CUBLAS_STATUS_ALLOC_FAILED:
			return "allocation failed";
		case CUBLAS_STATUS_INVALID_VALUE:
			return "invalid value";
		case CUBLAS_STATUS_ARCH_MISMATCH:
			return "architecture mismatch";
		case CUBLAS_STATUS_MAPPING_ERROR:
			return "mapping error";
		case CUBLAS_STATUS_EXECUTION_FAILED:
			return "execution failed";
		case CUBLAS_STATUS_INTERNAL_ERROR:
			return "internal error";
		case CUBLAS_STATUS_NOT_SUPPORTED:
			return "not supported";
		case CUBLAS_STATUS_LICENSE_ERROR:
			return "license error";
		default:
			return "unknown status";
	}
}

cai_status
cuda_fail_lt(cai_error *err, cublasStatus_t code, const char *what)
{
	cai_status	status = CAI_ERR_BACKEND;

	if (code == CUBLAS_STATUS_ALLOC_FAILED)
		status = CAI_ERR_NO_MEMORY;
	else if (code == CUBLAS_STATUS_NOT_SUPPORTED || code == CUBLAS_STATUS_ARCH_MISMATCH)
		status = CAI_ERR_UNSUPPORTED;
	return cuda_fail(err, status, "cublaslt error in %s: %s (%d)", what, lt_status_name(code),
					 (int) code);
}

/* A trivial kernel whose attributes tell whether this build has code for the device. */
static __global__ void
probe_kernel(int *p)
{
	if (p)
		*p = 0;
}

extern "C" int
cai_cuda_device_count(char *why, size_t why_len)
{
	int			n = 0;
	cudaError_t rc = cudaGetDeviceCount(&n);

	if (rc != cudaSuccess)
	{
		if (why && why_len > 0)
			snprintf(why, why_len, "%s", cudaGetErrorString(rc));
		cudaGetLastError();		/* clear the sticky-free error so later calls start clean */
		return 0;
	}
	if (n == 0 && why && why_len > 0)
		snprintf(why, why_len, "no cuda device is present");
	return n;
}

extern "C" cai_status
cai_cuda_ctx_create(int device, cai_cuda_ctx **out, cai_error *err)
{
	cai_cuda_ctx *ctx;
	cai_status	st;
	cudaError_t rc;
	cublasStatus_t lrc;
	cudaFuncAttributes fa;
	int			n = 0;

	*out = NULL;
	rc = cudaGetDeviceCount(&n);
	if (rc != cudaSuccess)
		return cuda_fail_rt(err, rc, "cudaGetDeviceCount");
	if (device < 0 || device >= n)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "cuda device %d does not exist (%d present)", device, n);

	ctx = (cai_cuda_ctx *) calloc(1, sizeof(*ctx));
	if (!ctx)
		return cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory allocating the cuda context");
	ctx->device = device;

	if ((rc = cudaSetDevice(device)) != cudaSuccess)
	{
		st = cuda_fail_rt(err, rc, "cudaSetDevice");
		goto fail;
	}
	if ((rc = cudaGetDeviceProperties(&ctx->prop, device)) != cudaSuccess)
	{
		st = cuda_fail_rt(err, rc, "cudaGetDeviceProperties");
		goto fail;
	}
	if (ctx->prop.major < 8)
	{
		st = cuda_fail(err, CAI_ERR_UNSUPPORTED,
					   "cuda device %d (%s) has compute capability %d.%d; pg_cai needs 8.0 or newer",
					   device, ctx->prop.name, ctx->prop.major, ctx->prop.minor);
		goto fail;
	}
	rc = cudaFuncGetAttributes(&fa, probe_kernel);
	if (rc != cudaSuccess)
	{
		st = cuda_fail(err, CAI_ERR_UNSUPPORTED,
					   "libcai_cuda has no code for cuda device %d (%s, compute capability %d.%d): %s",
					   device, ctx->prop.name, ctx->prop.major, ctx->prop.minor,
					   cudaGetErrorString(rc));
		cudaGetLastError();
		goto fail;
	}

	if ((st = cuda_attention_init(ctx, err)) != CAI_OK ||
		(st = cuda_rotate_init(ctx, err)) != CAI_OK)
		goto fail;
	if ((rc = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) != cudaSuccess ||
		(rc = cudaStreamCreateWithFlags(&ctx->copy_stream, cudaStreamNonBlocking)) != cudaSuccess)
	{
		st = cuda_fail_rt(err, rc, "cudaStreamCreate");
		goto fail;
	}
	if ((rc = cudaEventCreateWithFlags(&ctx->compute_mark, cudaEventDisableTiming)) != cudaSuccess ||
		(rc = cudaEventCreateWithFlags(&ctx->copy_mark, cudaEventDisableTiming)) != cudaSuccess ||
		(rc = cudaEventCreateWithFlags(&ctx->meta_uploaded, cudaEventDisableTiming)) != cudaSuccess)
	{
		st = cuda_fail_rt(err, rc, "cudaEventCreate");
		goto fail;
	}
	for (int i = 0; i < CUDA_XFER_EVENTS; i++)
	{
		if ((rc = cudaEventCreateWithFlags(&ctx->xfer_events[i], cudaEventDisableTiming)) != cudaSuccess)
		{
			st = cuda_fail_rt(err, rc, "cudaEventCreate");
			goto fail;
		}
	}

	if ((lrc = cublasLtCreate(&ctx->lt)) != CUBLAS_STATUS_SUCCESS)
	{
		st = cuda_fail_lt(err, lrc, "cublasLtCreate");
		goto fail;
	}
	ctx->lt_workspace_bytes = LT_WORKSPACE_BYTES;
	if ((rc = cudaMalloc(&ctx->lt_workspace, ctx->lt_workspace_bytes)) != cudaSuccess)
	{
		ctx->lt_workspace = NULL;
		st = cuda_fail(err, CAI_ERR_NO_MEMORY,
					   "out of device memory allocating the cublaslt workspace (%zu bytes): %s",
					   ctx->lt_workspace_bytes, cudaGetErrorString(rc));
		cudaGetLastError();
		goto fail;
	}
	*out = ctx;
	return CAI_OK;

fail:
	cai_cuda_ctx_free(ctx);
	return st;
}

extern "C" void
cai_cuda_ctx_free(cai_cuda_ctx *ctx)
{
	if (!ctx)
		return;
	cudaSetDevice(ctx->device);
	/* a capture left open would make the synchronizations below fail */
	if (ctx->capturing)
		cai_cuda_graph_abort(ctx);
	if (ctx->stream)
		cudaStreamSynchronize(ctx->stream);
	if (ctx->copy_stream)
		cudaStreamSynchronize(ctx->copy_stream);
	cai_cuda_graph_reset(ctx);
	cuda_gemm_free_cache(ctx);
	if (ctx->lt)
		cublasLtDestroy(ctx->lt);
	cudaFree(ctx->lt_workspace);
	cudaFree(ctx->acc);
	cudaFree(ctx->attn_split);
	cudaFree(ctx->rotate_amax);
	cudaFree(ctx->argmax_best);
	cudaFree(ctx->meta_dev);
	cudaFreeHost(ctx->meta_host);
	for (int i = 0; i < CUDA_XFER_EVENTS; i++)
		if (ctx->xfer_events[i])
			cudaEventDestroy(ctx->xfer_events[i]);
	if (ctx->compute_mark)
		cudaEventDestroy(ctx->compute_mark);
	if (ctx->copy_mark)
		cudaEventDestroy(ctx->copy_mark);
	if (ctx->meta_uploaded)
		cudaEventDestroy(ctx->meta_uploaded);
	if (ctx->stream)
		cudaStreamDestroy(ctx->stream);
	if (ctx->copy_stream)
		cudaStreamDestroy(ctx->copy_stream);
	cudaGetLastError();
	free(ctx);
}

extern "C" void
cai_cuda_get_device_info(cai_cuda_ctx *ctx, cai_cuda_device_info *info)
{
	size_t		free_b = 0,
				total_b = 0;

	memset(info, 0, sizeof(*info));
	info->device = ctx->device;
	snprintf(info->name, sizeof(info->name), "%s", ctx->prop.name);
	info->cc_major = ctx->prop.major;
	info->cc_minor = ctx->prop.minor;
	info->sm_count = ctx->prop.multiProcessorCount;
	info->l2_bytes = (size_t) ctx->prop.l2CacheSize;
	if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
	{
		cudaGetLastError();
		total_b = ctx->prop.totalGlobalMem;
		free_b = 0;
	}
	info->total_bytes = total_b;
	info->free_bytes = free_b;
}

extern "C" cai_status
cai_cuda_sync(cai_cuda_ctx *ctx, cai_error *err)
{
	CUDA_CHECK(cudaStreamSynchronize(ctx->stream), err, "the compute stream");
	CUDA_CHECK(cudaStreamSynchronize(ctx->copy_stream), err, "the copy stream");
	return CAI_OK;
}

cai_status
cuda_scratch_reserve(cai_cuda_ctx *ctx, void **buf, size_t *have, size_t want, size_t elem_bytes,
					 const char *what, cai_error *err)
{
	void	   *p = NULL;
	cudaError_t rc;
	size_t		bytes;

	if (want <= *have)
		return CAI_OK;
	if (ctx->capturing)
		return cuda_fail(err, CAI_ERR_INTERNAL,
						 "%s needs %zu elements while a cuda graph is being captured; reserve before capturing",
						 what, want);
	/* grow by half again so that slowly rising sizes do not reallocate every step */
	if (want < *have + *have / 2)
		want = *have + *have / 2;
	if (__builtin_mul_overflow(want, elem_bytes, &bytes))
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "%s size overflows", what);
	/* the old buffer may still be read by queued kernels */
	CUDA_CHECK(cudaStreamSynchronize(ctx->stream), err, what);
	rc = cudaMalloc(&p, bytes);
	if (rc != cudaSuccess)
	{
		cudaGetLastError();
		return cuda_fail(err, CAI_ERR_NO_MEMORY, "out of device memory allocating %s (%zu bytes)",
						 what, bytes);
	}
	cudaFree(*buf);
	*buf = p;
	*have = want;
	/* captured graphs point at the old buffer */
	cai_cuda_graph_reset(ctx);
	return CAI_OK;
}
