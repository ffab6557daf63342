"""In-context classification with a causal language model: zero-shot (GPT-2) and few-shot (GPT-3).

``sesame prompt-eval`` asks a pretrained decoder to classify a labeled file without any training,
as Radford et al. (2019, §3: GPT-2, zero-shot) and Brown et al. (2020, §2.4: GPT-3, few-shot) do:

* every label is verbalised by a word or phrase (by default the label's own name);
* a prompt is ``k`` demonstrations drawn from a training file, each the template filled with a text
  and its verbaliser (default ``"{text}\\nSentiment: {label}\\n\\n"``, the blank line delimiting
  demonstrations as GPT-3's newlines do), then the evaluated text with the label slot left open;
* the prediction is the label whose verbaliser the model finds likeliest as the continuation. By
  default the likelihood is per token (the mean log-probability of the verbaliser's tokens, which GPT-3
  uses for most tasks "to normalize for length", §2.4); ``scoring="sum"`` compares total log-probabilities;
  ``scoring="calibrated"`` is Zhao et al.'s (2021, §4, eq. 1; their code's ``diagonal_W``) contextual
  calibration, which removes a bias towards a label that the prompt itself induces (small models often
  answer one label almost always): the same demonstrations are followed by each of the content-free inputs
  "N/A", "" and "[MASK]" in place of the evaluated text; p_cf, each label's probability averaged over the
  three and normalised over the labels, is computed once per demonstration set (:func:`content_free`), and
  the prediction is the argmax of W·p̂ with W = diag(p_cf)⁻¹, p̂ the labels' normalised probabilities
  (:func:`calibrate`). A label's probability is that of its whole verbaliser (the product over its tokens;
  the paper's labels are one token). Zhao et al. draw one demonstration set per seed for every example;
  here each example has its own (GPT-3's draw, below), so p_cf is computed for each distinct set of the
  demonstrations a prompt kept, and once for all of k = 0: three more prompts per demonstration set.

Demonstrations are drawn, as in GPT-3, uniformly at random for each evaluated example (no balancing
of labels), never including a training row whose text is the evaluated text; the generator is seeded
by (seed, draw, example index), so a draw is repeatable and every draw differs. Accuracy is reported per
``k`` with its spread over the draws (``k`` = 0 has one, deterministic draw).

Prompt details: each prompt starts with the tokenizer's separator token, which is how a document
begins in sesame's pre-training (shards put it after every document; a converted GPT-2 maps it to
``<|endoftext|>``, the token GPT-2 saw between documents), so the model starts from the state it
learned for a fresh document rather than from nothing. The texts are plain text, encoded without the
tokenizer's special-token template. Spaces (not newlines) before ``{label}`` belong to the
continuation, so " positive" is scored as one byte-level BPE word. Pieces (demonstrations, the
evaluated text, each verbaliser) are encoded separately and their ids concatenated: the ids decode to
the prompt exactly, and GPT-2's pre-tokeniser splits at those boundaries anyway. A prompt longer than
the model's context loses its oldest (leftmost) demonstrations first; only an evaluated text too long
by itself loses its first tokens. The context is the length the model was pre-trained on (a sesame
run's ``seq_len``; a converted checkpoint's positions), since positions beyond it were never trained.
"""
from __future__ import annotations

import math
import random
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from ..data.labeled import read_fields
from ..errors import SesameError
from ..language_model import continuation_logprobs, load_language_model
from ..metrics import accuracy, spread
from ..options import option, split_known
from ..run import RunConfig
from ..runtime import Runtime, given_runtime

DEFAULT_TEMPLATE = "{text}\nSentiment: {label}\n\n"
SCORINGS = ("mean", "sum", "calibrated")
CONTENT_FREE = ("N/A", "", "[MASK]")  # Zhao et al. 2021's content-free inputs (§4; their code's p_cf)


