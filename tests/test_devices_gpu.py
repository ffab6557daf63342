"""The GPU tests (marked ``gpu``: skipped without CUDA; scripts/gpu_check.sh runs them on one): runs saved and
loaded across CPU and CUDA, mixed precision resuming exactly on CUDA, and the inference commands and sampling's
draws giving on CUDA what they give on the CPU."""
import json

import pytest
import torch

import sesame
from sesame.cli import main
from sesame.runtime import Runtime
from sesame.train.checkpoint import load_weights

from .device_helpers import TINY, command, same_weights, stopped_at_2_then_resumed


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
def test_the_inference_commands_give_on_cuda_what_they_give_on_the_cpu(name, command_inputs, tmp_path, capsys):
    outputs = []
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        capsys.readouterr()
        assert main(["--no-progress", *command(name, command_inputs, out), "--device", device]) == 0
        outputs.append(out.read_text() if out.is_file() else capsys.readouterr().out)
    if name == "neighbors":  # cosines agree to rounding
        a, b = (json.loads(text) for text in outputs)
        assert [n["token"] for n in a["static"]] == [n["token"] for n in b["static"]]
        assert all(abs(x["score"] - y["score"]) < 1e-3 for o, p in zip(a["occurrences"], b["occurrences"])
                   for x, y in zip(o["neighbors"], p["neighbors"]))
    else:  # greedy tokens, translations and accuracies: the same
        assert outputs[0] == outputs[1]


@pytest.mark.gpu
def test_sampling_draws_the_same_tokens_on_cuda_as_on_the_cpu(command_inputs):
    from sesame.decoding import GenerationConfig
    from sesame.generation import generate

    cfg = GenerationConfig(sample=True, seed=5, max_new_tokens=8)
    texts = [generate(str(command_inputs / "gpt"), ["The cat", "A dog"], cfg, runtime=Runtime(device=device))
             for device in ("cpu", "cuda")]
    assert texts[0] == texts[1]  # the same uniform draws; a tiny model's probabilities agree across them
