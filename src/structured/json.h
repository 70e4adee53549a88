/*
 * json.h — a strict JSON (RFC 8259) parser for untrusted text, and compact serialization.
 *
 * Parses into a document tree that owns all of its memory.  Strict: no comments, no trailing
 * commas, no NaN/Infinity, no leading zeros, no raw control characters in strings, valid UTF-8
 * only, \u escapes of surrogates only as a high-low pair, no duplicate object keys, nothing but
 * whitespace after the value, nesting at most JSON_MAX_DEPTH arrays and objects deep.  Errors
 * name the byte offset where the text went wrong.
 *
 * Numbers keep their literal text (the parser checks its grammar); strings are unescaped into
 * UTF-8 bytes with a length (a "\u0000" escape becomes a NUL byte inside them).
 */
#ifndef CAI_JSON_H
#define CAI_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "util.h"

#define JSON_MAX_DEPTH 64

typedef enum json_type
{
	JSON_NULL = 0,
	JSON_FALSE,
	JSON_TRUE,
	JSON_NUMBER,
	JSON_STRING,
	JSON_ARRAY,
	JSON_OBJECT
} json_type;

typedef struct json_value json_value;

typedef struct json_member
{
	const char *key;			/* unescaped UTF-8, NUL-terminated (may hold NULs before) */
	size_t		key_len;
	json_value *value;
} json_member;

/*
 * qsort comparator of json_member pointers by key bytes (UTF-8 byte order is code point order,
 * which is also Python's str order: jinja's tojson sorts keys so).
 */
int			cai_json_member_ptr_cmp(const void *a, const void *b);

struct json_value
{
	json_type	type;
	size_t		offset;			/* byte offset of the value's first byte in the text */
	union
	{
		struct
		{
			const char *text;	/* the literal as written, NUL-terminated */
			size_t		len;
		}			number;
		struct
		{
			const char *bytes;	/* unescaped UTF-8, NUL-terminated (may hold NULs before) */
			size_t		len;
		}			string;
		struct
		{
			json_value **items;
			size_t		n;
		}			array;
		struct
		{
			json_member *members;	/* in the order of the text */
			size_t		n;
		}			object;
	}			u;
};

typedef struct json_doc json_doc;

/* JSON's whitespace, digits and hex digits (-1: not one), for the parser and the matcher. */
static inline bool
json_is_ws(unsigned char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static inline bool
json_is_digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

static inline int
json_hex_value(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* json_parse flags */
#define JSON_DUPLICATE_KEYS 0x1 /* accept repeated keys (RFC 8259 only says they SHOULD NOT be) */

/*
 * Parses text[0..len).  On failure *out is NULL and err says what and at which byte: the
 * status is CAI_ERR_INVALID_ARGUMENT for text that is not JSON, CAI_ERR_UNSUPPORTED for JSON
 * that nests deeper than JSON_MAX_DEPTH (the message "nests deeper than ... at byte N").
 */
cai_status	json_parse(const char *text, size_t len, unsigned flags, json_doc **out,
					   cai_error *err);
const json_value *json_doc_root(const json_doc *doc);
void		json_doc_free(json_doc *doc);

/* The member of object obj named key (a NUL-terminated name), or NULL. */
const json_value *json_object_get(const json_value *obj, const char *key);

/*
 * Appends v's compact serialization: no whitespace, members in document order, numbers as
 * written, strings escaped canonically (\" \\ \b \f \n \r \t, \u00XX for other control
 * characters, everything else as its UTF-8).  False when out of memory.
 */
bool		json_serialize(const json_value *v, cai_buf *out);

/* Appends the canonical serialization of the string s[0..len) (quotes included). */
bool		json_serialize_string(const char *s, size_t len, cai_buf *out);

#endif							/* CAI_JSON_H */
