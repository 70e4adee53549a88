/*
 * options.c — parses and validates generation options given as jsonb.
 *
 * Every key is checked: an unknown key, a value of the wrong JSON type, or a value out of range
 * is an error naming the key, so that a typo never silently falls back to a default.
 */
#include "postgres.h"

#include <ctype.h>
#include <math.h>

#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "guc.h"
#include "options.h"
#include "protocol.h"

#define CAI_VALID_OPTIONS		"max_tokens, temperature, top_p, top_k, seed, stop, truncate, ignore_eos, response_format, json_whitespace, allow_partial, presence_penalty, frequency_penalty, repetition_penalty, min_p, logit_bias, logprobs, top_logprobs, n, model"

/*
 * CaiOptionsInit
 *		The defaults: greedy decoding, pg_cai.max_tokens tokens, no stop strings, and the oldest
 *		turns dropped when a conversation outgrows the context.
 */
void
CaiOptionsInit(CaiOptions *options)
{
	memset(options, 0, sizeof(*options));
	options->max_tokens = cai_default_max_tokens;
	options->temperature = 0.0;
	options->top_p = 1.0;
	options->top_k = 0;
	options->seed = 0;
	options->n_stop = 0;
	options->truncate = true;
	options->json_whitespace = CAI_JSON_WS_COMPACT;
	options->allow_partial = false;
	options->repetition_penalty = 1.0;
	options->n_samples = 1;
}

static const char *
jsonb_type_name(const JsonbValue *value)
{
	switch (value->type)
	{
		case jbvNull:
			return "null";
		case jbvString:
			return "string";
		case jbvNumeric:
			return "number";
		case jbvBool:
			return "boolean";
		case jbvArray:
			return "array";
		case jbvObject:
		case jbvBinary:
			return "object";
		default:
			return "value";
	}
}

static void
wrong_type(const char *key, const char *expected, const JsonbValue *value)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("option \"%s\" must be %s", key, expected),
			 errdetail("Got a JSON %s.", jsonb_type_name(value))));
}

/*
 * numeric_to_int64
 *		The numeric as an int64 when it is a whole number that fits; false otherwise.
 */
static bool
numeric_to_int64(Numeric num, int64 *out)
{
	char	   *text = DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(num)));
	char	   *end;
	long long	value;

	errno = 0;
	value = strtoll(text, &end, 10);
	if (end == text || errno == ERANGE)
		return false;
	if (*end == '.')
	{
		for (end++; *end == '0'; end++)
			;
	}
	if (*end != '\0')
		return false;
	*out = (int64) value;
	return true;
}

static int64
get_integer(const char *key, const JsonbValue *value, int64 min, int64 max)
{
	int64		result;

	if (value->type != jbvNumeric)
		wrong_type(key, "an integer", value);
	if (!numeric_to_int64(value->val.numeric, &result))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"%s\" must be an integer", key),
				 errdetail("Got %s.",
						   DatumGetCString(DirectFunctionCall1(numeric_out,
															   NumericGetDatum(value->val.numeric))))));
	if (result < min || result > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"%s\" must be between " INT64_FORMAT " and " INT64_FORMAT,
						key, min, max),
				 errdetail("Got " INT64_FORMAT ".", result)));
	return result;
}

/*
 * The numeric as text for an error's detail: as written when short, else in scientific
 * notation (a 400-digit number helps nobody).
 */
static char *
numeric_detail_text(Numeric num)
{
	char	   *text = DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(num)));

	if (strlen(text) <= 24)
		return text;
	return numeric_out_sci(num, 6);
}

/*
 * A number as a double.  Values beyond double precision become infinity or zero rather than
 * an error of their own, so that the option's range check reports them by name.
 */
static double
get_number(const char *key, const JsonbValue *value)
{
	if (value->type != jbvNumeric)
		wrong_type(key, "a number", value);
	return DatumGetFloat8(DirectFunctionCall1(numeric_float8_no_overflow,
											  NumericGetDatum(value->val.numeric)));
}

