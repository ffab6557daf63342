"""The outputs of ``sesame compare``: one row per cell, then results.json, results.csv, results.md (a table
per task, with what every row shares said once) and results.png (a bar chart of dev accuracy)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from ...pipelines.stages import duration
from ...run import read_config
from ...train.checkpoint import write_json
from ...train.metrics_log import read_metrics
from .tasks import CompareTask

COLUMNS = {  # CSV/JSON field: Markdown header
    "approach": "approach", "kind": "kind", "parameters": "parameters", "pretrain_seconds": "pre-training time",
    "pretrain_tokens": "pre-training tokens", "finetune_epochs": "fine-tuning epochs",
    "finetune_seconds": "fine-tuning time", "train_accuracy": "train accuracy", "dev_accuracy": "dev accuracy",
    "dev_macro_f1": "dev macro-F1",
}
KINDS = {"pretrained": ("#4c72b0", ""), "baseline": ("#55a868", ".."), "scratch": ("#b0b0b0", "//"),
         "tf-idf": ("#dd8452", "xx")}  # colour, hatch


def table_row(task: CompareTask, name: str, kind: str, slug: str, record: dict, pre: dict, **extra: object) -> dict:
    """The table's row of a cell: its ``record``, the pre-training columns ``pre`` and ``extra`` fields."""
    return {"task": task.name, "approach": name, "kind": kind, "parameters": record["parameters"],
            "pretrain_seconds": pre["seconds"], "pretrain_tokens": pre["tokens"],
            "finetune_epochs": record.get("epochs"), "finetune_seconds": record["seconds"],
            "train_accuracy": record["train"]["accuracy"], "dev_accuracy": record["dev"]["accuracy"],
            "dev_macro_f1": record["dev"]["macro_f1"], "run": f"{task.name}/{slug}",
            **({"C": record["C"]} if "C" in record else {}), **extra}


def pretraining_row(approach: str, run: Path, record: dict) -> dict:
    """What pre-training ``approach`` into ``run`` bought: its objective, steps and tokens (``record``) and the
    losses of its last validation (the last ``dev`` line of its metrics.jsonl; ``None`` when it logged none)."""
    dev = [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "dev"] \
        if (run / "metrics.jsonl").exists() else []
    last = dev[-1] if dev else {}
    return {"approach": approach, "objective": read_config(run, "--out").pretrained.objective, "steps": record["steps"],
            "tokens": record["tokens"], "valid_loss": last.get("loss"), "valid_perplexity": last.get("perplexity"),
            "valid_parts": {k: v for k, v in last.items() if k.endswith(("_loss", "_accuracy"))}}


def _pretraining_lines(pretrained: list[dict], shared: list[str]) -> list[str]:
    """The section of results.md on what each approach's pre-training bought, when any pre-trained here."""
    def number(x: float | None, fmt: str) -> str:
        return "—" if x is None else format(x, fmt)

    def parts(row: dict) -> str:
        return ", ".join(f"{name.replace('_', ' ')} {value:.3f}" for name, value in row["valid_parts"].items()) or "—"

    return ["", "## Pre-training", "",
            "Valid loss: the objective's own loss on the validation text at the end of pre-training (exp of it: "
            "valid perplexity). Each objective scores its own targets (masked tokens, corrupted spans, the next "
            "token, the clean text), so losses compare only between rows with the same objective and tokenizer.", "",
            "| approach | objective | steps | tokens | valid loss | valid perplexity | parts (valid) |",
            "|---|---|---|---|---|---|---|",
            *(f"| {_short(r['approach'], shared)} | {r['objective']} | {r['steps']:,} | {_count(r['tokens'])} | "
              f"{number(r['valid_loss'], '.3f')} | {number(r['valid_perplexity'], ',.1f')} | "
              f"{parts(r)} |"
              for r in pretrained)]


def _count(n: int) -> str:
    for unit, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= unit:
            return f"{n / unit:.1f}{name}"
    return str(n)


def _shared_items(rows: list[dict]) -> list[str]:
    """The ``KEY=VALUE`` items that every approach names, when there are several."""
    items = [r["approach"].split(":")[2:] for r in rows if r["kind"] in ("pretrained", "baseline")]
    return [item for item in items[0] if all(item in i for i in items)] if len(items) > 1 else []


def _short(approach: str, shared: list[str]) -> str:
    """``approach`` without the ``shared`` items."""
    return ":".join(part for i, part in enumerate(approach.split(":")) if i < 2 or part not in shared)


def _cells(row: dict, shared: list[str]) -> list[str]:
    """The Markdown cells of ``row``; pre-training that did not happen or is unknown shows as ``—``."""
    pre, tokens = row["pretrain_seconds"], row["pretrain_tokens"]
    return [_short(row["approach"], shared), row["kind"], _count(row["parameters"]), duration(pre) if pre else "—",
            _count(tokens) if tokens else "—", str(row["finetune_epochs"] or "—"),
            duration(row["finetune_seconds"]), *(f"{row[k]:.4f}" for k in ("train_accuracy", "dev_accuracy",
                                                                            "dev_macro_f1"))]


def _own_settings(rows: list[dict], common: dict, shared: list[str]) -> str:
    """The rows of one task fine-tuned with other settings than ``common`` (the command's and the task's),
    by the family's defaults or their ``finetune.`` items: ``lstm:mini`` (lr 0.002); ..."""
    def item(key: str, value: object) -> str:
        shown = f"{value:g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, bool) else value
        return f"{key.replace('_', ' ')} {shown}"

    own = [(r["approach"], [item(k, v) for k, v in r["finetune"].items() if common.get(k) != v])
           for r in rows if "finetune" in r]
    return "; ".join(f"`{_short(name, shared)}` ({', '.join(diff)})" for name, diff in own if diff)


