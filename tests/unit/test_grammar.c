/*
 * test_grammar.c — JSON Schema compiled to a byte-level matcher (json_schema.c,
 * json_matcher.c): for every supported keyword, texts the matcher must take and texts it must
 * refuse (each text it takes also passes the independent validator of json_validate.h); every
 * unsupported keyword and malformed schema and the error it gets; the whitespace bound, number
 * bounds reasoned digit by digit, string lengths in code points, what jsonb refuses.
 *
 * Masks over tokens are tested in test_token_mask.c.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json.h"
#include "json_matcher.h"
#include "json_validate.h"
#include "test.h"

static cai_grammar *
compile_ok(const char *schema)
{
	cai_grammar *g = NULL;
	cai_error	err;
	cai_status	st = cai_grammar_from_schema(schema, strlen(schema), &g, &err);

	CHECK_MSG(st == CAI_OK, "%s: %s", schema, err.message);
	return g;
}

static void
compile_fails(const char *schema, const char *message)
{
	cai_grammar *g = NULL;
	cai_error	err;
	cai_status	st = cai_grammar_from_schema(schema, strlen(schema), &g, &err);

	CHECK_MSG(st == CAI_ERR_INVALID_ARGUMENT, "%s compiled", schema);
	CHECK(g == NULL);
	if (st != CAI_OK)
		CHECK_MSG(strcmp(err.message, message) == 0, "%s:\n      got  \"%s\"\n      want \"%s\"",
				  schema, err.message, message);
	cai_grammar_free(g);
}

/* Whether the matcher takes text as one whole value of schema; a text it takes must validate. */
static void
expect(const char *schema, const char *text, bool want)
{
	cai_grammar *g = compile_ok(schema);
	int			got;

	if (!g)
		return;
	got = gm_accepts(g, g->root, text, strlen(text));
	CHECK_MSG(got == want, "%s: %s %s", schema, want ? "refused" : "took", text);
	if (got == 1)
	{
		json_doc   *s = NULL,
				   *v = NULL;
		cai_error	err;

		CHECK(json_parse(schema, strlen(schema), 0, &s, &err) == CAI_OK);
		CHECK_MSG(json_parse(text, strlen(text), JSON_DUPLICATE_KEYS, &v, &err) == CAI_OK, "%s: %s", text, err.message);
		if (s && v)
		{
			CHECK_MSG(jv_validate(json_doc_root(s), json_doc_root(s), json_doc_root(v), 0),
					  "%s: took %s, which is not valid", schema, text);
			CHECK(jv_jsonb_ok(json_doc_root(v)));
			CHECK(jv_text_limits(text, strlen(text), schema));
		}
		json_doc_free(s);
		json_doc_free(v);
	}
	cai_grammar_free(g);
}

/* Every text of yes taken, every text of no refused (NULL-terminated lists). */
static void
expect_texts(const char *schema, const char *const *yes, const char *const *no)
{
	for (int i = 0; yes && yes[i]; i++)
		expect(schema, yes[i], true);
	for (int i = 0; no && no[i]; i++)
		expect(schema, no[i], false);
}

#define TEXTS(...) ((const char *const[]) {__VA_ARGS__, NULL})

TEST(grammar_type_string)
{
	expect_texts("{\"type\":\"string\"}",
				 TEXTS("\"\"", "\"abc\"", " \"x y\"", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\u00e9\\u00E9\"",
					   "\"\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80\"", "\"\x7f\"", "\"\\ud83d\\ude00\""),
				 TEXTS("abc", "\"abc", "'a'", "\"a\"b\"", "\"\x01\"", "\"a\nb\"", "\"\\x\"", "\"\\u12\"",
					   "\"\\u12g4\"", "1", "null", "\"a\" ", "\"\\'\""));
}

TEST(grammar_strings_are_valid_utf8_for_jsonb)
{
	/* raw bytes: only well-formed UTF-8 */
	expect_texts("{\"type\":\"string\"}",
				 TEXTS("\"\xc2\x80\"", "\"\xe0\xa0\x80\"", "\"\xed\x9f\xbf\"", "\"\xf0\x90\x80\x80\"",
					   "\"\xf4\x8f\xbf\xbf\"", "\"\xee\x80\x80\""),
				 TEXTS("\"\x80\"", "\"\xc0\xaf\"", "\"\xc1\xbf\"", "\"\xe0\x9f\xbf\"", "\"\xed\xa0\x80\"",
					   "\"\xf0\x8f\xbf\xbf\"", "\"\xf4\x90\x80\x80\"", "\"\xf5\x80\x80\x80\"", "\"\xff\"",
					   "\"\xc3\"", "\"\xe6\x97\""));
	/* escapes: never \u0000, never an unpaired surrogate */
	expect_texts("{\"type\":\"string\"}",
				 TEXTS("\"\\u0001\"", "\"\\u0010\"", "\"\\uD800\\uDC00\"", "\"\\udbff\\udfff\"",
					   "\"\\ud7ff\"", "\"\\ue000\"", "\"\\uFFFF\""),
				 TEXTS("\"\\u0000\"", "\"a\\u0000b\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"",
					   "\"\\ud800x\"", "\"\\ud800\\ud800\"", "\"\\uDFFF\"", "\"\\ud800\\\"\""));
}

