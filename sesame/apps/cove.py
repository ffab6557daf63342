"""Training CoVe's MT-LSTM on a parallel corpus, decoding it, and scoring translations with BLEU.

McCann et al. (2017), §3-4: the MT-LSTM (:mod:`sesame.models.cove`) is trained on English → German
with teacher forcing, minimising the cross-entropy of each reference word given the source and the
reference words before it (:mod:`sesame.objectives.translation`); the source embedding starts from GloVe and stays fixed. Its encoder is
then CoVe, the feature extractor.

* Data: two line-aligned UTF-8 files per split (source, target), one sentence per line.
* Tokenisation: a word vocabulary per language (:func:`sesame.tokenizer.train_tokenizer` kind
  ``word``), **lower-cased**, the ``vocab_size`` most frequent words seen at least twice; the rest are
  ``<unk>``. Sentences are encoded ``<s> words </s>`` and truncated to ``max_length`` tokens.
* Decoding (:mod:`sesame.decoding`): greedy, or beam search with finished hypotheses ranked by their
  **mean log-probability per token** (Σ log p over the generated words and ``</s>``, divided by that
  count; the length penalty ``lp = length``, α = 1 of Wu et al. 2016's family). A hypothesis finishes
  when ``</s>`` ranks among the beam's best k candidates of a step; a sentence
  is done when k hypotheses have finished (``early_stopping``), or at the length limit, where the live
  hypotheses are ranked too.
* BLEU: sacrebleu's corpus BLEU of the output (words joined by spaces, ``<unk>`` dropped) against the
  raw reference lines, with its default ``13a`` tokenisation (which splits punctuation from words, so
  "mann ," and "Mann," agree) and ``lowercase=True``, since the output is lower-cased.

Deviations from the paper: training uses the trainer's AdamW and linear schedule (not OpenNMT's SGD),
decoding's length normalisation is stated above (the paper does not give its decoder's), and the
weights kept are those with the best dev BLEU of greedy decoding.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from ..data.corpus import decoded_lines
from ..data.labeled import a_file
from ..decoding import GenerationConfig, beam_search, greedy
from ..errors import SesameError
from ..families import get_family
from ..metrics import bleu, language_model_report
from ..models.cove import COVE_SIZES, CoveConfig, MTLSTM
from ..objectives import Translation, build_objective
from ..options import RATE, check_ranges, option
from ..outputs import new_file
from ..resume import record_training, resumed_spec
from ..run import CovePart, PretrainedPart, RunConfig, load_backbone, load_tokenizer, read_config, write_config
from ..rundir import from_checkpoint, new_run, setup_killed
from ..runtime import Placement, Runtime, device_of, to_device
from ..specs import training
from ..tasks import bucketed_batches, steps_per_epoch
from ..tasks.base import pad
from ..tokenizer import TextTokenizer, train_tokenizer
from ..train import RunSettings, TrainConfig, Trainer
from ..data.vectors import WordVectors, embedding_matrix, load_vectors

FAMILY = "cove"  # the family of the runs this module makes
TARGET_TOKENIZER = "target_tokenizer.json"
EVAL_BATCH = 64
SENTENCES = "a text file with one sentence per line"
DEFAULTS = {"lr": 1e-3, "weight_decay": 0.0, "warmup": 0.02, "batch_size": 64, "clip": 5.0, "eval_every": 500,
            "save_every": 500}  # clip 5: OpenNMT's default, the toolkit the paper trained with



@dataclass(kw_only=True)
class CoveSpec:
    """``sesame cove``: an MT-LSTM trained from source to target sentences (McCann et al. 2017, §3) into a run;
    ``training`` holds TrainConfig fields over :data:`DEFAULTS`."""
    train_src: str = option(help="source sentences, one per line (e.g. train.en)")
    train_tgt: str = option(help="their translations, line-aligned (e.g. train.de)")
    valid_src: str = option(help="dev source sentences")
    valid_tgt: str = option(help="dev translations, line-aligned")
    out: str = option(help="the run directory to create")
    size: str = option("small", help="tiny, mini, small or base (the paper's 300-d, 300 per direction)")
    vectors: str | None = option(None, help="GloVe/word2vec text file: initialises the source embedding, kept fixed")
    vocab_size: int = option(10000, help="words per language (lower-cased, seen twice or more)")
    max_length: int = option(64, help="tokens per sentence, <s> and </s> included")
    dropout: float = option(0.2, within=RATE, help="dropout rate of the MT-LSTM")
    bleu_sentences: int | None = option(None, help="dev BLEU at evaluations on the first N dev lines (default all)")
    training: dict = option(factory=dict, cli=False, help="TrainConfig fields over DEFAULTS")
    runtime: Runtime = option(factory=Runtime, cli=False, help="device, precision, TF32, compile (sesame.runtime)")
    resume: bool = option(False, help="continue the run in --out from its last checkpoint")
    progress: bool = option(True, cli=False, help="show progress bars")

    def train_config(self) -> TrainConfig:
        """DEFAULTS under the given TrainConfig fields; ``max_minutes`` alone lifts the default step budget."""
        given = {k: v for k, v in self.training.items() if v is not None}
        timed = "max_minutes" in given and "max_steps" not in given
        return training({**DEFAULTS, **({"max_steps": None} if timed else {})}, given)

    def validate(self) -> None:
        """Every check that reads no file."""
        check_ranges(self)
        self.train_config()
        if self.size not in COVE_SIZES:
            raise SesameError(f"--size {self.size!r} is unknown; choose one of: {', '.join(COVE_SIZES)}")
        if not 4 <= self.max_length <= 1024:
            raise SesameError(f"--max-length {self.max_length}: use a length between 4 and 1024")
        if self.bleu_sentences is not None and self.bleu_sentences < 1:
            raise SesameError(f"--bleu-sentences {self.bleu_sentences}: must be positive")


# -- data ------------------------------------------------------------------------------------------

def read_parallel(source: str | Path, target: str | Path, source_flag: str, target_flag: str
                  ) -> tuple[list[str], list[str]]:
    """Two line-aligned UTF-8 files → (source sentences, target sentences). Unequal line counts, invalid UTF-8
    and a line blank on one side only name the file (and line); lines blank on both sides are skipped."""
    sides = []
    for path, flag in ((source, source_flag), (target, target_flag)):
        sides.append([line.strip() for _, line in decoded_lines(a_file(path, SENTENCES, flag))])
    (src, tgt), (src_path, tgt_path) = sides, (source, target)
    if len(src) != len(tgt):
        raise SesameError(f"{target_flag} {tgt_path}: {len(tgt)} lines, but {source_flag} {src_path} has {len(src)}; "
                          "parallel files must be line-aligned (one translation per line)")
    pairs = []
    for lineno, (s, t) in enumerate(zip(src, tgt), 1):
        if bool(s) != bool(t):
            blank = f"{src_path}:{lineno}" if not s else f"{tgt_path}:{lineno}"
            raise SesameError(f"{blank}: blank line, but its translation is not; the files are misaligned here")
        if s:
            pairs.append((s, t))
    if not pairs:
        raise SesameError(f"{source_flag} {src_path}: no sentences; give a file with one sentence per line")
    return [s for s, _ in pairs], [t for _, t in pairs]


def collate(source: Sequence[Sequence[int]], target: Sequence[Sequence[int]], source_pad: int, target_pad: int
            ) -> dict[str, torch.Tensor]:
    """A batch: ``ids``/``padding`` (source), ``target``/``target_padding`` (``<s> .. </s>``), and ``targets``,
    the real target tokens the decoder predicts (all but each row's ``<s>``), flattened."""
    ids, tgt = pad(source, source_pad), pad(target, target_pad)
    padding = torch.arange(ids.shape[1]) < torch.tensor([len(s) for s in source])[:, None]
    target_padding = torch.arange(tgt.shape[1]) < torch.tensor([len(t) for t in target])[:, None]
    return {"ids": ids, "padding": padding, "target": tgt, "target_padding": target_padding,
            "targets": tgt[:, 1:][target_padding[:, 1:]]}


# -- a trained model -------------------------------------------------------------------------------

class Translator:
    """A trained MT-LSTM run loaded for translation: its two tokenizers and the model in eval mode, on
    ``placement``'s device (default: the CPU in float32)."""

    def __init__(self, run: str | Path, flag: str = "--model", *, placement: Placement | None = None):
        self.run = Path(run)
        self.config = read_config(self.run, flag, ("pretrained",))
        if self.config.pretrained.objective != "translation":
            raise SesameError(f"{flag} {run}: a {self.config.family} run; translate needs a run of `sesame cove`")
        self.source = load_tokenizer(self.run, flag)
        self.target = load_tokenizer(self.run / TARGET_TOKENIZER, flag)
        self.placement = placement or Placement.cpu()
        self.model = self.placement.model(load_backbone(self.run, flag))

    def translate(self, texts: Sequence[str], *, beam: int = 1, batch_size: int = EVAL_BATCH,
                  progress: bool = False) -> list[str]:
        """Translations of ``texts`` (lower-cased words joined by spaces); ``beam`` 1 decodes greedily."""
        with self.placement.autocast():
            return decode(self.model, self.source, self.target, texts, max_length=self.config.max_length, beam=beam,
                          batch_size=batch_size, progress=progress)


def decode(model: MTLSTM, source: TextTokenizer, target: TextTokenizer, texts: Sequence[str], *, max_length: int,
           beam: int = 1, batch_size: int = EVAL_BATCH, progress: bool = False) -> list[str]:
    """Translate ``texts`` in batches of similar length, on ``model``'s device; at most 2 × source length + 10
    output tokens (and 2 × ``max_length``)."""
    if beam < 1:
        raise SesameError(f"--beam {beam}: must be at least 1 (1 is greedy decoding)")
    ids = source.encode(list(texts), max_length=max_length)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    bos, eos, device = target.specials.cls, target.specials.sep, device_of(model)
    with torch.no_grad():
        for start in tqdm(range(0, len(order), batch_size), desc="translate", unit="batch", disable=not progress):
            chunk = order[start: start + batch_size]
            batch = to_device(pad([ids[i] for i in chunk], source.specials.pad), device)
            padding = batch != source.specials.pad
            limit = min(2 * max_length, 2 * batch.shape[1] + 10)
            state, start = model.start(batch, padding), torch.full((len(chunk),), bos, device=device)
            hyps = (greedy(model.step, state, start, eos=eos, max_len=limit) if beam == 1 else
                    beam_search(model.step, state, start, GenerationConfig(max_new_tokens=limit, beams=beam,
                                                                           early_stopping=True), eos=eos))
            for i, hyp in zip(chunk, hyps):
                out[i] = target.decode(hyp.tokens)
    return out


def translate_file(model: str, input: str, *, reference: str | None = None, beam: int = 1,
                   output: str | None = None, progress: bool = True, runtime: Runtime | None = None) -> dict:
    """Translate the lines of ``input`` (written to ``output`` if given) on ``runtime``'s device; with
    ``reference``, line-aligned with ``input``, also the BLEU of the translations. Returns {"translations",
    "bleu"?, ...}."""
    placement = (runtime or Runtime()).place()
    if output:
        new_file(output, "--output", {"--input": input, "--reference": reference, "--model": model})
    if reference:
        sources, references = read_parallel(input, reference, "--input", "--reference")
    else:
        sources, references = [line.strip() for _, line in decoded_lines(a_file(input, SENTENCES, "--input"))], None
    translator = Translator(model, placement=placement)
    started = time.time()
    translations = translator.translate(sources, beam=beam, progress=progress)
    result: dict = {"translations": translations, "sentences": len(sources), "beam": beam,
                    "seconds": round(time.time() - started, 1)}
    if references is not None:
        result["bleu"] = round(bleu(translations, references), 2)
    if output:
        Path(output).write_text("".join(t + "\n" for t in translations), encoding="utf-8")
    return result


# -- training --------------------------------------------------------------------------------------

def _vectors(model: MTLSTM, vectors: WordVectors, source: TextTokenizer) -> float:
    """Copy GloVe/word2vec rows into the encoder embedding; returns the share of non-special words found."""
    words = [source.backend.id_to_token(i) for i in range(source.vocab_size)]
    matrix, found = embedding_matrix(vectors, words)
    with torch.no_grad():
        model.embed.tokens.weight.copy_(matrix)
    specials = set(source.specials.all)
    real = torch.tensor([i not in specials for i in range(len(words))])
    return float(found[real].float().mean())


def _new_model(model_cfg: CoveConfig, source: TextTokenizer, *, seed: int, vectors: WordVectors | None
               ) -> tuple[MTLSTM, float | None]:
    """A freshly initialised MT-LSTM, its source embedding from ``vectors`` when given, and their coverage."""
    torch.manual_seed(seed)
    model = MTLSTM(model_cfg)
    return model, _vectors(model, vectors, source) if vectors else None


def _create(run: Path, spec: CoveSpec, cfg: TrainConfig, src: list[str], tgt: list[str]) -> MTLSTM:
    """A new run's two word vocabularies, config.json and freshly initialised MT-LSTM (its source embedding from
    ``spec.vectors`` when given)."""
    source = train_tokenizer(src, "word", spec.vocab_size, lowercase=True)
    target = train_tokenizer(tgt, "word", spec.vocab_size, lowercase=True)
    embedding, hidden = COVE_SIZES[spec.size]
    word_vectors = load_vectors(spec.vectors) if spec.vectors else None
    model_cfg = CoveConfig(
        vocab_size=source.vocab_size, target_vocab_size=target.vocab_size,
        embedding_size=word_vectors.dim if word_vectors else embedding, hidden_size=hidden,
        pad_id=source.specials.pad, target_pad_id=target.specials.pad, dropout=spec.dropout,
        freeze_embedding=spec.vectors is not None)
    model, coverage = _new_model(model_cfg, source, seed=cfg.seed, vectors=word_vectors)
    source.save(run / "tokenizer.json")
    target.save(run / TARGET_TOKENIZER)
    write_config(run, RunConfig(
        kind="pretrained", family=FAMILY, size=spec.size, pooling=get_family(FAMILY).pooling, model=model_cfg,
        max_length=spec.max_length, train=asdict(cfg), pretrained=PretrainedPart(objective="translation"),
        cove=CovePart(lowercase=True, vectors=spec.vectors, vector_coverage=coverage, train_src=str(spec.train_src),
                      train_tgt=str(spec.train_tgt), valid_src=str(spec.valid_src), valid_tgt=str(spec.valid_tgt))))
    return model


def train_cove(spec: CoveSpec) -> dict:
    """Train an MT-LSTM (McCann et al. 2017, §3) from ``spec.train_src`` to ``spec.train_tgt`` into the run
    ``spec.out``.

    ``size`` picks (embedding, hidden per direction) from :data:`COVE_SIZES`; ``vectors`` (a GloVe or word2vec
    text file) sets the source embedding, which then stays fixed, and its width. Every ``eval_every`` steps
    the dev loss, perplexity and greedy BLEU (on the first ``bleu_sentences`` dev lines, default all) are
    logged; the weights with the best dev BLEU are kept. Returns the kept weights' dev metrics (and the
    GloVe coverage when ``vectors`` is given)."""
    started = time.time()
    if spec.resume and not setup_killed(spec.out):  # as the run was made, with the budget given now
        config = read_config(spec.out, "--out", ("pretrained",))
        if config.pretrained.objective != "translation":
            raise SesameError(f"--out {spec.out}: a {config.family} run; --resume needs a run of `sesame cove`")
        cove = config.cove
        spec = resumed_spec(spec, config, {
            "size": config.size, "max_length": config.max_length, "dropout": config.model.dropout,
            "vectors": cove.vectors, "train_src": cove.train_src, "train_tgt": cove.train_tgt,
            "valid_src": cove.valid_src, "valid_tgt": cove.valid_tgt})
    spec.validate()
    placement = spec.runtime.place()
    cfg = spec.train_config()
    src, tgt = read_parallel(spec.train_src, spec.train_tgt, "--train-src", "--train-tgt")
    dev_src, dev_tgt = read_parallel(spec.valid_src, spec.valid_tgt, "--valid-src", "--valid-tgt")

    resumed = from_checkpoint(spec.out, spec.resume)  # else a new model, also for a run killed before its first
    with new_run(spec.out, "pretrained", spec.resume) as run:
        if not spec.resume:
            model = _create(run, spec, cfg, src, tgt)
        config = read_config(run, "--out", ("pretrained",))
        source, target = load_tokenizer(run), load_tokenizer(run / TARGET_TOKENIZER, "--out")
        max_length = config.max_length
        if spec.resume:  # the checkpoint's weights, or (killed before the first) the run's initial ones
            vectors = load_vectors(config.cove.vectors) if config.cove.vectors and not resumed else None
            model, _ = _new_model(config.model, source, seed=cfg.seed, vectors=vectors)
        objective = build_objective(config.pretrained.objective, model, source)
        train_ids = list(zip(source.encode(src, max_length=max_length), target.encode(tgt, max_length=max_length)))
        dev_ids = list(zip(source.encode(dev_src, max_length=max_length),
                           target.encode(dev_tgt, max_length=max_length)))
        per_epoch = steps_per_epoch(len(train_ids), cfg.batch_size)
        lengths = [len(s) + len(t) for s, t in train_ids]
        shown = dev_src[:spec.bleu_sentences] if spec.bleu_sentences else dev_src

        def batches(step: int, progress_fraction: float) -> list[dict[str, torch.Tensor]]:
            epoch, k = divmod(step, per_epoch)
            order = bucketed_batches(lengths, cfg.batch_size, torch.Generator().manual_seed(cfg.seed + epoch))[k]
            per_micro = math.ceil(len(order) / cfg.accumulate)
            return [_collate([train_ids[i] for i in order[j: j + per_micro]], source, target)
                    for j in range(0, len(order), per_micro)]

        def evaluate(m: Translation) -> dict:
            total, count = 0.0, 0
            for start in range(0, len(dev_ids), EVAL_BATCH):
                batch = to_device(_collate(dev_ids[start: start + EVAL_BATCH], source, target), device_of(m))
                total += float(m(batch))
                count += batch["targets"].numel()
            report = language_model_report(total, count)
            hyps = decode(m.backbone, source, target, shown, max_length=max_length)
            return {"loss": report["loss"], "perplexity": report["perplexity"],
                    "bleu": bleu(hyps, dev_tgt[: len(shown)])}

        settings = RunSettings(run, cfg, placement=placement, progress=spec.progress, started=started)
        trainer = Trainer(objective, settings, batches, evaluate=evaluate, select="bleu")
        metrics = trainer.fit(resume=resumed, record=lambda: record_training(
            run, config, cfg, runtime=spec.runtime.record(placement)))
        coverage = config.cove.vector_coverage
        return {**metrics, **({"vector_coverage": coverage} if coverage is not None else {}),
                "train_sentences": len(train_ids), "source_vocab": source.vocab_size,
                "target_vocab": target.vocab_size}


def _collate(pairs: Sequence[tuple[list[int], list[int]]], source: TextTokenizer, target: TextTokenizer
             ) -> dict[str, torch.Tensor]:
    return collate([s for s, _ in pairs], [t for _, t in pairs], source.specials.pad, target.specials.pad)

