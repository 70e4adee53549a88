/*
 * test_json.c — the strict JSON parser and serializer (src/structured/json.c): valid documents and
 * their trees, every kind of invalid text with the byte offset its error names, the nesting
 * limit, numbers, escapes and surrogates, duplicate keys, compact serialization.
 */
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "test.h"

static json_doc *
parse_ok(const char *text)
{
	json_doc   *doc = NULL;
	cai_error	err;
	cai_status	st = json_parse(text, strlen(text), 0, &doc, &err);

	CHECK_MSG(st == CAI_OK, "%s: %s", text, err.message);
	return doc;
}

/* Parses text (which must fail) and checks the message names byte `at`. */
static void
parse_fails(const char *text, size_t len, size_t at)
{
	json_doc   *doc = NULL;
	cai_error	err;
	char		want[64];
	cai_status	st = json_parse(text, len, 0, &doc, &err);

	CHECK_MSG(st == CAI_ERR_INVALID_ARGUMENT, "accepted %.*s", (int) len, text);
	CHECK(doc == NULL);
	if (st == CAI_ERR_INVALID_ARGUMENT)
	{
		snprintf(want, sizeof(want), "at byte %zu:", at);
		CHECK_MSG(strstr(err.message, want) != NULL, "%.*s: \"%s\" lacks \"%s\"", (int) len, text,
				  err.message, want);
	}
	json_doc_free(doc);
}

#define FAILS(text, at) parse_fails(text, sizeof(text) - 1, at)

/* Too deep: CAI_ERR_UNSUPPORTED (the text may be valid JSON), naming the byte. */
static void
parse_too_deep(const char *text, size_t len, size_t at)
{
	json_doc   *doc = NULL;
	cai_error	err;
	char		want[96];
	cai_status	st = json_parse(text, len, 0, &doc, &err);

	CHECK_MSG(st == CAI_ERR_UNSUPPORTED, "%.*s: status %d", (int) (len < 80 ? len : 80), text, st);
	CHECK(doc == NULL);
	snprintf(want, sizeof(want), "nests deeper than %d arrays and objects at byte %zu",
			 JSON_MAX_DEPTH, at);
	CHECK_MSG(st == CAI_OK || strcmp(err.message, want) == 0, "\"%s\", want \"%s\"",
			  err.message, want);
	json_doc_free(doc);
}

/* The compact serialization of text's value. */
static void
serializes_to(const char *text, const char *want)
{
	json_doc   *doc = parse_ok(text);
	cai_buf	buf = {0};

	if (!doc)
		return;
	CHECK(json_serialize(json_doc_root(doc), &buf));
	CHECK_MSG(buf.len == strlen(want) && memcmp(buf.data, want, buf.len) == 0, "%s -> %.*s, want %s",
			  text, (int) buf.len, buf.data, want);
	cai_buf_free(&buf);
	json_doc_free(doc);
}

