"""ELECTRA's replaced token detection (Clark et al. 2020): sampling, labels, sharing, gradients, loss."""
import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

import sesame
from sesame.errors import SesameError
from sesame.models import Transformer, TransformerConfig
from sesame.objectives.electra import Electra
from sesame.objectives.mlm import masked_entries
from sesame.tokenizer import SpecialIds
from sesame.train import mean_loss

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 60


def config(**kw) -> TransformerConfig:
    return TransformerConfig(**{"vocab_size": VOCAB, "hidden": 64, "layers": 2, "heads": 2, "intermediate": 128,
                                "max_positions": 64, "dropout": 0.0, **kw})


def electra(cfg: TransformerConfig | None = None, seed: int = 0, **options) -> Electra:
    torch.manual_seed(seed)
    return Electra(Transformer(cfg or config()), SPECIALS, **options)


def windows(n: int = 8, length: int = 30, seed: int = 0) -> torch.Tensor:
    """Rows counting up from a random start through 8 of the ordinary tokens: a skewed vocabulary, and each
    token follows from its neighbours."""
    starts = torch.randint(0, 8, (n, 1), generator=torch.Generator().manual_seed(seed))
    return (starts + torch.arange(length)) % 8 + 5


def batch_of(obj: Electra, rows: torch.Tensor, first: int = 0) -> dict[str, torch.Tensor]:
    return obj.make_batch(rows, [torch.Generator().manual_seed(first + i) for i in range(len(rows))])


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {k: (p.grad.clone() if p.grad is not None else None) for k, p in module.named_parameters()}


def test_masking_uses_mask_only_and_is_per_example():
    obj = electra()
    rows = windows(64)
    batch = batch_of(obj, rows)
    full = torch.cat([torch.full((64, 1), SPECIALS.cls), rows, torch.full((64, 1), SPECIALS.sep)], 1).flatten()
    flat = batch["ids"].flatten()
    selected = torch.zeros_like(flat, dtype=torch.bool)
    selected[masked_entries(batch, "positions")] = True
    assert (flat[selected] == SPECIALS.mask).all() and torch.equal(flat[~selected], full[~selected])
    assert torch.equal(masked_entries(batch, "targets"), full[selected])
    assert abs(selected.float().sum().item() / rows.numel() - 0.15) < 0.03
    assert batch["draws"].shape == batch["ids"].shape
    alone = batch_of(obj, rows[3:4], first=3)
    assert torch.equal(alone["ids"][0], batch["ids"][3]) and torch.equal(alone["draws"][0], batch["draws"][3])


def test_unchanged_leaves_that_share_of_the_selected_tokens_as_they_are():
    """The official code's masking (``pretrain_helpers.mask``): 85% of the selected tokens become [MASK], the rest
    stay; the generator predicts and D's labels cover all of them."""
    rows = windows(256)
    full = torch.cat([torch.full((256, 1), SPECIALS.cls), rows, torch.full((256, 1), SPECIALS.sep)], 1).flatten()
    batch = batch_of(electra(unchanged=0.15), rows)
    selected = batch["ids"].flatten()[masked_entries(batch, "positions")]
    assert torch.equal(masked_entries(batch, "targets")[selected != SPECIALS.mask], selected[selected != SPECIALS.mask])
    assert abs((selected != SPECIALS.mask).float().mean().item() - 0.15) < 0.04
    assert torch.equal(batch["ids"].flatten()[full == SPECIALS.mask], full[full == SPECIALS.mask])


def test_the_generator_learns_a_rule_from_context_with_tokens_left_unchanged():
    """Windows that count up through 8 tokens: each masked token follows from its neighbours. With 15% of the selected
    tokens left unchanged, as the official code does, G's masked-LM loss falls far under the unigram's ln 8 = 2.08
    (with every one masked it stays there for thousands of steps: the docstring's note)."""
    torch.manual_seed(0)
    obj = electra(config(hidden=32, heads=2, intermediate=64), generator_fraction=1.0, unchanged=0.15)
    opt = torch.optim.AdamW(obj.parameters(), lr=3e-3)
    losses = []
    for step in range(500):
        batch = batch_of(obj, windows(16, seed=step), first=16 * step)
        parts = obj(batch)
        mlm = parts["mlm"] / batch["masked"]
        (mlm + 50.0 * parts["disc"] / batch["ids"].numel()).backward()
        opt.step()
        opt.zero_grad()
        losses.append(mlm.item())
    assert sum(losses[-20:]) / 20 < 1.0, losses[-20:]


