"""Does transformers' BART collapse too? A sesame ``bart`` run's pre-training replayed step by step, its model and
transformers' ``BartForConditionalGeneration`` side by side from the same initial weights, on the run's own
denoising batches with the run's recipe, then each asked whether its decoder reads its source.

The run gives everything: its config (model, objective, seed, peak rate, warmup, weight decay, clipping, batch,
steps), its tokenizer and its prepared shards. sesame's side is rebuilt as ``sesame pretrain`` built it (same seed),
so it repeats the run (its losses are the run's metrics.jsonl's, the check that this is a replay); transformers'
model gets the same weights (the interop's export) and the same batches, AdamW groups, schedule and clipping. Both
losses are printed every ``--every`` steps; at the end each side's source use on validation text, as
``scripts/source_use.py`` measures it: the loss with each row's own input, another row's and the clean text, and
the encoder states' spread over positions after the embeddings and after each layer. Equal losses on both sides
clear sesame's model of a collapse that transformers' model shows too. Dropout is the run's (``mini`` runs: 0), so
the two sides compute the same function; with dropout they draw different masks.

    python scripts/bart_vs_transformers.py runs/bart-lr1e-3 --valid ../shared/data/wikitext2/valid.txt
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from source_use import Batch, source_losses, spreads, valid_batch  # noqa: E402

from sesame.data.shards import Shards  # noqa: E402
from sesame.data.windows import training_windows, window_batches  # noqa: E402
from sesame.interop.encoder_decoder import export_weights, hf_config  # noqa: E402
from sesame.objectives import build_objective  # noqa: E402
from sesame.run import build_backbone, load_tokenizer, read_config  # noqa: E402
from sesame.train import TrainConfig  # noqa: E402
from sesame.train.optim import adamw  # noqa: E402
from sesame.train.trainer import mean_loss  # noqa: E402


def transformers_twin(backbone: nn.Module, specials: dict[str, int]) -> nn.Module:
    """transformers' ``BartForConditionalGeneration`` of ``backbone``'s config (the interop's, attention weights
    dropped at the model's dropout as sesame drops them) with its weights, in training mode."""
    import transformers

    config = hf_config(backbone.config.to_dict(), "bart", source={"attention_dropout": backbone.config.dropout},
                       tokens=specials)
    twin = transformers.BartForConditionalGeneration(transformers.AutoConfig.for_model(**config,
                                                                                         attn_implementation="sdpa"))
    twin.load_state_dict(export_weights("bart", backbone.state_dict(), backbone), strict=False)  # lm_head: tied
    return twin.train()


def summed_loss(twin: nn.Module, pad: int):
    """``twin``'s summed cross-entropy of a batch's targets (pad ignored), as sesame's objective returns it."""
    def loss(batch: Batch) -> torch.Tensor:
        labels = batch["targets"].masked_fill(batch["targets"] == pad, -100)
        out = twin(input_ids=batch["ids"], attention_mask=batch["padding"], labels=labels)
        return out.loss * int((labels != -100).sum())
    return loss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a pre-trained bart run (denoising), with its shards")
    parser.add_argument("--valid", required=True, help="validation text for the source use")
    parser.add_argument("--steps", type=int, help="steps replayed (default: the run's --max-steps)")
    parser.add_argument("--every", type=int, default=10, help="print both losses every this many steps (10)")
    parser.add_argument("--rows", type=int, default=16, help="validation windows scored (default 16)")
    args = parser.parse_args(argv)

    config = read_config(args.run, "run", ("pretrained",))
    part = config.pretrained
    if part.objective != "denoising" or config.family != "bart":
        parser.error(f"run {args.run}: a {config.family} run of {part.objective}; give a bart denoising run")
    cfg = TrainConfig(**config.train)
    if args.steps is None and cfg.max_minutes:
        parser.error(f"run {args.run}: trained to a time budget; give --steps")
    steps = args.steps or cfg.max_steps
    tokenizer, pad = load_tokenizer(args.run, "run"), config.model.pad_id
    torch.manual_seed(cfg.seed)  # as sesame pretrain builds its model
    objective = build_objective(part.objective, build_backbone(config), tokenizer, part.objective_options)
    twin = transformers_twin(objective.backbone, asdict(tokenizer.specials))
    length = objective.window_length(part.seq_len, **part.objective_options)
    shards = Shards(part.shards)
    windows, _, _ = training_windows(shards, Shards(part.valid_shards) if part.valid_shards else None,
                                     length=length, seq_len=part.seq_len)
    batches = window_batches(objective, shards, [(length, windows)], cfg)
    sides = {"sesame": (objective, lambda batch: mean_loss(objective, batch)),
             "transformers": (twin, lambda batch: summed_loss(twin, pad)(batch) / batch["targets"].numel())}
    optimizers = {name: adamw(model, cfg.lr, cfg.weight_decay) for name, (model, _) in sides.items()}
    print(json.dumps({"run": str(args.run), "steps": steps, "lr": cfg.lr, "warmup": cfg.warmup,
                      "batch_size": cfg.batch_size, "seq_len": part.seq_len}), flush=True)
    for step in range(steps):
        progress = step / steps
        (batch,) = batches(step, progress)
        losses = {}
        for name, (model, loss_of) in sides.items():
            optimizer = optimizers[name]
            for group in optimizer.param_groups:
                group["lr"] = group["base_lr"] * cfg.rate(progress)
            loss = loss_of(batch)
            loss.backward()
            if cfg.clip:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[name] = round(loss.item(), 5)
        if step == 0 or (step + 1) % args.every == 0:
            print(json.dumps({"step": step + 1, **losses}), flush=True)

    objective.eval(), twin.eval()
    batch = valid_batch(objective, tokenizer, path=args.valid, rows=args.rows, chars=200_000,
                        seq_len=part.seq_len)
    for name, loss_sum in (("sesame", objective), ("transformers", summed_loss(twin, pad))):
        losses = source_losses(loss_sum, batch, pad=pad, clean=True)
        print(f"{name}: loss per target token, " + ", ".join(f"{k} {v:.4f}" for k, v in losses.items()))
    ids = batch["ids"][:1]
    with torch.no_grad():
        ours = objective.backbone.encoder_layers(ids)
        theirs = twin.model.encoder(input_ids=ids, output_hidden_states=True).hidden_states
    for name, states in (("sesame", [h[0] for h in ours]), ("transformers", [h[0] for h in theirs])):
        print(f"{name}: encoder states' spread over positions, embeddings then each layer: {spreads(states)}")


if __name__ == "__main__":
    main()