@dataclass(kw_only=True)
class PromptSpec:
    """``sesame prompt-eval``: a causal language model classifying a labeled file from prompts, no training."""
    model: str = option(help="a pretrained gpt/gpt2 run, or a transformers GPT-2 directory")
    data: str = option(help="the labeled file to classify (CSV, TSV or JSONL)")
    train: str | None = option(None, help="where demonstrations come from (needed for k > 0; never the evaluated "
                                          "example)")
    text_column: str = option("text", help="the column (JSONL: the field) of the text")
    label_column: str = option("label", help="the column (JSONL: the field) of the label")
    verbalizers: dict[str, str] | None = option(None, cli=False, help="label → word (default: the label names)")
    template: str = option(DEFAULT_TEMPLATE, help="a demonstration, with {text} and {label} (default: "
                                                  "'{text}\\nSentiment: {label}\\n\\n')")
    ks: list[int] = option(factory=lambda: [0, 1, 4, 8], flag="--k", metavar="K", help="numbers of demonstrations")
    draws: int = option(5, help="demonstration draws per k > 0 (the spread is over these)")
    seed: int = option(0, help="seed of the demonstration draws")
    limit: int | None = option(None, help="evaluate only the first N rows")
    scoring: str = option("mean", choices=SCORINGS,
                          help="compare verbalisers by mean log-probability per token (GPT-3), total, or calibrated "
                               "against content-free inputs (Zhao et al. 2021)")
    max_length: int | None = option(None, help="prompt length in tokens (default: the model's pre-training length)")
    runtime: Runtime = option(factory=Runtime, cli=False, help="device and precision (sesame.runtime)")
    progress: bool = option(True, cli=False, help="show progress bars")

    def __post_init__(self) -> None:
        self.ks = sorted(set(self.ks))

    def validate(self) -> None:
        """Every check that reads no file."""
        if not self.ks or self.ks[0] < 0:
            raise SesameError(f"--k {self.ks}: give one or more numbers of demonstrations, 0 or more")
        if self.draws < 1:
            raise SesameError(f"--draws {self.draws}: use 1 or more")
        if self.limit is not None and self.limit < 1:
            raise SesameError(f"--limit {self.limit}: use 1 or more, or leave it out to evaluate every row")
        if self.scoring not in SCORINGS:
            raise SesameError(f"--scoring {self.scoring!r}: choose one of {', '.join(SCORINGS)}")
        if self.ks[-1] > 0 and self.train is None:
            raise SesameError(f"--k {self.ks[-1]}: demonstrations come from a --train file; give one, or use --k 0")


@dataclass(frozen=True)
class Template:
    """A prompt format ``before{text}between{label}after``: a demonstration fills both slots; the
    evaluated example stops before ``{label}``, whose preceding spaces go to the continuation."""

    before: str
    between: str
    after: str

    @classmethod
    def parse(cls, template: str) -> "Template":
        """Parse a ``--template`` string: ``{text}`` then ``{label}``, once each; ``{{``/``}}`` are literal
        braces; the two-character escapes ``\\n`` and ``\\t`` become a newline and a tab (for shells)."""
        template = template.replace("\\n", "\n").replace("\\t", "\t")
        try:
            parts = list(string.Formatter().parse(template))
        except ValueError as err:
            raise SesameError(f"--template {template!r}: {err}; write literal braces as {{{{ and }}}}") from None
        literals, fields = [""], []
        for literal, name, spec, conversion in parts:  # "{{" splits a literal: join the pieces between fields
            literals[-1] += literal
            if name is not None:
                fields.append((name, spec, conversion))
                literals.append("")
        names = [name for name, spec, conversion in fields if not spec and not conversion]
        if names != ["text", "label"] or len(fields) != 2:
            raise SesameError(f"--template {template!r}: needs {{text}} then {{label}}, once each and nothing else in "
                              f"braces, e.g. {DEFAULT_TEMPLATE!r}")
        return cls(*literals)

    def demonstration(self, text: str, verbalizer: str) -> str:
        return f"{self.before}{text}{self.between}{verbalizer}{self.after}"

    def query(self, text: str) -> str:
        return f"{self.before}{text}{self.between.rstrip(' ')}"

    def continuation(self, verbalizer: str) -> str:
        return self.between[len(self.between.rstrip(" ")):] + verbalizer


