/*
 * cuda_error.c — the CUDA backend's error reports.  The shared object links nothing of libcai,
 * so it has its own cai_fail; it stands apart so that every C file of the backend can report
 * through it without depending on backend_cuda.c, which depends on them.
 */
#include "cuda_kernels.h"

#include <stdarg.h>
#include <stdio.h>

/* See cuda_kernels.h. */
cai_status
cai_cuda_fail(cai_error *err, cai_status status, const char *fmt, ...)
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