static void
add_stop(CaiOptions *options, const char *key, const JsonbValue *value)
{
	if (value->type != jbvString)
		wrong_type(key, "a string or an array of strings", value);
	if (value->val.string.len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"stop\" must not contain an empty string")));
	if (value->val.string.len > CAI_STOP_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"stop\" takes strings of at most %d bytes", CAI_STOP_MAX_BYTES),
				 errdetail("Got one of %d bytes.", value->val.string.len)));
	if (options->n_stop == CAI_MAX_STOP_STRINGS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"stop\" takes at most %d strings", CAI_MAX_STOP_STRINGS)));
	options->stop[options->n_stop++] = pnstrdup(value->val.string.val, value->val.string.len);
}

/*
 * apply_stop
 *		Sets the stop strings from a string or an array of strings.
 */
static void
apply_stop(CaiOptions *options, const JsonbValue *value)
{
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	elem;

	options->n_stop = 0;
	if (value->type == jbvString)
	{
		add_stop(options, "stop", value);
		return;
	}
	if (value->type != jbvBinary || !JsonContainerIsArray(value->val.binary.data))
		wrong_type("stop", "a string or an array of strings", value);

	it = JsonbIteratorInit(value->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &elem, true)) != WJB_DONE)
	{
		if (tok == WJB_ELEM)
		{
			if (elem.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("option \"stop\" must be a string or an array of strings"),
						 errdetail("The array holds a JSON %s.", jsonb_type_name(&elem))));
			add_stop(options, "stop", &elem);
		}
	}
}

static void
bad_response_format(const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("option \"response_format\" must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}"),
			 errdetail("%s", detail)));
}

/* The value of key in a jsonb object container, or NULL when the key is absent. */
static JsonbValue *
object_field(JsonbContainer *object, const char *key)
{
	return getKeyJsonValueFromContainer(object, key, strlen(key), NULL);
}

/* Errors unless every key of the object is one of the NULL-terminated allowed names. */
static void
check_keys(JsonbContainer *object, const char *const *allowed, const char *where)
{
	JsonbIterator *it = JsonbIteratorInit(object);
	JsonbIteratorToken tok;
	JsonbValue	v;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		const char *const *a;

		if (tok != WJB_KEY)
			continue;
		for (a = allowed; *a; a++)
			if ((int) strlen(*a) == v.val.string.len &&
				memcmp(*a, v.val.string.val, v.val.string.len) == 0)
				break;
		if (*a == NULL)
			bad_response_format(psprintf("%s has an unknown key \"%s\".", where,
										 pnstrdup(v.val.string.val, v.val.string.len)));
	}
}

/*
 * apply_response_format
 *		OpenAI's response_format: the shape is checked here; the schema itself is compiled by
 *		the engine, which names any keyword it does not support.
 */
static void
apply_response_format(CaiOptions *options, const JsonbValue *value)
{
	static const char *const format_keys[] = {"type", "json_schema", NULL};
	static const char *const schema_keys[] = {"name", "description", "schema", "strict", NULL};
	JsonbContainer *format;
	JsonbValue *type;
	char	   *type_name;

	if (value->type != jbvBinary || !JsonContainerIsObject(value->val.binary.data))
		bad_response_format(psprintf("Got a JSON %s.", jsonb_type_name(value)));
	format = value->val.binary.data;
	check_keys(format, format_keys, "response_format");
	type = object_field(format, "type");
	if (type == NULL || type->type != jbvString)
		bad_response_format("It has no string \"type\".");
	type_name = pnstrdup(type->val.string.val, type->val.string.len);

	options->json_schema = NULL;
	if (strcmp(type_name, "text") == 0 || strcmp(type_name, "json_object") == 0)
	{
		if (object_field(format, "json_schema") != NULL)
			bad_response_format(psprintf("\"json_schema\" goes with type \"json_schema\", not \"%s\".",
										 type_name));
		options->response_format = strcmp(type_name, "text") == 0 ? CAI_RESPONSE_TEXT :
			CAI_RESPONSE_JSON_OBJECT;
	}
	else if (strcmp(type_name, "json_schema") == 0)
	{
		JsonbValue *js = object_field(format, "json_schema");
		JsonbValue *schema;
		JsonbValue *name;
		JsonbValue *strict;

		if (js == NULL || js->type != jbvBinary || !JsonContainerIsObject(js->val.binary.data))
			bad_response_format("Type \"json_schema\" needs a \"json_schema\" object.");
		check_keys(js->val.binary.data, schema_keys, "json_schema");
		schema = object_field(js->val.binary.data, "schema");
		name = object_field(js->val.binary.data, "name");
		strict = object_field(js->val.binary.data, "strict");
		if (name != NULL && name->type != jbvString)
			bad_response_format("\"json_schema\".\"name\" must be a string.");
		if (strict != NULL && strict->type != jbvBool)
			bad_response_format("\"json_schema\".\"strict\" must be a boolean.");
		if (schema == NULL ||
			!((schema->type == jbvBinary && JsonContainerIsObject(schema->val.binary.data)) ||
			  schema->type == jbvBool))
			bad_response_format("\"json_schema\".\"schema\" must be a JSON Schema (an object or a boolean).");
		options->response_format = CAI_RESPONSE_JSON_SCHEMA;
		if (schema->type == jbvBool)
			options->json_schema = pstrdup(schema->val.boolean ? "true" : "false");
		else
			options->json_schema = JsonbToCString(NULL, schema->val.binary.data,
												  schema->val.binary.len);
	}
	else
		bad_response_format(psprintf("Unknown type \"%s\".", type_name));
}

