"""The cells of ``sesame compare``: one resumable stage (:mod:`sesame.pipelines.stages`) per pre-training
and per fine-tuning, what a cell depends on (its origin), and the from-scratch twins."""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ... import api, pipelines
from ...errors import SesameError
from ...families import backbone_config
from ...interop.sources import MINILM, minilm_dir
from ...pipelines.stages import NO_STEP_CAP, cached_stage, duration, stage_runtime, trainer_state
from ...run import load_tokenizer, read_config
from ...runtime import Runtime
from ...specs import PretrainSpec
from ...train.checkpoint import checkpoint_dir
from .approaches import FINETUNE, Approach, run_config
from .baselines import scores
from .tasks import CompareTask

if TYPE_CHECKING:
    from .spec import CompareSpec


def say(where: str, name: str, record: dict, reused: bool) -> None:
    """One line on stderr per cell: what it measured, how long it took, whether it was reused."""
    what = (f"dev accuracy {record['dev']['accuracy']:.4f}" if "dev" in record
            else f"{record['steps']:,} steps, {record['tokens']:,} tokens")
    print(f"{where:<10} {name:<36} {what} in {duration(record['seconds'])}{'  (reused)' if reused else ''}",
          file=sys.stderr, flush=True)


def pretraining_spec(approach: Approach, run: Path, spec: CompareSpec, *, runtime: Runtime) -> PretrainSpec:
    """The pre-training of ``approach`` into ``run``: the comparison's corpus (paths resolved), budget and seed, the
    approach's keywords (:meth:`Approach.pretraining`; a ``teacher=`` student's family and size are its teacher's),
    on ``runtime``."""
    corpus = [str(Path(p).resolve()) for p in spec.corpus]
    valid = [str(Path(p).resolve()) for p in spec.valid] if spec.valid else None
    return PretrainSpec.of(corpus, str(run), valid=valid, progress=spec.progress, max_minutes=spec.minutes,
                           max_steps=spec.max_steps or NO_STEP_CAP, seed=spec.seed, **approach.pretraining(),
                           runtime=runtime)


def pretrain_cell(approach: Approach, run: Path, spec: CompareSpec) -> tuple[dict, bool]:
    """Pre-train ``approach`` into ``run`` on the comparison's corpus and budget, in its ``precision=…`` or the
    command's: (its record, reused). A ``teacher=`` student's cell depends on the teacher's weights too."""
    runtime, precision = stage_runtime(replace(spec.runtime, precision=approach.options.get("precision")
                                               or spec.runtime.precision))
    pretraining = pretraining_spec(approach, run, spec, runtime=runtime)

    def work(resume: bool) -> dict:
        try:
            pipelines.pretrain(replace(pretraining, resume=resume))
        except SesameError as err:
            raise SesameError(f"--approaches {approach.spec}: {err}") from None
        state, seq_len = trainer_state(run), read_config(run, "--out").pretrained.seq_len
        return {"steps": state["step"], "tokens": state["step"] * state["config"]["batch_size"] * seq_len,
                "seconds": round(state["elapsed"], 3)}

    settings = {"approach": approach.spec, "corpus": pretraining.corpus, "valid": pretraining.valid,
                "minutes": spec.minutes, "max_steps": spec.max_steps, "seed": spec.seed, **precision,
                **({"teacher": origin(pretraining.teacher)} if approach.distils else {})}
    return cached_stage(run, settings, work)


def prior_training(base: str) -> dict:
    """``{"seconds", "tokens"}`` spent pre-training the run ``base``, read from its checkpoint and summed over
    the runs it continued (``config.base``: ULMFiT's target LM continues the general one); tokens are
    steps × batch × sequence length. None for what the runs do not record (a transformers directory, MiniLM,
    a run without checkpoint; tokens of a ``sesame cove`` run, whose examples are sentence pairs)."""
    seconds, tokens, path, seen = 0.0, 0, Path(base), set()
    while path is not None:
        config = run_config(str(path))
        if config is None or config.kind != "pretrained" or checkpoint_dir(path) is None or path.resolve() in seen:
            return {"seconds": None, "tokens": None}
        seen.add(path.resolve())
        state = trainer_state(path)
        seconds += state["elapsed"]
        seq_len = config.pretrained.seq_len
        tokens = tokens + state["step"] * state["config"]["batch_size"] * seq_len \
            if tokens is not None and seq_len is not None else None
        path = Path(config.base) if config.base else None
    return {"seconds": round(seconds, 3), "tokens": tokens}


