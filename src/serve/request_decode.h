/*
 * request_decode.h — a request payload (wire.h) turned into what the engine runs.
 *
 * The engine process decodes each request once, here: every field is checked (a payload comes
 * from a PostgreSQL backend, but the engine trusts no byte it did not check), a chat request's
 * turns go through the model's chat template (stored token ids reused where valid), a prompt too
 * long for the context is truncated or refused, and sampling options out of range are refused
 * with a message that names them.
 */
#ifndef CAI_REQUEST_DECODE_H
#define CAI_REQUEST_DECODE_H

#include "cai.h"
#include "wire.h"

typedef struct cai_decoded_request
{
	cai_request_kind kind;

	/* CHAT and COMPLETE: ready for cai_engine_submit (user_data left NULL; a grammar in it is
	 * owned until submitted: set params.grammar to NULL once the engine has it) */
	cai_request_params params;
	int32_t    *prompt;			/* params.prompt, owned */
	char	   *stop[CAI_MAX_STOP_STRINGS]; /* params.sampling.stop, owned */
	cai_logit_bias *logit_bias;	/* params.sampling.logit_bias, owned */
	int			first_message;	/* CHAT: the oldest turn kept after truncation */
	int32_t    *user_tokens;	/* CHAT: the last turn's content ids, owned */
	int			n_user_tokens;
	cai_tool_set *tools;		/* CHAT: params.tools, owned */
	char	   *tool_name;		/* CHAT: params.tool_name, owned */

	/* TOKENIZE: the text, pointing into the payload */
	const char *text;
	uint32_t	text_len;

	/* CACHE_FORGET: the conversation */
	uint64_t	owner;

	/* DETOKENIZE: the ids, owned */
	int32_t    *ids;
	int			n_ids;

	/* EMBED: each text's token ids (BOS first where the model asks for it), owned */
	int			n_texts;
	int32_t   **text_ids;
	int		   *text_n_ids;
} cai_decoded_request;

/*
 * Decodes a payload of the given kind for model, served with context_length tokens per
 * sequence.  Errors: CAI_ERR_INTERNAL for a payload that does not follow the format (a bug on
 * the writing side), CAI_ERR_INVALID_ARGUMENT for values out of range, CAI_ERR_CONTEXT_FULL for
 * a prompt that does not fit and may not be truncated, CAI_ERR_NO_MEMORY.  On error *out needs
 * no freeing.
 */
cai_status	cai_request_decode(const cai_model *model, int context_length, uint32_t kind,
							   const void *payload, size_t len, cai_decoded_request *out,
							   cai_error *err);
void		cai_decoded_request_free(cai_decoded_request *req);

#endif							/* CAI_REQUEST_DECODE_H */