/*
 * CaiOptionsSetSchema
 *		Constrains the reply to a JSON Schema given as jsonb (the typed-reply functions' schema
 *		argument).
 */
void
CaiOptionsSetSchema(CaiOptions *options, Jsonb *schema)
{
	if (JB_ROOT_IS_SCALAR(schema))
	{
		JsonbValue	v;

		if (!JsonbExtractScalar(&schema->root, &v) || v.type != jbvBool)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("schema must be a JSON Schema: an object or a boolean")));
		options->json_schema = pstrdup(v.val.boolean ? "true" : "false");
	}
	else if (!JB_ROOT_IS_OBJECT(schema))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("schema must be a JSON Schema: an object or a boolean")));
	else
		options->json_schema = JsonbToCString(NULL, &schema->root, VARSIZE(schema));
	options->response_format = CAI_RESPONSE_JSON_SCHEMA;
}

/*
 * CaiOptionsSetSchemaText
 *		Constrains the reply to a JSON Schema given as JSON text (the typed-reply functions'
 *		text and json overloads): the engine reads it as written, so its properties keep the
 *		text's order, which jsonb would have sorted.
 */
void
CaiOptionsSetSchemaText(CaiOptions *options, const char *schema)
{
	options->json_schema = pstrdup(schema);
	options->response_format = CAI_RESPONSE_JSON_SCHEMA;
}

/*
 * CaiOptionsCheck
 *		Raises the error the engine would raise for these options as a whole: a schema it cannot
 *		compile (compiled here with the engine's own compiler, then freed), stop strings beside
 *		a JSON format.  So options that are stored (a conversation's defaults, a reply
 *		trigger's argument) are refused when stored, not by every later call.
 */
void
CaiOptionsCheck(const CaiOptions *options)
{
	if (options->response_format != CAI_RESPONSE_TEXT && options->n_stop > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stop strings cannot be combined with a JSON response_format")));
	if (options->response_format == CAI_RESPONSE_JSON_SCHEMA && options->json_schema)
	{
		char	   *utf8 = pg_server_to_any(options->json_schema, strlen(options->json_schema),
											PG_UTF8);
		cai_grammar *grammar = NULL;
		cai_error	err;
		cai_status	status;

		memset(&err, 0, sizeof(err));
		status = cai_grammar_from_schema(utf8, strlen(utf8), &grammar, &err);
		cai_grammar_free(grammar);
		if (status == CAI_ERR_NO_MEMORY)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("%s", err.message)));
		if (status != CAI_OK)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s", err.message)));
	}
}

/* ---------------------------------------------------------------------------------------------
 * Penalties, filters and logprobs
 * ------------------------------------------------------------------------------------------- */

/*
 * A number within [min, max] (or (min, max] when min_open), the range said in the error as the
 * engine says it, so that the SQL and the engine refuse the same values in the same words.
 */
static double
get_ranged_number(const char *key, const JsonbValue *value, double min, double max, bool min_open)
{
	double		v = get_number(key, value);

	if (!((min_open ? v > min : v >= min) && v <= max))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 min_open ?
				 errmsg("option \"%s\" must be greater than %g and at most %g", key, min, max) :
				 errmsg("option \"%s\" must be between %g and %g", key, min, max),
				 errdetail("Got %s.", numeric_detail_text(value->val.numeric))));
	return v;
}

