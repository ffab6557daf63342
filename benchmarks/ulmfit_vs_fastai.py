"""ULMFiT traced against fastai: sesame's classifier recipe and fastai's, stage by stage, on airline sentiment.

Both libraries fine-tune an AWD-LSTM classifier (3 layers, sesame's ``--size``: mini is embedding 200, hidden
400) with ULMFiT's recipe on airline train (text → airline_sentiment), evaluated on airline dev, from three
starting points:

* ``scratch``: a random AWD-LSTM (both libraries initialise it alike: embeddings U(−0.1, 0.1), PyTorch's LSTMs);
* ``fastai-lm`` (the table's "fastai's LM"): both libraries from the same start, fastai's LM below, its encoder
  renamed into a sesame run for sesame's classifier, so only the classifier recipes differ;
* ``pretrained`` (the table's "own LM"): a language model each library pre-trains on WikiText-2 train for the
  same wall time (``--lm-minutes``): sesame with ``sesame ulmfit``'s stage (a) (``sesame pretrain --family ulmfit``: AdamW
  3e-3, linear decay, the family's dropouts, variable-length BPTT), fastai with ``fit_one_cycle`` as its
  ``train_wt103.py`` does (lr 1e-2, drop_mult 0.1, weight decay 0.1, moms 0.8/0.7/0.8, AR/TAR), timed by the
  same clock. Neither fine-tunes the LM on the tweets first (ULMFiT's stage b): the classifier starts from the
  general LM, the same vocabulary on both sides.

The same tokens: fastai reads the ids sesame's word tokenizer gives (the classifier's inputs ``</s> text``, cut at
``--max-length``; the LM's WikiText-2 stream from sesame's shards, documents ending in ``</s>``), so only the
training recipes differ. The recipes, each its library's own:

* sesame (``sesame.apps.ulmfit.classifier_recipe``): 5 epochs, the head alone, then one more layer group per
  epoch (LSTM 3, 2, 1, embeddings), rates ÷2.6 per group under a peak of 0.01, one slanted triangle per epoch,
  AdamW (0.9, 0.999), AWD-LSTM's five dropouts × ``--drop-mult``, length-bucketed batches of 64;
* fastai (its ULMFiT notebook, ``text_classifier_learner`` with ``drop_mult`` = ``--drop-mult``): ``fit_one_cycle``
  per stage, the head alone at 2e-2, then ``freeze_to(-2)`` at slice(1e-2/2.6⁴, 1e-2), ``freeze_to(-3)`` at 5e-3,
  ``unfreeze()`` at 1e-3 for ``--epochs`` − 3 epochs (LSTM 1 and the embeddings together); Adam (moms 0.8, 0.7,
  0.8; β2 0.99), AR/TAR, batches of 64 sorted by length, padded first and read in BPTT chunks of 72.

``--drop-mult`` (default 0.5: fastai's text classifier's and ``sesame ulmfit``'s) scales both classifiers'
dropouts alike, so the collapse at ``drop_mult`` 1 can be rerun beside the default (each in its own ``--out``: it
is one of the recorded settings). Per stage, the dev accuracy after it and the wall time so far: head only,
+LSTM 3, +LSTM 2, all (sesame's epoch 5, fastai's last). Finished stages are kept in ``OUT/results.json``, so an
interrupted run continues; ``--write-docs`` writes the table into docs/ulmfit.md between the ``ulmfit-vs-fastai``
markers (the one table there: the default's).

    pip install -c constraints.txt -e '.[fastai]'
    python benchmarks/ulmfit_vs_fastai.py --out runs/ulmfit-vs-fastai --seeds 0 1 --write-docs   # about 65 minutes
    python benchmarks/ulmfit_vs_fastai.py --out runs/ulmfit-vs-fastai-dm1 --drop-mult 1    # the dropouts unscaled
    python benchmarks/ulmfit_vs_fastai.py --out /tmp/smoke --smoke                    # tiny data (see below)

Measured on 2 quiet cores (2026-11-27): the two LMs of ``--lm-minutes`` 20 each, then per seed five
classifiers of 5 epochs on 11,712 tweets of about 2 to 3 minutes each (sesame's and fastai's alike). The smoke run takes about 30 s of one core (4 minutes of wall time
on a loaded 2-core machine).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from recorded import mean_sd, open_record, replace_block, stage  # noqa: E402

from sesame import api  # noqa: E402
from sesame.apps.ulmfit import CLASSIFIER_DROP_MULT, DISCRIMINATIVE, FAMILY, classifier_recipe  # noqa: E402
from sesame.data.shards import Shards  # noqa: E402
from sesame.errors import SesameError  # noqa: E402
from sesame.families import RECURRENT_SIZES, recurrent_dropouts  # noqa: E402
from sesame.pipelines.stages import NO_STEP_CAP  # noqa: E402
from sesame.run import load_tokenizer, read_config  # noqa: E402
from sesame.tasks import make_task  # noqa: E402

DATA = Path(os.environ.get("SESAME_DATA", Path(__file__).parents[1] / "../shared/data"))
TEXT, LABEL = "text", "airline_sentiment"
TABLE = "ulmfit-vs-fastai"
STAGES = ("head only", "+LSTM 3", "+LSTM 2", "all")
SESAME_EPOCH = {"head only": 1, "+LSTM 3": 2, "+LSTM 2": 3}  # "all": the last epoch
# fastai's ULMFiT notebook: (freeze_to, peak rate) per stage, the lowest group at peak / 2.6⁴
FASTAI_STAGES = ((-1, 2e-2), (-2, 1e-2), (-3, 5e-3), (0, 1e-3))
FASTAI_LM = {"lr": 1e-2, "drop_mult": 0.1, "wd": 0.1}  # fastai's train_wt103.py
LAYERS = 3
# the table's starting points: random weights; each library's own LM; fastai's LM for both (converted for sesame)
STARTS = {"scratch": "scratch", "pretrained": "own LM", "fastai-lm": "fastai's LM"}
FASTAI_RUN = {"scratch": "scratch", "pretrained": "pretrained", "fastai-lm": "pretrained"}  # fastai's side of each
OUTPUT_DROPOUT = 0.4  # sesame's classifier output dropout (sesame ulmfit's --dropout), before --drop-mult
# the real run, and the smoke run: a few hundred tweets and WikiText-2 lines, a tiny model, seconds of LM
FULL = {"size": "mini", "vocab_size": 30000, "seq_len": 70, "batch_size": 64, "max_length": 128, "classifier_lr": 1e-2}
SMOKE = {"size": "tiny", "vocab_size": 2000, "seq_len": 16, "batch_size": 16, "max_length": 32, "classifier_lr": 1e-2}


def smoke_data(out: Path) -> dict[str, Path]:
    """The first 240 airline training tweets, 80 dev tweets, 600 lines of WikiText-2 train and 100 of valid."""
    folder = out / "smoke-data"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, source, n in (("train", "airline/train.csv", 241), ("dev", "airline/dev.csv", 81),
                            ("corpus", "wikitext2/train.txt", 600), ("valid", "wikitext2/valid.txt", 100)):
        paths[name] = folder / f"{name}{Path(source).suffix}"
        if not paths[name].exists():
            with (DATA / source).open(encoding="utf-8", newline="") as f:
                lines = [line for _, line in zip(range(n), f)] if source.endswith(".txt") else None
                if lines is None:
                    reader = csv.reader(f)
                    rows = [row for _, row in zip(range(n), reader)]
            if lines is not None:
                paths[name].write_text("".join(lines), encoding="utf-8")
            else:
                with paths[name].open("w", encoding="utf-8", newline="") as f:
                    csv.writer(f).writerows(rows)
    return paths


def real_data() -> dict[str, Path]:
    return {"train": DATA / "airline/train.csv", "dev": DATA / "airline/dev.csv",
            "corpus": DATA / "wikitext2/train.txt", "valid": DATA / "wikitext2/valid.txt"}


# -- sesame --------------------------------------------------------------------------------------------------

def sesame_lm(data: dict[str, Path], run: Path, settings: dict, minutes: float, seed: int) -> dict:
    """``sesame ulmfit``'s stage (a): the general-domain LM for ``minutes`` of wall time."""
    dev = api.pretrain([str(data["corpus"])], str(run), family=FAMILY, size=settings["size"],
                       vocab_size=settings["vocab_size"], seq_len=settings["seq_len"], valid=[str(data["valid"])],
                       max_minutes=minutes, max_steps=NO_STEP_CAP, batch_size=settings["batch_size"], seed=seed,
                       progress=False, resume=(run / "config.json").is_file())  # an interrupted run continues
    return {"dev_loss": dev["loss"], "perplexity": float(np.exp(dev["loss"]))}


