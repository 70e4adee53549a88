/*
 * json_string.h — the little JSON writing `cai bench` and `cai eval` need: a string with escapes.
 */
#ifndef CAI_CLI_JSON_STRING_H
#define CAI_CLI_JSON_STRING_H

#include <stdio.h>

/* Writes s as a JSON string literal (quotes included); NULL is written as null. */
static inline void
json_write_string(FILE *out, const char *s)
{
	if (s == NULL)
	{
		fputs("null", out);
		return;
	}
	fputc('"', out);
	for (const unsigned char *p = (const unsigned char *) s; *p; p++)
	{
		switch (*p)
		{
			case '"':
				fputs("\\\"", out);
				break;
			case '\\':
				fputs("\\\\", out);
				break;
			case '\n':
				fputs("\\n", out);
				break;
			case '\r':
				fputs("\\r", out);
				break;
			case '\t':
				fputs("\\t", out);
				break;
			default:
				if (*p < 0x20)
					fprintf(out, "\\u%04x", *p);
				else
					fputc(*p, out);
		}
	}
	fputc('"', out);
}

#endif							/* CAI_CLI_JSON_STRING_H */
