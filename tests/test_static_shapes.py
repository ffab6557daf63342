"""Static shapes for --compile: the masked positions of a batch padded to a count fixed by its shape (as cramming's
sparse prediction), with the same selection, the same loss and the same gradients as unpadded, and one compiled
graph across batches whose masked counts differ (sesame/objectives/mlm.py, docs/devices.md)."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

from sesame.models import Transformer, TransformerConfig
from sesame.objectives.electra import Electra
from sesame.objectives.masking import mask_tokens
from sesame.objectives.mlm import IGNORE, PAD_MULTIPLE, MaskedLM, fixed_count, masked_entries
from sesame.objectives.span import SpanBERT
from sesame.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 60
STARTS = torch.arange(VOCAB) % 3 == 0  # every third id begins a word
PER_TARGET = ("positions", "targets", "left", "right", "offsets")  # the padded fields of a batch


def backbone() -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=VOCAB, hidden=32, layers=1, heads=2, intermediate=64,
                                         dropout=0.0, max_positions=64))


OBJECTIVES = {
    "token": lambda: MaskedLM(backbone(), SPECIALS),
    "whole_word": lambda: MaskedLM(backbone(), SPECIALS, masking="whole_word", word_starts=STARTS),
    "span": lambda: SpanBERT(backbone(), SPECIALS, STARTS),
    "electra": lambda: Electra(backbone(), SPECIALS, generator_fraction=0.5),
}


def windows(seed: int) -> torch.Tensor:
    return torch.randint(5, VOCAB, (4, 30), generator=torch.Generator().manual_seed(seed))


def batch_of(obj, seed: int) -> dict:
    return obj.make_batch(windows(seed), [torch.Generator().manual_seed(100 * seed + i) for i in range(4)])


def unpadded(batch: dict) -> dict:
    return {**batch, **{key: masked_entries(batch, key) for key in PER_TARGET if key in batch}}


def loss_and_grads(obj, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    obj.zero_grad(set_to_none=True)
    out = obj(batch)
    loss = sum(out.values()) if isinstance(out, dict) else out
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in obj.named_parameters() if p.grad is not None}


def test_the_fixed_count_depends_on_the_shape_and_holds_every_selection() -> None:
    n, rate = 32 * 128, 0.15
    bound = fixed_count(n, rate, 0)
    mean, spread = rate * n, (n * rate * (1 - rate)) ** 0.5
    assert bound % PAD_MULTIPLE == 0 and mean + 4 * spread <= bound < mean + 4 * spread + PAD_MULTIPLE
    assert {fixed_count(n, rate, selected) for selected in (0, 500, 614, bound)} == {bound}
    assert fixed_count(n, rate, bound + 1) == bound + PAD_MULTIPLE  # a rare excess: the next multiple, none dropped
    assert fixed_count(0, rate, 0) == 0


@pytest.mark.parametrize("kind", OBJECTIVES)
def test_padding_keeps_the_selection_and_fills_with_ignored_entries(kind: str) -> None:
    obj = OBJECTIVES[kind]()
    batch = batch_of(obj, 0)
    n, size = batch["masked"], len(batch["positions"])
    assert size == fixed_count(batch["ids"].numel(), obj.rate, n) and 0 < n < size
    for key in PER_TARGET:
        assert key not in batch or len(batch[key]) == size
    assert (batch["targets"][n:] == IGNORE).all() and not batch["positions"][n:].any()
    assert (batch["targets"][:n] != IGNORE).all() and batch["positions"][:n].unique().numel() == n
    assert next(iter(batch["counts"].values())) == n


@pytest.mark.parametrize("kind, fractions", [("token", (0.8, 0.1)), ("electra", (1.0, 0.0))])
def test_the_selection_and_corruption_are_mask_tokens_own_draws(kind: str, fractions: tuple[float, float]) -> None:
    """The same Bernoulli(0.15) selection and 80/10/10 (ELECTRA: all [MASK]) as mask_tokens for the row's seed."""
    obj = OBJECTIVES[kind]()
    batch = batch_of(obj, 0)
    clean = torch.cat([torch.full((4, 1), SPECIALS.cls), windows(0), torch.full((4, 1), SPECIALS.sep)], 1)
    rows = [mask_tokens(row, obj.special_ids, SPECIALS.mask, VOCAB, torch.Generator().manual_seed(i), obj.rate,
                        *fractions) for i, row in enumerate(clean)]
    assert torch.equal(batch["ids"], torch.stack([corrupted for corrupted, _ in rows]))
    selected = torch.stack([chosen for _, chosen in rows]).flatten().nonzero().squeeze(1)
    assert torch.equal(masked_entries(batch, "positions"), selected)
    assert torch.equal(masked_entries(batch, "targets"), clean.flatten()[selected])


@pytest.mark.parametrize("kind", OBJECTIVES)
def test_loss_and_gradients_are_exactly_those_of_the_unpadded_batch(kind: str) -> None:
    obj = OBJECTIVES[kind]().train()
    batch = batch_of(obj, 1)
    assert len(batch["positions"]) > batch["masked"]  # some padding
    loss, grads = loss_and_grads(obj, batch)
    want_loss, want = loss_and_grads(obj, unpadded(batch))
    assert torch.equal(loss, want_loss)
    assert grads.keys() == want.keys() and grads
    for name in want:
        assert torch.equal(grads[name], want[name]), name


@pytest.mark.parametrize("kind", ["token", "span"])
def test_a_compiled_step_sees_one_shape_across_masked_counts(kind: str) -> None:
    """Dynamo's own counter: the graphs are compiled for the first batch only, though the masked counts differ
    (without the padding, the second count recompiles the gather)."""
    obj = OBJECTIVES[kind]().train()
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(obj, backend=counter)
    counts, frames = set(), []
    try:
        for seed in range(4):
            batch = batch_of(obj, seed)
            counts.add(batch["masked"])
            out = compiled(batch)
            (sum(out.values()) if isinstance(out, dict) else out).backward()
            frames.append(counter.frame_count)
    finally:
        torch._dynamo.reset()
    assert len(counts) > 1 and frames[0] > 0
    assert frames == [frames[0]] * 4
