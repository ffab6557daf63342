"""The placement rule (docs/devices.md) without a GPU: forward and backward of the objectives, the task models and
the decoding steps under a fake default device that catches tensors made without the model's device, the
objectives' batches made on the CPU wherever the model is, and the language model's cache in its compute type on
its device."""
import json

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import sesame
from sesame.families import FAMILIES
from sesame.objectives import build_objective
from sesame.runtime import Placement
from sesame.tasks import make_task
from sesame.tokenizer import train_tokenizer

from .conftest import sentences

# -- placement: tensors made without the model's device ----------------------------------------------------
# Under ``torch.device("meta")`` a tensor made inside a forward pass without ``device=`` lands on the meta device,
# as it would land on the CPU beside a CUDA model; the model and its batch stay on the CPU, so what a forward pass
# reads back from its tensors (lengths, counts) still works. :class:`SameDevice` then fails every operation whose
# tensor arguments lie on two devices: stricter than CUDA, which also takes CPU index tensors (0-dim tensors,
# which CUDA takes from the CPU, pass).

class SameDevice(TorchDispatchMode):
    """Fails an operation (forward or backward) whose tensor arguments of one or more dimensions are on two
    devices."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {t.device for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.dim()}
        if len(devices) > 1:
            raise AssertionError(f"{func}: tensors on {sorted(map(str, devices))}")
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(sentences(300), "wordpiece", 200)


def tiny_backbone(family, tokenizer):
    from sesame.families import backbone_config

    return sesame.models.build_model(backbone_config(family, "tiny", tokenizer.vocab_size, tokenizer.specials.pad,
                                                     0.1, 64, specials=tokenizer.specials).to_dict())


def forward_backward_off_the_default_device(model, batch):
    model.train()
    with torch.device("meta"), SameDevice():
        output = model(batch)
        loss = sum(output.values()) if isinstance(output, dict) else output
        loss.backward()
    assert loss.device.type == "cpu" and torch.isfinite(loss)


@pytest.mark.parametrize("objective, family", [("mlm", "bert"), ("clm", "gpt"), ("span", "spanbert"),
                                               ("electra", "electra"), ("mlm_nsp", "bert"), ("bilm", "elmo"),
                                               ("awd_lm", "ulmfit")])
def test_objectives_make_no_tensor_off_the_models_device(objective, family, tokenizer):
    from sesame.data.windows import generators

    obj = build_objective(objective, tiny_backbone(family, tokenizer), tokenizer, {})
    windows = torch.randint(5, tokenizer.vocab_size, (2, obj.window_length(16)))
    partners = windows.flip(0) if obj.pairs else None
    forward_backward_off_the_default_device(obj, obj.make_batch(windows, generators(0, [0, 1]), partners))


@pytest.mark.parametrize("objective, family", [("mlm", "bert"), ("clm", "gpt"), ("span", "spanbert"),
                                               ("electra", "electra"), ("mlm_nsp", "bert"), ("span_corruption", "t5"),
                                               ("denoising", "bart")])
def test_a_model_on_the_meta_device_computes_its_loss_there(objective, family):
    """A model sized without memory (``meta``, which has no autocast) runs the fused projection: its product type is
    float32, as on a device without bf16 autocast. Nothing in the forward pass or the loss reads a value back to
    the host (a meta tensor has none): a padding mask given is applied, not asked whether it pads anything (issue
    35: on a GPU the question would make the host wait at every step)."""
    from sesame.data.windows import generators
    from sesame.objectives.projection import product_dtype

    assert product_dtype(torch.zeros(2, 3, device="meta")) == torch.float32
    assert product_dtype(torch.zeros(2, 3, device="meta", dtype=torch.float64)) == torch.float64
    tok = train_tokenizer(sentences(300), FAMILIES[family].tokenizer, 200, sentinels=FAMILIES[family].sentinels)
    obj = build_objective(objective, tiny_backbone(family, tok), tok, {})
    text = torch.tensor(tok.encode(sentences(20, seed=1), special=False)[0] * 9)  # sentences for BART to permute
    windows = text[: 2 * obj.window_length(16)].view(2, -1)
    batch = obj.make_batch(windows, generators(0, [0, 1]), windows.flip(0) if obj.pairs else None)
    assert objective not in ("mlm_nsp", "denoising") or "padding" in batch  # pairs and deletions pad their rows
    output = obj.to("meta")({k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    losses = output.values() if isinstance(output, dict) else [output]
    assert all(loss.device.type == "meta" and loss.dtype == torch.float32 and loss.dim() == 0 for loss in losses)


def test_a_padding_mask_is_asked_whether_it_pads_on_the_cpu_alone():
    """On the CPU a mask that is all True is skipped (asking costs no wait); elsewhere a mask given is applied, read
    as a mask that pads: ``meta`` stands in for the GPU (it has no values, so asking would fail)."""
    from sesame.models.padding import is_padded

    full, padded = torch.ones(2, 3, dtype=torch.bool), torch.tensor([[True, True, True], [True, False, False]])
    assert [is_padded(None), is_padded(full), is_padded(padded)] == [False, False, True]
    assert is_padded(full.to("meta")) and is_padded(padded.to("meta"))


def no_mask_trains_as_a_mask_that_pads_nothing(model, batch):
    """``model``'s training loss on ``batch`` (which pads nothing) is the same, bit for bit, when its padding mask is
    None, as the trainer passes it (:func:`sesame.runtime.unpadded`)."""
    assert batch["padding"].all()
    model.train()
    losses = []
    for padding in (batch["padding"], None):
        torch.manual_seed(0)  # the same dropout
        output = model({**batch, "padding": padding})
        losses.append(sum(output.values()) if isinstance(output, dict) else output)
    assert torch.isfinite(losses[0]) and torch.equal(*losses)


@pytest.mark.parametrize("family, pooling", [("bert", "mean"), ("lstm", "concat"), ("t5", "last"), ("t5", "mean"),
                                             ("xlnet", "last")])
def test_a_classifier_reads_no_padding_mask_as_every_token_real(family, pooling, tokenizer):
    job = make_task("classify")
    model = job.build(tiny_backbone(family, tokenizer), 2, pooling, 0.1)
    features = job.features([{"text": "the cat sleeps", "label": "a", "line": i} for i in (1, 2)], tokenizer, 32,
                            ["a", "b"], False)
    no_mask_trains_as_a_mask_that_pads_nothing(model, job.collate(features, tokenizer.specials.pad))


def test_gpts_auxiliary_lm_reads_no_padding_mask_as_every_token_real(tokenizer):
    from sesame.train.auxiliary_lm import add_auxiliary_lm, next_tokens

    job = make_task("classify")
    model = job.build(tiny_backbone("gpt", tokenizer), 2, "last", 0.1)
    add_auxiliary_lm(model, 0.5)
    batch = job.collate(job.features([{"text": "the cat sleeps", "label": "a", "line": i} for i in (1, 2)],
                                     tokenizer, 32, ["a", "b"], False), tokenizer.specials.pad)
    batch["counts"] = {"loss": 2, "lm": int(next_tokens(batch["padding"]).sum())}
    no_mask_trains_as_a_mask_that_pads_nothing(model, batch)


def test_cross_view_training_and_the_mt_lstm_read_no_padding_mask_as_every_token_real(tokenizer, tmp_path):
    from sesame.apps.cove import collate
    from sesame.models.cove import MTLSTM, CoveConfig
    from sesame.tasks.cvt import unlabeled_batch

    (tmp_path / "unlabeled.txt").write_text("\n".join(sentences(10, seed=5)) + "\n")
    job = make_task("tag", {"cvt_unlabeled": str(tmp_path / "unlabeled.txt")})
    tagger = job.build(tiny_backbone("bilstm", tokenizer), 2, "max", 0.1)
    no_mask_trains_as_a_mask_that_pads_nothing(tagger, unlabeled_batch([["the", "cat", "sleeps"]] * 2, tokenizer, 32))
    translator = MTLSTM(CoveConfig(vocab_size=tokenizer.vocab_size, target_vocab_size=30, embedding_size=8,
                                   hidden_size=6, dropout=0.1))
    no_mask_trains_as_a_mask_that_pads_nothing(build_objective("translation", translator, tokenizer),
                                               collate([[5, 6, 7], [9, 10, 11]], [[1, 5, 6, 2], [1, 7, 2]], 0, 0))


def test_layer_matching_reads_no_padding_mask_as_every_token_real(tokenizer):
    from sesame.objectives.distillation import LayerMatching
    from sesame.pipelines.distil import layer_widths, teacher_states

    student, teacher = tiny_backbone("bert", tokenizer), tiny_backbone("bert", tokenizer)
    matching = LayerMatching([(0, 0), (2, 2)], layer_widths(student), layer_widths(teacher),
                             teacher=lambda batch: teacher_states(teacher, batch), weight=1.0)

    class Student(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.matching = student, matching

        def forward(self, batch):
            layers = self.backbone(batch["ids"], None, padding=batch["padding"], all_layers=True)
            return self.matching(layers, batch)

    ids = torch.randint(5, tokenizer.vocab_size, (2, 7))
    no_mask_trains_as_a_mask_that_pads_nothing(Student(), {"ids": ids, "padding": torch.ones_like(ids, dtype=bool)})


@pytest.mark.parametrize("objective, family, kind", [("span_corruption", "t5", "unigram"),
                                                     ("denoising", "bart", "bpe")])
def test_encoder_decoder_objectives_make_no_tensor_off_the_models_device(objective, family, kind):
    from sesame.data.windows import generators

    tok = train_tokenizer(sentences(300), kind, 200, sentinels=FAMILIES[family].sentinels)
    obj = build_objective(objective, tiny_backbone(family, tok), tok, {})
    text = torch.tensor(tok.encode(sentences(20, seed=1), special=False)[0] * 9)  # sentences for BART to permute
    windows = text[: 2 * obj.window_length(16)].view(2, -1)
    forward_backward_off_the_default_device(obj, obj.make_batch(windows, generators(0, [0, 1])))


@pytest.mark.parametrize("objective, family, options", [
    ("mlm", "bert", {}), ("mlm", "bert", {"masking": "whole_word"}), ("mlm", "bert", {"masking": "phrase"}),
    ("span", "spanbert", {}), ("electra", "electra", {}), ("mlm_nsp", "bert", {}), ("mlm_sop", "albert", {}),
    ("clm", "gpt", {}), ("span_corruption", "t5", {}), ("denoising", "bart", {})])
def test_batches_are_made_on_the_cpu_wherever_the_model_is(objective, family, options):
    """Issue 18: ``model.to(device)`` moves buffers, but batches are made on the CPU; the tables ``make_batch``
    reads (special ids, word starts, the replacement pool) must stay there. ``meta`` stands in for the GPU: the
    model's every tensor leaves the CPU, and the batch must be the same CPU batch as before."""
    from sesame.data.windows import generators

    tok = train_tokenizer(sentences(300), FAMILIES[family].tokenizer, 200, sentinels=FAMILIES[family].sentinels)
    obj = build_objective(objective, tiny_backbone(family, tok), tok, options)
    text = torch.tensor(tok.encode(sentences(20, seed=1), special=False)[0] * 9)  # real words, and sentences
    windows = text[: 2 * obj.window_length(16)].view(2, -1)
    partners = windows.flip(0) if obj.pairs else None
    on_cpu = tree_flatten(obj.make_batch(windows, generators(0, [0, 1]), partners))[0]
    obj.to("meta")
    assert all(p.device.type == "meta" for p in obj.parameters())
    elsewhere = tree_flatten(obj.make_batch(windows, generators(0, [0, 1]), partners))[0]
    assert len(elsewhere) == len(on_cpu)
    for a, b in zip(on_cpu, elsewhere):
        assert not isinstance(b, torch.Tensor) or b.device.type == "cpu" and torch.equal(a, b)
        assert isinstance(b, torch.Tensor) or a == b


