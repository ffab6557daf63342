"""``sesame pretrain --teacher``: DistilBERT's pre-training distillation (Sanh et al. 2019), the parts
:func:`sesame.pipelines.pretrain` asks of the teacher.

The teacher is a masked LM that sesame loads: a pretrained run, or a transformers directory converted on the way
(``minilm`` among them). The student is the teacher's architecture and width with the layers ``--student-layers``
names (default: one out of two), reads the teacher's tokenizer (the soft targets are over the teacher's vocabulary,
position by position) and starts from the teacher's weights; the run is an ordinary ``mlm`` run of the teacher's
family, which ``sesame finetune --from`` and ``sesame evaluate`` read. The loss, the layer copy and the deviations:
:mod:`sesame.objectives.distillation`. The teacher and the resolved layers are recorded in config.json's ``setup``,
which ``--resume`` holds the command to (and which gives the teacher when ``--teacher`` is not given again).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..data.shards import Shards
from ..data.windows import Corpus
from ..errors import SesameError
from ..models import TransformerConfig
from ..objectives import OBJECTIVES, MaskedLM, build_objective
from ..objectives.distillation import MaskedLMDistillation, every_other_layer, frozen_teacher, student_weights
from ..run import build_backbone, load_backbone, load_tokenizer, read_config
from ..sources import opened
from ..specs import PretrainSpec
from ..tokenizer import TextTokenizer
from ..train.checkpoint import load_weights
from .starts import Origin, dropout

STUDENT_OBJECTIVE = "mlm"  # the student learns the masked LM alone (Sanh et al. 2019 §3: no next-sentence prediction)
# what a student cannot change of its teacher (the spec's field → its flag)
TEACHERS_OWN = {"family": "--family", "size": "--size", "tokenizer": "--tokenizer", "vocab_size": "--vocab-size",
                "cased": "--cased", "attention_window": "--attention-window"}


class PretrainTeacher:
    """The masked LM ``given`` names, read once into memory: its run config, its tokenizer (``tok``), its model
    (its masked-LM objective where it has one, else its backbone) and that model's weights under the names of a
    student's objective (``state``). It is what the student's run starts from (a
    :class:`sesame.pipelines.starts.Start`)."""

    def __init__(self, given: str):
        self.given = given
        with opened(given, "--teacher") as (_, run):
            config = read_config(run, "--teacher")
            model = config.model  # a student copies the layers of a plain Transformer encoder
            what = (f"a {config.kind} run" if config.kind != "pretrained" else
                    f"its model is {type(model).__name__.removesuffix('Config')}, not a Transformer" if type(model) is not TransformerConfig else
                    "causal" if model.causal else
                    f"sharing {model.sharing} layers" if model.sharing != "none" else None)
            if what is not None:
                raise SesameError(f"--teacher {given}: {what}; DistilBERT distils a pretrained Transformer encoder "
                                  "whose layers are its own (a BERT-like masked LM: a sesame mlm run, a transformers "
                                  "BERT directory, minilm)")
            self.config, self.tok = config, load_tokenizer(run, "--teacher")
            objective = config.pretrained.objective
            self.soft_targets = objective is not None and issubclass(OBJECTIVES[objective], MaskedLM)
            if self.soft_targets:
                self.model = build_objective(objective, build_backbone(config), self.tok,
                                             config.pretrained.objective_options)
                self.model.load_state_dict(load_weights(run / "model.safetensors"))
                self.state = self.model.state_dict()
            else:
                self.model = load_backbone(run, "--teacher")
                self.state = {f"backbone.{name}": value for name, value in self.model.state_dict().items()}

    @property
    def layers(self) -> int:
        return self.config.model.layers

    def taught(self, spec: PretrainSpec) -> PretrainSpec:
        """``spec`` as the teacher makes it: the teacher's family, the ``mlm`` objective and the student's layers
        (``--student-layers``, else one out of two); refuses what a student cannot change of its teacher."""
        explicit = spec.given_fields()
        for name, flag in TEACHERS_OWN.items():
            value = getattr(spec, name)
            if name in explicit and value is not None and value is not False:
                raise SesameError(f"{flag} {value}: a student has its teacher's family, size, tokenizer and width "
                                  f"(--teacher {self.given}); drop {flag}")
        if spec.objective not in (None, STUDENT_OBJECTIVE) or spec.base is not None:
            given = f"--objective {spec.objective}" if spec.base is None else f"base={spec.base!r}"
            raise SesameError(f"{given}: DistilBERT's student learns the masked LM alone (no next-sentence "
                              f"prediction), from --teacher {self.given}; leave it out")
        taught = spec.distillation
        layers = taught.student_layers or every_other_layer(self.layers)
        if max(layers) >= self.layers:
            raise SesameError(f"--student-layers {' '.join(map(str, layers))}: --teacher {self.given} has layers 0 "
                              f"to {self.layers - 1}")
        length, flag = spec.longest_examples()
        if length > self.config.model.max_positions:
            raise SesameError(f"{flag} {length}: --teacher {self.given} has {self.config.model.max_positions} "
                              "positions, which the student copies; give at most that")
        masking = spec.objective_options.get("masking", "token")
        if taught.mlm_smoothing and masking != "token":
            raise SesameError(f"--mlm-smoothing {taught.mlm_smoothing}: DistilBERT's smoothing chooses single tokens, and "
                              f"--masking {masking} chooses whole words; give --mlm-smoothing 0, or leave --masking "
                              "out")
        if taught.kl_weight and not self.soft_targets:
            raise SesameError(f"--kl-weight {taught.kl_weight}: --teacher {self.given} has no masked-LM head (converted "
                              "without one, as all-MiniLM-L6-v2, which ships its encoder alone), so it gives no soft "
                              "targets; give --kl-weight 0 to distil its hidden states (--cosine-weight) beside the "
                              "student's masked LM, or a teacher with the head (a sesame mlm run, a transformers "
                              "BertForMaskedLM directory)")
        return replace(spec, family=self.config.family, objective=STUDENT_OBJECTIVE,
                       distillation=replace(taught, student_layers=layers))

    def student_model(self, spec: PretrainSpec, dropout: float) -> TransformerConfig:
        """The student's backbone config: the teacher's with the student's layers and ``dropout``."""
        return replace(self.config.model, layers=len(spec.distillation.student_layers), dropout=dropout)

    # the pre-training pipeline's Start (sesame.pipelines.starts): the teacher's tokenizer and its student

    def tokenizer(self, corpus: Corpus, spec: PretrainSpec) -> tuple[TextTokenizer, str | None]:
        return self.tok, spec.tokenizer

    def backbone(self, spec: PretrainSpec, tok: TextTokenizer) -> TransformerConfig:
        return self.student_model(spec, dropout(spec))

    def origin(self, spec: PretrainSpec, model: TransformerConfig) -> Origin:
        return Origin(None, spec.teacher, pooling=spec.fam.pooling)

    def initialise(self, student: MaskedLM, spec: PretrainSpec) -> None:
        """Copy the teacher's weights into a new ``student`` (:func:`student_weights`)."""
        student.load_state_dict(student_weights(self.state, student.state_dict(), spec.distillation.student_layers))

    def learner(self, student: MaskedLM, spec: PretrainSpec, corpus: Shards) -> MaskedLMDistillation:
        """What the trainer trains: ``student`` inside DistilBERT's loss, with the spec's weights, masking tokens by
        their counts in the ``corpus`` shards when its ``mlm_smoothing`` says so."""
        taught = spec.distillation
        weights = {"mlm": taught.mlm_weight, "kl": taught.kl_weight, "cosine": taught.cosine_weight}
        counts = torch.from_numpy(corpus.token_counts(self.tok.vocab_size)) if taught.mlm_smoothing else None
        return MaskedLMDistillation(student, frozen_teacher(self.model), soft_targets=self.soft_targets,
                                    weights=weights, temperature=taught.temperature, counts=counts,
                                    smoothing=taught.mlm_smoothing, train_positions=taught.train_positions)

