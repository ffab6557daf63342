"""sesame: transfer learning for NLP, from raw text to a fine-tuned, evaluated model.

The Python API mirrors the command line::

    import sesame
    sesame.pretrain(corpus=["text/"], out="runs/bert", family="bert", size="mini", max_minutes=20)
    sesame.finetune(base="runs/bert", train="train.csv", dev="dev.csv", out="runs/clf",
                    text_column="text", label_column="label")
    sesame.evaluate("runs/clf", "dev.csv")["accuracy"]
    sesame.load("runs/clf").predict(["what a lovely flight"])
    sesame.generate("runs/gpt2", ["The river"], sesame.GenerationConfig(sample=True, top_p=0.9))
    sesame.prompt_eval("runs/gpt2", data="dev.csv", train="train.csv", ks=(0, 4))
"""
from .api import distil, evaluate, finetune, load, predict, pretrain
from .apps.prompting import prompt_eval_of as prompt_eval
from .decoding import GenerationConfig
from .errors import SesameError
from .generation import generate
from .version import __version__

__all__ = ["pretrain", "finetune", "distil", "evaluate", "predict", "load", "generate", "GenerationConfig",
           "prompt_eval", "SesameError", "__version__"]