static void
bad_logit_bias(const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("option \"logit_bias\" must be an object mapping token ids to numbers between %g and %g",
					-CAI_LOGIT_BIAS_MAX, CAI_LOGIT_BIAS_MAX),
			 errdetail("%s", detail),
			 errhint("Example: '{\"logit_bias\": {\"2\": -100}}' bans token 2.")));
}

/*
 * apply_logit_bias
 *		OpenAI's logit_bias: {"<token id>": bias}.  The ids are checked against the vocabulary
 *		by the engine, the one that knows the model in use.
 */
static void
apply_logit_bias(CaiOptions *options, const JsonbValue *value)
{
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	v;
	int			n = 0;

	if (value->type != jbvBinary || !JsonContainerIsObject(value->val.binary.data))
		bad_logit_bias(psprintf("Got a JSON %s.", value->type == jbvBinary ? "array" :
								jsonb_type_name(value)));
	options->logit_bias = palloc(sizeof(cai_logit_bias) * CAI_MAX_LOGIT_BIAS);
	it = JsonbIteratorInit(value->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		char	   *id_text;
		char	   *end;
		long		id;
		double		bias;

		if (tok != WJB_KEY)
			continue;
		id_text = pnstrdup(v.val.string.val, v.val.string.len);
		errno = 0;
		id = strtol(id_text, &end, 10);
		if (v.val.string.len == 0 || *end != '\0' || errno == ERANGE || id < 0 ||
			id > PG_INT32_MAX || !isdigit((unsigned char) id_text[0]))
			bad_logit_bias(psprintf("Key \"%s\" is not a token id (a non-negative integer).",
									id_text));
		if (n == CAI_MAX_LOGIT_BIAS)
			bad_logit_bias(psprintf("It has more than %d tokens.", CAI_MAX_LOGIT_BIAS));
		tok = JsonbIteratorNext(&it, &v, true);
		Assert(tok == WJB_VALUE);
		if (v.type != jbvNumeric)
			bad_logit_bias(psprintf("Token %ld maps to a JSON %s.", id, jsonb_type_name(&v)));
		bias = DatumGetFloat8(DirectFunctionCall1(numeric_float8_no_overflow,
												  NumericGetDatum(v.val.numeric)));
		if (!(bias >= -CAI_LOGIT_BIAS_MAX && bias <= CAI_LOGIT_BIAS_MAX))
			bad_logit_bias(psprintf("Token %ld maps to %s.", id,
									numeric_detail_text(v.val.numeric)));
		options->logit_bias[n].token = (int32) id;
		options->logit_bias[n].bias = (float) bias;
		n++;
	}
	options->n_logit_bias = n;
}

/*
 * apply_sampling_key
 *		The penalties, filters and logprobs options; false for a key that is none of them.
 */
static bool
apply_sampling_key(CaiOptions *options, const char *key, const JsonbValue *value,
				   const CaiOptions *defaults)
{
	bool		is_null = value->type == jbvNull;

	if (strcmp(key, "presence_penalty") == 0)
		options->presence_penalty = is_null ? defaults->presence_penalty :
			get_ranged_number(key, value, -CAI_PENALTY_MAX, CAI_PENALTY_MAX, false);
	else if (strcmp(key, "frequency_penalty") == 0)
		options->frequency_penalty = is_null ? defaults->frequency_penalty :
			get_ranged_number(key, value, -CAI_PENALTY_MAX, CAI_PENALTY_MAX, false);
	else if (strcmp(key, "repetition_penalty") == 0)
	{
		options->repetition_penalty = is_null ? defaults->repetition_penalty :
			get_ranged_number(key, value, 0.0, CAI_REPETITION_PENALTY_MAX, true);
		/* the engine's single precision must not round a tiny penalty to 0 */
		if ((float) options->repetition_penalty <= 0.0f)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option \"repetition_penalty\" must be greater than 0 and at most %g",
							CAI_REPETITION_PENALTY_MAX),
					 errdetail("Got %s, which is 0 in the engine's single precision.",
							   numeric_detail_text(value->val.numeric))));
	}
	else if (strcmp(key, "min_p") == 0)
		options->min_p = is_null ? defaults->min_p :
			get_ranged_number(key, value, 0.0, 1.0, false);
	else if (strcmp(key, "logit_bias") == 0)
	{
		options->n_logit_bias = 0;
		if (!is_null)
			apply_logit_bias(options, value);
	}
	else if (strcmp(key, "logprobs") == 0)
	{
		if (is_null)
			options->logprobs = defaults->logprobs;
		else if (value->type != jbvBool)
			wrong_type(key, "a boolean", value);
		else
			options->logprobs = value->val.boolean;
	}
	else if (strcmp(key, "top_logprobs") == 0)
		options->top_logprobs = is_null ? defaults->top_logprobs :
			(int) get_integer(key, value, 0, CAI_TOP_LOGPROBS_MAX);
	else if (strcmp(key, "n") == 0)
		options->n_samples = is_null ? defaults->n_samples :
			(int) get_integer(key, value, 1, CAI_N_SAMPLES_MAX);
	else
		return false;
	return true;
}