def test_labels_mark_exactly_the_replaced_tokens():
    obj = electra()
    with torch.no_grad():  # the generator always predicts token 7
        obj.generator_bias[7] = 1e4
    rows = windows(16)
    rows[:, ::2] = 7  # half the originals are 7: sampling 7 there leaves them original
    batch = batch_of(obj, rows)
    samples = obj.sample(obj.predict(batch), batch)
    assert (samples == 7).all()
    ids, labels = obj.corrupt(batch, samples)
    positions, targets = masked_entries(batch, "positions"), masked_entries(batch, "targets")
    original = batch["ids"].flatten().index_put((positions,), targets).view_as(ids)
    assert torch.equal(labels, (ids != original).float())
    assert (ids.flatten()[positions] == 7).all()
    assert 0 < labels.sum() < len(positions)  # some masked positions sampled their original
    assert not labels.flatten()[positions[targets == 7]].any()


def test_sampling_is_repeatable_and_follows_the_draws():
    obj = electra()
    batch = batch_of(obj, windows())
    predicted = obj.predict(batch)
    first = obj.sample(predicted, batch)
    assert torch.equal(first, obj.sample(predicted, batch))
    assert not torch.equal(first, obj.sample(predicted, {**batch, "draws": 1 - batch["draws"]}))
    # an example draws the same replacements alone as in the batch
    alone = batch_of(obj, windows()[2:3], first=2)
    mine = (masked_entries(batch, "positions") // batch["ids"].shape[1]) == 2
    assert torch.equal(obj.sample(obj.predict(alone), alone), first[mine])
    first, second = obj(batch), obj(batch)
    assert all(torch.equal(first[k], second[k]) for k in first)


class HostReads(TorchDispatchMode):
    """The operators that read a tensor's value back to the host (``item``, ``int``, ``float``, ``bool``: one
    scalar; ``nonzero``, ``masked_select``: a count), as they run."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.nonzero,
                                   torch.ops.aten.masked_select):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_step_reads_nothing_back_to_the_host(monkeypatch):
    """ELECTRA's forward and backward read no tensor's value back to the host, so on an accelerator the step never
    waits for it: the per-row sampler read each example's seed and its count of masked positions, and the
    discriminator's loss its count of positions."""
    obj = electra()
    batch = batch_of(obj, windows())
    listed, tolist = [], torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: listed.append(self.shape) or tolist(self))  # (no operator)
    with HostReads() as mode:
        losses = obj(batch)
        (losses["mlm"] + losses["disc"]).backward()
    assert mode.reads == [] and listed == []


def test_embeddings_are_one_shared_tensor_stored_once(tmp_path):
    obj = electra(config(embedding_size=32))
    assert obj.generator.embed is None and obj.generator.project.in_features == 32
    state = obj.state_dict()
    assert not any(k.startswith("generator.embed") for k in state)
    pointers = [t.data_ptr() for t in state.values()]
    assert len(pointers) == len(set(pointers))
    # the generator's MLM loss alone trains the shared embeddings, on both its input and its tied decoder
    batch = batch_of(electra(), windows())
    obj = electra(disc_weight=0.0)
    mean_loss(obj, batch).backward()
    assert obj.backbone.embed.tokens.weight.grad.abs().sum() > 0
    assert obj.backbone.embed.positions.weight.grad.abs().sum() > 0
    save_file(obj.state_dict(), tmp_path / "model.safetensors")
    other = electra(seed=1)
    other.load_state_dict(load_file(tmp_path / "model.safetensors"))
    assert torch.equal(other.generator_bias, obj.generator_bias)


def test_generator_width_is_the_fraction():
    cfg = config(hidden=256, heads=4, intermediate=1024, norm="pre")
    g = electra(cfg, generator_fraction=0.5).generator.config
    assert (g.hidden, g.heads, g.intermediate, g.layers, g.norm, g.embedding_width) == (128, 2, 512, 2, "pre", 256)
    g = electra(cfg).generator.config
    assert (g.hidden, g.heads, g.intermediate) == (64, 1, 256)
    with pytest.raises(SesameError, match="generator_fraction=0.0: the electra objective's generator_fraction is "
                                          "above 0"):
        Electra.check_option("generator_fraction", 0.0)  # refused before a run is written


