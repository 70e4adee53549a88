/*
 * protocol.c — writes and reads the byte strings exchanged between backends and the worker.
 *
 * Values are copied with memcpy, so nothing in a payload needs to be aligned.  Text is written as
 * a uint32 length followed by the bytes, with no terminator.  Readers refuse to read past the end.
 */
#include "postgres.h"

#include "protocol.h"

void
cai_put_bytes(StringInfo buf, const void *data, Size len)
{
	appendBinaryStringInfo(buf, (const char *) data, (int) len);
}

void
cai_put_int32(StringInfo buf, int32 value)
{
	appendBinaryStringInfo(buf, (const char *) &value, sizeof(value));
}

void
cai_put_text(StringInfo buf, const char *text, Size len)
{
	uint32		len32 = (uint32) len;

	appendBinaryStringInfo(buf, (const char *) &len32, sizeof(len32));
	appendBinaryStringInfo(buf, text, (int) len);
}

void
cai_reader_init(CaiReader *reader, const void *data, Size len)
{
	reader->data = (const char *) data;
	reader->len = len;
	reader->pos = 0;
}

Size
cai_reader_remaining(const CaiReader *reader)
{
	return reader->len - reader->pos;
}

bool
cai_get_bytes(CaiReader *reader, void *out, Size len)
{
	if (len > reader->len - reader->pos)
		return false;
	memcpy(out, reader->data + reader->pos, len);
	reader->pos += len;
	return true;
}

bool
cai_get_int32(CaiReader *reader, int32 *value)
{
	return cai_get_bytes(reader, value, sizeof(*value));
}

/*
 * cai_get_text
 *		Points *text at the next text in place (not NUL-terminated) and sets *len.
 */
bool
cai_get_text(CaiReader *reader, const char **text, uint32 *len)
{
	uint32		n;

	if (!cai_get_bytes(reader, &n, sizeof(n)))
		return false;
	if (n > reader->len - reader->pos)
		return false;
	*text = reader->data + reader->pos;
	*len = n;
	reader->pos += n;
	return true;
}

/*
 * cai_get_int32_array
 *		Copies the next count int32 values into out (which has room for them).
 */
bool
cai_get_int32_array(CaiReader *reader, int32 count, int32 *out)
{
	if (count < 0)
		return false;
	return cai_get_bytes(reader, out, (Size) count * sizeof(int32));
}