TEST(grammar_string_lengths_count_code_points)
{
	const char *s = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}";

	expect_texts(s,
				 TEXTS("\"ab\"", "\"abc\"", "\"\xc3\xa9\xc3\xa9\"", "\"\xf0\x9f\x98\x80\xe6\x97\xa5\xc3\xa9\"",
					   "\"\\n\\t\"", "\"\\u00e9\\ud83d\\ude00x\"", "\"a\\\"\""),
				 TEXTS("\"\"", "\"a\"", "\"\xc3\xa9\"", "\"\\ud83d\\ude00\"", "\"abcd\"",
					   "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"", "\"\\n\\n\\n\\n\""));
	expect_texts("{\"type\":\"string\",\"maxLength\":0}", TEXTS("\"\""), TEXTS("\" \""));
	expect_texts("{\"type\":\"string\",\"minLength\":1.0}", TEXTS("\"a\""), TEXTS("\"\""));
}

TEST(grammar_numbers)
{
	expect_texts("{\"type\":\"number\"}",
				 TEXTS("0", "-0", "1", "-12", "3.25", "0.5", "1e5", "1E+05", "-2.5e-3", "1234567890123456789",
					   "0.1234567890123456", "9e999", " 7"),
				 TEXTS("01", "-", "+1", ".5", "1.", "1e", "1e+", "--1", "1.2.3", "0x1", "NaN", "\"1\"",
					   "12345678901234567890", "0.12345678901234567", "1e1234", "1 "));
	expect_texts("{\"type\":\"integer\"}",
				 TEXTS("0", "-0", "42", "-9223372036854775808", "9999999999999999999"),
				 TEXTS("1.0", "1e3", "1.5", "00", "10000000000000000000"));
}

TEST(grammar_number_bounds_reason_digit_by_digit)
{
	const char *s = "{\"type\":\"integer\",\"minimum\":1,\"maximum\":100}";

	expect_texts(s, TEXTS("1", "9", "10", "55", "99", "100"),
				 TEXTS("0", "-1", "101", "1000", "200", "-0", "1e2"));
	/* exclusive bounds (draft 6 numbers and draft 4 booleans), fractional bounds on integers */
	expect_texts("{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":3}",
				 TEXTS("1", "2"), TEXTS("0", "3", "-1"));
	expect_texts("{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,\"maximum\":3,\"exclusiveMaximum\":false}",
				 TEXTS("1", "3"), TEXTS("0", "4"));
	expect_texts("{\"type\":\"integer\",\"minimum\":-2.5,\"maximum\":2.5}",
				 TEXTS("-2", "0", "2"), TEXTS("-3", "3"));
	expect_texts("{\"type\":\"integer\",\"minimum\":-20,\"maximum\":-10}",
				 TEXTS("-10", "-15", "-20"), TEXTS("-1", "-9", "-21", "-100", "10", "0"));
	/* numbers: the fraction is bounded too, no exponent once bounded */
	expect_texts("{\"type\":\"number\",\"minimum\":0.5,\"exclusiveMaximum\":1.25}",
				 TEXTS("0.5", "0.50", "0.75", "1", "1.0", "1.2499999999999999", "1.249"),
				 TEXTS("0.4999", "0", "1.25", "1.250", "1.3", "2", "5e-1", "-0.5"));
	expect_texts("{\"type\":\"number\",\"minimum\":-1e-3,\"maximum\":0}",
				 TEXTS("0", "-0", "-0.001", "-0.0009", "0.0"), TEXTS("-0.0011", "-1", "0.1"));
	/* bounds beyond what can be generated: as if absent, or nothing */
	expect_texts("{\"type\":\"integer\",\"minimum\":-1e300}", TEXTS("-9999999999999999999", "5"),
				 TEXTS("1e3"));
	compile_fails("{\"type\":\"integer\",\"minimum\":1e20}", "the schema admits no value at the root");
	compile_fails("{\"type\":\"integer\",\"minimum\":0.2,\"maximum\":0.8}",
				  "the schema admits no value at the root");
	compile_fails("{\"type\":\"integer\",\"exclusiveMinimum\":1,\"exclusiveMaximum\":2}",
				  "the schema admits no value at the root");
	expect_texts("{\"type\":\"number\",\"exclusiveMinimum\":1,\"exclusiveMaximum\":1.0000000000000002}",
				 TEXTS("1.0000000000000001"), TEXTS("1", "1.0000000000000002"));
	/* a bound with more digits than can be written: rounded inward on the grid */
	expect_texts("{\"type\":\"number\",\"minimum\":0.12345678901234567}",
				 TEXTS("0.1234567890123457", "1"), TEXTS("0.1234567890123456"));
}

