"""BERT's masking, checked as a property over many draws (Devlin et al. 2019, §3.1)."""
import torch

from sesame.data.windows import generators
from sesame.models import Transformer, TransformerConfig
from sesame.objectives.masking import mask_tokens
from sesame.objectives.mlm import MaskedLM, masked_entries
from sesame.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 1000


def draw(n_rows=400, length=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (n_rows, length), generator=g)
    ids[:, 0], ids[:, -1], ids[:, 50] = SPECIALS.cls, SPECIALS.sep, SPECIALS.sep
    corrupted, selected = mask_tokens(ids, torch.tensor(SPECIALS.all), SPECIALS.mask, VOCAB, g)
    return ids, corrupted, selected


def test_fifteen_percent_of_ordinary_tokens_are_selected():
    ids, _, selected = draw()
    eligible = ids >= 5
    rate = selected[eligible].float().mean().item()
    assert abs(rate - 0.15) < 0.005  # 50k eligible tokens: std ≈ 0.0016
    assert not selected[~eligible].any()  # special tokens never selected


def test_eighty_ten_ten():
    ids, corrupted, selected = draw()
    chosen_orig, chosen_new = ids[selected], corrupted[selected]
    n = len(chosen_orig)
    masked = (chosen_new == SPECIALS.mask).float().sum().item() / n
    kept = (chosen_new == chosen_orig).float().sum().item() / n
    replaced = ((chosen_new != chosen_orig) & (chosen_new != SPECIALS.mask)).float().sum().item() / n
    assert abs(masked - 0.8) < 0.015 and abs(kept - 0.1) < 0.01 and abs(replaced - 0.1) < 0.01
    # a random replacement is an ordinary token, never a special one; nothing unselected changes
    assert (chosen_new[(chosen_new != chosen_orig) & (chosen_new != SPECIALS.mask)] >= 5).all()
    assert torch.equal(corrupted[~selected], ids[~selected])


def test_dynamic_masking_draws_new_masks_each_pass():
    _, _, first = draw(seed=0)
    _, _, second = draw(seed=1)
    assert not torch.equal(first, second)
    assert (first & second).float().sum() / first.float().sum() < 0.3  # overlap near chance (15%)


def test_loss_only_at_selected_positions():
    model = MaskedLM(Transformer(TransformerConfig(vocab_size=VOCAB, hidden=64, layers=1, heads=1,
                                                   intermediate=128, dropout=0.0)), SPECIALS)
    windows = torch.randint(5, VOCAB, (4, 30))
    batch = model.make_batch(windows, [torch.Generator().manual_seed(i) for i in range(4)])
    assert batch["ids"].shape == (4, 32) and (batch["ids"][:, 0] == SPECIALS.cls).all()
    assert len(batch["positions"]) == len(batch["targets"]) >= batch["masked"] > 0
    full = torch.cat([torch.full((4, 1), 2), windows, torch.full((4, 1), 3)], 1).flatten()
    assert torch.equal(masked_entries(batch, "targets"), full[masked_entries(batch, "positions")])
    assert batch["counts"] == {"loss": batch["masked"]}
    # the same example gets the same mask whatever else is in the batch
    alone = model.make_batch(windows[1:2], [torch.Generator().manual_seed(1)])
    assert torch.equal(alone["ids"][0], batch["ids"][1])


def test_evaluation_masks_are_a_fixed_function_of_the_seed_and_the_window_index():
    """``sesame evaluate`` corrupts window i with the generator of (seed 0 + 1, i) (pipelines.pretrain.lm_metrics),
    whatever else is in its batch: pinned by value, so a change of the masks fails here and must be named in
    docs/run_formats.md, as an old run's evaluation once moved without a word (issue 37)."""
    model = MaskedLM(Transformer(TransformerConfig(vocab_size=VOCAB, hidden=64, layers=1, heads=1,
                                                   intermediate=128, dropout=0.0)), SPECIALS)
    windows = torch.arange(100, 140).view(2, 20)
    batch = model.make_batch(windows, generators(1, [0, 7]))
    assert masked_entries(batch, "positions").tolist() == [3, 10, 15, 27, 34, 35]
    assert batch["ids"].tolist() == [
        [2, 100, 101, 236, 103, 104, 105, 106, 107, 108, 4, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 3],
        [2, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129, 130, 4, 4, 133, 134, 135, 136, 137, 138, 139, 3]]
    assert model.make_batch(windows[1:], generators(1, [7]))["ids"].tolist() == batch["ids"][1:].tolist()


def test_the_head_s_transform_takes_the_backbone_s_activation():
    """As BERT's prediction head transform applies the model's hidden_act: ReLU under a ReLU backbone (T5's
    layer choices on a BERT, --model-option activation=relu), GELU's tanh form under gelu_tanh."""
    for name, kind in (("relu", torch.nn.ReLU), ("gelu_tanh", torch.nn.GELU), ("gelu", torch.nn.GELU)):
        model = MaskedLM(Transformer(TransformerConfig(vocab_size=VOCAB, hidden=64, layers=1, heads=1,
                                                       intermediate=128, activation=name)), SPECIALS)
        assert type(model.transform[1]) is kind
        assert kind is torch.nn.ReLU or model.transform[1].approximate == ("tanh" if name == "gelu_tanh" else "none")
