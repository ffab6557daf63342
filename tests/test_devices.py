"""Devices (sesame.runtime): device names resolved or refused in one line, a precision the device cannot do
refused, the CPU given explicitly running the same code path as the default, and every command that runs a model
taking the runtime (compare and ulmfit give it to their stages without recording the device). The trainer's
precision and compile: test_trainer_runtime.py; tensors made off the model's device: test_placement.py; the GPU
tests: test_devices_gpu.py."""
import json

import pytest
import torch

from sesame.cli import main
from sesame.errors import SesameError
from sesame.runtime import Runtime, resolve_device

from .device_helpers import COMMANDS, command


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


@pytest.mark.parametrize("name", COMMANDS)
def test_every_model_command_refuses_a_device_it_lacks_in_one_line_writing_nothing(name, command_inputs, tmp_path,
                                                                                   capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "out"
    assert main(["--no-progress", *command(name, command_inputs, out), "--device", "cuda:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"sesame: error: --device cuda:0: this machine has no CUDA GPU that PyTorch {torch.__version__} " \
                  "can use; use --device cpu (or auto)"
    assert not out.exists()


@pytest.mark.parametrize("name", ["generate", "prompt-eval", "neighbors", "translate", "cove"])
def test_the_cpu_explicitly_runs_every_inference_command_as_the_default_does(name, command_inputs, tmp_path, capsys):
    outputs = []
    for device, out in ((["--device", "cpu"], tmp_path / "cpu"), ([], tmp_path / "default")):
        capsys.readouterr()
        assert main(["--no-progress", *command(name, command_inputs, out), *device]) == 0
        text = out.read_text() if out.is_file() else capsys.readouterr().out
        outputs.append(text if name != "cove" else json.loads((out / "config.json").read_text())["runtime"])
    assert outputs[0] and (outputs[0] == outputs[1] or name == "cove")
    if name == "cove":
        assert outputs[0] == {"device": "cpu", "precision": "fp32", "tf32": False, "compile": False}


def stage_settings(folder):
    return {str(path.parent.relative_to(folder)): json.loads(path.read_text())["settings"]
            for path in folder.rglob("compare.json")}


def test_compare_records_the_precision_not_the_device_in_its_cells_settings(command_inputs, tmp_path, capsys):
    out = tmp_path / "compare"
    assert main(["--no-progress", *command("compare", command_inputs, out), "--device", "cpu"]) == 0
    settings = stage_settings(out)
    assert len(settings) == 4 and not any({"device", "precision"} & set(s) for s in settings.values())
    capsys.readouterr()
    assert main(["--no-progress", *command("compare", command_inputs, out), "--precision", "fp32"]) == 0  # any device
    assert capsys.readouterr().err.count("(reused)") == 4
    assert main(["--no-progress", *command("compare", command_inputs, out), "--precision", "bf16"]) == 2
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


def test_ulmfit_gives_its_stages_the_runtime_and_records_no_device(command_inputs, tmp_path):
    out = tmp_path / "ulmfit"
    assert main(["--no-progress", *command("ulmfit", command_inputs, out), "--device", "cpu", "--json"]) == 0
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