def test_the_mt_lstm_makes_no_tensor_off_its_device(tokenizer):
    from sesame.apps.cove import collate
    from sesame.decoding import GenerationConfig, beam_search
    from sesame.models.cove import MTLSTM, CoveConfig

    model = MTLSTM(CoveConfig(vocab_size=tokenizer.vocab_size, target_vocab_size=30, embedding_size=8,
                              hidden_size=6, dropout=0.1))
    source = [[5, 6, 7, 8], [9, 10]]
    forward_backward_off_the_default_device(build_objective("translation", model, tokenizer),
                                            collate(source, [[1, 5, 6, 2], [1, 7, 2]], 0, 0))
    model.eval()
    batch = collate(source, [[1, 2], [1, 2]], 0, 0)
    with torch.device("meta"), SameDevice(), torch.no_grad():
        state = model.start(batch["ids"], batch["padding"])
        beam_search(model.step, state, batch["target"][:, 0].clone(), GenerationConfig(max_new_tokens=4, beams=2),
                    eos=2)


def squad_examples(tmp_path):
    context = "The cat sat on the mat near the old river."
    qas = [{"id": "q1", "question": "Where did the cat sit?", "answers": [{"text": "on the mat",
                                                                          "answer_start": context.index("on the")}]}]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context,
                                                                                          "qas": qas}]}]}))
    return make_task("span_qa", {"doc_stride": 4}).read(str(path))