/*
 * apply_key
 *		Applies one option; a JSON null restores the key's default.
 */
static void
apply_key(CaiOptions *options, const char *key, const JsonbValue *value)
{
	CaiOptions	defaults;

	CaiOptionsInit(&defaults);

	if (strcmp(key, "max_tokens") == 0)
		options->max_tokens = value->type == jbvNull ? defaults.max_tokens :
			(int) get_integer(key, value, 1, CAI_MAX_TOKENS_MAX);
	else if (strcmp(key, "temperature") == 0)
	{
		double		t = value->type == jbvNull ? defaults.temperature : get_number(key, value);

		if (!(t >= 0.0 && t <= CAI_TEMPERATURE_MAX))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option \"temperature\" must be between 0 and %g", CAI_TEMPERATURE_MAX),
					 errdetail("Got %s.", numeric_detail_text(value->val.numeric))));
		options->temperature = t;
	}
	else if (strcmp(key, "top_p") == 0)
	{
		double		p = value->type == jbvNull ? defaults.top_p : get_number(key, value);

		/* the engine samples in single precision: a p that rounds to 0 there is 0 */
		if (!(p > 0.0 && p <= 1.0 && (float) p > 0.0f))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option \"top_p\" must be greater than 0 and at most 1"),
					 (p > 0.0 && p <= 1.0) ?
					 errdetail("Got %s, which is 0 in the engine's single precision.",
							   numeric_detail_text(value->val.numeric)) :
					 errdetail("Got %s.", numeric_detail_text(value->val.numeric))));
		options->top_p = p;
	}
	else if (strcmp(key, "top_k") == 0)
		options->top_k = value->type == jbvNull ? defaults.top_k :
			(int) get_integer(key, value, 0, CAI_TOP_K_MAX);
	else if (strcmp(key, "seed") == 0)
		options->seed = value->type == jbvNull ? defaults.seed :
			get_integer(key, value, 0, PG_INT64_MAX);
	else if (strcmp(key, "stop") == 0)
	{
		if (value->type == jbvNull)
			options->n_stop = 0;
		else
			apply_stop(options, value);
	}
	else if (strcmp(key, "truncate") == 0)
	{
		if (value->type == jbvNull)
			options->truncate = defaults.truncate;
		else if (value->type != jbvBool)
			wrong_type(key, "a boolean", value);
		else
			options->truncate = value->val.boolean;
	}
	else if (strcmp(key, "ignore_eos") == 0)
	{
		if (value->type == jbvNull)
			options->ignore_eos = defaults.ignore_eos;
		else if (value->type != jbvBool)
			wrong_type(key, "a boolean", value);
		else
			options->ignore_eos = value->val.boolean;
	}
	else if (strcmp(key, "allow_partial") == 0)
	{
		if (value->type == jbvNull)
			options->allow_partial = defaults.allow_partial;
		else if (value->type != jbvBool)
			wrong_type(key, "a boolean", value);
		else
			options->allow_partial = value->val.boolean;
	}
	else if (strcmp(key, "json_whitespace") == 0)
	{
		if (value->type == jbvNull)
			options->json_whitespace = defaults.json_whitespace;
		else if (value->type == jbvString && value->val.string.len == 7 &&
				 memcmp(value->val.string.val, "compact", 7) == 0)
			options->json_whitespace = CAI_JSON_WS_COMPACT;
		else if (value->type == jbvString && value->val.string.len == 4 &&
				 memcmp(value->val.string.val, "free", 4) == 0)
			options->json_whitespace = CAI_JSON_WS_FREE;
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option \"json_whitespace\" must be \"compact\" or \"free\""),
					 value->type == jbvString ?
					 errdetail("Got \"%s\".", pnstrdup(value->val.string.val, value->val.string.len)) :
					 errdetail("Got a JSON %s.", jsonb_type_name(value))));
	}
	else if (strcmp(key, "response_format") == 0)
	{
		if (value->type == jbvNull)
		{
			options->response_format = defaults.response_format;
			options->json_schema = NULL;
		}
		else
			apply_response_format(options, value);
	}
	else if (strcmp(key, "model") == 0)
	{
		if (value->type == jbvNull)
			options->model = defaults.model;
		else if (value->type != jbvString)
			wrong_type(key, "a string naming a model of pg_cai.models", value);
		else
			options->model = pnstrdup(value->val.string.val, value->val.string.len);
	}
	else if (apply_sampling_key(options, key, value, &defaults))
		return;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unrecognized option \"%s\"", key),
				 errhint("Valid options are: %s.", CAI_VALID_OPTIONS)));
}

