"""Devices, precision and compile (sesame.runtime): the same code path on the CPU with --device cpu explicit, a
fake device that catches tensors made on the CPU beside the model, fp16's scaler on the CPU, and the GPU tests
(marked ``gpu``: skipped without CUDA; scripts/gpu_check.sh runs them on one)."""
import json

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import sesame
from sesame.cli import main
from sesame.errors import SesameError
from sesame.objectives import build_objective
from sesame.runtime import Placement, Runtime, resolve_device
from sesame.tasks import make_task
from sesame.tokenizer import train_tokenizer
from sesame.train import Interrupted, RunSettings, TrainConfig, Trainer
from sesame.train.checkpoint import load_weights

from .conftest import sentences

TINY = dict(family="bert", size="tiny", vocab_size=200, seq_len=32, batch_size=8, eval_every=2, save_every=2,
            progress=False)


def test_device_names_resolve_or_are_refused_in_one_line():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cuda", "mps", "cpu")
    with pytest.raises(SesameError, match="--device gpu0: choose auto, cpu, cuda, cuda:N or mps"):
        resolve_device("gpu0")


@pytest.mark.parametrize("flags, message", [
    (["--device", "cuda:0"], "--device cuda:0: this machine has no CUDA GPU"),
    (["--device", "cpu", "--precision", "fp16"], "--precision fp16: float16 training needs a CUDA GPU"),
    (["--device", "cpu", "--tf32"], "--tf32: TF32 is a mode of NVIDIA GPUs"),
    (["--device", "tpu"], "--device tpu: choose auto, cpu, cuda, cuda:N or mps"),
])
def test_impossible_device_and_precision_exit_2_in_one_line_writing_nothing(flags, message, corpus, tmp_path,
                                                                           capsys):
    if flags[1].startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(out), "--size", "tiny", "--max-steps", "1",
                 *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sesame: error: ") and message in err and "\n" not in err
    assert not out.exists()