def choice_examples(tmp_path):
    path = tmp_path / "choices.jsonl"
    path.write_text("".join(json.dumps({"context": "The cat sleeps.", "choices": ["It rests.", "It flies away."],
                                        "label": i % 2}) + "\n" for i in range(2)))
    return make_task("multiple_choice").read(str(path))


@pytest.mark.parametrize("task, family, examples, labels", [
    ("classify", "bert", lambda _: [{"text": "the cat sleeps", "label": "a", "line": i} for i in (1, 2)], ["a", "b"]),
    ("classify", "lstm", lambda _: [{"text": "the cat sleeps", "label": "a", "line": i} for i in (1, 2)], ["a", "b"]),
    ("tag", "bert", lambda _: [{"words": ["the", "cat"], "tags": ["O", "B-X"], "line": i} for i in (1, 2)],
     ["O", "B-X"]),
    ("span_qa", "bert", squad_examples, []),
    ("multiple_choice", "bert", choice_examples, []),
])
def test_task_models_make_no_tensor_off_the_models_device(task, family, examples, labels, tokenizer, tmp_path):
    job = make_task(task, {"doc_stride": 4} if task == "span_qa" else {})
    model = job.build(tiny_backbone(family, tokenizer), len(labels), "last", 0.1)
    features = job.features(examples(tmp_path), tokenizer, 32, labels, False)
    forward_backward_off_the_default_device(model, job.collate(features, tokenizer.specials.pad))


