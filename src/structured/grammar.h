/*
 * grammar.h — JSON-constrained decoding: a JSON Schema (or "any JSON object") compiled to a
 * grammar, and per-step masks of the tokens that keep a reply inside it.
 *
 * How the engine uses it:
 *
 *   once per model      cai_token_index_create(tokenizer, end ids)     -> index   (shared)
 *   once per request    cai_grammar_from_schema(text) or cai_grammar_any_object() -> grammar
 *                       cai_grammar_state_create(grammar, index)      -> state
 *   every step          cai_grammar_state_allowed(state, bits)  then mask the logits of the
 *                       tokens whose bit is clear, sample, and cai_grammar_state_accept(state, id)
 *   at the end          cai_grammar_state_complete(state) says whether the reply is a whole value
 *
 * The reply text the state tracks is the bytes of the accepted tokens exactly as the reply will
 * hold them: cai_tokenizer_token_bytes(), except that with a SentencePiece tokenizer that adds
 * a space prefix the leading space of the reply's first piece is dropped (as cai_detokenizer
 * does).  The state must see every token of the reply, from its first.
 *
 * What the reply can be: one JSON value valid under the schema, with at most 16 whitespace
 * bytes in a row between its tokens and before it, none after it (a compact grammar,
 * cai_grammar_set_whitespace(): one space at most, only after a ':' or a ','),
 * strings of valid UTF-8 whose escapes never make U+0000 or an unpaired surrogate (PostgreSQL's
 * jsonb accepts every such reply), numbers of at most 19 integer digits, 16 fraction digits and
 * 3 exponent digits (no exponent when the schema bounds the number; enum and const values are
 * written as the schema writes them), objects with their declared properties in declaration
 * order (optional ones may be left out).  A free object ("type": "object" without properties,
 * or the any-object grammar) may repeat a key: the matcher cannot remember every key, and jsonb
 * keeps the last.
 *
 * Thread safety: a grammar and an index are read-only once made and may be shared by any
 * number of threads and states; a state is used by one thread at a time.  Everything is
 * deterministic: the same tokens give the same masks, alone or batched.
 */
#ifndef CAI_GRAMMAR_H
#define CAI_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "tokenizer.h"

typedef struct cai_token_index cai_token_index;
typedef struct cai_grammar_state cai_grammar_state;

/* ---------------------------------------------------------------------------------------------
 * Grammars
 * ------------------------------------------------------------------------------------------- */

/*
 * cai_grammar_from_schema(), cai_grammar_any_object() and cai_grammar_free() are declared in
 * cai.h, the engine's public interface, since a request carries its grammar.  What they do:
 *
 * cai_grammar_from_schema compiles a JSON Schema (UTF-8 JSON text, len bytes, not necessarily
 * NUL-terminated).
 *
 * Supported: type (a name or an array of names: object, array, string, number, integer,
 * boolean, null), properties, required, additionalProperties (false, true or {}: either way
 * only the declared properties are generated), propertyOrdering (Gemini's: an array of
 * property names generated first, in its order, the others after them in the schema's; for a
 * schema that went through jsonb, which sorts keys), items (a schema), minItems, maxItems, enum,
 * const (any JSON values, generated as their compact serialization: no whitespace, members in
 * the schema's order, numbers as the schema writes them), anyOf, minLength and maxLength
 * (code points after unescaping), minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers,
 * or draft-4 booleans), $ref to "#/$defs/...", "#/definitions/..." or any other JSON pointer
 * into the document, without cycles, boolean schemas, and the annotations title, description,
 * $schema, $id, $comment, default, examples, deprecated, readOnly, writeOnly (ignored).
 *
 * Narrowings, each generating only values the schema accepts:
 *  - "type": "object" without "properties" is any JSON object, "type": "array" without
 *    "items" any JSON array (nesting at most 16 deep inside);
 *  - a schema without "type" takes its type from the keywords it has (properties -> object,
 *    items -> array, minLength -> string, minimum -> number, ...); with none, any JSON value;
 *  - enum and const values are kept only when the rest of the schema (type, bounds, ...) as
 *    generated accepts their serialization.
 *
 * Errors (CAI_ERR_INVALID_ARGUMENT), each saying where as a JSON pointer: text that is not
 * JSON (with the byte offset), JSON nested deeper than 64 arrays and objects (said as such,
 * with the byte offset), any other keyword ("unsupported JSON Schema keyword \"pattern\"
 * at /properties/email"), a keyword of the wrong type or range, minLength > maxLength and the
 * like, "required" naming an undeclared property, a $ref that does not resolve or is part of a
 * cycle, anyOf or $ref beside other constraints, \u0000 in a const, enum or property name, a
 * const or enum number PostgreSQL's numeric cannot store, nesting deeper than 128 subschemas
 * (or than the matcher's 255 frames), more than 256 anyOf alternatives open at once, and a
 * schema no value can satisfy.
 *
 * cai_grammar_any_object is OpenAI's {"type": "json_object"}: any JSON object, its values any
 * JSON, nesting at most 16 deep.
 */

