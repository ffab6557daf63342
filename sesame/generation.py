"""Text generation from a causal language model (GPT, GPT-2), and from an encoder-decoder (T5, BART): the decoder's
output for a source text (:class:`Transducer`). Which of the two a run is comes from its model's arch
(:data:`LOADERS`). The library's, which ``sesame generate``, ``sesame serve`` and the Python API build on; GPT-2's
"TL;DR:" prompt (``sesame generate --tldr``) is an application's.

Decoding strategies, each a transformation of the next-token logits:

* greedy: the most likely token;
* sampling with a temperature, top-k (Fan et al. 2018) and nucleus / top-p (Holtzman et al. 2020:
  the smallest set of most likely tokens whose probability reaches p);
* repetition penalty (Keskar et al. 2019, CTRL §4.1): a token already in the context has its logit
  divided by θ if positive, multiplied by θ if negative (as Hugging Face, the prompt counts as context);
* beam search with a length penalty: hypotheses ranked by Σ log p / length^α (Wu et al. 2016 use a
  smoothed length; α = 0 ranks by the sum alone).

A prompt is read as the start of a document: it follows the separator token that ends every
document in pre-training, and generation ends at the next separator, at a stop string (cut off
from the text), or after ``max_new_tokens``. With the KV cache (the default) each step feeds only
the new token through the network; without it, each step recomputes the whole sequence. Prompts
are decoded in batches, left-padded, each counting positions from its own first token.

Sampling is inverse-CDF sampling (:func:`sesame.decoding.next_tokens`, which encoder-decoders share): at each step
a prompt's next token is the first whose cumulative probability exceeds one uniform number, drawn on a CPU generator
seeded by (seed, the prompt's index, the step) and moved to the model's device (:func:`uniform_draws`). The draws
are therefore the same on every device and whatever the batch size; the tokens are too, unless two devices'
probabilities differ across a draw (rounding, bf16).
The model, its KV cache and every tensor of a step live on the language model's device.

An encoder-decoder reads each source as its run's inputs were read, the tokenizer's pieces then ``</s>``, with
``<s>`` first as its text2text fine-tuning recorded (``bos``), else as its family's inputs start
(:attr:`sesame.families.Family.source_start`: BART's ``<s>``, Lewis et al. 2020 §2.2), and decodes by
:func:`sesame.seq2seq.generate_seq2seq` with the same settings (greedy, sampling, beam search, stop strings); the
output is the decoder's text alone, not a continuation of the source. Deviation: a run pre-trained with another
family's objective (``--family t5 --objective denoising``, whose encoder read ``<s>``) is framed as its family's.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import decoding
from .decoding import GenerationConfig, next_tokens, penalise_repetition, stop_strings, uniform_draws
from .errors import SesameError
from .families import FAMILIES, run_family
from .inputs import SourceStart, source_start
from .interop import resolve
from .language_model import LanguageModel
from .models.encoder_decoder import EncoderDecoder
from .models.transformer import KVCache
from .run import load_backbone, load_tokenizer, read_config
from .runtime import Placement, Runtime
from .seq2seq import generate_seq2seq
from .tokenizer import TextTokenizer


# -- the text side: stop strings and streaming --------------------------------------------------------

class Continuation:
    """One prompt's generated tokens and their text, cut at the first stop string; ``fresh()`` returns the
    text that is final (it cannot become part of a stop string or of an unfinished UTF-8 character)."""

    def __init__(self, tokenizer: TextTokenizer, stop: tuple[str, ...], end: int):
        self.tokenizer, self.stop, self.end = tokenizer, stop, end
        self.ids: list[int] = []
        self.text, self.shown, self.finish = "", 0, None

    def add(self, token: int) -> None:
        if token == self.end:
            self.finish = "end"
            return
        self.ids.append(token)
        self.text = self.tokenizer.decode(self.ids)
        cuts = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.text, self.finish = self.text[: min(cuts)], "stop"

    def fresh(self) -> str:
        final = len(self.text)
        if self.finish is None:
            final = len(self.text.rstrip("\ufffd"))
            held = max((n for s in self.stop for n in range(1, len(s)) if self.text.endswith(s[:n])), default=0)
            final = min(final, len(self.text) - held)
        piece, self.shown = self.text[self.shown: max(final, self.shown)], max(final, self.shown)
        return piece


# -- decoding -------------------------------------------------------------------------------------------

def _left_pad(sequences: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    padding = torch.zeros(len(sequences), width, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq):] = torch.tensor(seq)
        padding[row, width - len(seq):] = True
    return ids, padding


@torch.no_grad()
def decode(lm: LanguageModel, prompts: list[list[int]], cfg: GenerationConfig,
           on_text: Callable[[int, str], None] | None = None, *, first: int = 0) -> list[Continuation]:
    """Greedy or sampled continuations of a batch of token-id prompts, the first of which is prompt ``first`` of
    all (sampling's draws are the prompt's, :func:`uniform_draws`); ``on_text(row, text)`` streams them."""
    ids, padding = lm.to_device(_left_pad(prompts, lm.tokenizer.specials.pad))
    positions = (padding.long().cumsum(1) - 1).clamp(min=0)
    out = [Continuation(lm.tokenizer, cfg.stop, lm.end) for _ in prompts]
    cache = lm.cache(len(prompts), ids.shape[1] + cfg.max_new_tokens) if cfg.cache else None
    indices = range(first, first + len(prompts))
    step_ids, step_positions = ids, positions
    for step in range(cfg.max_new_tokens):
        if cache is not None:
            logits = lm.logits(step_ids, padding=padding, positions=step_positions, cache=cache)
        else:
            logits = lm.logits(ids, padding=padding, positions=positions)
        context = torch.where(padding, ids, ids[:, -1:])  # the pads stand in for a real token of their row
        uniforms = uniform_draws(cfg.seed, indices, step) if cfg.sample else None
        tokens = next_tokens(penalise_repetition(logits, context, cfg.repetition_penalty), cfg, uniforms)
        for row, token in enumerate(tokens.tolist()):
            if out[row].finish is None:
                out[row].add(token)
                if on_text is not None:
                    on_text(row, out[row].fresh())
        if all(c.finish for c in out):
            break
        step_ids, step_positions = tokens[:, None], positions[:, -1:] + 1
        ids, positions = torch.cat([ids, step_ids], 1), torch.cat([positions, step_positions], 1)
        padding = torch.cat([padding, torch.ones_like(step_ids, dtype=torch.bool)], 1)
    for row, c in enumerate(out):
        if c.finish is None:  # cut at max_new_tokens: the text held back for a stop string or a character is final
            c.finish = "length"
            if on_text is not None:
                on_text(row, c.fresh())
    return out


@dataclass
class _Context:
    """Beam search's state in generation: each row's tokens so far and the KV cache of those fed already."""

    ids: torch.Tensor  # (rows, time)
    cache: KVCache | None

    def select(self, index: torch.Tensor) -> _Context:
        if self.cache is not None:
            self.cache.reorder(index)
        return _Context(self.ids.index_select(0, index), self.cache)


@torch.no_grad()
def beam_search(lm: LanguageModel, prompt: list[int], cfg: GenerationConfig) -> Continuation:
    """The best of ``cfg.beams`` hypotheses by Σ log p / length^α, length counting the new tokens and the end
    token (:func:`sesame.decoding.beam_search`), as transformers' ``generate(num_beams=...,
    early_stopping=False)``. A hypothesis is finished by the end token or a stop string when it ranks among
    the step's best ``beams`` candidates; the search stops when no live hypothesis can still rank above the
    worst of ``beams`` finished ones (Hugging Face's default criterion), or after ``max_new_tokens``."""
    cache = lm.cache(1, len(prompt) + cfg.max_new_tokens) if cfg.cache else None

    def step(previous: torch.Tensor, context: _Context) -> tuple[torch.Tensor, _Context]:
        ids = torch.cat([context.ids, previous[:, None]], 1)
        logits = lm.logits(ids[:, cache.length:], cache=cache) if cache is not None else lm.logits(ids)
        return penalise_repetition(logits, ids, cfg.repetition_penalty).log_softmax(-1), _Context(ids, cache)

    # the last prompt token is the first step's input
    start = _Context(lm.to_device(torch.tensor([prompt[:-1]], dtype=torch.long)), cache)
    best = decoding.beam_search(step, start, lm.to_device(torch.tensor(prompt[-1:])), cfg, eos=lm.end,
                                stopped=stop_strings(cfg.stop, lm.tokenizer.decode))[0]
    out = Continuation(lm.tokenizer, cfg.stop, lm.end)
    out.ids = best.tokens[:-1]
    if best.tokens:
        out.add(best.tokens[-1])
    out.finish = best.finish
    return out


class Transducer:
    """An encoder-decoder run (pre-trained or fine-tuned; a transformers T5 or BART directory is imported first) with
    its tokenizer, on ``placement``'s device, generating the decoder's text for source texts."""

    def __init__(self, backbone: EncoderDecoder, tokenizer: TextTokenizer, *, start: SourceStart,
                 placement: Placement):
        self.placement, self.tokenizer, self.start = placement, tokenizer, start
        self.backbone = placement.model(backbone).eval()

    @classmethod
    def load(cls, run: Path, flag: str = "--model", *, placement: Placement) -> Transducer:
        config = read_config(run, flag, ("pretrained", "finetuned"))
        bos = config.finetuned.task_options.get("bos")  # text2text's, as fine-tuning recorded it; else the family's
        start = source_start(bos) if bos is not None else run_family(config, f"{flag} {run}").source_start
        return cls(load_backbone(run, flag), load_tokenizer(run, flag), start=start, placement=placement)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each source's ids: ``[<s>] pieces </s>``."""
        specials = self.tokenizer.specials
        start = self.start.tokens(specials)
        return [start + ids + [specials.sep] for ids in self.tokenizer.encode(list(texts), special=False)]

    def generate(self, sources: Sequence[str], cfg: GenerationConfig, *, batch_size: int,
                 on_text: Callable[[int, str], None] | None, first: int) -> list[dict]:
        """:func:`generate`'s records for ``sources`` (``on_text`` hears each text once it is whole)."""
        eos = self.tokenizer.specials.sep
        with self.placement.autocast():
            hyps = generate_seq2seq(self.backbone, self.encode(sources), cfg, eos=eos, text=self.tokenizer.decode,
                                    first=first, batch_size=batch_size)
        results = []
        for i, (source, hyp) in enumerate(zip(sources, hyps, strict=True)):
            out = Continuation(self.tokenizer, cfg.stop, eos)
            for token in hyp.tokens:
                out.add(token)
            if on_text is not None:
                on_text(i, out.text)
            results.append({"prompt": source, "text": out.text, "new_tokens": len(hyp.tokens) + (hyp.finish == "end"),
                            "finish": hyp.finish})
        return results


# a run's (model arch, causal) → what it is, and how it is loaded for generation
LOADERS: dict[tuple[str, bool], tuple[str, Callable[..., LanguageModel | Transducer]]] = {
    ("transformer", True): ("a causal language model", LanguageModel.load),
    ("encoder_decoder", False): ("an encoder-decoder", Transducer.load)}


def load_generator(model: str, *, runtime: Runtime | None = None) -> LanguageModel | Transducer:
    """A run or transformers directory loaded for generation by its model's arch and causality (:data:`LOADERS`), onto
    ``runtime``'s device (default :class:`Runtime`'s: ``auto``)."""
    placement = (runtime or Runtime()).place()
    with resolve(model, "--model") as run:
        config = read_config(run, "--model")
        key = (config.model.arch, config.causal)
        if key not in LOADERS:
            names = {k: ", ".join(f.name for f in FAMILIES.values() if (f.arch, f.causal) == k) for k in LOADERS}
            readers = " or ".join(f"{what} (family {names[k]})" for k, (what, _) in LOADERS.items())
            kind = "causal" if config.causal else "bidirectional"
            raise SesameError(f"--model {model}: a {kind} {config.family} model; generate needs {readers}")
        return LOADERS[key][1](run, placement=placement)


def generate(model: str | LanguageModel | Transducer, prompts: Sequence[str], config: GenerationConfig | None = None,
             *, batch_size: int = 8, on_text: Callable[[int, str], None] | None = None, first: int = 0,
             runtime: Runtime | None = None) -> list[dict]:
    """Continue each prompt, or for an encoder-decoder write the decoder's output for each source; ``model`` is a run
    or transformers directory (loaded onto ``runtime``'s device, :func:`load_generator`), or a loaded model.
    Returns, per prompt, ``{"prompt", "text", "new_tokens", "finish"}`` (``finish``: end, stop or length).
    ``on_text(index, text)`` receives each prompt's text as it becomes final (streaming). ``first``: the index of
    ``prompts[0]`` among all the prompts of a run given in parts, whose sampling draws (:func:`uniform_draws`) are
    then those of one call with every prompt."""
    cfg = config or GenerationConfig()
    cfg.validate()
    lm = load_generator(model, runtime=runtime) if isinstance(model, str) else model
    if isinstance(lm, Transducer):
        return lm.generate(prompts, cfg, batch_size=batch_size, on_text=on_text, first=first)
    encoded = lm.encode(prompts)
    for i, ids in enumerate(encoded):
        cfg.check_room(lm.backbone.config.max_positions, prompt=len(ids), which=f"prompt {i + 1}")
    results: list[dict] = []
    step = 1 if cfg.beams > 1 else batch_size
    for start in range(0, len(encoded), step):
        batch = encoded[start: start + step]
        if cfg.beams > 1:
            done = [beam_search(lm, batch[0], cfg)]
            if on_text is not None:
                on_text(start, done[0].fresh())
        else:
            done = decode(lm, batch, cfg, None if on_text is None else lambda row, text: on_text(start + row, text),
                          first=first + start)
        results += [{"prompt": prompts[start + i], "text": c.text, "new_tokens": len(c.ids) + (c.finish == "end"),
                     "finish": c.finish} for i, c in enumerate(done)]
    return results