def parse_verbalizers(spec: str) -> dict[str, str]:
    """The ``--verbalizers`` flag: ``negative=bad,neutral=okay,positive=good`` → ``{label: verbaliser}``."""
    verbalizers: dict[str, str] = {}
    for item in spec.split(","):
        label, equals, word = (part.strip() for part in item.partition("="))
        if not equals or not label or not word:
            raise SesameError(f"--verbalizers {spec!r}: give LABEL=WORD pairs separated by commas, e.g. "
                              "negative=bad,positive=good")
        if label in verbalizers:
            raise SesameError(f"--verbalizers {spec!r}: label {label!r} is given twice")
        verbalizers[label] = word
    return verbalizers


def demonstration_indices(train_texts: Sequence[str], texts: Sequence[str], *, k: int, seed: int, draw: int,
                          train: str = "--train") -> list[list[int]]:
    """For each evaluated text, ``k`` distinct rows of the training texts in random order, drawn uniformly
    from those whose text (spaces stripped) differs from it, by a generator seeded with (seed, draw,
    example index). ``train`` names the training file in errors."""
    rows_of: dict[str, list[int]] = {}
    for j, text in enumerate(train_texts):
        rows_of.setdefault(text.strip(), []).append(j)
    n, chosen = len(train_texts), []
    for i, text in enumerate(texts):
        excluded = set(rows_of.get(text.strip(), ()))
        if k > n - len(excluded):
            raise SesameError(f"--k {k}: {train} has only {n - len(excluded)} rows whose text differs from evaluated "
                              f"example {i + 1}; use a smaller --k or a larger --train")
        # the first k non-excluded entries of a random ordering are a uniform random choice among the rest
        order = random.Random(f"{seed}/{draw}/{i}").sample(range(n), k + len(excluded)) if k else []
        chosen.append([j for j in order if j not in excluded][:k])
    return chosen


def assemble(start: Sequence[int], demonstrations: Sequence[Sequence[int]], query: Sequence[int],
             budget: int) -> tuple[list[int], int, bool]:
    """``start + demonstrations + query`` in at most ``budget`` tokens: the oldest (leftmost) demonstrations
    go first; only if the query alone does not fit, its first tokens too. Returns (ids, demonstrations
    dropped, query cut)."""
    room = budget - len(start) - len(query)
    kept: list[Sequence[int]] = []
    for demo in reversed(demonstrations):
        if len(demo) > room:
            break
        kept.insert(0, demo)
        room -= len(demo)
    cut = room < 0
    query = query[len(query) - (budget - len(start)):] if cut else query
    return [*start, *(t for demo in kept for t in demo), *query], len(demonstrations) - len(kept), cut


def content_free(scores: torch.Tensor) -> torch.Tensor:
    """log p_cf (Zhao et al. 2021, §4) from ``scores`` ``[inputs, labels]``, each label's total log-probability
    after each content-free input: the labels' probabilities averaged over the inputs, normalised over the labels."""
    mean = torch.logsumexp(scores, 0) - math.log(len(scores))
    return mean - torch.logsumexp(mean, 0)


def calibrate(scores: torch.Tensor, log_p_cf: torch.Tensor) -> torch.Tensor:
    """log W·p̂ with W = diag(p_cf)⁻¹ (Zhao et al. 2021, eq. 1, b = 0): ``scores`` ``[..., labels]`` are total
    log-probabilities, p̂ their probabilities normalised over the labels, ``log_p_cf`` (:func:`content_free`)
    broadcast against them."""
    return scores.log_softmax(-1) - log_p_cf


def _read(path: str, flag: str, text_column: str, label_column: str) -> list[dict]:
    rows = read_fields(path, {"text": (text_column, "--text-column"), "label": (label_column, "--label-column")})
    for row in rows:
        row["label"] = row["label"].strip()
        row["file"] = f"{flag} {path}:{row['line']}"
    return rows