TEST(grammar_boolean_null_and_type_arrays)
{
	expect_texts("{\"type\":\"boolean\"}", TEXTS("true", "false"), TEXTS("null", "1", "\"true\"", "tru"));
	expect_texts("{\"type\":\"null\"}", TEXTS("null"), TEXTS("false", "nul"));
	expect_texts("{\"type\":[\"string\",\"null\"],\"maxLength\":1}", TEXTS("null", "\"a\""),
				 TEXTS("\"ab\"", "1", "false"));
	expect_texts("{\"type\":[\"integer\",\"number\"],\"maximum\":2}", TEXTS("1.5", "2"), TEXTS("2.5"));
	expect_texts("{\"type\":[\"boolean\",\"null\",\"array\"]}", TEXTS("true", "null", "[1,\"a\"]"),
				 TEXTS("{}", "0"));
}

TEST(grammar_enum_and_const_match_exact_serializations)
{
	const char *e = "{\"enum\":[\"red\",\"dark red\",1,10,1.5,null,true,{\"a\":[1,{}]},[],\"\\n\\u00e9\"]}";

	expect_texts(e, TEXTS("\"red\"", "\"dark red\"", "1", "10", "1.5", "null", "true", "{\"a\":[1,{}]}", "[]",
						  "\"\\n\xc3\xa9\"", " \"red\""),
				 TEXTS("\"re\"", "\"redd\"", "100", "1.0", "false", "{\"a\": [1,{}]}", "[ ]", "\"\\u00e9\"",
					   "\"\\n\\u00e9\"", "\"Red\""));
	expect_texts("{\"const\":{\"k\":\"v\",\"n\":[true,2]}}", TEXTS("{\"k\":\"v\",\"n\":[true,2]}"),
				 TEXTS("{\"n\":[true,2],\"k\":\"v\"}", "{}"));
	expect_texts("{\"const\":\"x\",\"enum\":[\"x\",\"y\"]}", TEXTS("\"x\""), TEXTS("\"y\""));
	/* the rest of the schema filters the values */
	expect_texts("{\"type\":\"string\",\"enum\":[\"a\",1,\"bcd\"],\"maxLength\":2}", TEXTS("\"a\""),
				 TEXTS("1", "\"bcd\""));
	expect_texts("{\"type\":\"integer\",\"enum\":[1,2.5,3,\"3\"],\"maximum\":2}", TEXTS("1"),
				 TEXTS("2.5", "3", "\"3\""));
	/* a number that is the whole reply may go on growing: enum [1, 10] after "1" */
	expect_texts("{\"type\":\"array\",\"items\":{\"enum\":[1,10,100]}}", TEXTS("[1,10,100]", "[10 , 1]"),
				 TEXTS("[1000]", "[11]"));
	/* literals are generated as written, beyond the digit limits of free numbers */
	expect_texts("{\"enum\":[123456789012345678901234567890,1e131071,0.1e131072,1E-16383,-0e-16383]}",
				 TEXTS("123456789012345678901234567890", "1e131071", "0.1e131072", "1E-16383", "-0e-16383"),
				 TEXTS("1e131072", "1"));
	/* but only what PostgreSQL's numeric can store */
	compile_fails("{\"const\":1e131072}",
				  "\"const\" holds a number out of numeric's range, which PostgreSQL's jsonb cannot store at the root");
	compile_fails("{\"enum\":[1,[{\"a\":0.1e-16383}]]}",
				  "\"enum\" holds a number out of numeric's range, which PostgreSQL's jsonb cannot store at the root");
	compile_fails("{\"const\":0e9999999999}",
				  "\"const\" holds a number out of numeric's range, which PostgreSQL's jsonb cannot store at the root");
	compile_fails("{\"type\":\"string\",\"enum\":[1,2]}", "the schema admits no value at the root");
	compile_fails("{\"const\":\"x\",\"enum\":[\"y\"]}", "the schema admits no value at the root");
}