/*
 * CaiOptionsApply
 *		Applies every key of a jsonb object over options.  NULL json changes nothing.
 */
void
CaiOptionsApply(CaiOptions *options, Jsonb *json)
{
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	key;
	JsonbValue	value;

	if (json == NULL)
		return;
	if (!JB_ROOT_IS_OBJECT(json) || JB_ROOT_IS_SCALAR(json))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("options must be a JSON object"),
				 errhint("Pass options like '{\"max_tokens\": 64, \"temperature\": 0.7}'.")));

	it = JsonbIteratorInit(&json->root);
	while ((tok = JsonbIteratorNext(&it, &key, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			char	   *name = pnstrdup(key.val.string.val, key.val.string.len);

			tok = JsonbIteratorNext(&it, &value, true);
			Assert(tok == WJB_VALUE);
			apply_key(options, name, &value);
		}
	}
}

/*
 * CaiOptionsValidate
 *		Raises the error an options object would raise when used alone, its schema compiled.
 */
void
CaiOptionsValidate(Jsonb *json)
{
	CaiOptions	options;

	CaiOptionsInit(&options);
	CaiOptionsApply(&options, json);
	CaiOptionsCheck(&options);
}

/*
 * CaiOptionsWriteGeneration
 *		Writes the generation block of a CHAT or COMPLETE payload; stop strings go in UTF-8, as
 *		the engine's text is.  conversation_id (0 for none) is the owner the engine files the
 *		request's cached blocks under, which cai_forget() goes by.
 */
void
CaiOptionsWriteGeneration(cai_wbuf *buf, const CaiOptions *options, uint64 cache_salt,
						  int64 conversation_id)
{
	cai_wire_generation g;
	int			i;

	cai_wire_generation_init(&g);
	g.temperature = (float) options->temperature;
	g.top_p = (float) options->top_p;
	g.top_k = options->top_k;
	g.seed = (uint64) options->seed;
	g.max_tokens = options->max_tokens;
	g.truncate = options->truncate;
	g.ignore_eos = options->ignore_eos;
	g.use_cache = true;
	g.cache_salt = cache_salt;
	g.cache_owner = conversation_id > 0 ? (uint64) conversation_id : 0;
	g.n_stop = options->n_stop;
	for (i = 0; i < options->n_stop; i++)
		g.stop[i] = pg_server_to_any(options->stop[i], strlen(options->stop[i]), PG_UTF8);
	g.response_format = (uint8_t) options->response_format;
	if (options->json_schema)
		g.schema = pg_server_to_any(options->json_schema, strlen(options->json_schema), PG_UTF8);
	g.json_whitespace = (uint8_t) options->json_whitespace;
	g.presence_penalty = (float) options->presence_penalty;
	g.frequency_penalty = (float) options->frequency_penalty;
	g.repetition_penalty = (float) options->repetition_penalty;
	g.min_p = (float) options->min_p;
	g.n_logit_bias = options->n_logit_bias;
	g.logit_bias = options->logit_bias;
	/* top_logprobs without logprobs asks for nothing, as in OpenAI's API */
	g.logprobs = options->logprobs;
	g.top_logprobs = options->logprobs ? options->top_logprobs : 0;
	g.n_samples = options->n_samples;
	cai_wire_put_generation(buf, &g);
}
