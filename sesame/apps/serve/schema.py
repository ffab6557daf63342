"""The OpenAPI 3.1 description of ``sesame serve``'s endpoints (``GET /openapi.json``), written out: a handful of fixed
routes needs no generator. ``tests/test_serve.py`` checks that it lists every route the application has."""
from __future__ import annotations

from . import spec

ERROR = {"type": "object", "required": ["error", "status"],
         "properties": {"error": {"type": "string", "description": "what was wrong, and what to change"},
                        "status": {"type": "integer"}}}
TEXT = {"type": "string", "minLength": 1}
INPUT = {"oneOf": [
    {**TEXT, "description": "classify, regress, tag (split at whitespace), text2text"},
    {"type": "array", "items": TEXT, "description": "a pair [first, second] (pair, or classify with a pair "
                                                    "column), or tag's words"},
    {"type": "object", "description": "span_qa: {question, context, id?}; multiple_choice: the fields of a "
                                      "line of its JSONL file"}]}
PREDICTION = {"type": "object", "description": "the input's fields and the task's prediction, as a line of "
                                               "`sesame predict`: label and probabilities (classify, pair), score "
                                               "(regress), words and tags (tag), id, answer and n_best (span_qa), "
                                               "choice, answer and probabilities (multiple_choice), output "
                                               "(text2text)", "additionalProperties": True}
GENERATION = {"type": "object", "properties": {"prompt": TEXT, "text": {"type": "string"},
                                               "new_tokens": {"type": "integer"},
                                               "finish": {"enum": ["end", "stop", "length"]}}}
PARAMETERS = {"type": "object", "description": "sesame.decoding.GenerationConfig's fields (those of `sesame "
                                               "generate`'s flags)",
              "properties": {"max_new_tokens": {"type": "integer", "minimum": 1, "default": 50,
                                                "description": "at most the server's --max-new-tokens"},
                             "sample": {"type": "boolean"}, "temperature": {"type": "number"},
                             "top_k": {"type": "integer"}, "top_p": {"type": "number"},
                             "repetition_penalty": {"type": "number"},
                             "beams": {"type": "integer", "minimum": 1, "default": 1,
                                       "description": "at most the server's --max-beams"},
                             "length_penalty": {"type": "number"}, "early_stopping": {"type": "boolean"},
                             "stop": {"type": "array", "items": TEXT}, "seed": {"type": "integer"}},
              "additionalProperties": False}
REFUSALS = {"400": f"malformed JSON, nested deeper than {spec.MAX_DEPTH} levels, or holding half of a UTF-16 "
                   "surrogate pair",
            "401": "missing or wrong API key (with --api-key)",
            "404": "this model does not serve the endpoint",
            "408": "the body did not arrive within --request-timeout", "413": "body over --payload-limit",
            "422": "inputs of the wrong shape, too many (--max-client-batch-size) or too long (the model's length; "
                   f"{spec.CHARACTERS_PER_TOKEN} characters per token of --max-batch-tokens, counted before "
                   "tokenizing); more tokens than --max-batch-tokens (a generation: prompts × beams × (longest "
                   "prompt + new tokens)); parameters unknown or out of range, beyond --max-new-tokens or --max-beams",
            "429": "--max-concurrent-requests in flight",
            "503": "waited for the model past --request-timeout (the server is busy)",
            "504": "worked on past --request-timeout; a generation stops at its next token"}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _post(summary: str, request: dict, answer: dict, *, stream: bool = False) -> dict:
    responses = {"200": answer, **{code: _json(ERROR, why) for code, why in REFUSALS.items()}}
    if stream:
        responses["200"] = {**answer, "content": {**answer["content"], "text/event-stream": {"schema": {
            "type": "string", "description": "with \"stream\": true: events `token` {index, text} as each prompt's "
                                             "text becomes final, then `done` {generations} or `error` {error} (a "
                                             "failure, or --request-timeout passed: the generation stops)"}}}}
    return {"post": {"summary": summary, "security": [{"bearer": []}], "responses": responses,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": request}}}}}


def _get(summary: str, answer: dict, *, secured: bool = True) -> dict:
    return {"get": {"summary": summary, "responses": {"200": answer}, **({"security": [{"bearer": []}]}
                                                                          if secured else {"security": []})}}


def openapi() -> dict:
    inputs = {"oneOf": [INPUT, {"type": "array", "items": INPUT, "minItems": 1}],
              "description": "one input, or a list of them (at most --max-client-batch-size)"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "sesame serve", "version": "1", "description": spec.__doc__.split("\n\n")[0]},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "only when the server was started with "
                                                                     "--api-key"}}},
        "paths": {
            "/v1/predict": _post("predictions of a fine-tuned run, micro-batched with other requests",
                                 {"type": "object", "required": ["inputs"], "properties": {"inputs": inputs},
                                  "additionalProperties": False},
                                 _json({"type": "object", "properties": {"predictions": {
                                     "type": "array", "items": PREDICTION}}}, "one prediction per input")),
            "/v1/generate": _post("continuations of prompts by a language model (an encoder-decoder: its output)",
                                  {"type": "object", "required": ["inputs"], "additionalProperties": False,
                                   "properties": {"inputs": {"oneOf": [TEXT, {"type": "array", "items": TEXT}]},
                                                  "parameters": PARAMETERS, "stream": {"type": "boolean"}}},
                                  _json({"type": "object", "properties": {"generations": {
                                      "type": "array", "items": GENERATION}}}, "one generation per prompt"),
                                  stream=True),
            "/health": _get("whether the server can answer", _json({"type": "object"}, "{\"status\": \"ok\"}"),
                            secured=False),
            "/info": _get("the model (kind, family, size, task, task options, labels; export: an ONNX export's "
                          "format and quantisation, else null) and the server's limits",
                          _json({"type": "object"}, "the model and limits")),
            "/metrics": _get("Prometheus metrics: requests by endpoint and status, latency, queue depth, "
                             "requests in flight, batch sizes and tokens",
                             {"description": "Prometheus' text format", "content": {"text/plain": {}}}),
            "/openapi.json": _get("this description", _json({"type": "object"}, "OpenAPI 3.1"), secured=False),
            "/": _get("the demo page", {"description": "HTML", "content": {"text/html": {}}}, secured=False),
        },
    }