TEST(json_parses_values_into_a_tree)
{
	json_doc   *doc = parse_ok(" {\"a\": [1, -2.5e+3, true, false, null], \"b\": {\"c\": \"x\"}, \"\": 0}\n");
	const json_value *root,
			   *a,
			   *b;

	if (!doc)
		return;
	root = json_doc_root(doc);
	CHECK_EQ_INT(root->type, JSON_OBJECT);
	CHECK_EQ_INT(root->u.object.n, 3);
	CHECK_EQ_INT(root->offset, 1);
	a = json_object_get(root, "a");
	CHECK(a && a->type == JSON_ARRAY && a->u.array.n == 5);
	if (a && a->u.array.n == 5)
	{
		CHECK_EQ_INT(a->u.array.items[0]->type, JSON_NUMBER);
		CHECK(strcmp(a->u.array.items[1]->u.number.text, "-2.5e+3") == 0);
		CHECK_EQ_INT(a->u.array.items[1]->u.number.len, 7);
		CHECK_EQ_INT(a->u.array.items[2]->type, JSON_TRUE);
		CHECK_EQ_INT(a->u.array.items[3]->type, JSON_FALSE);
		CHECK_EQ_INT(a->u.array.items[4]->type, JSON_NULL);
		CHECK_EQ_INT(a->u.array.items[4]->offset, 33);
	}
	b = json_object_get(root, "b");
	CHECK(b && json_object_get(b, "c") && json_object_get(b, "c")->type == JSON_STRING);
	CHECK(json_object_get(root, "") != NULL);
	CHECK(json_object_get(root, "z") == NULL);
	CHECK(strcmp(root->u.object.members[1].key, "b") == 0);	/* document order */
	json_doc_free(doc);

	json_doc_free(parse_ok("0"));
	json_doc_free(parse_ok("-0.0E-0"));
	json_doc_free(parse_ok("\"\""));
	json_doc_free(parse_ok("[]"));
	json_doc_free(parse_ok("{ }"));
	json_doc_free(parse_ok("\t\r\n[\t1\r,\n2 ]\t"));
}

TEST(json_unescapes_strings)
{
	json_doc   *doc = parse_ok("\"a\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u20AC\\ud83d\\ude00\\u0000z\xc3\xa9\"");
	const json_value *v;
	static const char want[] = "a\"\\/\b\f\n\r\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\0z\xc3\xa9";

	if (!doc)
		return;
	v = json_doc_root(doc);
	CHECK_EQ_INT(v->u.string.len, sizeof(want) - 1);
	CHECK(memcmp(v->u.string.bytes, want, sizeof(want) - 1) == 0);
	json_doc_free(doc);
}

TEST(json_refuses_invalid_text_naming_the_byte)
{
	FAILS("", 0);
	FAILS("   ", 3);
	FAILS("{", 1);
	FAILS("[1,]", 3);
	FAILS("[1 2]", 3);
	FAILS("{\"a\" 1}", 5);
	FAILS("{\"a\":1,}", 7);
	FAILS("{1:2}", 1);
	FAILS("{'a':1}", 1);
	FAILS("tru", 0);
	FAILS("nul", 0);
	FAILS("True", 0);
	FAILS("NaN", 0);
	FAILS("[Infinity]", 1);
	FAILS("1 2", 2);
	FAILS("{} x", 3);
	FAILS("// c\n1", 0);
	FAILS("\"abc", 0);
	FAILS("\"a\nb\"", 2);
	FAILS("\"\x01\"", 1);
	FAILS("\"\\x\"", 1);
	FAILS("\"\\u12\"", 1);
	FAILS("\"\\u12G4\"", 1);
	FAILS("\"ab\\", 3);
	FAILS("\xEF\xBB\xBF{}", 0);	/* a byte order mark */
}

TEST(json_refuses_bad_numbers)
{
	FAILS("01", 0);
	FAILS("-01", 0);
	FAILS("+1", 0);
	FAILS(".5", 0);
	FAILS("1.", 0);
	FAILS("1.e5", 0);
	FAILS("1e", 0);
	FAILS("1e+", 0);
	FAILS("-", 0);
	FAILS("[-a]", 1);
	FAILS("0x10", 1);
	json_doc_free(parse_ok("1E+400"));	/* syntax only: the value is the schema's business */
	json_doc_free(parse_ok("123456789012345678901234567890.12345678901234567890"));
}

TEST(json_refuses_invalid_utf8_and_lone_surrogates)
{
	FAILS("\"\xC3\"", 1);				/* truncated */
	FAILS("\"\xC0\xAF\"", 1);			/* overlong */
	FAILS("\"\xED\xA0\x80\"", 1);		/* a surrogate encoded */
	FAILS("\"\xF4\x90\x80\x80\"", 1);	/* above U+10FFFF */
	FAILS("\"\x80\"", 1);				/* a stray continuation */
	FAILS("[\"\\ud800\"]", 2);
	FAILS("\"\\udc00\"", 1);
	FAILS("\"\\ud800\\u0041\"", 1);
	FAILS("\"\\ud800x\"", 1);
	FAILS("\"a\\ud83d\"", 2);
}