TEST(grammar_objects_in_declaration_order)
{
	const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
		"\"c\":{\"type\":\"boolean\"},\"d\":{\"type\":\"null\"}},\"required\":[\"b\",\"d\"]}";

	expect_texts(s,
				 TEXTS("{\"b\":\"x\",\"d\":null}", "{\"a\":1,\"b\":\"\",\"c\":true,\"d\":null}",
					   "{ \"a\" : 1 , \"b\" : \"x\" , \"d\" : null }", "{\"b\":\"x\",\"c\":false,\"d\":null}",
					   "{\n  \"b\": \"x\",\n  \"d\": null\n}"),
				 TEXTS("{}", "{\"b\":\"x\"}", "{\"d\":null,\"b\":\"x\"}", "{\"b\":\"x\",\"d\":null,\"a\":1}",
					   "{\"a\":1,\"d\":null}", "{\"b\":\"x\",\"d\":null,}", "{\"b\":\"x\",\"e\":1,\"d\":null}",
					   "{\"b\":\"x\",\"b\":\"y\",\"d\":null}", "{\"b\" \"x\",\"d\":null}", "{\"a\":\"1\",\"b\":\"x\",\"d\":null}"));
	/* keys sharing prefixes; an optional property whose schema is false can never appear */
	expect_texts("{\"properties\":{\"ab\":{\"type\":\"null\"},\"a\":{\"type\":\"null\"},\"abc\":false,"
				 "\"a b\":{\"type\":\"null\"}}}",
				 TEXTS("{}", "{\"ab\":null}", "{\"a\":null}", "{\"ab\":null,\"a\":null,\"a b\":null}", "{\"a b\":null}"),
				 TEXTS("{\"abc\":null}", "{\"a\":null,\"ab\":null}", "[]"));
	/* escaped keys are generated escaped */
	expect_texts("{\"properties\":{\"q\\\"\\n\":{\"const\":1}},\"required\":[\"q\\\"\\n\"]}",
				 TEXTS("{\"q\\\"\\n\":1}"), TEXTS("{\"q\\u0022\\n\":1}"));
}

TEST(grammar_additional_properties)
{
	/* false, true, {} or absent: only the declared properties */
	const char *variants[] = {"false", "true", "{}", NULL};

	for (int i = 0; i < 4; i++)
	{
		char		s[256];

		snprintf(s, sizeof(s), "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}%s%s}",
				 variants[i] ? ",\"additionalProperties\":" : "", variants[i] ? variants[i] : "");
		expect_texts(s, TEXTS("{}", "{\"a\":1}"), TEXTS("{\"b\":1}", "{\"a\":1,\"b\":2}"));
	}
	/* no properties declared: any object, or only {} when none may be added */
	expect_texts("{\"type\":\"object\"}",
				 TEXTS("{}", "{\"x\":[1,{\"y\":null}],\"x2\":\"\\u00e9\"}", "{\"\":{}}"),
				 TEXTS("[]", "{\"x\"}", "{1:2}"));
	expect_texts("{\"type\":\"object\",\"additionalProperties\":false}", TEXTS("{}", "{ }"), TEXTS("{\"x\":1}"));
	/* properties declared, but none: only {} */
	expect_texts("{\"properties\":{}}", TEXTS("{}", "{ }"), TEXTS("{\"x\":1}", "[]"));
}

TEST(grammar_arrays)
{
	expect_texts("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
				 TEXTS("[1]", "[1,2,3]", "[ 1 , 2 ]", "[\n1\n]"),
				 TEXTS("[]", "[1,2,3,4]", "[1,]", "[,1]", "[\"1\"]", "[1 2]"));
	expect_texts("{\"type\":\"array\"}", TEXTS("[]", "[1,\"a\",[null,{}],{\"k\":[]}]"), TEXTS("{}", "[1,]"));
	expect_texts("{\"type\":\"array\",\"items\":false}", TEXTS("[]"), TEXTS("[1]", "[[]]"));
	expect_texts("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":1},\"minItems\":2}",
				 TEXTS("[[],[true]]", "[[false],[],[]]"), TEXTS("[[]]", "[[true,false],[]]"));
	compile_fails("{\"type\":\"array\",\"items\":false,\"minItems\":1}",
				  "the item schema admits no value, and \"minItems\" asks for items at /items");
}

TEST(grammar_any_of)
{
	const char *s = "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"string\",\"minLength\":5},"
		"{\"type\":\"integer\",\"minimum\":10},{\"anyOf\":[{\"type\":\"null\"},false]},"
		"{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}},\"required\":[\"k\"]},"
		"{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\"}},\"required\":[\"k\"]}]}";

	expect_texts(s, TEXTS("\"abc\"", "\"abcde\"", "\"\"", "10", "999", "null", "{\"k\":1}", "{\"k\":\"s\"}"),
				 TEXTS("\"abcd\"", "9", "true", "{\"k\":null}", "{}"));
	expect_texts("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"const\":1},{\"type\":\"integer\",\"minimum\":5}]}}",
				 TEXTS("[1,5,1,100]", "[]"), TEXTS("[2]", "[1,2]"));
	compile_fails("{\"anyOf\":[false,{\"type\":\"integer\",\"minimum\":2.2,\"maximum\":2.8}]}",
				  "the schema admits no value at the root");
}

