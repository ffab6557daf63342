"""The ``xlnet`` step of ``benchmarks/train_step.py``: XLNet's permutation language model (Yang et al. 2019,
§2.2–2.4) in sesame (:class:`~sesame.objectives.plm.PermutationLM` over :class:`~sesame.models.xlnet.XLNet`) against
transformers' ``XLNetLMHeadModel``, on one configuration, the same weights, the same batch and the same permutations.

* Model: the xlnet family's mini (4 layers, hidden 256, 4 heads, feed-forward 1024; post-LayerNorm, GELU, relative
  positions and segments, two streams) with XLNet's vocabulary of 32000 tokens and its special ids (``<cls>`` 3,
  ``<sep>`` 4, ``<pad>`` 5, ``<mask>`` 6; windows are random ids above ``<eop>`` 8), dropout 0.1.
  transformers' ``XLNetConfig`` is the interop's (``sesame.interop.xlnet.hf_config``, what ``sesame convert``
  exports), its random initial weights are copied into sesame's model (``import_weights``, the LM head's bias too),
  so both sides start from one function.
* Batch: the family's default pre-training, batch 32 of ``segments`` = 2 consecutive segments of 128 tokens (126 of
  text, then ``<sep> <cls>``), K = 6 (the last 1/6 of each segment's sampled factorisation order is predicted, §2.3:
  21 targets a segment), the second segment reading the first's 126 text states as memory (``mem_len`` 128, the
  model's default; §2.4), the loss the mean over every segment's targets. sesame builds the batch
  (``PermutationLM.make_batch``: the orders from each row's generator) and its masks inside its step;
  transformers gets the same orders as XLNet's inputs, made once outside its step as a data collator would:
  ``perm_mask`` (1 where position i may not see j: j a target no earlier than i in the order), ``target_mapping``
  (the one-hot of the predicted positions), ``token_type_ids`` (``<cls>`` in segment 2) and ``labels``, with
  ``reuse_len`` 126 and ``mems`` from the first segment's call. Neither side replaces the inputs by ``<mask>``.
* Parity: before timing, both models without dropout must give the same loss on the step's batch (fp32, relative
  1e-4), :func:`~train_step_core.check_same_loss`.
* Dropout: transformers' also inside the feed-forward and on the last layer's output, where sesame's XLNet has none
  (``sesame.models.xlnet``'s deviations), so its step does a little more.

FLOPs (the conventions of ``train_step_core``) per segment of T = 128 tokens after M memory states, K = M + T keys,
R = K + T − 1 relative distances and P predicted positions, over L layers and the batch: the matrices of T content
and P query rows (q, o, feed-forward: 2h^2 + 2hI each) and of K key rows (k, v: 2h^2), 6x; attention 6h(2K + R) per
query row (content and position scores, weighted sum), for T content rows and P query rows in sesame, T query rows
in transformers (its query stream attends at every position, ``target_mapping`` moving P rows onto T and back:
12hPT more); the position keys 6Rh^2 once in sesame and per row in transformers (it expands the sinusoids over the
batch); the LM head 6hV per target. Segment terms, masks and the relative shift are not counted.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
import transformers

from sesame.interop.xlnet import hf_config, import_weights
from sesame.models.xlnet import XLNet, XLNetConfig, target_mapping
from sesame.objectives.plm import CLS_SEGMENT, ENDING, PermutationLM
from sesame.tokenizer import SpecialIds

sys.path.insert(0, str(Path(__file__).parent))
from train_step_core import (BenchConfig, Contender, Variant, check_same_loss, check_same_size,  # noqa: E402
                             contender, generators)

SPECIALS = SpecialIds(unk=0, cls=3, sep=4, pad=5, mask=6)  # XLNet's ids 0-8: <unk> <s> </s> <cls> <sep> <pad> <mask>
FIRST_PLAIN = 9  # above them and <eod> <eop>


def build_pair(cfg: BenchConfig, seed: int) -> tuple[PermutationLM, torch.nn.Module]:
    """sesame's ``PermutationLM`` (its defaults: K = 6, ``cfg.segments`` segments) over an ``XLNet`` of ``cfg``'s
    shape, and ``XLNetLMHeadModel`` of the configuration the interop derives from it (keeping the text of each
    segment as memory, ``reuse_len``), both with transformers' random initialisation (seeded), in training mode."""
    ours = XLNet(XLNetConfig(vocab_size=cfg.vocab_size, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                             intermediate=cfg.intermediate, dropout=cfg.dropout, pad_id=SPECIALS.pad))
    config = hf_config(ours.config.to_dict(), source={"reuse_len": cfg.seq_len - ENDING}, tokens=asdict(SPECIALS))
    torch.manual_seed(seed)
    theirs = transformers.XLNetLMHeadModel(transformers.AutoConfig.for_model(**config))
    ours.load_state_dict(import_weights(theirs.transformer.state_dict(), ours.config.to_dict(), "XLNetLMHeadModel"))
    objective = PermutationLM(ours, SPECIALS, segments=cfg.segments)
    with torch.no_grad():
        objective.bias.copy_(theirs.lm_loss.bias)
    return objective.train(), theirs.train()


