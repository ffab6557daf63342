"""What the device tests share (tests/test_devices.py, test_trainer_runtime.py, test_devices_gpu.py): a tiny
pretraining run's settings, a run stopped and resumed, and every model command's line on tiny inputs
(conftest's ``command_inputs`` writes them with :func:`write_command_inputs`)."""
import json
from pathlib import Path

import pytest
import torch

import sesame
from sesame.tokenizer import train_tokenizer
from sesame.train import Interrupted, Trainer
from sesame.train.checkpoint import load_weights

from .conftest import sentences

TINY = dict(family="bert", size="tiny", vocab_size=200, seq_len=32, batch_size=8, eval_every=2, save_every=2,
            progress=False)


def stopped_at_2_then_resumed(corpus, out, monkeypatch, *, precision, device):
    """A 4-step run stopped after step 2 (as Ctrl-C stops it), then resumed without --precision."""
    original = Trainer._train_step

    def stop_after_two(self, wrapped):
        result = original(self, wrapped)
        self._stop_requested = self.step == 2
        return result

    monkeypatch.setattr(Trainer, "_train_step", stop_after_two)
    with pytest.raises(Interrupted, match="step 2"):
        sesame.pretrain([str(corpus)], str(out), max_steps=4, precision=precision, device=device, **TINY)
    monkeypatch.setattr(Trainer, "_train_step", original)
    sesame.pretrain([str(corpus)], str(out), max_steps=4, resume=True, device=device, **TINY)


def same_weights(a, b):
    a, b = load_weights(a / "model.safetensors"), load_weights(b / "model.safetensors")
    return all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def write_command_inputs(root: Path) -> None:
    """Tiny inputs of every command into ``root``: a GPT run, a labeled task (CSV, and as compare's JSON task), a
    corpus, a parallel corpus and a trained MT-LSTM run."""
    from sesame.apps.cove import CoveSpec, train_cove
    from sesame.families import backbone_config
    from sesame.run import PretrainedPart, RunConfig, write_config
    from sesame.train.checkpoint import save_weights

    tok = train_tokenizer(sentences(200), "bpe", 300)
    cfg = backbone_config("gpt", "tiny", tok.vocab_size, tok.specials.pad, 0.0, 64)
    gpt = root / "gpt"
    gpt.mkdir()
    tok.save(gpt / "tokenizer.json")
    save_weights(gpt / "model.safetensors", {"backbone." + k: v for k, v in sesame.models.Transformer(cfg)
                                             .state_dict().items()})
    write_config(gpt, RunConfig(kind="pretrained", family="gpt", size="tiny", model=cfg, pooling="last",
                                pretrained=PretrainedPart(objective="clm", seq_len=32)))
    (root / "corpus.txt").write_text("\n".join(sentences(200)) + "\n")
    for split, seed, n in (("train", 10, 48), ("dev", 11, 16)):
        (root / f"{split}.csv").write_text("text,label\n" + "".join(
            f'"{s}",{"animal" if {"cat", "dog"} & set(s.lower()[:-1].split()) else "none"}\n'
            for s in sentences(n, seed)))
    (root / "task.json").write_text(json.dumps({"name": "animals", "train": str(root / "train.csv"),
                                                "dev": str(root / "dev.csv")}))
    lines = "".join(f"{' '.join(s.lower().split()[:4])}\n" for s in sentences(60, 3))
    for name in ("src", "tgt"):
        (root / f"pairs.{name}").write_text(lines)
    pairs = {f"{split}_{side}": str(root / f"pairs.{side}") for split in ("train", "valid") for side in ("src", "tgt")}
    train_cove(CoveSpec(**pairs, out=str(root / "cove"), size="tiny", progress=False,
                        training=dict(max_steps=2, eval_every=2, batch_size=16)))


def command(name, root, out):
    """``name``'s command line on the tiny inputs, writing (if at all) into ``out``."""
    compare_approach = "gpt:tiny:seq_len=16:batch_size=8:vocab_size=200"
    return {
        "generate": ["generate", "--model", f"{root}/gpt", "--prompt", "The cat", "--prompt", "A dog",
                     "--max-new-tokens", "3", "--json"],
        "prompt-eval": ["prompt-eval", "--model", f"{root}/gpt", "--data", f"{root}/dev.csv", "--k", "0", "--json"],
        "neighbors": ["neighbors", "--model", f"{root}/gpt", "--word", "cat", "--corpus", f"{root}/corpus.txt",
                      "--json"],
        "translate": ["translate", "--model", f"{root}/cove", "--input", f"{root}/pairs.src", "--output", str(out)],
        "cove": ["cove", "--train-src", f"{root}/pairs.src", "--train-tgt", f"{root}/pairs.tgt", "--valid-src",
                 f"{root}/pairs.src", "--valid-tgt", f"{root}/pairs.tgt", "--out", str(out), "--size", "tiny",
                 "--max-steps", "2", "--eval-every", "2", "--batch-size", "16"],
        "ulmfit": ["ulmfit", "--train", f"{root}/train.csv", "--dev", f"{root}/dev.csv", "--corpus",
                   f"{root}/corpus.txt", "--out", str(out), "--size", "tiny", "--vocab-size", "100", "--seq-len", "16",
                   "--lm-steps", "2", "--target-epochs", "1", "--batch-size", "16", "--max-length", "24"],
        "compare": ["compare", "--approaches", compare_approach, "--corpus", f"{root}/corpus.txt", "--tasks",
                    f"{root}/task.json", "--out", str(out), "--minutes", "1", "--max-steps", "2", "--epochs", "1",
                    "--batch-size", "16", "--max-length", "24"],
        "demo": ["demo", "--out", str(out)],
    }[name]


COMMANDS = ("generate", "prompt-eval", "neighbors", "translate", "cove", "ulmfit", "compare", "demo")