TEST(grammar_refs_and_defs)
{
	expect_texts("{\"$defs\":{\"pos\":{\"type\":\"integer\",\"minimum\":1},\"pt\":{\"type\":\"object\","
				 "\"properties\":{\"x\":{\"$ref\":\"#/$defs/pos\"},\"y\":{\"$ref\":\"#/$defs/pos\"}},"
				 "\"required\":[\"x\",\"y\"]}},\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/pt\"}}",
				 TEXTS("[{\"x\":1,\"y\":2}]", "[]"), TEXTS("[{\"x\":0,\"y\":2}]", "[{\"x\":1}]"));
	expect_texts("{\"definitions\":{\"a/b\":{\"const\":\"s\"},\"t~\":{\"const\":2}},\"properties\":{"
				 "\"p\":{\"$ref\":\"#/definitions/a~1b\"},\"q\":{\"$ref\":\"#/definitions/t~0\"},"
				 "\"r\":{\"$ref\":\"#/properties/q\"}}}",
				 TEXTS("{\"p\":\"s\",\"q\":2,\"r\":2}"), TEXTS("{\"p\":2}"));
	expect_texts("{\"anyOf\":[{\"$ref\":\"#/anyOf/1\"},{\"type\":\"null\"}]}", TEXTS("null"), TEXTS("1"));
}

TEST(grammar_boolean_schemas)
{
	expect_texts("true", TEXTS("1", "\"a\"", "[{}]", "null", "{\"a\":[true]}"), TEXTS("", "x"));
	expect_texts("{}", TEXTS("1", "\"a\""), TEXTS(""));
	expect_texts("{\"description\":\"anything\",\"title\":\"t\",\"$schema\":\"x\",\"$id\":\"y\",\"$comment\":\"\","
				 "\"default\":1,\"examples\":[1],\"deprecated\":false,\"readOnly\":true,\"writeOnly\":false}",
				 TEXTS("[]", "false"), NULL);
	compile_fails("false", "the schema admits no value at the root");
	compile_fails("{\"properties\":{\"a\":false},\"required\":[\"a\"]}",
				  "property \"a\" is required, but its schema admits no value at /properties/a");
}

TEST(grammar_type_from_keywords)
{
	/* no "type": the keywords' types */
	expect_texts("{\"properties\":{\"a\":{\"type\":\"null\"}}}", TEXTS("{\"a\":null}", "{}"),
				 TEXTS("1", "\"x\"", "[]"));
	expect_texts("{\"maxLength\":2}", TEXTS("\"ab\""), TEXTS("\"abc\"", "1"));
	expect_texts("{\"minimum\":1,\"maxItems\":1}", TEXTS("1", "[\"x\"]"), TEXTS("0", "[1,2]", "\"a\""));
}

TEST(grammar_any_object)
{
	cai_grammar *g = NULL;
	cai_error	err;
	char		deep[256];
	int			n = 0;
	const char *const yes[] = {"{}", "{\"a\":1,\"b\":[true,null,{\"c\":\"\\u00e9\"}],\"a\":-1.5e3}",
	"{ \"x\" : [ ] }", NULL};
	const char *const no[] = {"[]", "1", "\"s\"", "{\"a\"}", "{\"a\":}", "{a:1}", "{\"a\":1,}", NULL};

	CHECK(cai_grammar_any_object(&g, &err) == CAI_OK);
	if (!g)
		return;
	for (int i = 0; yes[i]; i++)
		CHECK_MSG(gm_accepts(g, g->root, yes[i], strlen(yes[i])) == 1, "refused %s", yes[i]);
	for (int i = 0; no[i]; i++)
		CHECK_MSG(gm_accepts(g, g->root, no[i], strlen(no[i])) == 0, "took %s", no[i]);
	/* 16 levels of arrays and objects, not 17 */
	for (int i = 0; i < GM_ANY_DEPTH; i++)
		n += snprintf(deep + n, sizeof(deep) - n, i == 0 ? "{\"k\":" : "[");
	n += snprintf(deep + n, sizeof(deep) - n, "0");
	for (int i = GM_ANY_DEPTH - 1; i >= 0; i--)
		n += snprintf(deep + n, sizeof(deep) - n, i == 0 ? "}" : "]");
	CHECK_MSG(gm_accepts(g, g->root, deep, n) == 1, "refused %s", deep);
	memmove(deep + 6, deep + 5, n - 5);
	deep[5] = '[';
	memmove(deep + n - 1, deep + n - 2, 3);
	deep[n - 1] = ']';
	CHECK_MSG(gm_accepts(g, g->root, deep, n + 2) == 0, "took %.*s", n + 2, deep);
	cai_grammar_free(g);
}

