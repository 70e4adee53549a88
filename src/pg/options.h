/*
 * options.h — the options of a generation call (max_tokens, temperature, ...), parsed from jsonb.
 *
 * A call's options start from the defaults, then a conversation's stored options are applied,
 * then the call's own: later layers override earlier ones key by key.  A JSON null restores a
 * key's default.
 */
#ifndef PG_CAI_OPTIONS_H
#define PG_CAI_OPTIONS_H

#include "lib/stringinfo.h"
#include "utils/jsonb.h"

#include "cai.h"
#include "wire.h"

typedef struct CaiOptions
{
	int			max_tokens;
	double		temperature;
	double		top_p;
	int			top_k;
	int64		seed;
	int			n_stop;
	char	   *stop[CAI_MAX_STOP_STRINGS];
	bool		truncate;
	bool		ignore_eos;		/* run to max_tokens (benchmarks, tests) */
	cai_response_format response_format;
	char	   *json_schema;	/* CAI_RESPONSE_JSON_SCHEMA: the schema as JSON text */
	cai_json_whitespace json_whitespace;	/* of a JSON reply */
	bool		allow_partial;	/* a JSON reply cut by max_tokens is returned, not an error */
	double		presence_penalty;
	double		frequency_penalty;
	double		repetition_penalty;
	double		min_p;
	int			n_logit_bias;
	cai_logit_bias *logit_bias;	/* palloc'd [n_logit_bias] */
	bool		logprobs;		/* cai_chat_completion reports them */
	int			top_logprobs;
	char	   *model;			/* the model to answer (pg_cai.models); NULL: the default */
	int			n_samples;		/* "n": parallel samples (cai_chat_completion, cai_complete_n) */
} CaiOptions;

extern void CaiOptionsInit(CaiOptions *options);
extern void CaiOptionsApply(CaiOptions *options, Jsonb *json);
extern void CaiOptionsValidate(Jsonb *json);
extern void CaiOptionsSetSchema(CaiOptions *options, Jsonb *schema);
extern void CaiOptionsSetSchemaText(CaiOptions *options, const char *schema);
extern void CaiOptionsCheck(const CaiOptions *options);
extern void CaiOptionsWriteGeneration(cai_wbuf *buf, const CaiOptions *options,
									  uint64 cache_salt, int64 conversation_id);

#endif							/* PG_CAI_OPTIONS_H */