def hf_segments(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """transformers' inputs for each segment of sesame's batch: the ids, segment ids (``<cls>`` last, in segment 2),
    ``perm_mask`` of the same orders (1: may not attend; a target hides from the positions no later than it in the
    order, itself included), ``target_mapping`` of the predicted positions and their tokens as ``labels``."""
    ids, rank, predict = batch["ids"], batch["rank"], batch["predict"]
    b, segments, length = ids.shape
    types = torch.zeros(b, length, dtype=torch.long, device=ids.device)
    types[:, -1] = CLS_SEGMENT
    inputs = []
    for s in range(segments):
        order = rank[:, s]
        hidden = (order >= 0)[:, None, :] & (order[:, None, :] >= order[:, :, None])
        inputs.append({"input_ids": ids[:, s].contiguous(), "token_type_ids": types, "perm_mask": hidden.float(),
                       "target_mapping": target_mapping(predict[:, s], length),
                       "labels": batch["targets"][:, s].contiguous()})
    return inputs


def hf_loss(forward: Callable, segments: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """The mean loss over every segment's targets, each segment after the memory of those before it."""
    mems, total = None, 0.0
    for s, inputs in enumerate(segments):
        out = forward(**inputs, mems=mems, use_mems=s + 1 < len(segments))
        total, mems = total + out.loss, out.mems
    return total / len(segments)


def xlnet_flops(cfg: BenchConfig, *, predicted: int, mem_len: int, every_query: bool, positions_per_row: bool
                ) -> float:
    """Training FLOPs of one step (the module docstring's count): ``predicted`` targets a segment, at most ``mem_len``
    states of memory; ``every_query``: the query stream attends at every position (transformers');
    ``positions_per_row``: the position keys are projected for each row of the batch (transformers')."""
    h, t, rows = cfg.hidden, cfg.seq_len, cfg.batch
    text, memory, flops = t - ENDING, 0, 0.0
    for _ in range(cfg.segments):
        keys = memory + t
        distances = keys + t - 1
        queries = t if every_query else predicted
        matrices = rows * ((t + predicted) * (2 * h * h + 2 * h * cfg.intermediate) + keys * 2 * h * h)
        attention = rows * h * (t + queries) * (2 * keys + distances)
        positions = distances * h * h * (rows if positions_per_row else 1)
        mapping = 2 * rows * predicted * t * h if every_query else 0
        head = h * cfg.vocab_size * rows * predicted
        flops += 6 * (cfg.layers * (matrices + attention + positions + mapping) + head)
        memory = min(memory + text, mem_len)
    return flops


def xlnet_contenders(cfg: BenchConfig, seed: int, variant: Variant) -> list[Contender]:
    """sesame's ``PermutationLM`` and ``XLNetLMHeadModel`` on one batch of sesame's orders of random windows, once
    both are shown to compute the same loss."""
    sesame, hf = build_pair(cfg, seed)
    check_same_size(sesame, hf)
    windows = torch.randint(FIRST_PLAIN, cfg.vocab_size, (cfg.batch, sesame.window_length(cfg.seq_len)),
                            generator=torch.Generator().manual_seed(seed))
    placement = variant.placement()
    batch = placement.move(sesame.make_batch(windows, generators(cfg.batch, seed)))
    segments = hf_segments(batch)
    n_targets = batch["targets"].numel()
    count = partial(xlnet_flops, cfg, predicted=batch["predict"].shape[-1], mem_len=sesame.backbone.config.mem_len)

    def ours(forward: Callable) -> torch.Tensor:
        return forward(batch).float() / n_targets

    def theirs(forward: Callable) -> torch.Tensor:
        return hf_loss(forward, segments)

    check_same_loss((placement.model(sesame), ours), (placement.model(hf), theirs))
    return [
        contender("sesame", variant, sesame, ours, count(every_query=False, positions_per_row=False)),
        contender("transformers", variant, hf, theirs, count(every_query=True, positions_per_row=True)),
    ]