TEST(grammar_whitespace_is_bounded)
{
	char		text[128];
	const char *s = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}";

	/* 16 whitespace bytes in a row anywhere whitespace may go, not 17 */
	for (int ws = 15; ws <= 17; ws++)
	{
		snprintf(text, sizeof(text), "[1,%*s2]", ws, "");
		expect(s, text, ws <= 16);
		snprintf(text, sizeof(text), "%*s[1]", ws, "");
		expect(s, text, ws <= 16);
		snprintf(text, sizeof(text), "[1%*s]", ws, "");
		expect(s, text, ws <= 16);
		snprintf(text, sizeof(text), "{%*s\"k\"%*s:%*s1%*s}", ws, "", ws, "", ws, "", ws, "");
		expect("{\"properties\":{\"k\":{}}}", text, ws <= 16);
	}
	expect(s, "[1,\t\t\t\t\n\n\n\n\r\r\r\r    2]", true);
	expect(s, "[1,\t\t\t\t\n\n\n\n\r\r\r\r     2]", false);
	/* runs are counted apart, and spaces inside strings are text */
	expect(s, "[                1,                2]", true);
	expect("{\"type\":\"string\"}", "\"                                   \"", true);
	/* nothing after the value */
	expect(s, "[1] ", false);
	expect(s, "[1]\n", false);
}

/* Whether the matcher of schema (NULL: any object) with whitespace ws takes text as one value. */
static void
expect_ws(const char *schema, cai_json_whitespace ws, const char *text, bool want)
{
	cai_grammar *g = NULL;
	cai_error	err;
	int			got;

	CHECK(schema ? cai_grammar_from_schema(schema, strlen(schema), &g, &err) == CAI_OK :
		  cai_grammar_any_object(&g, &err) == CAI_OK);
	if (!g)
		return;
	cai_grammar_set_whitespace(g, ws);
	got = gm_accepts(g, g->root, text, strlen(text));
	CHECK_MSG(got == want, "%s: %s %s", schema ? schema : "any object", want ? "refused" : "took",
			  text);
	cai_grammar_free(g);
}

TEST(grammar_compact_whitespace)
{
	const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
		"\"b\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"a\",\"b\"]}";
	static const char *const yes[] = {
		"{\"a\":1,\"b\":[\"x\",\"y\"]}", "{\"a\": 1, \"b\": [\"x\", \"y\"]}",
		"{\"a\": 1,\"b\":[\"x y\", \"  \"]}", NULL
	};
	static const char *const no[] = {
		" {\"a\":1,\"b\":[]}", "{ \"a\":1,\"b\":[]}", "{\"a\" :1,\"b\":[]}",
		"{\"a\":  1,\"b\":[]}", "{\"a\":\n1,\"b\":[]}", "{\"a\":\t1,\"b\":[]}",
		"{\"a\":1 ,\"b\":[]}", "{\"a\":1,\"b\":[ ]}", "{\"a\":1,\"b\":[\"x\" ]}",
		"{\"a\":1,\"b\":[] }", "{\"a\":1,\n\"b\":[]}", NULL
	};

	for (int i = 0; yes[i]; i++)
	{
		expect_ws(s, CAI_JSON_WS_COMPACT, yes[i], true);
		expect_ws(s, CAI_JSON_WS_FREE, yes[i], true);
	}
	for (int i = 0; no[i]; i++)
	{
		expect_ws(s, CAI_JSON_WS_COMPACT, no[i], false);
		expect_ws(s, CAI_JSON_WS_FREE, no[i], true);	/* free whitespace takes them all */
	}
	/* any JSON inside, and the any-object grammar, alike */
	expect_ws("{\"type\":\"object\"}", CAI_JSON_WS_COMPACT, "{\"k\": [1, {\"j\": null}], \"m\":2}", true);
	expect_ws(NULL, CAI_JSON_WS_COMPACT, "{\"k\": [1, {\"j\": null}]}", true);
	expect_ws(NULL, CAI_JSON_WS_COMPACT, "{\"k\": [1, {\"j\" : null}]}", false);
	expect_ws(NULL, CAI_JSON_WS_COMPACT, "{\"k\": [1,\n{\"j\": null}]}", false);
	expect_ws(NULL, CAI_JSON_WS_COMPACT, "{\"k\": [1, {\"j\": null} ]}", false);
	expect_ws(NULL, CAI_JSON_WS_FREE, "{\n  \"k\": [1, {\"j\" : null} ]\n}", true);
}

