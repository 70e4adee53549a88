/*
 * protocol.c — wire buffers for backends: the formats of src/common/wire.h written into memory
 * that palloc gives, so that an error raised while a request is built frees it.
 */
#include "postgres.h"

#include "protocol.h"

static void *
grow_in_memory_context(void *ptr, size_t size)
{
	return ptr ? repalloc(ptr, size) : palloc(size);
}

void
CaiWireInit(cai_wbuf *buf)
{
	cai_wbuf_init(buf, grow_in_memory_context);
}
