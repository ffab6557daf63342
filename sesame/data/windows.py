"""Corpus → shards → training windows, decided once: which tokenizer a corpus is read with, whether
``--corpus`` is a prepared shard directory or raw text, which windows train and which validate, how a
window's partner is drawn for next-sentence objectives, and which windows make up each global step.

Every random draw is a function of (seed, step, example): example ``g`` of a run is corrupted by a
generator seeded by ``g`` alone, so neither accumulation, the number of processes nor resuming
changes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np
import torch

from ..errors import SesameError, warn
from ..run import CorpusMixing, load_tokenizer
from ..seeding import generators
from ..tokenizer import TextTokenizer, train_tokenizer
from ..train import TrainConfig
from ..train.prefetch import Phased
from ..train.trainer import micro_batches
from .corpus import iter_texts, record_format, resolve_sources
from .mixing import mixing_rates, mixture_example
from .shards import Shards, Window, is_shard_dir, prepare_corpus

MAX_EVAL_WINDOWS = 256
MIN_EVAL_TOKENS = 1000  # fewer held-out tokens give a perplexity that moves by ~10% with the text chosen
TWO_PHASE_SWITCH = 0.9  # BERT, Appendix A.2: short sequences for 90% of the steps, then long ones
PARTNER_SALT = 7919

if TYPE_CHECKING:
    from ..objectives import Objective


@dataclass(frozen=True)
class Corpus:
    """What ``--corpus`` (or ``--valid``, ``--data``) names, decided once: one prepared shard directory, or
    text files, folders and files of records: JSON Lines (compressed or not), CSV/TSV and Parquet (``text_field`` of
    each record, row's column)."""
    paths: tuple[str, ...]
    flag: str
    text_field: str = "text"

    @classmethod
    def of(cls, paths: Sequence[str] | str, flag: str, text_field: str = "text") -> Corpus:
        return cls(tuple(str(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)), flag, text_field)

    @cached_property
    def shard_dir(self) -> Path | None:
        """The prepared shard directory, when that is what the paths name."""
        return Path(self.paths[0]) if len(self.paths) == 1 and is_shard_dir(Path(self.paths[0])) else None

    def texts(self) -> Iterator[str]:
        return iter_texts(resolve_sources(self.paths, self.flag), self.text_field)

    def tokenizer(self, given: str | None, kind: str, vocab_size: int, progress: bool, *,
                  cased: bool = False, sentinels: int = 0) -> TextTokenizer:
        """The tokenizer ``given`` (--tokenizer), or the one stored with prepared shards, or one trained on the text
        (keeping letter case if ``cased``; ending with ``sentinels`` of T5's sentinel tokens, which a tokenizer
        given must have too)."""
        path = self.shard_dir or given
        if path and cased:
            raise SesameError(f"--cased: {path} brings its own tokenizer, whose case is decided; drop --cased")
        if path:
            tok = load_tokenizer(path, self.flag if path != given else "--tokenizer")
            if tok.kind != kind:
                raise SesameError(f"--tokenizer {path}: a {tok.kind} tokenizer, but this family uses {kind}")
            if sentinels and not len(tok.sentinels()):
                raise SesameError(f"{self.flag if path != given else '--tokenizer'} {path}: has no sentinel tokens "
                                  f"(<extra_id_0>, ...), which this family's objective needs; train one with `sesame "
                                  f"tokenizer train --kind {kind} --sentinels {sentinels}`")
            return tok
        return train_tokenizer(self.texts, kind, vocab_size, lowercase=False if cased else None,
                               show_progress=progress, sentinels=sentinels)

    def shards(self, tok: TextTokenizer, dest: Path, progress: bool) -> Shards:
        """The prepared shards, which must have been made with ``tok``; or the text prepared into ``dest``."""
        if self.shard_dir is None:
            return prepare_corpus(resolve_sources(self.paths, self.flag), tok, dest, self.text_field, progress)
        if load_tokenizer(self.shard_dir, self.flag).backend.to_str() != tok.backend.to_str():
            raise SesameError(f"{self.flag} {self.shard_dir}: these shards were made with another tokenizer; prepare "
                              "them again")
        return Shards(self.shard_dir)

    def size(self) -> dict | None:
        """The UTF-8 bytes and the characters of the text (of files of records, their text fields), which bits per
        byte and per character divide by; None for a shard directory, whose text is gone."""
        if self.shard_dir is not None:
            return None
        size = {"bytes": 0, "chars": 0}
        for f in resolve_sources(self.paths, self.flag):
            texts = iter_texts([f], self.text_field) if record_format(f) else \
                [f.read_bytes().decode("utf-8")]
            for text in texts:
                size["bytes"] += len(text.encode("utf-8"))
                size["chars"] += len(text)
        return size


def partners(shards: Shards, windows: list[Window], length: int) -> Callable[[int, torch.Generator], Window]:
    """``partner(own, generator)``: a window (of ``length`` tokens) whose first document part, the one a random
    next segment is read from (:class:`~sesame.objectives.pairs.BertPretraining`), belongs to a document that
    window ``own`` does not touch: drawn uniformly from the windows whose part comes from another document of
    the same source file as ``own``'s; when that file has no other (a single-document file), from those of
    any other document; when every window's part comes from ``own``'s documents, from the other windows (and
    ``own`` itself when it is the only one). ``mlm_nsp`` refuses a corpus of one document
    (:func:`require_documents`), so the last two are for held-out windows that fall in one document.

    BERT draws the random next sentence from another document of its corpus (Devlin et al. 2019, §3.1);
    keeping to the same file stops a corpus of several files (Wikipedia and books) from teaching the
    classifier which file a segment comes from rather than whether it follows."""
    first, last = shards.documents(windows), shards.documents(windows, length - 1)
    # the document of each window's first part: of its second token when its first closes a document
    given = shards.documents(windows, min(1, length - 1))
    source = shards.doc_sources[given]  # all four non-decreasing: windows are in corpus order

    def partner(own: int, generator: torch.Generator) -> Window:
        mine = np.searchsorted(given, first[own], "left"), np.searchsorted(given, last[own], "right")
        files = shards.doc_sources[[first[own], last[own]]]
        pools = [(np.searchsorted(source, files[0], "left"), np.searchsorted(source, files[1], "right"), mine),
                 (0, len(windows), mine), (0, len(windows), (own, own + 1)), (0, len(windows), (0, 0))]
        lo, hi, (skip_lo, skip_hi) = next(pool for pool in pools if pool[1] - pool[0] > pool[2][1] - pool[2][0])
        r = lo + int(torch.randint(hi - lo - (skip_hi - skip_lo), (1,), generator=generator))
        return windows[r if r < skip_lo else r + skip_hi - skip_lo]

    return partner


def require_documents(shards: Shards, *, flag: str, objective: str) -> None:
    """Refuse a pair objective that draws negatives from other documents (``pairs``) on shards of one document."""
    if len(shards.doc_ends) < 2:
        names = ", ".join(shards.meta["sources"][:3]) or str(shards.path)
        raise SesameError(
            f"{flag} {names}: {len(shards.doc_ends)} document, but {objective} draws its negative segments from "
            "other documents; give several: WikiText ' = Title = ' lines, CHAPTER headings, blank lines between "
            "documents, one JSON Lines record each, or more files (then `sesame prepare` again), or use "
            "--objective mlm")


def examples(obj: Objective, shards: Shards, windows: list[Window], picks: Sequence[int], seeds: Sequence[int],
             length: int, seed: int, partner: Callable[[int, torch.Generator], Window] | None = None
             ) -> dict[str, torch.Tensor]:
    """The objective's batch for windows ``picks`` (of ``length`` tokens: the objective's window length), example
    ``i`` corrupted by a generator seeded by ``seeds[i]``; pair objectives also get a window from ``partner`` per
    example, drawn by a generator of the same seed."""
    rows = torch.from_numpy(np.stack([shards.read(windows[w], length) for w in picks]))
    paired = None
    if partner is not None:
        draws = generators(seed + PARTNER_SALT, seeds)
        paired = torch.from_numpy(np.stack([shards.read(partner(w, g), length) for w, g in zip(picks, draws)]))
    return obj.make_batch(rows, generators(seed, seeds), paired)


def corpus_mixing(corpus: Corpus, shards: Shards, windows: list[Window], temperature: float) -> CorpusMixing:
    """The mixing of ``corpus``'s arguments (its sources) at ``temperature``: each source's share of the training
    ``windows`` (a window belongs to the source of its first token), and its rate
    (:func:`sesame.data.mixing.mixing_rates`, uncapped)."""
    source_of = {str(f): i for i, path in enumerate(corpus.paths) for f in resolve_sources([path], corpus.flag)}
    files = [source_of[str(f)] for f in shards.meta["sources"]]
    counts = np.bincount(window_sources(shards, windows, files), minlength=len(corpus.paths)).tolist()
    rates = mixing_rates(dict(enumerate(counts)), cap=max(counts), temperature=temperature)
    return CorpusMixing(temperature, [str(Path(p).resolve()) for p in corpus.paths], counts,
                        [rates[i] for i in range(len(counts))], files)


def window_sources(shards: Shards, windows: list[Window], files: Sequence[int]) -> np.ndarray:
    """The source of each window: that of the file its first token's document came from (``files``: each file's)."""
    return np.asarray(files, dtype=np.int64)[shards.doc_sources[shards.documents(windows)]]


def window_batches(obj: Objective, shards: Shards, phases: list[tuple[int, list[Window]]], cfg: TrainConfig,
                   static_masks: int = 0, mixing: CorpusMixing | None = None) -> Phased:
    """``batches(step, progress)``: this process's micro-batches of global step ``step``, a :class:`Phased` source
    (the trainer builds a step's batches while the one before trains).

    ``phases`` holds ``(length, windows)``, windows of ``length`` tokens (the objective's window length for a
    sequence length): one, or two for BERT's two-phase schedule (the second from
    ``TWO_PHASE_SWITCH`` of the budget on). Example ``g`` of the run is window ``perm_e[g mod N]`` of
    epoch ``e = g div N`` and is corrupted with a generator seeded by ``g`` alone, so neither
    accumulation nor the number of processes changes it. With ``static_masks = k`` the seed is
    ``(window, e mod k)`` instead: each window has k fixed corruptions, as when BERT duplicated its
    data k times with different masks at preparation (same effect, nothing stored). With ``mixing``
    (``--mixing-temperature``), example ``g`` is instead a window of the source drawn for ``g`` at the sources'
    rates, uniform among that source's windows (:func:`sesame.data.mixing.mixture_example`, with replacement: a
    function of (seed, g) alone as well); a source with no window of a phase's length is left out of that phase.
    """
    cache: dict[tuple[int, int], list[int]] = {}
    drawers = [partners(shards, windows, length) if obj.pairs else None for length, windows in phases]
    pools = [source_pools(shards, windows, mixing) for _, windows in phases] if mixing else None

    def permutation(n: int, epoch: int) -> list[int]:
        if (n, epoch) not in cache:
            cache.clear()
            cache[n, epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed + epoch)).tolist()
        return cache[n, epoch]

    def phase_at(progress: float) -> int:
        return len(phases) - 1 if progress >= TWO_PHASE_SWITCH else 0

    def batches(step: int, phase: int) -> list[dict[str, torch.Tensor]]:
        length, windows = phases[phase]
        n = len(windows)

        def build(chunk: list[int]) -> dict[str, torch.Tensor]:
            if pools is not None:
                pool, sizes, rates = pools[phase]
                drawn = (mixture_example(rates, sizes, seed=cfg.seed, index=g) for g in chunk)
                picks = [int(pool[source][k]) for source, k in drawn]
            else:
                picks = [permutation(n, g // n)[g % n] for g in chunk]
            seeds = [w * static_masks + (g // n) % static_masks for g, w in zip(chunk, picks)] if static_masks else chunk
            return examples(obj, shards, windows, picks, seeds, length, cfg.seed, drawers[phase])

        return micro_batches(range(step * cfg.batch_size, (step + 1) * cfg.batch_size), cfg.accumulate, build)

    return Phased(batches, phase_at)


def source_pools(shards: Shards, windows: list[Window], mixing: CorpusMixing
                 ) -> tuple[list[np.ndarray], dict[int, int], dict[int, float]]:
    """For each source of ``mixing``, the indices of its ``windows``, their number and its rate (0 for a source
    without any of these windows)."""
    own = window_sources(shards, windows, mixing.files)
    pool = [np.flatnonzero(own == source) for source in range(len(mixing.sources))]
    sizes = {source: len(indices) for source, indices in enumerate(pool)}
    return pool, sizes, {source: rate if sizes[source] else 0.0 for source, rate in enumerate(mixing.rates)}


def warn_if_few(windows: list[Window], length: int, what: str) -> None:
    """Warn when ``windows`` (of ``length`` tokens: held-out text, named by ``what``) are too few tokens for
    their perplexity to mean anything."""
    tokens = len(windows) * length
    if tokens < MIN_EVAL_TOKENS:
        warn(f"{what} holds only {tokens} tokens ({len(windows)} window{'s' * (len(windows) != 1)} of {length}); "
             f"a perplexity on fewer than {MIN_EVAL_TOKENS} means little: give more text")


def training_windows(shards: Shards, valid: Shards | None, *, length: int, seq_len: int
                     ) -> tuple[list[Window], Shards, list[Window]]:
    """Training windows of ``length`` tokens (an objective's window for ``seq_len``), and validation windows
    from ``valid`` or else the corpus's last 1% (at most 256)."""
    windows = shards.windows(length)
    if valid is not None:
        held, valid_windows = windows, valid.windows(length)[:MAX_EVAL_WINDOWS]
    else:
        n_valid = min(MAX_EVAL_WINDOWS, max(1, len(windows) // 100))
        held, valid, valid_windows = windows[:-n_valid], shards, windows[-n_valid:]
    if not held or not valid_windows:
        raise SesameError(f"--corpus: too little text for --seq-len {seq_len} ({shards.n_tokens} tokens, "
                          f"validation {valid.n_tokens}); add text or lower --seq-len")
    return held, valid, valid_windows