def write_results(out: Path, rows: list[dict], tasks: list[CompareTask], command: str, minutes: float,
                  options: dict, *, pretrained: list[dict]) -> None:
    """results.json (command, pre-training and rows), results.csv, results.md (the pre-training, then a table per
    task) and results.png; ``pretrained`` holds a :func:`pretraining_row` per approach pre-trained here."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"command": command, "pretraining": pretrained, "rows": rows})
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, ["task", *COLUMNS, "run"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    shared = _shared_items(rows)
    twins = {r["approach"]: r["twin_of"] for r in rows if r["kind"] == "scratch"}
    here = any(r["kind"] == "pretrained" and "from" not in r for r in rows)
    lines = ["# sesame compare", "", "Made by:", "", "```bash", command, "```", "",
             *([f"- Pre-training: {minutes:g} min of wall time per approach pre-trained here, on the same corpus "
                "(tokenizer, data preparation and training); pre-training tokens = steps × batch × sequence "
                "length."] if here else []),
             *([f"- Every approach's recipe includes `{':'.join(shared)}`, left out of the tables."] if shared else []),
             *(["- `from=` rows fine-tune an existing run, pre-trained elsewhere: its time and tokens are read from its "
                "checkpoints (summed over the runs it continued, as ULMFiT's target LM continues the general one); "
                "`—` where the run does not record them."] if any("from" in r for r in rows) else []),
             f"- Fine-tuning: epochs {options['epochs']}, lr {options['lr']:g}, batch {options['batch_size']}, max "
             f"length {options['max_length']}, seed {options['seed']}, unless the family (its defaults), the task or "
             "the approach (`finetune.KEY=VALUE`) says otherwise, in that order of precedence; each task lists the "
             "rows that differ. The epoch with the best dev accuracy is kept.",
             *(["- `baseline` rows: a family without pre-training (an LSTM, GRU or BiLSTM classifier), trained from "
                "random weights (or `finetune.vectors`) on the task alone, with a word tokenizer of its training "
                "texts."] if any(r["kind"] == "baseline" for r in rows) else []),
             *(["- `scratch:` rows: the same architecture from random weights, with the approach's tokenizer and "
                "fine-tuning options; one row serves every approach with the same architecture, tokenizer and "
                "options: " + "; ".join(f"`{name}` for {', '.join(_short(a, shared) for a in of)}"
                                        for name, of in twins.items()) + "."] if twins else []),
             "- The TF-IDF row: logistic regression on word 1–2-gram and character 2–5-gram TF-IDF features (for a "
             "pair (u, v): u, v, |u − v| and u ∗ v), its C picked on dev. Like the best epoch above, that makes its "
             "dev score slightly optimistic."]
    lines += _pretraining_lines(pretrained, shared) if pretrained else []
    for task in tasks:
        mine = [r for r in rows if r["task"] == task.name]
        own = "".join(f", {k.replace('_', ' ')} {v:g}" for k, v in task.options.items())
        differ = _own_settings(mine, {**options, **task.options}, shared)
        lines += ["", f"## {task.name}", "",
                  f"`{task.train}` → `{task.dev}`, {task.text_column}"
                  f"{f' + {task.pair_column}' if task.pair_column else ''} → {task.label_column}"
                  f"{f'; fine-tuning for this task{own}' if own else ''}; TF-IDF C = "
                  f"{next(r['C'] for r in mine if r['kind'] == 'tf-idf'):g}."
                  f"{f' Fine-tuned otherwise: {differ}.' if differ else ''}", "",
                  "| " + " | ".join(COLUMNS.values()) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(_cells(r, shared)) + " |" for r in mine]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    _chart(rows, [t.name for t in tasks], [_short(r["approach"], shared) for r in rows], out / "results.png")


def _chart(rows: list[dict], tasks: list[str], names: list[str], path: Path) -> None:
    """Dev accuracy per approach, one panel per task; baselines hatched, TF-IDF's score a dashed line."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    per_task = max(sum(r["task"] == t for r in rows) for t in tasks)
    fig = Figure(figsize=(8, 1.2 + len(tasks) * (0.8 + 0.35 * per_task)), layout="constrained")
    for ax, task in zip(fig.subplots(len(tasks), 1, squeeze=False)[:, 0], tasks):
        mine = [(r, name) for r, name in zip(rows, names) if r["task"] == task]
        for i, (r, _) in enumerate(mine):
            colour, hatch = KINDS[r["kind"]]
            ax.barh(i, r["dev_accuracy"], color=colour, hatch=hatch, edgecolor="#333333")
            ax.text(r["dev_accuracy"], i, f" {r['dev_accuracy']:.3f}", va="center", fontsize=8)
            if r["kind"] == "tf-idf":
                ax.axvline(r["dev_accuracy"], color=colour, linestyle="--", linewidth=1)
        ax.set_yticks(range(len(mine)), [name for _, name in mine])
        ax.invert_yaxis()
        ax.set_xlim(0, 1.1)
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("dev accuracy", fontsize=8)
        ax.tick_params(labelsize=8)
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    fig.legend(handles=[Patch(facecolor=KINDS[k][0], hatch=KINDS[k][1], edgecolor="#333333", label=k) for k in kinds],
               loc="outside lower center", ncols=len(kinds), fontsize=8)
    fig.savefig(path, dpi=120)