def test_cross_view_training_makes_no_tensor_off_the_models_device(tokenizer, tmp_path):
    from sesame.tasks.cvt import unlabeled_batch

    (tmp_path / "unlabeled.txt").write_text("\n".join(sentences(10, seed=5)) + "\n")
    job = make_task("tag", {"cvt_unlabeled": str(tmp_path / "unlabeled.txt")})
    model = job.build(tiny_backbone("bilstm", tokenizer), 2, "max", 0.1)
    labeled = [{"words": ["the", "cat"], "tags": ["O", "B-X"], "line": i} for i in (1, 2)]
    forward_backward_off_the_default_device(model, job.collate(job.features(labeled, tokenizer, 32, ["O", "B-X"],
                                                                            False), tokenizer.specials.pad))
    forward_backward_off_the_default_device(model, unlabeled_batch([s.split() for s in sentences(3, seed=9)],
                                                                   tokenizer, 32))


def test_the_language_models_cached_steps_make_no_tensor_off_its_device(tokenizer):
    from sesame.decoding import GenerationConfig
    from sesame.generation import beam_search, decode
    from sesame.language_model import LanguageModel

    lm = LanguageModel(tiny_backbone("gpt", tokenizer), tokenizer)
    forward = lm.backbone.forward

    def checked(*args, **kwargs):  # the steps' forward passes, their inputs built by decode on the CPU
        with torch.device("meta"), SameDevice():
            return forward(*args, **kwargs)

    lm.backbone.forward = checked
    prompts = tokenizer.encode(["the cat", "a dog runs over the"], special=False)
    assert len(decode(lm, prompts, GenerationConfig(max_new_tokens=4, sample=True))) == 2
    assert beam_search(lm, prompts[1], GenerationConfig(max_new_tokens=4, beams=2)).finish  # its steps count positions


@pytest.mark.parametrize("careless", [
    lambda x: (x * torch.ones(x.shape)).sum(),  # a tensor made without device=
    lambda x: x[torch.arange(x.shape[0]), 0].sum(),  # an index tensor made without device= (CUDA takes it)
])
def test_the_placement_check_catches_a_tensor_made_without_the_models_device(careless):
    class Careless(nn.Module):
        def forward(self, batch):
            return careless(batch["x"])

    with pytest.raises((RuntimeError, NotImplementedError, AssertionError)):
        forward_backward_off_the_default_device(Careless(), {"x": torch.ones(3, 2, requires_grad=True)})



def test_a_language_model_caches_keys_in_its_compute_type_on_its_device(tokenizer):
    from sesame.language_model import LanguageModel

    lm = LanguageModel(tiny_backbone("gpt", tokenizer), tokenizer,
                       placement=Placement(device=torch.device("cpu"), precision="bf16"))
    cache = lm.cache(1, 8)
    assert cache.keys[0].dtype == torch.bfloat16 and cache.keys[0].device == lm.device
    logits = lm.logits(torch.tensor([[5, 6, 7]]), cache=cache)
    assert logits.dtype == torch.float32 and cache.length == 3

