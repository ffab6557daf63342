"""What a pre-training run starts from, in :func:`sesame.pipelines.pretrain`: a :class:`Start` gives the tokenizer,
the backbone's configuration and the fields of config.json that say where the model came from, sets the first
weights and wraps the model in what the trainer trains. A new model of a family is :class:`NewModel`; a pretrained
run continued on a new corpus is :class:`Continued`; DistilBERT's student of a teacher is
:class:`sesame.pipelines.distilbert.PretrainTeacher`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, Sequence

import torch
from torch import nn

from ..data.ppmi import ppmi_vectors
from ..data.shards import Shards
from ..data.windows import Corpus
from ..errors import SesameError
from ..families import backbone_config
from ..models import ModelConfig
from ..objectives import Objective
from ..run import RunConfig, read_config
from ..specs import PretrainSpec
from ..tokenizer import TextTokenizer
from ..train.checkpoint import load_weights


@dataclass(frozen=True)
class Origin:
    """Where a pre-trained model came from, as config.json records it: its ``size`` (None: a teacher's student), the
    run or model it started from (``base``), how its classifiers read it (``pooling``) and the words continued
    pre-training added to its vocabulary."""
    size: str | None
    base: str | None
    pooling: str
    added_words: int = 0


class Start(Protocol):
    """The protocol (module docstring)."""

    def tokenizer(self, corpus: Corpus, spec: PretrainSpec) -> tuple[TextTokenizer, str | None]:
        """The run's tokenizer, and the file it was read from (None: trained on the corpus, or a teacher's)."""

    def backbone(self, spec: PretrainSpec, tok: TextTokenizer) -> ModelConfig:
        """The backbone's configuration, before the spec's recurrent dropouts."""

    def origin(self, spec: PretrainSpec, model: ModelConfig) -> Origin:
        """Where the model came from (its backbone configuration ``model``)."""

    def initialise(self, obj: Objective, spec: PretrainSpec) -> None:
        """Set the first weights of a run that starts at step 0 (a resumed run's are its checkpoint's)."""

    def learner(self, obj: Objective, spec: PretrainSpec, corpus: Shards) -> nn.Module:
        """What the trainer trains on the ``corpus`` shards: ``obj``, or a module around it that computes another loss
        (the run keeps ``obj``'s weights)."""


def dropout(spec: PretrainSpec) -> float:
    """A new backbone's dropout: ``--dropout``, else the family's pre-training dropout."""
    return spec.dropout if spec.dropout is not None else spec.fam.pretrain_dropout


class NewModel:
    """A new model of the spec's family and size, its tokenizer given (``--tokenizer``), stored with the shards, or
    trained on the corpus."""

    def tokenizer_file(self, spec: PretrainSpec) -> str | None:
        return spec.tokenizer

    def tokenizer(self, corpus: Corpus, spec: PretrainSpec) -> tuple[TextTokenizer, str | None]:
        fam, file = spec.fam, self.tokenizer_file(spec)
        return corpus.tokenizer(file, fam.tokenizer, spec.vocab_size, spec.progress, cased=spec.cased,
                                sentinels=fam.sentinels), file

    def backbone(self, spec: PretrainSpec, tok: TextTokenizer) -> ModelConfig:
        config = backbone_config(spec.family, spec.size, tok.vocab_size, tok.specials.pad, dropout(spec),
                                 max(spec.fam.context, spec.seq_len), specials=tok.specials)
        if spec.attention_window is not None:
            config = replace(config, attention_window=spec.attention_window)
        scale = spec.fam.counted_embedding_std if spec.embedding_start == "ppmi" else None
        counted = {"embedding_std": scale} if scale is not None else {}
        return replace(config, **{**counted, **spec.model_options})  # (checked by PretrainSpec.validate)

    def origin(self, spec: PretrainSpec, model: ModelConfig) -> Origin:
        return Origin(spec.size, spec.base, pooling=spec.fam.pretrain_pooling or spec.fam.pooling)

    def initialise(self, obj: Objective, spec: PretrainSpec) -> None:
        pass

    def learner(self, obj: Objective, spec: PretrainSpec, corpus: Shards) -> nn.Module:
        return obj


class Continued(NewModel):
    """A pretrained run (``spec.base``) trained on: its tokenizer (with the new corpus's words where the family
    adds them: ULMFiT's target-task LM, Howard & Ruder 2018, §3.2), its backbone and its weights."""

    def __init__(self, spec: PretrainSpec):
        self.config = read_config(spec.base, "--from", ("pretrained",))
        if self.config.family != spec.family:
            raise SesameError(f"--from {spec.base}: a {self.config.family} run; continue it with --family "
                              f"{self.config.family}")
        if spec.tokenizer or spec.cased:
            flag = "--tokenizer" if spec.tokenizer else "--cased"
            raise SesameError(f"{flag}: {spec.base} brings its own tokenizer; drop {flag}")
        untied = self.config.pretrained.objective_options.get("decoder") == "untied"
        if untied and spec.objective_settings().get("decoder") != "untied":
            raise SesameError(f"--from {spec.base}: its masked LM's decoder is untied from the token table; continue "
                              "it with --objective-option decoder=untied")

    def tokenizer_file(self, spec: PretrainSpec) -> str | None:
        return str(Path(spec.base) / "tokenizer.json")

    def tokenizer(self, corpus: Corpus, spec: PretrainSpec) -> tuple[TextTokenizer, str | None]:
        tok, file = super().tokenizer(corpus, spec)
        if corpus.shard_dir is None:  # (shards were made with their tokenizer)
            tok = spec.fam.continued_words(tok, corpus.texts, spec.vocab_size)
        return tok, file

    def backbone(self, spec: PretrainSpec, tok: TextTokenizer) -> ModelConfig:
        # the words continued pre-training added, if any (a converted T5's table may also have unused rows beyond its
        # tokenizer's ids, which it keeps)
        return replace(self.config.model, vocab_size=max(tok.vocab_size, self.config.model.vocab_size),
                       **({"dropout": spec.dropout} if spec.dropout is not None else {}))

    def origin(self, spec: PretrainSpec, model: ModelConfig) -> Origin:
        return Origin(self.config.size, spec.base, pooling=self.config.pooling,
                      added_words=model.vocab_size - self.config.model.vocab_size)

    def initialise(self, obj: Objective, spec: PretrainSpec) -> None:
        obj.load_state_dict(with_new_words(load_weights(Path(spec.base) / "model.safetensors"),
                                           obj.backbone.config.vocab_size))


def with_new_words(weights: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """``weights`` whose word embedding grew to ``vocab_size`` rows, each new word at the mean of the old rows
    (ULMFiT's target vocabulary, :func:`sesame.tokenizer.extend_words`)."""
    name = "backbone.embed.tokens.weight"
    table = weights.get(name)
    if table is None or table.shape[0] == vocab_size:
        return weights
    return {**weights, name: torch.cat([table, table.mean(0).expand(vocab_size - table.shape[0], -1)])}


def counted_table(backbone: nn.Module, run: RunConfig, tok: TextTokenizer, *, progress: bool) -> None:
    """``counts:RUN`` (:mod:`sesame.sources`): ``backbone``'s token table as a new run of ``run``'s shards starts it
    with ``--embedding-init ppmi`` (:func:`ppmi_embedding`, with the run's pre-training seed); ``tok`` is the run's
    tokenizer, whose specials keep their random rows."""
    seed = (run.train or {}).get("seed", 0)
    ppmi_embedding(backbone, Shards(run.pretrained.shards), skip=tok.specials.all, seed=seed, progress=progress)


def ppmi_embedding(backbone: nn.Module, corpus: Shards, *, skip: Sequence[int], seed: int, progress: bool) -> None:
    """Start ``backbone``'s token embeddings (``embed.tokens``) from the PPMI-SVD vectors of the ``corpus`` shards
    (:mod:`sesame.data.ppmi`): centred (the mean vector of the ids that have one taken away) and each scaled to the
    random rows' mean norm (BERT's counted start draws them at 0.1: ``Family.counted_embedding_std``), so that every
    token enters the model at the scale the family's initialisation gives it and only the directions come from the
    counts (uncentred, unnormalised vectors share one dominant direction and span norms over orders of magnitude,
    and a BERT pre-trained from them stalled at the unigram loss). Ids in ``skip`` (the specials) and ids that never
    co-occur keep their random rows; columns beyond the SVD's rank (a vocabulary narrower than the table) are zero.
    (BERT's default and ``--embedding-init ppmi``: a deliberate departure from every family's paper, which starts
    from random embeddings; docs/pretraining.md.)"""
    began = time.perf_counter()
    table = backbone.embed.tokens.weight
    vectors, counted = ppmi_vectors(corpus, table.shape[0], table.shape[1], skip=skip, seed=seed, progress=progress)
    vectors, counted = torch.from_numpy(vectors).to(table.device), torch.from_numpy(counted).to(table.device)
    if not counted.any():
        print("sesame: --embedding-init ppmi: no two tokens of the corpus share a window; the token embeddings stay "
              "random", file=sys.stderr, flush=True)
        return
    with torch.no_grad():
        centred = vectors[counted] - vectors[counted].mean(0)
        rows = torch.zeros(len(centred), table.shape[1], device=table.device)
        rows[:, :vectors.shape[1]] = torch.nn.functional.normalize(centred, dim=1) * table.norm(dim=1).mean()
        table[counted] = rows.to(table.dtype)
    print(f"sesame: token embeddings from the corpus's PPMI-SVD: {int(counted.sum()):,} of {table.shape[0]:,} ids, "
          f"{vectors.shape[1]} of {table.shape[1]} dimensions ({time.perf_counter() - began:.0f} s)",
          file=sys.stderr, flush=True)