/* ---------------------------------------------------------------------------------------------
 * Token indexes (one per tokenizer)
 * ------------------------------------------------------------------------------------------- */

/*
 * Indexes tok's vocabulary for masking: every token's bytes in a trie, and the classes of
 * tokens whose effect inside a string does not depend on the state.  end_ids (n_end of them,
 * e.g. EOS and end-of-turn; ids outside the vocabulary are ignored) are the tokens that end the
 * reply: allowed exactly when the value is complete.  Control and special tokens are never
 * allowed otherwise, nor are tokens without bytes.
 *
 * tok must outlive the index.  Fails with CAI_ERR_UNSUPPORTED when some byte that a JSON reply
 * may need (whitespace, printable ASCII, the bytes of UTF-8 sequences) is not a token of its
 * own: masks could then run empty.
 */
cai_status	cai_token_index_create(const cai_tokenizer *tok, const int32_t *end_ids, int n_end,
								   cai_token_index **out, cai_error *err);
void		cai_token_index_free(cai_token_index *index);

int			cai_token_index_n_vocab(const cai_token_index *index);

/* uint64_t words of a mask: (n_vocab + 63) / 64. */
int			cai_token_index_mask_words(const cai_token_index *index);

/* ---------------------------------------------------------------------------------------------
 * Per-request states
 * ------------------------------------------------------------------------------------------- */

/* A state at the start of a reply.  grammar and index must outlive it. */
cai_status	cai_grammar_state_create(const cai_grammar *grammar, const cai_token_index *index,
									 cai_grammar_state **out, cai_error *err);
void		cai_grammar_state_free(cai_grammar_state *state);

/* A copy of state (same grammar and index) that goes on independently. */
cai_status	cai_grammar_state_clone(const cai_grammar_state *state, cai_grammar_state **out,
									cai_error *err);

/*
 * Writes the tokens allowed next as a bitset: bit id % 64 of bits[id / 64], for n_vocab ids
 * (cai_token_index_mask_words() words; bits past n_vocab are zero).  While the value is
 * incomplete the mask is never empty and holds no end token; once it is complete, the end
 * tokens are allowed, and nothing else unless the value can still grow (only a number that is
 * the whole reply can: "1" may become "10").  Returns false only when out of memory (bits are
 * then all set: the caller should fail the request).
 */
bool		cai_grammar_state_allowed(cai_grammar_state *state, uint64_t *bits);

/*
 * Advances by token id.  False, leaving the state as it was, when the token is not allowed
 * (exactly the tokens cai_grammar_state_allowed() clears) or when out of memory.  Accepting an
 * end token leaves the state as it is.
 */
bool		cai_grammar_state_accept(cai_grammar_state *state, int32_t id);

/* True when the tokens accepted so far are one complete value. */
bool		cai_grammar_state_complete(const cai_grammar_state *state);

#endif							/* CAI_GRAMMAR_H */
