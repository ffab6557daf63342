"""``sesame serve``: a fine-tuned run or a language model behind an HTTP API, with a demo page (docs/serving.md).

What it serves and its limits, as :class:`ServeSpec`; the package (:mod:`sesame.apps.serve`) serves it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...options import option

CHARACTERS_PER_TOKEN = 16  # a request's texts may have this many characters per token of --max-batch-tokens (a
# bound checked before tokenizing, without which one long text costs hundreds of megabytes; English averages about 4)
MAX_DEPTH = 32  # levels a request's JSON may nest (its deepest strings, a multiple-choice input's choices: 4)


@dataclass
class ServeSpec:
    """What ``sesame serve`` serves and its limits (the defaults are text-embeddings-inference's where it has one)."""

    model: str = option(help="a fine-tuned run (or a transformers sequence classifier directory, or a folder "
                             "`sesame export` wrote), served at /v1/predict; or a pre-trained language model (gpt, "
                             "gpt2, t5, bart), served at /v1/generate")
    host: str = option("127.0.0.1", help="the address to listen on (another than 127.0.0.1 exposes the model to the "
                                         "network: give --api-key)")
    port: int = option(8000, within=(0, 65536), help="the port to listen on (0: any free port)")
    api_key: str | None = option(None, help="require 'Authorization: Bearer KEY' on /v1/*, /info and /metrics "
                                            "(default: no key)")
    max_concurrent_requests: int = option(512, within=(1, 1 << 31), help="requests in flight at once (queued or "
                                                                           "running); more are refused with 429")
    max_batch_tokens: int = option(16384, within=(1, 1 << 31), help="tokens of one forward pass (a generation's: "
                                                                     "prompts x beams x (the longest prompt + the new "
                                                                     "tokens)); a request with more, or with texts "
                                                                     f"of more than {CHARACTERS_PER_TOKEN} characters "
                                                                     "per token of it "
                                                                     "(counted before tokenizing), is refused with 422")
    max_client_batch_size: int = option(32, within=(1, 1 << 31), help="inputs of one request; more: 422")
    payload_limit: int = option(2_000_000, within=(1, 1 << 31), help="bytes of a request's body; more: 413")
    auto_truncate: bool = option(False, help="cut inputs longer than the model reads (its fine-tuning --max-length) "
                                             "instead of refusing them with 422")
    batch_wait_ms: float = option(2.0, within=(0, 1000), help="how long the first request of a micro-batch waits "
                                                               "for others (0: each request is a forward pass "
                                                               "of its own)")
    max_new_tokens: int = option(256, within=(1, 1 << 31), help="the most new tokens a /v1/generate request may "
                                                                 "ask for; more: 422")
    max_beams: int = option(8, within=(1, 1 << 31), help="the most beams a /v1/generate request may ask for (beam "
                                                         "search holds prompts x beams copies of the decoder's "
                                                         "state); more: 422")
    request_timeout: float = option(60.0, within=(0, 1e6), help="seconds from a request's arrival to its answer (a "
                                                                "stream: its last event); past them its work stops "
                                                                "(a generation at its next token) and it gets 408 "
                                                                "if its body had not arrived, 503 if the model had "
                                                                "not started on it, else 504 (0: no limit)")
