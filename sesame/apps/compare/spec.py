"""What ``sesame compare`` compares: :class:`CompareSpec`, which the package (:mod:`sesame.apps.compare`) runs."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from ...options import option
from ...runtime import Runtime
from .tasks import FINETUNE_OPTIONS, SHORTCUTS, default_data

ROW_DEFAULT = "fine-tuning {} of every row whose family, task or approach sets none"


@dataclass(kw_only=True)
class CompareSpec:
    """``sesame compare``: the approaches, the shared corpus and budget, the tasks, and the fine-tuning settings
    of rows that set none of their own (3 epochs at lr 2e-4 suit the small Transformers; a family's defaults,
    ``Family.finetune``, come next, then the task's, then the approach's ``finetune.KEY=VALUE`` items)."""
    approaches: list[str] = option(metavar="FAMILY:SIZE[:KEY=VALUE...]",
                                   help="e.g. bert:mini roberta:mini:accumulate=4 lstm:mini cove:mini:from=runs/cove "
                                        "bert:mini:from=minilm:finetune.lr=5e-5; KEY: a pretrain option or objective "
                                        "option, from (a run to fine-tune instead of pre-training) or finetune.KEY (a "
                                        "finetune option)")
    corpus: list[str] = option(help="pre-training text files or folders, shared by all")
    valid: list[str] | None = option(None, help="validation text (default: the corpus's last 1%%)")
    tasks: list[str] = option(metavar="TASK[:KEY=VALUE...]",
                              help=f"built-in ({', '.join(SHORTCUTS)}, under --data) or JSON files "
                                   '{"name", "train", "dev", "text_column", "label_column", "pair_column"}; KEY=VALUE: '
                                   f"this task's own {', '.join(FINETUNE_OPTIONS)}, e.g. sst2:epochs=1")
    data: str = option(factory=default_data, help="where the built-in tasks live (default: $SESAME_DATA, else "
                                                  "../shared/data)")
    out: str = option(help="directory of the cells and results; rerun to resume")
    minutes: float = option(help="pre-training wall-time budget per approach")
    max_steps: int | None = option(None, help="also stop pre-training at this many steps (quick checks)")
    epochs: int = option(3, help=ROW_DEFAULT.format("epochs"))
    lr: float = option(2e-4, help=ROW_DEFAULT.format("learning rate"))
    batch_size: int = option(32, help=ROW_DEFAULT.format("batch size"))
    max_length: int = option(128, help=ROW_DEFAULT.format("tokens per text"))
    seed: int = option(0, help="seed of every pre-training and fine-tuning")
    runtime: Runtime = option(factory=Runtime, cli=False, help="every cell's device and precision (sesame.runtime; "
                                                               "an approach's precision=… or finetune.precision=… "
                                                               "overrides the precision)")
    progress: bool = option(True, cli=False, help="show progress bars")

    @property
    def fine_tuning(self) -> dict:
        """The command's fine-tuning options, the first of a row's (:meth:`Approach.fine_tuning`)."""
        return {"epochs": self.epochs, "lr": self.lr, "batch_size": self.batch_size, "max_length": self.max_length,
                "seed": self.seed}

    @property
    def command(self) -> str:
        """The command line that makes this comparison, written atop results.md."""
        return shlex.join(["sesame", "compare", "--approaches", *self.approaches, "--corpus", *self.corpus,
                           *(["--valid", *self.valid] if self.valid else []), "--tasks", *self.tasks, "--data",
                           self.data, "--out", str(self.out), "--minutes", f"{self.minutes:g}",
                           *(["--max-steps", str(self.max_steps)] if self.max_steps else []),
                           "--epochs", str(self.epochs), "--lr", f"{self.lr:g}", "--batch-size", str(self.batch_size),
                           "--max-length", str(self.max_length), "--seed", str(self.seed),
                           *(["--precision", self.runtime.precision] if self.runtime.precision else [])])