def sesame_classifier(base: str, data: dict[str, Path], run: Path, settings: dict, epochs: int, seed: int, *,
                      drop_mult: float) -> dict:
    """sesame's classifier recipe from ``base``, AWD-LSTM's dropouts times ``drop_mult``; each epoch's dev accuracy
    and the seconds spent by then."""
    recipe = {**classifier_recipe(epochs=epochs, lr=settings["classifier_lr"], dropout=OUTPUT_DROPOUT),
              "drop_mult": drop_mult}
    api.finetune(base, str(data["train"]), str(data["dev"]), str(run), text_column=TEXT, label_column=LABEL,
                 max_length=settings["max_length"], batch_size=settings["batch_size"], seed=seed, progress=False,
                 resume=(run / "config.json").is_file(), **recipe)
    evaluations = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    epochs_seen = [e for e in evaluations if e["split"] == "dev"]
    stages = {name: epochs_seen[SESAME_EPOCH.get(name, len(epochs_seen)) - 1] for name in STAGES}
    return {"stages": {name: {"accuracy": e["accuracy"], "seconds": e["elapsed"]} for name, e in stages.items()},
            "epochs": [e["accuracy"] for e in epochs_seen]}


def encoded(run: Path, data: dict[str, Path], max_length: int) -> dict:
    """The classifier inputs of sesame's run ``run`` (its tokenizer, ``</s> text`` cut at ``max_length``) and the
    label indices, for train and dev: exactly what sesame trained on."""
    job = make_task("classify", {"text_column": TEXT, "label_column": LABEL})
    tok, labels = load_tokenizer(run), json.loads((run / "labels.json").read_text())
    splits = {}
    for split in ("train", "dev"):
        features = job.features(job.read(str(data[split])), tok, max_length, labels, True)
        splits[split] = [(f["ids"], f["target"]) for f in features]
    return {**splits, "vocab_size": tok.vocab_size, "pad": tok.specials.pad, "labels": labels}