def _verbalizers(given: dict[str, str] | None, rows: list[dict]) -> dict[str, str]:
    """The candidates: ``given`` (every label met must have one), or each label's own name, sorted."""
    if given is None:
        labels = sorted({row["label"] for row in rows})
        if len(labels) < 2:
            raise SesameError(f"--label-column: the files hold only one label ({labels}); check --label-column")
        return {label: label for label in labels}
    for row in rows:
        if row["label"] not in given:
            raise SesameError(f"{row['file']}: label {row['label']!r} has no verbaliser; add it to --verbalizers "
                              f"(which has {', '.join(given)})")
    words = [word.strip() for word in given.values()]
    if not all(words) or len(set(words)) < len(words) or len(words) < 2:
        raise SesameError(f"--verbalizers {given}: give two or more labels, each a distinct, non-empty word")
    return dict(given)


def _context(config: RunConfig, model: str, max_length: int | None) -> int:
    """The prompt length: ``max_length``, or the length the model was pre-trained on."""
    positions = config.model.max_positions
    if max_length is None:
        trained = max(config.pretrained.seq_len or 0, config.pretrained.final_seq_len or 0)
        return positions if config.hf or not trained else min(trained, positions)
    if not 8 <= max_length <= positions:
        raise SesameError(f"--max-length {max_length}: use 8 to {positions} (--model {model}'s positions)")
    return max_length


def prompt_eval(spec: PromptSpec) -> dict:
    """In-context classification accuracy of a causal language model on a labeled file, for each number
    of demonstrations ``k`` in ``spec.ks`` (see the module docstring; Brown et al. 2020, §2.4).

    Returns, per k: accuracy ``mean``, sample ``sd``, ``min``, ``max`` and ``accuracies`` over its draws
    (``draws``, one for k = 0), ``n``, the share of predictions per label (``predicted``), and how many
    prompts lost demonstrations (``shortened``) or the start of their text (``cut``) to fit; and, for
    reference, the accuracy of always answering ``data``'s most frequent label (``majority``).
    """
    spec.validate()
    ks, train, scoring = spec.ks, spec.train, spec.scoring
    form = Template.parse(spec.template)
    rows = _read(spec.data, "--data", spec.text_column, spec.label_column)[:spec.limit]
    train_rows = _read(train, "--train", spec.text_column, spec.label_column) if train is not None else []
    verbalizers = _verbalizers(spec.verbalizers, rows + train_rows)
    labels = list(verbalizers)
    lm = load_language_model(spec.model, runtime=spec.runtime)
    tok, config = lm.tokenizer, lm.config
    context = _context(config, spec.model, spec.max_length)
    candidates = tok.encode([form.continuation(verbalizers[label]) for label in labels], special=False)
    start = [lm.end]
    if len(start) + max(map(len, candidates)) + 1 > context:
        raise SesameError(f"--max-length {context}: too short for the prompt's start and the longest verbaliser")
    budget = context - max(map(len, candidates)) + 1  # the last verbaliser token is never an input
    queries = tok.encode([form.query(row["text"]) for row in rows], special=False)
    demos = tok.encode([form.demonstration(row["text"], verbalizers[row["label"]]) for row in train_rows],
                       special=False) if ks[-1] > 0 else []
    gold = torch.tensor([labels.index(row["label"]) for row in rows])
    lengths = torch.tensor([len(c) for c in candidates], dtype=torch.float)
    texts, train_texts = [row["text"] for row in rows], [row["text"] for row in train_rows]
    calibrated = scoring == "calibrated"
    content_free_queries = tok.encode([form.query(text) for text in CONTENT_FREE], special=False)
    log_p_cf: dict[tuple[int, ...], torch.Tensor] = {}  # demonstration set (indices, in order) → log p_cf
    draws = {k: spec.draws if k else 1 for k in ks}
    bar = tqdm(total=sum(len(rows) * draws[k] for k in ks), desc="prompt-eval", unit="prompt",
               disable=not spec.progress, dynamic_ncols=True)
    results = []
    with bar:
        for k in ks:
            accuracies, predicted, shortened, cut = [], Counter(), 0, 0
            for draw in range(draws[k]):
                picks = demonstration_indices(train_texts, texts, k=k, seed=spec.seed, draw=draw,
                                              train=f"--train {train}")
                prompts, kept = [], []
                for query, chosen in zip(queries, picks):
                    ids, dropped, was_cut = assemble(start, [demos[j] for j in chosen], query, budget)
                    prompts.append(ids)
                    kept.append(tuple(chosen[dropped:]))  # the demonstrations the prompt kept
                    shortened, cut = shortened + (dropped > 0), cut + was_cut
                new = list(dict.fromkeys(demo_set for demo_set in kept if demo_set not in log_p_cf)) \
                    if calibrated else []
                references = [assemble(start, [demos[j] for j in demo_set], query, budget)[0]
                              for demo_set in new for query in content_free_queries]
                bar.total += len(references)
                scores = continuation_logprobs(lm, prompts + references, candidates, done=bar.update)
                if calibrated:
                    found = scores[len(prompts):].view(len(new), len(CONTENT_FREE), len(labels))
                    log_p_cf.update(zip(new, map(content_free, found)))
                    scores = calibrate(scores[: len(prompts)], torch.stack([log_p_cf[d] for d in kept]))
                guesses = (scores / lengths if scoring == "mean" else scores).argmax(1)
                accuracies.append(accuracy(gold.tolist(), guesses.tolist()))
                predicted.update(guesses.tolist())
            total = sum(predicted.values())
            results.append({"k": k, **spread(accuracies), "accuracies": accuracies,
                            "draws": len(accuracies), "n": len(rows),
                            "predicted": {label: predicted[i] / total for i, label in enumerate(labels)},
                            "shortened": shortened, "cut": cut})
    majority, count = Counter(row["label"] for row in rows).most_common(1)[0]
    return {"model": str(spec.model), "data": str(spec.data), "train": train, "n": len(rows),
            "verbalizers": verbalizers, "template": form.demonstration("{text}", "{label}"), "scoring": scoring,
            "max_length": context, "majority": {"label": majority, "accuracy": count / len(rows)}, "results": results}


