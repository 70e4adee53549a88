/*
 * embed.c — cai_embed: embeddings of texts, through the engine worker like a generation.
 *
 * One EMBED request carries every text of a call; the engine runs each as a prefill of its
 * own, batched with whatever else runs, and answers once with all the vectors (wire.h).  A
 * vector is real[] (float4, what pgvector's vector casts from), L2-normalized.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "channel.h"
#include "guc.h"
#include "protocol.h"
#include "shmem.h"

PG_FUNCTION_INFO_V1(pg_cai_embed);
PG_FUNCTION_INFO_V1(pg_cai_embed_texts);

/* Appends one text to embed, converted to UTF-8; an empty text is refused here. */
static void
put_text(cai_wbuf *payload, text *t, int index)
{
	char	   *input = text_to_cstring(t);
	int			len = strlen(input);
	char	   *utf8 = pg_server_to_any(input, len, PG_UTF8);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 index > 0 ? errmsg("text %d to embed is empty", index)
				 : errmsg("the text to embed is empty")));
	if (utf8 != input)
		len = strlen(utf8);
	cai_put_text(payload, utf8, len);
}

/*
 * ask_embeddings
 *		Posts an EMBED payload of n texts to the model and returns the vectors as n real[]
 *		datums.
 */
static Datum *
ask_embeddings(const cai_wbuf *payload, int n, const char *model)
{
	CaiChannel *channel = CaiChannelOpenFor(CAI_REQUEST_EMBED, payload, model);
	char	   *data;
	Size		len;
	cai_reader	r;
	uint8		type;
	int32		count,
				dim,
				prompt_tokens;
	Datum	   *vectors;
	Datum	   *elems;

	CaiChannelReceive(channel, &data, &len);
	if (len >= 1 && data[0] == CAI_MSG_ERROR)
	{
		char	   *copy = palloc(len);
		int32		status = CAI_ERR_INTERNAL;

		memcpy(copy, data, len);
		CaiChannelClose(channel);
		if (len >= 1 + sizeof(int32))
			memcpy(&status, copy + 1, sizeof(status));
		/* a text longer than a step: the generations' hint (truncate, max_tokens) is no help */
		if (status == CAI_ERR_CONTEXT_FULL)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("%s", pnstrdup(copy + 1 + sizeof(int32), len - 1 - sizeof(int32))),
					 errhint("Split the text, or raise pg_cai.max_step_tokens.")));
		CaiRaiseWorkerError(copy + 1, len - 1);
	}
	cai_reader_init(&r, data, len);
	if (!cai_get_u8(&r, &type) || type != CAI_MSG_EMBEDDINGS || !cai_get_i32(&r, &count) ||
		!cai_get_i32(&r, &dim) || !cai_get_i32(&r, &prompt_tokens) || count != n || dim < 1 ||
		cai_reader_remaining(&r) != (Size) count * dim * sizeof(float4))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("pg_cai engine worker sent a malformed embedding answer")));
	vectors = palloc(sizeof(Datum) * n);
	elems = palloc(sizeof(Datum) * dim);
	for (int i = 0; i < n; i++)
	{
		for (int j = 0; j < dim; j++)
		{
			float4		v;

			(void) cai_get_f32(&r, &v);
			elems[j] = Float4GetDatum(v);
		}
		vectors[i] = PointerGetDatum(construct_array(elems, dim, FLOAT4OID, sizeof(float4),
													 true, TYPALIGN_INT));
	}
	CaiChannelClose(channel);
	return vectors;
}

/*
 * cai_embed(input text, model text DEFAULT NULL) -> real[]
 *		The text's embedding: the model's final hidden states pooled as its GGUF says (mean
 *		when it names no pooling) and L2-normalized.
 */
Datum
pg_cai_embed(PG_FUNCTION_ARGS)
{
	cai_wbuf	payload;
	const char *model;

	(void) CaiSharedStateOrError();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("the text to embed must not be null")));
	model = CaiModelArgument(fcinfo, 1);
	CaiWireInit(&payload);
	cai_put_i32(&payload, 1);
	put_text(&payload, PG_GETARG_TEXT_PP(0), 0);
	PG_RETURN_DATUM(ask_embeddings(&payload, 1, model)[0]);
}

/*
 * cai_embed(inputs text[], model text DEFAULT NULL)
 *		-> TABLE (ordinality integer, embedding real[])
 *		One row per text, in the array's order (ordinality from 1), all computed by one request:
 *		the engine batches the texts.  An empty array gives no rows.
 */
Datum
pg_cai_embed_texts(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	cai_wbuf	payload;
	Datum	   *vectors;
	const char *model;

	(void) CaiSharedStateOrError();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("the texts to embed must not be null")));
	model = CaiModelArgument(fcinfo, 1);
	arr = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("the texts to embed must be a one-dimensional array")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	if (n > CAI_EMBED_MAX_TEXTS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("cannot embed %d texts in one call", n),
				 errdetail("One call embeds at most %d texts.", CAI_EMBED_MAX_TEXTS)));
	InitMaterializedSRF(fcinfo, 0);
	if (n == 0)
		return (Datum) 0;
	CaiWireInit(&payload);
	cai_put_i32(&payload, n);
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("text %d to embed is null", i + 1)));
		put_text(&payload, DatumGetTextPP(elems[i]), i + 1);
	}
	vectors = ask_embeddings(&payload, n, model);
	for (int i = 0; i < n; i++)
	{
		Datum		values[2];
		bool		isnull[2] = {false, false};

		values[0] = Int32GetDatum(i + 1);
		values[1] = vectors[i];
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}
	return (Datum) 0;
}