def test_no_gradient_through_sampling_and_lambda_weighting():
    base = electra(disc_weight=0.0)
    batch = batch_of(base, windows())
    mlm_only = mean_loss(base, batch)
    mlm_only.backward()
    weighted = electra(disc_weight=50.0)
    loss = mean_loss(weighted, batch)
    loss.backward()
    parts = {k: v.item() for k, v in weighted(batch).items()}
    n_masked, n_positions = batch["masked"], batch["ids"].numel()
    # generator gradients come from L_MLM only, whatever λ
    for name, g in grads(weighted.generator).items():
        assert torch.allclose(g, grads(base.generator)[name], atol=1e-6), name
    assert torch.equal(weighted.generator_bias.grad, base.generator_bias.grad)
    # the trained loss is mean L_MLM + λ·mean L_Disc
    mlm_mean, disc_mean = parts["mlm"] / n_masked, parts["disc"] / n_positions
    assert batch["counts"] == {"mlm": n_masked, "disc": n_positions}
    assert torch.isclose(loss, torch.tensor(mlm_mean + 50.0 * disc_mean), rtol=1e-5)
    assert torch.isclose(mlm_only, torch.tensor(mlm_mean), rtol=1e-5)
    ids, labels = weighted.corrupt(batch, weighted.sample(weighted.predict(batch), batch))
    disc = weighted.discriminate(ids, labels)
    assert torch.isclose(loss - mlm_only, 50.0 * disc / n_positions, rtol=1e-5)


def test_padding_is_left_out_of_the_discriminator_loss():
    obj = electra()
    ids = torch.randint(5, VOCAB, (2, 10))
    labels = torch.zeros(2, 10)
    padding = torch.ones(2, 10, dtype=torch.bool)
    padding[1, 6:] = False
    loss = obj.discriminate(ids, labels, padding)
    logits = obj.discriminator_head(obj.backbone(ids, padding=padding)).squeeze(-1)
    expected = torch.nn.functional.softplus(logits[padding]).sum()  # BCE with label 0
    assert torch.isclose(loss, expected, rtol=1e-5)


def test_backbone_keys_load_into_a_plain_transformer():
    obj = electra()
    exported = {k[len("backbone."):]: v for k, v in obj.state_dict().items() if k.startswith("backbone.")}
    plain = Transformer(config())
    plain.load_state_dict(exported)  # strict: exactly the discriminator's tensors
    ids = torch.randint(5, VOCAB, (2, 12))
    assert torch.equal(plain(ids), obj.backbone(ids))


def test_two_stage_trains_the_generator_then_freezes_it():
    obj = electra(two_stage=0.5)
    batch = batch_of(obj, windows())
    obj.set_progress(0.2)
    assert set(obj(batch)) == {"mlm"}
    mean_loss(obj, batch).backward()
    assert all(g is not None for g in grads(obj.generator).values())
    assert obj.discriminator_head[0].weight.grad is None and obj.backbone.attention[0].qkv.weight.grad is None
    obj.zero_grad(set_to_none=True)
    obj.set_progress(0.7)
    assert set(obj(batch)) == {"disc"}
    loss = mean_loss(obj, batch)
    loss.backward()
    assert all(g is None for g in grads(obj.generator).values())
    assert obj.generator_bias.grad is None and obj.generator_head[0].weight.grad is None
    assert obj.discriminator_head[0].weight.grad.abs().sum() > 0
    assert torch.isclose(loss, 50.0 * obj(batch)["disc"] / batch["ids"].numel(), rtol=1e-5)


def test_loss_goes_down():
    obj = electra(config(hidden=32, heads=2, intermediate=64), generator_fraction=0.5)
    opt = torch.optim.AdamW(obj.parameters(), lr=3e-3)
    history = []
    for step in range(40):
        batch = batch_of(obj, windows(16, seed=step), first=16 * step)
        parts = obj(batch)
        mlm, disc = parts["mlm"] / batch["masked"], parts["disc"] / batch["ids"].numel()
        loss = mlm + 50.0 * disc
        loss.backward()
        opt.step()
        opt.zero_grad()
        history.append((loss.item(), mlm.item(), disc.item()))
    first, last = torch.tensor(history[:5]).mean(0), torch.tensor(history[-5:]).mean(0)
    assert (last < 0.75 * first).all(), (first, last)  # the total, the generator's and the discriminator's


def test_the_probe_reads_a_run_as_evaluate_does(corpus, tmp_path, one_thread):
    """scripts/electra_probe.py corrupts held-out text as evaluation does: over every window, its
    discriminator loss is evaluate's, and only masked tokens are ever replaced."""
    spec = importlib.util.spec_from_file_location("electra_probe", Path(__file__).parents[1] / "scripts/electra_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = tmp_path / "electra"
    sesame.pretrain([str(corpus)], str(run), family="electra", size="tiny", vocab_size=200, seq_len=32, max_steps=20,
                    batch_size=8, lr=1e-3, progress=False)
    report = module.probe(str(run), [str(corpus)], windows=10**6)
    evaluated = sesame.evaluate(str(run), [str(corpus)])
    assert report["disc_loss"] == pytest.approx(evaluated["disc_loss"], rel=1e-4)
    assert 0.1 < report["masked_rate"] < 0.2 and 0 < report["replaced_rate"] <= report["masked_rate"]
    assert 0 <= report["auc"] <= 1 and 0 <= report["generator_accuracy"] <= 1
