/*
 * tokens.c — cai_tokenize and cai_detokenize: a model's tokenizer, through the engine worker.
 *
 * The worker owns the model, so these go through it like a generation does; they are answered
 * at once, between engine steps.  Each takes an optional model name (a pg_cai.models entry;
 * absent or NULL: the first), since the models served side by side have tokenizers of their own.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "channel.h"
#include "protocol.h"
#include "shmem.h"

PG_FUNCTION_INFO_V1(pg_cai_tokenize);
PG_FUNCTION_INFO_V1(pg_cai_detokenize);

/*
 * ask_worker
 *		Posts a request and returns its one answer (type byte + body), raising a worker error.
 *		The answer is copied into the current memory context.
 */
static char *
ask_worker(cai_request_kind kind, const cai_wbuf *payload, const char *model, char expected,
		   Size *len)
{
	CaiChannel *channel = CaiChannelOpenFor(kind, payload, model);
	char	   *data;
	Size		nbytes;
	char	   *copy;

	CaiChannelReceive(channel, &data, &nbytes);
	copy = palloc(nbytes);
	memcpy(copy, data, nbytes);
	CaiChannelClose(channel);

	if (copy[0] == CAI_MSG_ERROR)
		CaiRaiseWorkerError(copy + 1, nbytes - 1);
	if (copy[0] != expected)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("pg_cai engine worker sent an unexpected message of type %d", copy[0])));
	*len = nbytes;
	return copy;
}

/*
 * cai_tokenize(text [, model text]) -> int4[]
 *		The model's token ids for the text.  Special-token text ("<|im_end|>") is tokenized as
 *		plain text; no BOS is added.  NULL text gives NULL (the two-argument form is not STRICT,
 *		so that a NULL model means the first one).
 */
Datum
pg_cai_tokenize(PG_FUNCTION_ARGS)
{
	char	   *input;
	int			len;
	char	   *utf8;
	const char *model;
	cai_wbuf	payload;
	char	   *answer;
	Size		answer_len;
	int32		count;
	Datum	   *elems;
	int			i;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	input = text_to_cstring(PG_GETARG_TEXT_PP(0));
	len = strlen(input);
	utf8 = pg_server_to_any(input, len, PG_UTF8);
	(void) CaiSharedStateOrError();
	model = CaiModelArgument(fcinfo, 1);
	if (utf8 != input)
		len = strlen(utf8);

	CaiWireInit(&payload);
	cai_put_text(&payload, utf8, len);
	answer = ask_worker(CAI_REQUEST_TOKENIZE, &payload, model, CAI_MSG_IDS, &answer_len);

	if (answer_len < 1 + sizeof(int32))
		elog(ERROR, "pg_cai engine worker sent a short token list");
	memcpy(&count, answer + 1, sizeof(count));
	if (count < 0 || (Size) count > (answer_len - 1 - sizeof(int32)) / sizeof(int32))
		elog(ERROR, "pg_cai engine worker sent a malformed token list");

	elems = palloc(sizeof(Datum) * Max(count, 1));
	for (i = 0; i < count; i++)
	{
		int32		id;

		memcpy(&id, answer + 1 + sizeof(int32) * (i + 1), sizeof(id));
		elems[i] = Int32GetDatum(id);
	}
	PG_RETURN_ARRAYTYPE_P(construct_array(elems, count, INT4OID, sizeof(int32), true,
										  TYPALIGN_INT));
}

/*
 * cai_detokenize(int4[] [, model text]) -> text
 *		The text of the token ids, special tokens included as their text.  Fails when an id is
 *		outside the model's vocabulary, or when the ids end inside a multi-byte character.
 */
Datum
pg_cai_detokenize(PG_FUNCTION_ARGS)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;
	int			n_vocab;
	const char *model;
	int			slot;
	cai_wbuf	payload;
	char	   *answer;
	Size		answer_len;
	char	   *converted;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	arr = PG_GETARG_ARRAYTYPE_P(0);
	(void) CaiSharedStateOrError();
	model = CaiModelArgument(fcinfo, 1);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("token ids must be a one-dimensional array")));
	deconstruct_array(arr, INT4OID, sizeof(int32), true, TYPALIGN_INT, &elems, &nulls, &n);

	n_vocab = 0;
	LWLockAcquire(cai_shared->lock, LW_SHARED);
	slot = CaiSharedModelIndex(model);
	if (slot >= 0 && cai_shared->models[slot].state == CAI_WORKER_READY)
		n_vocab = cai_shared->models[slot].model.info.n_vocab;
	LWLockRelease(cai_shared->lock);

	CaiWireInit(&payload);
	cai_put_i32(&payload, n);
	for (i = 0; i < n; i++)
	{
		int32		id;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("token ids must not be null"),
					 errdetail("Element %d is null.", i + 1)));
		id = DatumGetInt32(elems[i]);
		if (id < 0 || (n_vocab > 0 && id >= n_vocab))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("token id %d is out of range", id),
					 n_vocab > 0 ?
					 errdetail("Token ids run from 0 to %d for this model.", n_vocab - 1) : 0));
		cai_put_i32(&payload, id);
	}

	answer = ask_worker(CAI_REQUEST_DETOKENIZE, &payload, model, CAI_MSG_TEXT, &answer_len);
	converted = pg_any_to_server(answer + 1, (int) (answer_len - 1), PG_UTF8);
	if (converted != answer + 1)
		PG_RETURN_TEXT_P(cstring_to_text(converted));
	PG_RETURN_TEXT_P(cstring_to_text_with_len(answer + 1, (int) (answer_len - 1)));
}
