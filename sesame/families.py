"""The registry of model families and sizes.

A family is one row: which tokenizer it trains, how its Transformer is configured, which
pre-training objective (with which options) it uses, its default training recipe, how a
fine-tuned classifier pools the sequence, and whether fine-tuning adds GPT's input tokens. Sizes
follow Turc et al. (2019), "Well-Read Students Learn Better": heads = hidden / 64 and a feed-forward
width of 4 x hidden.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import SesameError
from .models import TransformerConfig


@dataclass(frozen=True)
class Family:
    name: str
    tokenizer: str  # wordpiece | bpe | unigram
    objective: str  # a key of sesame.objectives.OBJECTIVES
    causal: bool
    norm: str  # "post" (BERT, GPT) or "pre" (GPT-2: LayerNorm before each sublayer, one after the stack)
    embedding_norm: bool  # LayerNorm on the summed embeddings (BERT)
    pooling: str  # "cls": first token (encoders); "last": last real token (decoders)
    paper: str
    embedding_size: int | None = None  # ALBERT's factorised embedding E (None: E = hidden)
    sharing: str = "none"  # ALBERT's cross-layer sharing: none | all | attention | ffn
    objective_options: dict = field(default_factory=dict)
    recipe: dict = field(default_factory=dict)  # defaults for TrainConfig fields
    # fine-tuning adds GPT's start, delimiter and extract tokens (sesame.tasks.inputs; Radford et al. 2018,
    # §3.3). GPT-2's paper (2019) defines no fine-tuning inputs (it is evaluated zero-shot), so gpt2 keeps the
    # tokenizer's <s> a </s> b </s>, and GPT-2 checkpoints imported from transformers keep their vocabulary.
    input_tokens: bool = False
    context: int = 512  # learned positions (GPT and BERT: 512; GPT-2's longer context: 1024)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        #      name        tokenizer    objective  causal norm  emb-LN pooling paper
        Family("bert", "wordpiece", "mlm_nsp", False, "post", True, "cls", "Devlin et al. 2019"),
        Family("roberta", "bpe", "mlm", False, "post", True, "cls", "Liu et al. 2019",
               recipe={"batch_size": 128, "accumulate": 4}),  # FULL-SENTENCES, dynamic masks, large batches
        Family("albert", "unigram", "mlm_sop", False, "post", True, "cls", "Lan et al. 2020",
               embedding_size=128, sharing="all", objective_options={"masking": "phrase", "ngram": 3}),
        Family("spanbert", "wordpiece", "span", False, "post", True, "cls", "Joshi et al. 2020"),
        Family("electra", "wordpiece", "electra", False, "post", True, "cls", "Clark et al. 2020"),
        Family("gpt", "bpe", "clm", True, "post", False, "last", "Radford et al. 2018", input_tokens=True),
        Family("gpt2", "bpe", "clm", True, "pre", False, "last", "Radford et al. 2019", context=1024),
    ]
}

# (layers, hidden) per size; Turc et al. 2019, Table 6 / BERT-base.
SIZES: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
}


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise SesameError(f"--family {name!r} is unknown; choose one of: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def get_size(name: str) -> tuple[int, int]:
    if name not in SIZES:
        raise SesameError(f"--size {name!r} is unknown; choose one of: {', '.join(SIZES)}")
    return SIZES[name]


def backbone_config(family: str, size: str, vocab_size: int, pad_id: int, dropout: float = 0.1,
                    max_positions: int | None = None) -> TransformerConfig:
    """The Transformer configuration of ``family`` at ``size``, with the family's context unless ``max_positions``."""
    fam, (layers, hidden) = get_family(family), get_size(size)
    embedding_size = fam.embedding_size if fam.embedding_size and fam.embedding_size < hidden else None
    return TransformerConfig(
        vocab_size=vocab_size, hidden=hidden, layers=layers, heads=hidden // 64, intermediate=4 * hidden,
        max_positions=max_positions or fam.context, causal=fam.causal, norm=fam.norm, embedding_norm=fam.embedding_norm,
        dropout=dropout, pad_id=pad_id, layer_norm_eps=1e-12 if fam.norm == "post" else 1e-5,
        embedding_size=embedding_size, sharing=fam.sharing)