TEST(json_refuses_duplicate_keys)
{
	FAILS("{\"a\":1,\"b\":2,\"a\":3}", 17);
	FAILS("{\"x\":{\"k\":[],\"k\":{}}}", 17);
	/* equal after unescaping */
	FAILS("{\"A\":1,\"\\u0041\":2}", 16);
	json_doc_free(parse_ok("{\"a\":1,\"ab\":2,\"b\":3,\"\":4}"));
	/* unless asked to take them (generated free objects may repeat a key; jsonb keeps the last) */
	{
		json_doc   *doc = NULL;
		cai_error	err;
		const char *text = "{\"a\":1,\"a\":{\"b\":2,\"b\":3}}";

		CHECK(json_parse(text, strlen(text), JSON_DUPLICATE_KEYS, &doc, &err) == CAI_OK);
		if (doc)
			CHECK_EQ_INT(json_doc_root(doc)->u.object.n, 2);
		json_doc_free(doc);
	}
}

TEST(json_nesting_is_bounded)
{
	char		text[2 * JSON_MAX_DEPTH + 8];
	int			n = 0;

	/* exactly 64 levels parse */
	for (int i = 0; i < JSON_MAX_DEPTH; i++)
		text[n++] = '[';
	for (int i = 0; i < JSON_MAX_DEPTH; i++)
		text[n++] = ']';
	text[n] = '\0';
	json_doc_free(parse_ok(text));
	/* 65 do not; the error is at the 65th bracket */
	n = 0;
	for (int i = 0; i <= JSON_MAX_DEPTH; i++)
		text[n++] = '[';
	for (int i = 0; i <= JSON_MAX_DEPTH; i++)
		text[n++] = ']';
	parse_too_deep(text, n, JSON_MAX_DEPTH);

	{
		/* deep objects too, and far deeper input is refused the same way (no stack overflow) */
		size_t		deep = 100000;
		char	   *big = malloc(deep * 6 + 1);
		size_t		k = 0;

		for (size_t i = 0; i < deep; i++)
		{
			memcpy(big + k, "{\"a\":", 5);
			k += 5;
		}
		parse_too_deep(big, k, 5 * JSON_MAX_DEPTH);
		free(big);
	}
}

TEST(json_serializes_compactly_and_canonically)
{
	serializes_to(" { \"b\" : [ 1 , 2.50 , -0 , 1E5 ] , \"a\" : { } , \"c\" : [ ] } ",
				  "{\"b\":[1,2.50,-0,1E5],\"a\":{},\"c\":[]}");
	serializes_to("\"\\u0041\\/\\u001f\\u007f\\t\\b\\f\\n\\r\\\"\\\\\xc3\xa9\"",
				  "\"A/\\u001f\x7f\\t\\b\\f\\n\\r\\\"\\\\\xc3\xa9\"");
	serializes_to("[true,false,null]", "[true,false,null]");
	serializes_to("{\"k\\n\":\"v\"}", "{\"k\\n\":\"v\"}");
}

TEST(json_parses_text_that_is_not_nul_terminated)
{
	json_doc   *doc = NULL;
	cai_error	err;
	const char	text[] = "[1,2]garbage";

	CHECK(json_parse(text, 5, 0, &doc, &err) == CAI_OK);
	if (doc)
		CHECK_EQ_INT(json_doc_root(doc)->u.array.n, 2);
	json_doc_free(doc);
	/* a NUL byte inside is not the end of the text */
	parse_fails("[1]\0", 4, 3);
	CHECK(json_parse(NULL, 0, 0, &doc, &err) == CAI_ERR_INVALID_ARGUMENT);
}
