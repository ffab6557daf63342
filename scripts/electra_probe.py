"""Has an ELECTRA run's discriminator learned anything? Replaced-token detection on held-out text.

Corrupts held-out windows exactly as pre-training does (the run's generator fills 15% of the tokens
with samples) and reports, over every position: the share of replaced tokens r, the discriminator's
loss next to the loss of the best constant guess (the binary entropy H(r)), the ROC AUC of its
scores (0.5: no better than chance), the same AUC among the masked positions alone (can it tell a
sample from a correct reconstruction?), and the generator's top-1 accuracy at the masked positions.

    python scripts/electra_probe.py --model runs/compare-15min/pretrain/electra-mini-... \
        --data ../shared/data/wikitext2/valid.txt
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from sesame.data.windows import Corpus, examples
from sesame.objectives import build_objective
from sesame.objectives.electra import Electra
from sesame.objectives.mlm import masked_entries
from sesame.run import build_backbone, load_tokenizer, read_config
from sesame.train.checkpoint import load_weights


def probe(model: str, data: list[str], windows: int = 256, batch_size: int = 32) -> dict:
    """The replaced-token-detection report of the ELECTRA run ``model`` on the first ``windows`` windows of ``data``."""
    config = read_config(model, "--model", ("pretrained",))
    tok = load_tokenizer(model, "--model")
    obj = build_objective(config.pretrained.objective, build_backbone(config), tok, config.pretrained.objective_options)
    if not isinstance(obj, Electra):
        raise SystemExit(f"--model {model}: an {config.pretrained.objective} run; this probe reads ELECTRA runs")
    obj.load_state_dict(load_weights(Path(model) / "model.safetensors"))
    obj.eval()
    scores, labels, masked, hits = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        shards = Corpus.of(data, "--data").shards(tok, Path(tmp) / "shards", progress=False)
        length = obj.window_length(config.pretrained.seq_len)
        all_windows = shards.windows(length)
        picks = list(range(min(windows, len(all_windows))))
        for start in range(0, len(picks), batch_size):
            idx = picks[start: start + batch_size]
            batch = examples(obj, shards, all_windows, idx, idx, length, seed=1)
            predicted = obj.predict(batch)
            logits = torch.addmm(obj.generator_bias, predicted, obj.backbone.embed.tokens.weight.t())
            hits.append(logits.argmax(1) == masked_entries(batch, "targets"))
            ids, replaced = obj.corrupt(batch, obj.sample(predicted, batch))
            scores.append(obj.discriminator_head(obj.backbone(ids)).squeeze(-1).flatten())
            labels.append(replaced.flatten())
            was_masked = torch.zeros(ids.numel(), dtype=torch.bool)
            was_masked[masked_entries(batch, "positions")] = True
            masked.append(was_masked)
    score, label, mask = torch.cat(scores), torch.cat(labels), torch.cat(masked)
    rate = label.mean().item()
    return {"positions": len(label), "masked_rate": mask.float().mean().item(), "replaced_rate": rate,
            "disc_loss": F.binary_cross_entropy_with_logits(score, label).item(),
            "constant_guess_loss": -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)) if 0 < rate < 1 else 0.0,
            "auc": roc_auc_score(label.numpy(), score.numpy()),
            "auc_masked_only": roc_auc_score(label[mask].numpy(), score[mask].numpy())
            if 0 < label[mask].mean() < 1 else None,
            "generator_accuracy": torch.cat(hits).float().mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an ELECTRA pre-training run")
    parser.add_argument("--data", nargs="+", required=True, help="held-out text")
    parser.add_argument("--windows", type=int, default=256)
    args = parser.parse_args()
    print(json.dumps(probe(args.model, args.data, args.windows), indent=1))


if __name__ == "__main__":
    main()
