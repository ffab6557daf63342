"""`sesame pretrain --model-option KEY=VALUE`: a new model's configuration beyond its family and size (issue 36's
architecture ablations: pre-LN, no biases, the activation), recorded in config.json and kept by fine-tuning and the
scratch twin."""
import json

from torch import nn

import sesame
from sesame.cli import main
from sesame.run import build_backbone, read_config


def test_model_options_shape_the_new_model_and_travel_with_the_run(corpus, tmp_path):
    run = tmp_path / "pre"
    assert main(["--no-progress", "pretrain", "--corpus", str(corpus), "--out", str(run), "--size", "tiny",
                 "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8", "--max-steps", "2",
                 "--objective", "mlm", "--model-option", "norm=pre", "--model-option", "bias=false",
                 "--model-option", "activation=gelu_tanh"]) == 0
    model = json.loads((run / "config.json").read_text())["model"]
    assert (model["norm"], model["bias"], model["activation"]) == ("pre", False, "gelu_tanh")
    backbone = build_backbone(read_config(run, "--from"))
    assert isinstance(backbone.final_norm, nn.LayerNorm)  # pre-LN's last norm (Xiong et al. 2020)
    inside = [m for name, m in backbone.named_modules() if isinstance(m, nn.Linear) and not name.startswith("embed")]
    assert inside and all(m.bias is None for m in inside)
    labeled = tmp_path / "train.csv"
    labeled.write_text("text,label\n" + "".join(f"word {i},{i % 2}\n" for i in range(16)))
    for base, out in ((str(run), "tuned"), (f"scratch:{run}", "twin")):  # fine-tuned, and the scratch twin
        sesame.finetune(base, str(labeled), str(labeled), str(tmp_path / out), max_steps=1, batch_size=8,
                        max_length=16, progress=False)
        kept = json.loads((tmp_path / out / "config.json").read_text())["model"]
        assert kept == {**model, "dropout": kept["dropout"]}  # (fine-tuning's own dropout)