def test_the_cpu_explicitly_runs_pretrain_finetune_and_predict_and_records_it(corpus, labeled, tmp_path, capsys):
    pre, fine = tmp_path / "pre", tmp_path / "fine"
    assert main(["--no-progress", "pretrain", "--corpus", str(corpus), "--out", str(pre), "--size", "tiny",
                 "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8", "--max-steps", "2",
                 "--device", "cpu"]) == 0
    assert json.loads((pre / "config.json").read_text())["runtime"] == {
        "device": "cpu", "precision": "fp32", "tf32": False, "compile": False}
    train, dev = labeled
    assert main(["--no-progress", "finetune", "--from", str(pre), "--train", str(train), "--dev", str(dev),
                 "--out", str(fine), "--epochs", "1", "--batch-size", "16", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["predict", "--model", str(fine), "--input", str(dev), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 40 and json.loads(lines[0])["label"] in ("animal", "none")


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


def test_bf16_on_the_cpu_trains_with_finite_loss_and_resumes_exactly_keeping_its_precision(corpus, tmp_path,
                                                                                          monkeypatch):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    sesame.pretrain([str(corpus)], str(whole), max_steps=4, precision="bf16", device="cpu", **TINY)
    stopped_at_2_then_resumed(corpus, cut, monkeypatch, precision="bf16", device="cpu")
    losses = [r["loss"] for r in map(json.loads, (cut / "metrics.jsonl").read_text().splitlines())]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert json.loads((cut / "config.json").read_text())["runtime"]["precision"] == "bf16"
    assert same_weights(whole, cut)


def test_older_runs_precision_in_their_training_config_is_the_one_resume_takes():
    from sesame.resume import _runtime
    from sesame.specs import PretrainSpec, RunConfig

    spec = PretrainSpec(corpus="c", out="o")
    old = RunConfig(kind="pretrained", family="bert", model={}, train={"precision": "bf16"})
    assert _runtime(spec, old).precision == "bf16"
    given = PretrainSpec(corpus="c", out="o", runtime=Runtime(precision="fp32"))
    assert _runtime(given, old).precision == "fp32"  # the runtime may change on resume (sesame.runtime)


# -- the trainer's fp16 path (its gradient scaler) on the CPU: CPU autocast runs float16 too -----------------

class Scaled(nn.Module):
    """Σ w·x over a batch: a model whose gradients a test can make overflow."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, batch):
        return (self.w * batch["x"]).sum()


def fp16_trainer(run, steps, x):
    batches = lambda step, progress: [{"ids": torch.zeros(1, 4, dtype=torch.long), "targets": torch.zeros(1),
                                       "x": x.clone()}]
    cfg = TrainConfig(max_steps=steps, save_every=2, eval_every=100, clip=0.0, warmup=0.0, lr=1e-3)
    placement = Placement(device=torch.device("cpu"), precision="fp16")
    return Trainer(Scaled(), RunSettings(run, cfg, placement=placement, progress=False), batches)


def test_fp16_saves_its_scaler_with_the_checkpoint_and_resume_restores_it(tmp_path):
    trainer = fp16_trainer(tmp_path / "run", 2, torch.ones(4))
    trainer.fit()
    state = json.loads((tmp_path / "run/checkpoint/trainer_state.json").read_text())
    assert state["scaler"]["scale"] == trainer.scaler.get_scale() == 65536.0
    state["scaler"]["scale"] = 1024.0  # a scale a longer run would have reached
    (tmp_path / "run/checkpoint/trainer_state.json").write_text(json.dumps(state))
    resumed = fp16_trainer(tmp_path / "run", 3, torch.ones(4))
    resumed.resume()
    assert resumed.scaler.get_scale() == 1024.0 and resumed.step == 2


def test_fp16_skips_a_step_whose_gradients_overflow_and_halves_the_scale(tmp_path):
    trainer = fp16_trainer(tmp_path / "run", 1, torch.full((4,), 1e37))  # finite loss, but x·scale overflows
    trainer.fit()
    assert torch.equal(trainer.model.w.detach(), torch.ones(4))  # the step was skipped
    assert trainer.scaler.get_scale() == 32768.0


def test_compile_falls_back_with_one_warning_where_it_fails(tmp_path, monkeypatch, capsys):
    class Failed(torch._dynamo.exc.TorchDynamoException):
        pass

    def failing(fn, **kwargs):
        def call(*args, **kw):
            raise Failed("no backend for this device")
        return call

    monkeypatch.setattr(torch, "compile", failing)
    batches = lambda step, progress: [{"ids": torch.zeros(1, 4, dtype=torch.long), "targets": torch.zeros(1),
                                       "x": torch.ones(4)}]
    cfg = TrainConfig(max_steps=3, save_every=100, eval_every=100, clip=0.0, warmup=0.0)
    placement = Placement(device=torch.device("cpu"), compile=True)
    trainer = Trainer(Scaled(), RunSettings(tmp_path / "run", cfg, placement=placement, progress=False), batches)
    trainer.fit()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "--compile" in line]
    assert len(warnings) == 1 and "running it uncompiled" in warnings[0] and "Failed" in warnings[0]
    assert trainer.step == 3 and not torch.equal(trainer.model.w.detach(), torch.ones(4))


def test_compile_wraps_the_training_forward_pass(tmp_path, monkeypatch):
    compiled = []

    def fake(fn, **kwargs):
        compiled.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake)
    model = Scaled()
    batches = lambda step, progress: [{"ids": torch.zeros(1, 4, dtype=torch.long), "targets": torch.zeros(1),
                                       "x": torch.ones(4)}]
    cfg = TrainConfig(max_steps=1, save_every=100, eval_every=100)
    placement = Placement(device=torch.device("cpu"), compile=True)
    Trainer(model, RunSettings(tmp_path / "run", cfg, placement=placement, progress=False), batches).fit()
    assert compiled == [model]


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
                                                     0.1, 64).to_dict())


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


def test_the_mt_lstm_makes_no_tensor_off_its_device(tokenizer):
    from sesame.apps.cove import collate
    from sesame.decoding import beam_search
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
        beam_search(model.step, state, batch["target"][:, 0].clone(), beam=2, eos=2, max_len=4)


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
    from sesame.apps.generate import GenerationConfig, beam_search, decode
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


# -- every command that runs a model takes the runtime --------------------------------------------------------

@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Tiny inputs of every command: a GPT run, a labeled task (CSV, and as compare's JSON task), a corpus, a
    parallel corpus and a trained MT-LSTM run."""
    from sesame.apps.cove import CoveSpec, train_cove
    from sesame.families import backbone_config
    from sesame.rundir import write_config
    from sesame.specs import RunConfig
    from sesame.train.checkpoint import save_weights

    root = tmp_path_factory.mktemp("commands")
    tok = train_tokenizer(sentences(200), "bpe", 300)
    cfg = backbone_config("gpt", "tiny", tok.vocab_size, tok.specials.pad, 0.0, 64)
    gpt = root / "gpt"
    gpt.mkdir()
    tok.save(gpt / "tokenizer.json")
    save_weights(gpt / "model.safetensors", {"backbone." + k: v for k, v in sesame.models.Transformer(cfg)
                                             .state_dict().items()})
    write_config(gpt, RunConfig(kind="pretrained", family="gpt", size="tiny", seq_len=32, model=cfg.to_dict(),
                                objective="clm", pooling="last"))
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
    return root


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


@pytest.mark.parametrize("name", COMMANDS)
def test_every_model_command_refuses_a_device_it_lacks_in_one_line_writing_nothing(name, inputs, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "out"
    assert main(["--no-progress", *command(name, inputs, out), "--device", "cuda:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"sesame: error: --device cuda:0: this machine has no CUDA GPU that PyTorch {torch.__version__} " \
                  "can use; use --device cpu (or auto)"
    assert not out.exists()


@pytest.mark.parametrize("name", ["generate", "prompt-eval", "neighbors", "translate", "cove"])
def test_the_cpu_explicitly_runs_every_inference_command_as_the_default_does(name, inputs, tmp_path, capsys):
    outputs = []
    for device, out in ((["--device", "cpu"], tmp_path / "cpu"), ([], tmp_path / "default")):
        capsys.readouterr()
        assert main(["--no-progress", *command(name, inputs, out), *device]) == 0
        text = out.read_text() if out.is_file() else capsys.readouterr().out
        outputs.append(text if name != "cove" else json.loads((out / "config.json").read_text())["runtime"])
    assert outputs[0] and (outputs[0] == outputs[1] or name == "cove")
    if name == "cove":
        assert outputs[0] == {"device": "cpu", "precision": "fp32", "tf32": False, "compile": False}


def stage_settings(folder):
    return {str(path.parent.relative_to(folder)): json.loads(path.read_text())["settings"]
            for path in folder.rglob("compare.json")}


def test_compare_records_the_precision_not_the_device_in_its_cells_settings(inputs, tmp_path, capsys):
    out = tmp_path / "compare"
    assert main(["--no-progress", *command("compare", inputs, out), "--device", "cpu"]) == 0
    settings = stage_settings(out)
    assert len(settings) == 4 and not any({"device", "precision"} & set(s) for s in settings.values())
    capsys.readouterr()
    assert main(["--no-progress", *command("compare", inputs, out), "--precision", "fp32"]) == 0  # any device
    assert capsys.readouterr().err.count("(reused)") == 4
    assert main(["--no-progress", *command("compare", inputs, out), "--precision", "bf16"]) == 2
    assert "made with other settings (precision)" in capsys.readouterr().err


def test_stage_runtime_gives_the_precision_explicitly_and_records_only_a_lower_one():
    from sesame.pipelines.stages import stage_runtime

    assert stage_runtime(Runtime(device="cpu")) == (Runtime(device="cpu", precision="fp32"), {})
    assert stage_runtime(Runtime(precision="bf16", compile=True)) == (Runtime(precision="bf16", compile=True),
                                                                      {"precision": "bf16"})


def test_compare_takes_an_approachs_precision_and_refuses_its_device():
    from sesame.apps.compare import parse_approach

    approach = parse_approach("gpt:tiny:precision=bf16:finetune.precision=fp32")
    assert approach.options == {"precision": "bf16"} and approach.finetune == {"precision": "fp32"}
    with pytest.raises(SesameError, match="precision=fp8: choose one of fp32, bf16, fp16"):
        parse_approach("gpt:tiny:precision=fp8")
    with pytest.raises(SesameError, match="device is the machine's choice, the same for every approach; give "
                                          "compare --device"):
        parse_approach("gpt:tiny:device=cuda")
    with pytest.raises(SesameError, match="finetune.tf32 is the machine's choice"):
        parse_approach("gpt:tiny:finetune.tf32=true")


def test_ulmfit_gives_its_stages_the_runtime_and_records_no_device(inputs, tmp_path):
    out = tmp_path / "ulmfit"
    assert main(["--no-progress", *command("ulmfit", inputs, out), "--device", "cpu", "--json"]) == 0
    settings = stage_settings(out)
    assert set(settings) == {"general-lm", "target-lm", "classifier"}
    assert not any({"device", "precision"} & set(s) for s in settings.values())
    assert {json.loads((out / stage / "config.json").read_text())["runtime"]["device"] for stage in settings} == {"cpu"}


def test_the_api_merges_runtime_keywords_over_a_runtime():
    from sesame.specs import FinetuneSpec, PretrainSpec

    spec = PretrainSpec.of("c", "o", runtime=Runtime(device="cpu"), precision="bf16", lr=1.0)
    assert spec.runtime == Runtime(device="cpu", precision="bf16") and spec.training == {"lr": 1.0}
    tuned = FinetuneSpec.of("b", "t", "d", "o", runtime=Runtime(device="cpu"), training={"lr": 2.0})
    assert tuned.runtime == Runtime(device="cpu") and tuned.training == {"lr": 2.0}


def test_a_language_model_caches_keys_in_its_compute_type_on_its_device(tokenizer):
    from sesame.language_model import LanguageModel

    lm = LanguageModel(tiny_backbone("gpt", tokenizer), tokenizer,
                       placement=Placement(device=torch.device("cpu"), precision="bf16"))
    cache = lm.cache(1, 8)
    assert cache.keys[0].dtype == torch.bfloat16 and cache.keys[0].device == lm.device
    logits = lm.logits(torch.tensor([[5, 6, 7]]), cache=cache)
    assert logits.dtype == torch.float32 and cache.length == 3


# -- on a GPU (scripts/gpu_check.sh) ---------------------------------------------------------------------

@pytest.mark.gpu
def test_a_run_trained_on_cuda_loads_on_the_cpu_with_the_same_weights_and_predictions(corpus, labeled, tmp_path):
    pre, fine = tmp_path / "pre", tmp_path / "fine"
    sesame.pretrain([str(corpus)], str(pre), max_steps=4, device="cuda", **TINY)
    train, dev = labeled
    sesame.finetune(str(pre), str(train), str(dev), str(fine), epochs=1, batch_size=16, device="cuda",
                    progress=False)
    on_gpu = sesame.load(fine, runtime=Runtime(device="cuda"))
    on_cpu = sesame.load(fine, runtime=Runtime(device="cpu"))
    weights = load_weights(fine / "model.safetensors")
    assert all(torch.equal(on_cpu.model.state_dict()[k], weights[k]) for k in weights)
    assert all(torch.equal(on_gpu.model.state_dict()[k].cpu(), weights[k]) for k in weights)
    texts = ["the cat sleeps", "a tree near the river"]
    a, b = on_gpu.predict(texts), on_cpu.predict(texts)
    assert [x["label"] for x in a] == [x["label"] for x in b]
    for x, y in zip(a, b):
        assert all(abs(x["probabilities"][k] - y["probabilities"][k]) < 1e-4 for k in x["probabilities"])


@pytest.mark.gpu
def test_a_cpu_run_resumes_on_cuda(corpus, tmp_path):
    run = tmp_path / "run"
    sesame.pretrain([str(corpus)], str(run), max_steps=2, device="cpu", **TINY)
    sesame.pretrain([str(corpus)], str(run), max_steps=4, resume=True, device="cuda", **TINY)
    assert json.loads((run / "config.json").read_text())["runtime"]["device"].startswith("cuda")
    assert all(torch.isfinite(w).all() for w in load_weights(run / "model.safetensors").values())


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_on_cuda_trains_and_resumes_exactly(precision, corpus, tmp_path, monkeypatch):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    sesame.pretrain([str(corpus)], str(whole), max_steps=4, precision=precision, device="cuda", **TINY)
    stopped_at_2_then_resumed(corpus, cut, monkeypatch, precision=precision, device="cuda")
    state = json.loads((cut / "checkpoint/trainer_state.json").read_text())
    assert ("scaler" in state) == (precision == "fp16")
    assert same_weights(whole, cut)  # the same GPU and kernels: the same numbers


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["generate", "prompt-eval", "neighbors", "translate"])
def test_the_inference_commands_give_on_cuda_what_they_give_on_the_cpu(name, inputs, tmp_path, capsys):
    outputs = []
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        capsys.readouterr()
        assert main(["--no-progress", *command(name, inputs, out), "--device", device]) == 0
        outputs.append(out.read_text() if out.is_file() else capsys.readouterr().out)
    if name == "neighbors":  # cosines agree to rounding
        a, b = (json.loads(text) for text in outputs)
        assert [n["token"] for n in a["static"]] == [n["token"] for n in b["static"]]
        assert all(abs(x["score"] - y["score"]) < 1e-3 for o, p in zip(a["occurrences"], b["occurrences"])
                   for x, y in zip(o["neighbors"], p["neighbors"]))
    else:  # greedy tokens, translations and accuracies: the same
        assert outputs[0] == outputs[1]


@pytest.mark.gpu
def test_sampling_draws_the_same_tokens_on_cuda_as_on_the_cpu(inputs):
    from sesame.apps.generate import GenerationConfig, generate

    cfg = GenerationConfig(sample=True, seed=5, max_new_tokens=8)
    texts = [generate(str(inputs / "gpt"), ["The cat", "A dog"], cfg, runtime=Runtime(device=device))
             for device in ("cpu", "cuda")]
    assert texts[0] == texts[1]  # the same uniform draws; a tiny model's probabilities agree across them