TEST(grammar_property_ordering)
{
	/* jsonb stores keys shortest first: "propertyOrdering" keeps the order the schema wants */
	const char *s = "{\"type\":\"object\",\"properties\":{\"answer\":{\"type\":\"string\"},"
		"\"reasoning\":{\"type\":\"string\"},\"id\":{\"type\":\"integer\"}},"
		"\"propertyOrdering\":[\"reasoning\",\"answer\"],\"required\":[\"answer\",\"reasoning\",\"id\"]}";

	expect(s, "{\"reasoning\":\"r\",\"answer\":\"a\",\"id\":1}", true);
	expect(s, "{\"answer\":\"a\",\"reasoning\":\"r\",\"id\":1}", false);
	expect(s, "{\"id\":1,\"reasoning\":\"r\",\"answer\":\"a\"}", false);
	/* without it, the schema's text order */
	expect("{\"properties\":{\"reasoning\":{\"type\":\"string\"},\"answer\":{\"type\":\"string\"}},"
		   "\"required\":[\"reasoning\",\"answer\"]}", "{\"reasoning\":\"r\",\"answer\":\"a\"}", true);
	expect("{\"properties\":{\"reasoning\":{\"type\":\"string\"},\"answer\":{\"type\":\"string\"}},"
		   "\"required\":[\"reasoning\",\"answer\"]}", "{\"answer\":\"a\",\"reasoning\":\"r\"}", false);
	compile_fails("{\"properties\":{\"a\":{}},\"propertyOrdering\":[\"a\",\"b\"]}",
				  "\"propertyOrdering\" names \"b\", which is not in \"properties\" at the root");
	compile_fails("{\"properties\":{\"a\":{}},\"propertyOrdering\":[\"a\",\"a\"]}",
				  "\"propertyOrdering\" names \"a\" twice at the root");
	compile_fails("{\"properties\":{\"a\":{}},\"propertyOrdering\":\"a\"}",
				  "\"propertyOrdering\" must be an array of property names at the root");
	compile_fails("{\"type\":\"object\",\"propertyOrdering\":[]}",
				  "\"propertyOrdering\" without \"properties\" at the root");
	compile_fails("{\"properties\":{\"x\":{\"properties\":{\"a\":{}},\"propertyOrdering\":[1]}}}",
				  "\"propertyOrdering\" must be an array of property names at /properties/x");
}

