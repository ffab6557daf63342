"""How each Hugging Face ``model_type`` maps onto sesame's one Transformer stack: one row per architecture.

A row names, for its ``transformers`` base model (``BertModel``, ``GPT2Model``, ...):

* ``modules``: sesame backbone module → Hugging Face module (``{i}`` is the stored layer index; a
  tuple is concatenated along the output dimension: BERT's separate query, key and value are sesame's
  one ``qkv`` projection). Every parameter of the module (``weight``, ``bias``) maps alike;
* ``config``: ``TransformerConfig`` field → Hugging Face config key, and ``fixed``: the fields the
  architecture implies (post- or pre-LayerNorm, causal, no token types, ...);
* ``hf_fixed``: Hugging Face config values sesame's stack assumes (absolute positions, no cross
  attention, ...), checked on import and written on export; ``defaults``: the config class's defaults
  for keys a config.json may leave out (its activation, dropout, LayerNorm epsilon, ...);
* ``pooler``: BERT's and ALBERT's [CLS] pooler (dense + tanh), sesame's ``pooler.0``;
* ``classifier``: a fine-tuned ``SequenceModel``'s pooler and head → the modules of the matching
  ``*ForSequenceClassification``, or ``None`` with the reason the head does not map;
* ``lm``: the language-model head of ``*ForMaskedLM`` (or ``GPT2LMHeadModel``) as sesame's ``mlm``
  (or ``clm``) objective holds it, and ``pairs``: BERT's next-sentence / ALBERT's sentence-order
  head of ``*ForPreTraining`` as sesame's ``mlm_nsp`` / ``mlm_sop`` objective holds it (see :class:`LMHead`);
  ``discriminator``: ELECTRA's replaced-token head, sesame's ``electra`` objective's ``discriminator_head``;
* ``heads``: the top-level modules of the architecture's task and pre-training heads, which import
  leaves behind unless they map (a sesame run keeps the backbone, and the pooler where there is one).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import SesameError

# Hugging Face activation names ↔ TransformerConfig.activation
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
EXPORTED_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


@dataclass(frozen=True)
class LMHead:
    """A transformers language-model head and sesame's objective with the same function.

    sesame's MLM head (objectives/mlm.py) is dense → the backbone's GELU → LayerNorm → output layer tied
    to the token embeddings, plus a bias; its CLM (objectives/clm.py) is the tied output layer alone.
    ``modules``: sesame module → transformers module (weight and bias alike); ``bias``: the
    transformers name of sesame's ``bias``; ``decoder``: the tied output layer, whose weight (and bias)
    a checkpoint may store as copies; ``activation``: the config key naming the head's activation, or
    ``""`` where the class always applies exact GELU (a masked-LM head maps when its activation is the
    backbone's, :meth:`same_activation`)."""

    hf_class: str
    objective: str
    modules: dict[str, str] = field(default_factory=dict)
    bias: str | None = None
    decoder: str = ""
    activation: str = ""

    def same_activation(self, head_activation: str, backbone_activation: str) -> bool:
        """Whether the transformers head, applying ``head_activation`` (a TransformerConfig name), computes
        what sesame's head on a backbone with ``backbone_activation`` does (a causal LM head has none)."""
        return self.objective == "clm" or head_activation == backbone_activation


@dataclass(frozen=True)
class PairHead:
    """``*ForPreTraining``'s sentence-pair classifier on the [CLS] pooler: sesame's ``module`` of ``objective``."""

    hf_class: str
    objective: str
    module: str
    hf_module: str


@dataclass(frozen=True)
class Architecture:
    model_type: str
    family: str  # the sesame family a converted run belongs to (its pooling)
    prefix: str  # transformers' base_model_prefix: task models hold the backbone under "prefix."
    base_class: str
    tokenizer: str  # how vocabulary files build the tokenizer: wordpiece | roberta | gpt2 | json (tokenizer.json only)
    modules: dict[str, str | tuple[str, ...]]
    config: dict[str, str]
    fixed: dict[str, Any]
    hf_fixed: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    special_tokens: dict[str, str | None] = field(default_factory=dict)  # the tokenizer class's defaults
    inputs: tuple[str, ...] = ("input_ids", "token_type_ids", "attention_mask")  # what the model reads
    pooler: str | None = None
    classifier: dict[str, str] | None = None
    not_classifier: str = ""
    heads: tuple[str, ...] = ()
    lm: LMHead | None = None
    pairs: PairHead | None = None
    discriminator: dict[str, str] | None = None  # sesame module → ElectraForPreTraining module
    conv1d: bool = False  # GPT-2 stores its linear layers as Conv1D: weights (in, out)
    position_offset: bool = False  # RoBERTa: position p of a sequence reads row padding_idx + 1 + p
    groups: bool = False  # ALBERT: num_hidden_groups 1 shares every layer (sharing "all"); one per layer, none
    always_projects: bool = False  # ALBERT: the embedding → hidden projection exists even when E == H


def _bert_layers(layer: str) -> dict[str, str | tuple[str, ...]]:
    """BERT's encoder layer ``layer`` (with ``{i}``): shared by BERT, RoBERTa and ELECTRA."""
    return {
        "attention.{i}.qkv": tuple(f"{layer}.attention.self.{p}" for p in ("query", "key", "value")),
        "attention.{i}.out": f"{layer}.attention.output.dense",
        "attention.{i}.norm": f"{layer}.attention.output.LayerNorm",
        "feed_forward.{i}.inp": f"{layer}.intermediate.dense",
        "feed_forward.{i}.out": f"{layer}.output.dense",
        "feed_forward.{i}.norm": f"{layer}.output.LayerNorm",
    }


BERT_EMBEDDINGS = {
    "embed.tokens": "embeddings.word_embeddings",
    "embed.positions": "embeddings.position_embeddings",
    "embed.types": "embeddings.token_type_embeddings",
    "embed.norm": "embeddings.LayerNorm",
}
BERT_CONFIG = {
    "vocab_size": "vocab_size", "hidden": "hidden_size", "layers": "num_hidden_layers",
    "heads": "num_attention_heads", "intermediate": "intermediate_size", "max_positions": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size", "layer_norm_eps": "layer_norm_eps", "dropout": "hidden_dropout_prob",
    "activation": "hidden_act",
}
ENCODER = {"causal": False, "norm": "post", "embedding_norm": True}
BERT_FIXED = {**ENCODER, "embedding_size": None, "sharing": "none"}
ABSOLUTE = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}
BERT_DEFAULTS = {"hidden_act": "gelu", "hidden_dropout_prob": 0.1, "max_position_embeddings": 512,
                 "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0}
BERT_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                 "mask_token": "[MASK]"}
BERT_HEADS = ("cls", "classifier", "qa_outputs")
GELU_HEAD = "its head applies GELU after the dense layer where sesame's pooler applies tanh"

ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in [
    Architecture(
        "bert", "bert", "bert", "BertModel", "wordpiece",
        modules={**BERT_EMBEDDINGS, **_bert_layers("encoder.layer.{i}")},
        config=BERT_CONFIG, fixed=BERT_FIXED, hf_fixed=ABSOLUTE, defaults=BERT_DEFAULTS, special_tokens=BERT_SPECIALS,
        pooler="pooler.dense", classifier={"pooler.0": "bert.pooler.dense", "head": "classifier"}, heads=BERT_HEADS,
        lm=LMHead("BertForMaskedLM", "mlm", {"transform.0": "cls.predictions.transform.dense",
                                             "transform.2": "cls.predictions.transform.LayerNorm"},
                  "cls.predictions.bias", "cls.predictions.decoder", "hidden_act"),
        pairs=PairHead("BertForPreTraining", "mlm_nsp", "nsp", "cls.seq_relationship")),
    Architecture(
        "roberta", "roberta", "roberta", "RobertaModel", "roberta",
        modules={**BERT_EMBEDDINGS, **_bert_layers("encoder.layer.{i}")},
        config=BERT_CONFIG, fixed=BERT_FIXED, hf_fixed=ABSOLUTE, defaults={**BERT_DEFAULTS, "pad_token_id": 1},
        special_tokens={"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>", "sep_token": "</s>",
                        "mask_token": "<mask>", "bos_token": "<s>", "eos_token": "</s>"},
        inputs=("input_ids", "attention_mask"), pooler="pooler.dense",
        classifier={"pooler.0": "classifier.dense", "head": "classifier.out_proj"},
        heads=("lm_head", "classifier", "qa_outputs"), position_offset=True,
        lm=LMHead("RobertaForMaskedLM", "mlm", {"transform.0": "lm_head.dense", "transform.2": "lm_head.layer_norm"},
                  "lm_head.bias", "lm_head.decoder")),
    Architecture(
        "electra", "electra", "electra", "ElectraModel", "wordpiece",
        modules={**BERT_EMBEDDINGS, "project": "embeddings_project", **_bert_layers("encoder.layer.{i}")},
        config={**BERT_CONFIG, "embedding_size": "embedding_size"}, fixed={**ENCODER, "sharing": "none"},
        hf_fixed=ABSOLUTE, defaults={**BERT_DEFAULTS, "embedding_size": 128}, special_tokens=BERT_SPECIALS,
        not_classifier=GELU_HEAD,
        heads=("discriminator_predictions", "generator_predictions", "generator_lm_head", "classifier",
               "qa_outputs", "sequence_summary"),
        lm=LMHead("ElectraForMaskedLM", "mlm", {"transform.0": "generator_predictions.dense",
                                                "transform.2": "generator_predictions.LayerNorm"},
                  "generator_lm_head.bias", "generator_lm_head"),
        discriminator={"discriminator_head.0": "discriminator_predictions.dense",
                       "discriminator_head.2": "discriminator_predictions.dense_prediction"}),
    Architecture(
        "albert", "albert", "albert", "AlbertModel", "json",
        modules={
            "embed.tokens": "embeddings.word_embeddings", "embed.positions": "embeddings.position_embeddings",
            "embed.types": "embeddings.token_type_embeddings", "embed.norm": "embeddings.LayerNorm",
            "project": "encoder.embedding_hidden_mapping_in",
            "attention.{i}.qkv": tuple(f"encoder.albert_layer_groups.{{i}}.albert_layers.0.attention.{p}"
                                       for p in ("query", "key", "value")),
            "attention.{i}.out": "encoder.albert_layer_groups.{i}.albert_layers.0.attention.dense",
            "attention.{i}.norm": "encoder.albert_layer_groups.{i}.albert_layers.0.attention.LayerNorm",
            "feed_forward.{i}.inp": "encoder.albert_layer_groups.{i}.albert_layers.0.ffn",
            "feed_forward.{i}.out": "encoder.albert_layer_groups.{i}.albert_layers.0.ffn_output",
            "feed_forward.{i}.norm": "encoder.albert_layer_groups.{i}.albert_layers.0.full_layer_layer_norm",
        },
        config={**BERT_CONFIG, "embedding_size": "embedding_size"}, fixed=ENCODER,
        hf_fixed={**ABSOLUTE, "inner_group_num": 1},
        defaults={**BERT_DEFAULTS, "hidden_act": "gelu_new", "hidden_dropout_prob": 0.0, "embedding_size": 128,
                  "num_hidden_groups": 1, "inner_group_num": 1},
        special_tokens={"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "[CLS]", "sep_token": "[SEP]",
                        "mask_token": "[MASK]", "bos_token": "[CLS]", "eos_token": "[SEP]"},
        pooler="pooler", classifier={"pooler.0": "albert.pooler", "head": "classifier"},
        heads=("predictions", "sop_classifier", "classifier", "qa_outputs"), groups=True, always_projects=True,
        lm=LMHead("AlbertForMaskedLM", "mlm", {"transform.0": "predictions.dense",
                                               "transform.2": "predictions.LayerNorm"},
                  "predictions.bias", "predictions.decoder", "hidden_act"),
        pairs=PairHead("AlbertForPreTraining", "mlm_sop", "sop", "sop_classifier.classifier")),
    Architecture(
        "distilbert", "bert", "distilbert", "DistilBertModel", "wordpiece",
        modules={
            "embed.tokens": "embeddings.word_embeddings", "embed.positions": "embeddings.position_embeddings",
            "embed.norm": "embeddings.LayerNorm",
            "attention.{i}.qkv": tuple(f"transformer.layer.{{i}}.attention.{p}_lin" for p in "qkv"),
            "attention.{i}.out": "transformer.layer.{i}.attention.out_lin",
            "attention.{i}.norm": "transformer.layer.{i}.sa_layer_norm",
            "feed_forward.{i}.inp": "transformer.layer.{i}.ffn.lin1",
            "feed_forward.{i}.out": "transformer.layer.{i}.ffn.lin2",
            "feed_forward.{i}.norm": "transformer.layer.{i}.output_layer_norm",
        },
        config={"vocab_size": "vocab_size", "hidden": "dim", "layers": "n_layers", "heads": "n_heads",
                "intermediate": "hidden_dim", "max_positions": "max_position_embeddings", "dropout": "dropout",
                "activation": "activation"},
        fixed={**BERT_FIXED, "type_vocab_size": 0, "layer_norm_eps": 1e-12},
        hf_fixed={"sinusoidal_pos_embds": False}, special_tokens=BERT_SPECIALS,
        defaults={"activation": "gelu", "dropout": 0.1, "max_position_embeddings": 512, "pad_token_id": 0},
        inputs=("input_ids", "attention_mask"),
        not_classifier="its head is a dense layer with ReLU where sesame's pooler applies tanh",
        heads=("vocab_transform", "vocab_layer_norm", "vocab_projector", "pre_classifier", "classifier",
               "qa_outputs"),
        lm=LMHead("DistilBertForMaskedLM", "mlm", {"transform.0": "vocab_transform", "transform.2": "vocab_layer_norm"},
                  "vocab_projector.bias", "vocab_projector", "activation")),
    Architecture(
        "gpt2", "gpt2", "transformer", "GPT2Model", "gpt2",
        modules={
            "embed.tokens": "wte", "embed.positions": "wpe",
            "attention.{i}.qkv": "h.{i}.attn.c_attn", "attention.{i}.out": "h.{i}.attn.c_proj",
            "attention.{i}.norm": "h.{i}.ln_1",
            "feed_forward.{i}.inp": "h.{i}.mlp.c_fc", "feed_forward.{i}.out": "h.{i}.mlp.c_proj",
            "feed_forward.{i}.norm": "h.{i}.ln_2", "final_norm": "ln_f",
        },
        config={"vocab_size": "vocab_size", "hidden": "n_embd", "layers": "n_layer", "heads": "n_head",
                "intermediate": "n_inner", "max_positions": "n_positions", "layer_norm_eps": "layer_norm_epsilon",
                "dropout": "resid_pdrop", "activation": "activation_function"},
        fixed={"causal": True, "norm": "pre", "embedding_norm": False, "type_vocab_size": 0, "embedding_size": None,
               "sharing": "none"},
        hf_fixed={"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False},
        defaults={"activation_function": "gelu_new", "n_inner": None, "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1,
                  "n_positions": 1024},
        special_tokens={"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
        inputs=("input_ids", "attention_mask"),
        not_classifier="GPT2ForSequenceClassification's score layer has no bias, sesame's head has one",
        heads=("lm_head", "score", "multiple_choice_head"), conv1d=True,
        lm=LMHead("GPT2LMHeadModel", "clm", decoder="lm_head")),
]}

# a run's family → the architecture it exports as (when the run records no Hugging Face source)
FAMILY_MODEL_TYPES = {"bert": "bert", "spanbert": "bert", "roberta": "roberta", "electra": "electra",
                      "albert": "albert", "gpt2": "gpt2"}


def architecture(model_type: str | None, where: str) -> Architecture:
    """The row of ``model_type``, or a SesameError naming ``where`` it was read and what converts."""
    if model_type not in ARCHITECTURES:
        raise SesameError(f"{where}: model_type {model_type!r} is not supported; sesame converts "
                          f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]