def prompt_eval_of(model: str, data: str, **options: Any) -> dict:
    """The Python API's ``sesame.prompt_eval``: zero- and few-shot in-context classification accuracy of the causal
    language model ``model`` on the labeled file ``data``; e.g. ``prompt_eval("runs/gpt2", "dev.csv",
    train="train.csv", ks=(0, 4))``. Takes :class:`PromptSpec`'s fields as keywords, and ``device``, ``precision``:
    its runtime (:class:`sesame.runtime.Runtime`). Returns the accuracy per number of demonstrations
    (:func:`prompt_eval`)."""
    spec, runtime = split_known(options, PromptSpec, Runtime)
    runtime = given_runtime(spec, runtime)
    return prompt_eval(PromptSpec(model=model, data=data, **spec, runtime=runtime))


def format_report(report: dict) -> str:
    """:func:`prompt_eval`'s result as a table: accuracy per k, with its spread over the draws."""
    lines = [f"{report['model']} on {report['data']} (n = {report['n']}, scoring {report['scoring']}, prompts of at "
             f"most {report['max_length']} tokens)",
             f"majority class ({report['majority']['label']}): {report['majority']['accuracy']:.4f}", "",
             f"{'k':>3}  {'accuracy':>8}  {'sd':>6}  {'min':>6}  {'max':>6}  draws  shortened  predicted"]
    for r in report["results"]:
        shares = ", ".join(f"{label} {share:.2f}" for label, share in r["predicted"].items())
        lines.append(f"{r['k']:>3}  {r['mean']:>8.4f}  {r['sd']:>6.4f}  {r['min']:>6.4f}  {r['max']:>6.4f}  "
                     f"{r['draws']:>5}  {r['shortened']:>9}  {shares}")
    return "\n".join(lines)