def origin(base: str) -> dict:
    """What a cell depends on of the run ``base`` (fine-tuned from it, or a student's teacher): its path and a
    fingerprint of its weights and config (size and modification time), so that a changed run is noticed."""
    path = minilm_dir() if base == MINILM else Path(base)
    files = sorted(p for p in path.iterdir() if p.is_file() and (p.suffix in (".safetensors", ".bin")
                                                                 or p.name == "config.json"))
    return {"from": base if base == MINILM else str(path.resolve()),
            "fingerprint": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}}


@dataclass(frozen=True, kw_only=True)
class Start:
    """What a fine-tuning cell starts from: ``base`` (a run, a transformers directory, ``minilm`` or
    ``scratch:FAMILY:SIZE``), ``origin`` (the records it depends on, part of the cell's settings), the ``tokenizer``
    a from-scratch twin borrows, and ``name``, the approach's or twin's, which the cell's errors name."""
    name: str
    base: str
    origin: dict
    tokenizer: str | None = None


def finetune_cell(start: Start, run: Path, task: CompareTask, spec: CompareSpec, *, options: dict
                  ) -> tuple[dict, bool]:
    """Fine-tune from ``start`` on ``task`` into ``run`` with the fine-tuning ``options``, on the comparison's
    runtime (in the precision of ``options``, if they set one): (its record, reused)."""
    runtime, precision = stage_runtime(replace(spec.runtime, precision=options.get("precision")
                                               or spec.runtime.precision))

    def work(resume: bool) -> dict:
        try:
            dev = api.finetune(base=start.base, train=task.train, dev=task.dev, out=str(run), task=task.task,
                               task_options=task.columns, tokenizer=start.tokenizer, resume=resume,
                               progress=spec.progress, **options, runtime=runtime)
        except SesameError as err:
            raise SesameError(f"--approaches {start.name} (task {task.name}): {err}") from None
        model = api.load(run, runtime=runtime)
        return {"parameters": sum(p.numel() for p in model.model.parameters()), "epochs": options["epochs"],
                "seconds": round(trainer_state(run)["elapsed"], 3), "train": scores(model.evaluate(task.train)),
                "dev": scores(dev)}

    return cached_stage(run, {"from": start.origin, "task": asdict(task), **options, **precision}, work)


def scratch_twins(plan: list[Approach], runs: Path) -> dict[str, list[Approach]]:
    """``{name: approaches}``: one from-scratch twin per distinct architecture, tokenizer and fine-tuning
    options, named ``scratch:FAMILY:SIZE`` (and the approach's ``finetune.`` items) after the first approach
    that has them, whose tokenizer it uses. bert, spanbert and electra at one size with one tokenizer file
    share a twin: their runs would be identical. ``runs`` holds the runs compare pre-trained; approaches
    without a twin (:attr:`Approach.has_twin`) are left out."""
    twins: dict[tuple, str] = {}
    named: dict[str, list[Approach]] = {}
    for a in plan:
        if not a.has_twin:
            continue
        tokenizer = hashlib.sha256((a.run_dir(runs) / "tokenizer.json").read_bytes()).hexdigest()
        # an encoder-decoder's decoder start token is one of its tokenizer's specials
        specials = load_tokenizer(a.run_dir(runs)).specials if a.row.decoder_start else None
        key = (json.dumps(asdict(backbone_config(a.family, a.size, 1, 0, specials=specials))), tokenizer,
               json.dumps(a.finetune, sort_keys=True))
        if key not in twins:
            name = ":".join([f"scratch:{a.family}:{a.size}", *(item for item in a.spec.split(":")[2:]
                                                               if item.startswith(FINETUNE))])
            twins[key] = name if name not in named else f"{name}:tokenizer-of-{a.slug}"
        named.setdefault(twins[key], []).append(a)
    return named