TEST(grammar_unsupported_keywords_are_errors)
{
	static const char *const names[] = {
		"pattern", "format", "oneOf", "allOf", "not", "if", "then", "else", "multipleOf",
		"prefixItems", "patternProperties", "uniqueItems", "minProperties", "maxProperties",
		"contains", "dependentRequired", "propertyNames", "unevaluatedProperties", "$anchor",
		"$dynamicRef", "contentEncoding", "nullable", "x-custom"
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
	{
		char		schema[256],
					msg[256];

		snprintf(schema, sizeof(schema),
				 "{\"type\":\"object\",\"properties\":{\"email\":{\"type\":\"string\",\"%s\":1}}}", names[i]);
		snprintf(msg, sizeof(msg), "unsupported JSON Schema keyword \"%s\" at /properties/email", names[i]);
		compile_fails(schema, msg);
	}
	compile_fails("{\"oneOf\":[{}]}", "unsupported JSON Schema keyword \"oneOf\" at the root");
	compile_fails("{\"items\":[{}]}",
				  "unsupported JSON Schema keyword \"items\" with an array (tuple) value at the root");
	compile_fails("{\"properties\":{\"a/b~\":{\"additionalProperties\":{\"type\":\"string\"}}}}",
				  "unsupported JSON Schema keyword \"additionalProperties\" with a schema value (only true or false) at /properties/a~1b~0");
	compile_fails("{\"anyOf\":[{\"type\":\"array\",\"items\":{\"not\":{}}}]}",
				  "unsupported JSON Schema keyword \"not\" at /anyOf/0/items");
	compile_fails("{\"$defs\":{\"d\":{\"format\":\"x\"}},\"properties\":{\"p\":{\"$ref\":\"#/$defs/d\"}}}",
				  "unsupported JSON Schema keyword \"format\" at /$defs/d");
	/* an unused definition is never compiled */
	cai_grammar_free(compile_ok("{\"$defs\":{\"d\":{\"format\":\"x\"}},\"type\":\"null\"}"));
}

TEST(grammar_malformed_schemas_are_errors)
{
	compile_fails("{\"type\":\"string\",", "the JSON schema is not valid JSON: invalid JSON at byte 17: expected a string key in an object");
	compile_fails("[]", "a schema must be an object or a boolean at the root");
	compile_fails("{\"properties\":{\"a\":1}}", "a schema must be an object or a boolean at /properties/a");
	compile_fails("{\"type\":\"text\"}", "unknown type \"text\" in \"type\" at the root");
	compile_fails("{\"type\":[]}", "\"type\" must name at least one type at the root");
	compile_fails("{\"type\":1}", "\"type\" must be a string or an array of strings at the root");
	compile_fails("{\"type\":\"string\",\"minLength\":-1}", "\"minLength\" must be a non-negative integer at the root");
	compile_fails("{\"maxLength\":-22222222222222222222222222222222222222222222}",
				  "\"maxLength\" must be a non-negative integer at the root");
	cai_grammar_free(compile_ok("{\"maxLength\":-0.0,\"minItems\":1e300}"));
	expect_texts("{\"maxItems\":2.0e0}", TEXTS("[1,2]"), TEXTS("[1,2,3]"));
	compile_fails("{\"type\":\"string\",\"maxLength\":1.5}", "\"maxLength\" must be a non-negative integer at the root");
	compile_fails("{\"type\":\"string\",\"maxLength\":\"3\"}", "\"maxLength\" must be a non-negative integer at the root");
	compile_fails("{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "\"minLength\" is greater than \"maxLength\" at the root");
	compile_fails("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "\"minItems\" is greater than \"maxItems\" at the root");
	compile_fails("{\"type\":\"number\",\"minimum\":3,\"maximum\":2}", "\"minimum\" is greater than \"maximum\" at the root");
	compile_fails("{\"type\":\"number\",\"minimum\":\"1\"}", "\"minimum\" must be a number at the root");
	/* checked even where the keyword would not apply */
	compile_fails("{\"type\":\"string\",\"maximum\":[]}", "\"maximum\" must be a number at the root");
	compile_fails("{\"type\":\"null\",\"minItems\":true}", "\"minItems\" must be a non-negative integer at the root");
	compile_fails("{\"type\":\"integer\",\"properties\":1}", "\"properties\" must be an object at the root");
	compile_fails("{\"type\":\"string\",\"required\":[1]}", "\"required\" must be an array of strings at the root");
	compile_fails("{\"type\":\"number\",\"exclusiveMaximum\":null}",
				  "\"exclusiveMaximum\" must be a number (or, draft 4, a boolean) at the root");
	compile_fails("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"a\",\"b\"]}",
				  "\"required\" names \"b\", which is not in \"properties\" at the root");
	compile_fails("{\"required\":[\"a\"]}", "\"required\" names \"a\", which is not in \"properties\" at the root");
	compile_fails("{\"required\":\"a\",\"properties\":{}}", "\"required\" must be an array of strings at the root");
	compile_fails("{\"properties\":[]}", "\"properties\" must be an object at the root");
	compile_fails("{\"properties\":{\"p\":{\"$ref\":\"#/$defs/missing\"}}}",
				  "$ref \"#/$defs/missing\" does not resolve at /properties/p");
	compile_fails("{\"$ref\":\"other.json#/a\"}",
				  "unsupported $ref \"other.json#/a\" (only references inside the schema, \"#/...\") at the root");
	compile_fails("{\"$ref\":1}", "\"$ref\" must be a string at the root");
	compile_fails("{\"$defs\":{\"a\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/a\"}}},\"$ref\":\"#/$defs/a\"}",
				  "$ref \"#/$defs/a\" is recursive (a cycle of references) at /$defs/a/items");
	compile_fails("{\"properties\":{\"a\":{\"$ref\":\"#\"}}}",
				  "$ref \"#\" is recursive (a cycle of references) at /properties/a");
	compile_fails("{\"$defs\":[],\"type\":\"null\"}", "\"$defs\" must be an object of schemas at the root");
	compile_fails("{\"anyOf\":[]}", "\"anyOf\" must be a non-empty array of schemas at the root");
	compile_fails("{\"anyOf\":[{}],\"type\":\"string\"}",
				  "unsupported: \"anyOf\" beside other constraints (put them inside the referenced schema or each alternative) at the root");
	compile_fails("{\"$defs\":{\"a\":{}},\"$ref\":\"#/$defs/a\",\"minimum\":1}",
				  "unsupported: \"$ref\" beside other constraints (put them inside the referenced schema or each alternative) at the root");
	compile_fails("{\"enum\":[]}", "\"enum\" must be a non-empty array at the root");
	compile_fails("{\"enum\":1}", "\"enum\" must be a non-empty array at the root");
	compile_fails("{\"const\":\"a\\u0000\"}",
				  "\"const\" holds a string with \\u0000, which PostgreSQL's jsonb cannot store at the root");
	compile_fails("{\"enum\":[{\"k\\u0000\":1}]}",
				  "\"enum\" holds a string with \\u0000, which PostgreSQL's jsonb cannot store at the root");
	compile_fails("{\"properties\":{\"a\\u0000\":{}}}",
				  "a property name holds \\u0000, which PostgreSQL's jsonb cannot store at /properties/a?");
}

TEST(grammar_nesting_limits)
{
	/* schemas nested through $refs beyond what the matcher can hold are refused, not crashed on */
	char	   *s = malloc(64 * 1024);
	size_t		n = 0;

	n += sprintf(s + n, "{\"$defs\":{");
	for (int i = 0; i < 200; i++)
		n += sprintf(s + n, "%s\"d%d\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/d%d\"}}", i ? "," : "", i, i + 1);
	n += sprintf(s + n, ",\"d200\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/d0\"}");
	compile_fails(s, "schemas nested more than 128 deep (counting $refs) at /$defs/d63/items");

	/* valid JSON nested deeper than the parser goes: said as such, not "not valid JSON" */
	n = 0;
	for (int i = 0; i < 70; i++)
		n += sprintf(s + n, "{\"items\":");
	n += sprintf(s + n, "{}");
	for (int i = 0; i < 70; i++)
		s[n++] = '}';
	s[n] = '\0';
	compile_fails(s, "the JSON schema nests deeper than 64 arrays and objects at byte 576");
	free(s);
}