# -- fastai --------------------------------------------------------------------------------------------------

def fastai_config(kind: str, size: str, pad: int) -> dict:
    """fastai's AWD_LSTM configuration (``awd_lstm_lm_config`` or ``awd_lstm_clas_config``) at sesame's ``size``."""
    from fastai.text.all import awd_lstm_clas_config, awd_lstm_lm_config

    emb, hidden = RECURRENT_SIZES[size]
    base = awd_lstm_lm_config if kind == "lm" else awd_lstm_clas_config
    return {**base, "emb_sz": emb, "n_hid": hidden, "n_layers": LAYERS, "pad_token": pad}


def fastai_lm(sesame_run: Path, out: Path, settings: dict, minutes: float, seed: int) -> dict:
    """A fastai AWD-LSTM LM trained with one cycle over ``minutes`` of wall time (the cycle's position is the share
    of the time spent, as sesame's time budget sets its schedule) on the token stream of sesame's shards of the
    same corpus; its encoder saved to ``out/encoder.safetensors``."""
    from fastai.text.all import (AWD_LSTM, CancelFitException, CrossEntropyLossFlat, DataLoaders, LMDataLoader,
                                 LMLearner, ParamScheduler, awd_lstm_lm_split, combined_cos, get_language_model,
                                 set_seed)
    from safetensors.torch import save_file

    config, tok = read_config(sesame_run, "--lm"), load_tokenizer(sesame_run)

    def documents(path: str) -> list[torch.Tensor]:
        shards = Shards(path)
        stream = np.concatenate(shards.arrays).astype(np.int64)
        return [torch.from_numpy(doc) for doc in np.split(stream, shards.doc_ends[:-1]) if len(doc)]

    set_seed(seed)
    bs, seq_len = settings["batch_size"], settings["seq_len"]
    train, valid = documents(config.pretrained.shards), documents(config.pretrained.valid_shards)
    dls = DataLoaders(LMDataLoader(train, bs=bs, seq_len=seq_len, shuffle=True),
                      LMDataLoader(valid, bs=bs, seq_len=seq_len), device=torch.device("cpu"))
    model = get_language_model(AWD_LSTM, tok.vocab_size, config=fastai_config("lm", settings["size"], tok.specials.pad),
                               drop_mult=FASTAI_LM["drop_mult"])
    learn = LMLearner(dls, model, loss_func=CrossEntropyLossFlat(), splitter=awd_lstm_lm_split,
                      moms=(0.8, 0.7, 0.8))
    seconds, lr = 60 * minutes, FASTAI_LM["lr"]

    class TimedOneCycle(ParamScheduler):
        """fit_one_cycle's schedules (cosine up over 25%, then down), at the share of the time budget spent."""

        def before_fit(self) -> None:
            super().before_fit()
            self.started = time.time()

        def before_batch(self) -> None:
            spent = (time.time() - self.started) / seconds
            if spent >= 1:
                raise CancelFitException
            self._update_val(spent)

    schedule = TimedOneCycle({"lr": combined_cos(0.25, lr / 25, lr, lr / 1e5), "mom": combined_cos(0.25, 0.8, 0.7, 0.8)})
    started = time.time()
    with learn.no_bar(), learn.no_logging():
        learn.fit(10_000, lr, wd=FASTAI_LM["wd"], cbs=schedule)
        steps, seconds_spent = learn.train_iter, time.time() - started
        loss = float(learn.validate()[0])
    encoder = {k: v.detach().clone().contiguous() for k, v in learn.model[0].state_dict().items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(encoder, str(out / "encoder.safetensors"))
    return {"dev_loss": loss, "perplexity": float(np.exp(loss)), "seconds": round(seconds_spent, 1), "steps": steps}


def sesame_run_of_fastai_lm(sesame_run: Path, encoder: Path, out: Path) -> Path:
    """A sesame pretrained run (``out``) holding fastai's LM encoder ``encoder``: ``sesame_run``'s configuration and
    tokenizer (the same vocabulary, sizes and dropouts), the weights renamed (fastai's WeightDropout keeps the LSTM's
    hidden-to-hidden matrix as ``weight_hh_l0_raw``; the embedding-dropout wrapper's copy is the same tensor). Both
    are PyTorch LSTMs, so the gate order is the same."""
    from safetensors.torch import load_file

    from sesame.train.checkpoint import load_weights, save_weights

    if (out / "model.safetensors").is_file():
        return out
    fastai = load_file(str(encoder))
    renamed = {"backbone.embed.tokens.weight": fastai["encoder.weight"]}
    for key, tensor in fastai.items():
        if key.startswith("rnns."):
            layer, name = key.split(".")[1], key.split(".")[-1].removesuffix("_raw")
            renamed[f"backbone.layers.{layer}.rnn.{name}"] = tensor
    own = load_weights(sesame_run / "model.safetensors")
    if {k: v.shape for k, v in renamed.items()} != {k: v.shape for k, v in own.items()}:
        raise SystemExit(f"{encoder}: fastai's encoder does not map onto {sesame_run}'s weights one to one")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json"):
        (out / name).write_bytes((sesame_run / name).read_bytes())
    save_weights(out / "model.safetensors", renamed)
    return out


def fastai_classifier(inputs: dict, encoder: Path | None, settings: dict, epochs: int, seed: int, *,
                      drop_mult: float) -> dict:
    """fastai's ULMFiT classifier recipe (module docstring) on sesame's ``inputs``, from ``encoder`` (a saved
    fastai LM encoder) or from random weights, AWD-LSTM's dropouts times ``drop_mult``; each stage's dev accuracy
    and the seconds spent by its end."""
    from fastai.text.all import (AWD_LSTM, CrossEntropyLossFlat, DataLoaders, SortedDL, TensorText, TextLearner,
                                 accuracy, awd_lstm_clas_split, get_text_classifier, pad_input_chunk, set_seed)
    from safetensors.torch import load_file

    set_seed(seed)
    pad, bs = inputs["pad"], settings["batch_size"]

    def items(split: str) -> list[tuple]:
        return [(TensorText(torch.tensor(ids)), torch.tensor(target)) for ids, target in inputs[split]]

    before = partial(pad_input_chunk, pad_idx=pad, pad_first=True, seq_len=72)
    dls = DataLoaders(SortedDL(items("train"), bs=bs, shuffle=True, drop_last=True, before_batch=before),
                      SortedDL(items("dev"), bs=2 * bs, before_batch=before), device=torch.device("cpu"))
    model = get_text_classifier(AWD_LSTM, inputs["vocab_size"], len(inputs["labels"]),
                                config=fastai_config("classifier", settings["size"], pad),
                                drop_mult=drop_mult, pad_idx=pad)
    if encoder is not None:
        model[0].module.load_state_dict(load_file(str(encoder)))
    learn = TextLearner(dls, model, splitter=awd_lstm_clas_split, loss_func=CrossEntropyLossFlat(), metrics=accuracy)
    started, stages, seen = time.time(), {}, []
    with learn.no_bar(), learn.no_logging():
        for name, (groups, lr) in zip(STAGES, FASTAI_STAGES):
            learn.freeze_to(groups)
            n = epochs - 3 if name == "all" else 1
            learn.fit_one_cycle(n, lr if groups == -1 else slice(lr / DISCRIMINATIVE ** 4, lr))
            seen += [float(v[2]) for v in learn.recorder.values[-n:]]
            stages[name] = {"accuracy": seen[-1], "seconds": round(time.time() - started, 1)}
    return {"stages": stages, "epochs": seen}


# -- the table -----------------------------------------------------------------------------------------------

def cell(runs: list[dict], stage_name: str, key: str) -> str:
    values = [r["stages"][stage_name][key] for r in runs]
    if key == "seconds":
        return f"{mean_sd(values)[0]:.0f} s"
    mean, sd = mean_sd([100 * v for v in values])
    return f"{mean:.1f}" + (f" ± {sd:.1f}" if len(values) > 1 else "")


def table(results: dict, seeds: list[int], majority: float) -> list[str]:
    lines = ["| start | stage | sesame accuracy | fastai accuracy | sesame time | fastai time |",
             "|---|---|---|---|---|---|"]
    for side in ("sesame", "fastai"):
        lm = results.get(f"lm/{side}")
        if lm:
            lines.append(f"| LM ({side}) | WikiText-2 valid perplexity {lm['perplexity']:.0f} | | | | |")
    for start, label in STARTS.items():
        runs = {side: [results[f"{start if side == 'sesame' else FASTAI_RUN[start]}/{side}/{s}"] for s in seeds]
                for side in ("sesame", "fastai")}
        for name in STAGES:
            lines.append(f"| {label} | {name} | {cell(runs['sesame'], name, 'accuracy')} | "
                         f"{cell(runs['fastai'], name, 'accuracy')} | {cell(runs['sesame'], name, 'seconds')} | "
                         f"{cell(runs['fastai'], name, 'seconds')} |")
    seeds_said = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean ± sd over seeds {', '.join(map(str, seeds))}"
    return lines + ["", f"Airline dev accuracy (%; majority class {100 * majority:.1f}), {seeds_said}; both "
                        f"classifiers' dropouts x {results['settings']['drop_mult']:g} (--drop-mult)."]


def majority_share(path: Path) -> float:
    with path.open(encoding="utf-8", newline="") as f:
        labels = [row[LABEL] for row in csv.DictReader(f)]
    return max(labels.count(x) for x in set(labels)) / len(labels)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder of the runs and results.json; rerun to continue")
    parser.add_argument("--lm-minutes", type=float, default=20.0, help="each library's LM pre-training time")
    parser.add_argument("--epochs", type=int, default=5, help="classifier epochs (at least 5: head, 3 LSTMs, all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="classifier seeds (the LMs use the first)")
    parser.add_argument("--drop-mult", type=float, default=CLASSIFIER_DROP_MULT,
                        help="both classifiers' multiplier of AWD-LSTM's five dropouts (fastai's drop_mult; default "
                             f"{CLASSIFIER_DROP_MULT:g}, fastai's text classifier's and sesame ulmfit's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--smoke", action="store_true", help="tiny data and model, seconds of LM: a check that it runs")
    parser.add_argument("--write-docs", action="store_true", help=f"write the table into docs/ulmfit.md ({TABLE})")
    args = parser.parse_args(argv)
    if args.epochs < 5:
        parser.error("--epochs: at least 5, so gradual unfreezing reaches every layer group")
    try:  # sesame's rule, before the LMs train rather than at the first classifier
        recurrent_dropouts(FAMILY, OUTPUT_DROPOUT, args.drop_mult, arch="recurrent", what="the classifier")
    except SesameError as error:
        parser.error(str(error))
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    settings, minutes = (SMOKE, 0.05) if args.smoke else (FULL, args.lm_minutes)
    data = smoke_data(out) if args.smoke else real_data()
    record, results = open_record(out)
    made = {**settings, "lm_minutes": minutes, "epochs": args.epochs, "drop_mult": args.drop_mult}
    recorded = results.setdefault("settings", made)
    recorded.setdefault("drop_mult", CLASSIFIER_DROP_MULT)  # what runs recorded before --drop-mult existed used
    if recorded != made:
        parser.error(f"--out {out}: made with other settings ({results['settings']}); choose another --out")

    sesame_run, fastai_run = out / "sesame-lm", out / "fastai-lm"
    stage(results, "lm/sesame", record, lambda: sesame_lm(data, sesame_run, settings, minutes, args.seeds[0]))
    stage(results, "lm/fastai", record, lambda: fastai_lm(sesame_run, fastai_run, settings, minutes, args.seeds[0]))
    for start, base, encoder in (("scratch", f"scratch:{FAMILY}:{settings['size']}", None),
                                 ("pretrained", str(sesame_run), fastai_run / "encoder.safetensors")):
        for seed in args.seeds:
            run = out / f"{start}-sesame-{seed}"
            stage(results, f"{start}/sesame/{seed}", record,
                  lambda: sesame_classifier(base, data, run, settings, args.epochs, seed, drop_mult=args.drop_mult))
            stage(results, f"{start}/fastai/{seed}", record,
                  lambda: fastai_classifier(encoded(run, data, settings["max_length"]), encoder, settings,
                                            args.epochs, seed, drop_mult=args.drop_mult))
    for seed in args.seeds:  # fastai's side from its own LM is the pretrained row's: the same start, the same seed
        stage(results, f"fastai-lm/sesame/{seed}", record, lambda: sesame_classifier(
            str(sesame_run_of_fastai_lm(sesame_run, fastai_run / "encoder.safetensors", fastai_run / "as-sesame")),
            data, out / f"fastai-lm-sesame-{seed}", settings, args.epochs, seed, drop_mult=args.drop_mult))
    lines = table(results, args.seeds, majority_share(data["dev"]))
    command = "python benchmarks/ulmfit_vs_fastai.py --out OUT" + (
        f" --lm-minutes {args.lm_minutes:g} --epochs {args.epochs} --seeds {' '.join(map(str, args.seeds))}"
        f" --drop-mult {args.drop_mult:g}")
    if args.write_docs:
        replace_block(Path(__file__).parents[1] / "docs/ulmfit.md", TABLE, ["", f"`{command}`", "", *lines, ""])
    print("\n".join(lines))
    return results


if __name__ == "__main__":
    main()
