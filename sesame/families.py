"""The registry of model families and sizes.

A family is one row: which tokenizer it trains, its architecture and how it is configured, which
pre-training objective (with which options) it uses, its default training recipe, how a
fine-tuned classifier pools the sequence, and how its task models read their inputs (an
:class:`~sesame.inputs.InputFormat`: the tokenizer's template, GPT's input tokens, ULMFiT's documents, XLNet's
``<cls>`` last) and how they read its runs (a :class:`Reader`: its own network, fine-tuned, or ELMo's and CoVe's frozen
features), objects the pipelines call rather than flags they test.
Transformer sizes follow Turc et al. (2019), "Well-Read Students Learn Better": heads = hidden / 64
and a feed-forward width of 4 x hidden. Recurrent sizes scale AWD-LSTM's (embedding 400, hidden 1150
at ``base``; Merity et al. 2018) down for a CPU.

The recurrent families: ``lstm``, ``gru`` and ``bilstm`` are baselines trained from scratch (optionally
from word vectors, ``sesame finetune --vectors``); ``ulmfit`` is AWD-LSTM with its dropouts
(Howard & Ruder 2018, §4: 0.4 on the output, 0.3 between layers, 0.4 on the input, 0.05 on embeddings,
0.5 on the hidden-to-hidden weights); ``elmo`` is a character-aware biLM whose layers a task model
reads, frozen, beside its own embeddings; ``cove`` is the MT-LSTM encoder (trained by ``sesame cove``).

The encoder-decoder families (arch ``encoder_decoder``, :mod:`sesame.models.encoder_decoder`): ``t5`` (Raffel et
al. 2020), ``t5v1_1`` (T5 v1.1: gated-GELU feed-forward 8/3·hidden wide, untied output layer) and ``bart`` (Lewis et
al. 2020), whose rows take their model's fields from ``STYLES`` and have as many layers in the decoder as in the
encoder (T5's and BART's own sizes do); ``hf_model_type`` names the transformers ``model_type`` whose checkpoints
``sesame convert`` imports as the family's runs; docs/encoder_decoder.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Callable, Iterable

from .errors import SesameError
from .inputs import (BOS_FIRST, CLS_LAST, DOCUMENTS, GPT_TOKENS, PLAIN, TEXT_FIRST, WITHOUT_START, InputFormat,
                     SourceStart)
from .models import ARCHITECTURES, ModelConfig, RecurrentConfig, TransformerConfig
from .models.encoder_decoder import STYLES
from .tokenizer import SpecialIds, TextTokenizer, extend_words

if TYPE_CHECKING:
    from .run import RunConfig

# what a task model's word embedding --vectors may start, said after the flag that names the vectors
NEW_EMBEDDING = ("initialises the word embedding of a new recurrent task model: scratch:lstm|gru|bilstm|ulmfit:SIZE, "
                 "or one reading an elmo run")


class Reader:
    """How a new task model reads a run of its family, a row's ``reader`` (fastai's ``_model_meta`` likewise holds
    behaviour, so generic code never branches on a family): the default is the family's own network under a task
    head, fine-tuned, which may also start from new weights (``scratch:FAMILY:SIZE``), whose word embedding, if the
    family reads words, ``--vectors`` may start."""

    def task_model(self, family: Family, config: RunConfig, *, dropout: float) -> RunConfig:
        """The configuration of a task model that starts from ``config``, a run of ``family``: the run's own."""
        return config

    def scratch_refusal(self, family: Family) -> str | None:
        """Why no task model of ``family`` starts from new weights (None: one does)."""
        return None

    def vectors_refusal(self, family: Family, *, scratch: bool) -> str | None:
        """Why word vectors cannot start the word embedding of a task model of ``family`` with new weights
        (``scratch``) or a run's, said after the flag that names them (None: they can, a new embedding of words)."""
        return None if scratch and family.tokenizer == "word" else NEW_EMBEDDING


class FeatureReader(Reader):
    """A pretrained feature extractor (ELMo's biLM, CoVe's encoder) read frozen by a new task model beside its own
    word embedding (:func:`reading_features`), which starts as the extractor's own word vectors where
    ``extractor_vectors`` (CoVe's GloVe) and is new otherwise (ELMo's, which ``--vectors`` may start). Such a family
    has runs, not a task model of new weights."""

    def __init__(self, *, extractor_vectors: bool):
        self.extractor_vectors = extractor_vectors

    def task_model(self, family: Family, config: RunConfig, *, dropout: float) -> RunConfig:
        """The extractor's own run: the task model reading it; a task model that reads it already: as it is."""
        if config.model.arch != family.arch:
            return config
        return replace(config, pooling=family.pooling, model=reading_features(config.model, config.size, dropout))

    def scratch_refusal(self, family: Family) -> str | None:
        return (f"{family.name} gives a task model pretrained features; make a run first (`{family.maker}`) and "
                "fine-tune from it")

    def vectors_refusal(self, family: Family, *, scratch: bool) -> str | None:
        if not self.extractor_vectors:
            return None
        return (f"initialises the word embedding of a new task model, and a {family.name} task model's is the "
                f"extractor's own word vectors: give the vectors to `{family.maker} --vectors` instead")


OWN_NETWORK = Reader()
ELMO_FEATURES, COVE_FEATURES = FeatureReader(extractor_vectors=False), FeatureReader(extractor_vectors=True)


def same_words(tok: TextTokenizer, texts: Callable[[], Iterable[str]], vocab_size: int) -> TextTokenizer:
    """A pretrained run's tokenizer as continued pre-training reads a new corpus (``texts``): as it is."""
    return tok


def with_target_words(tok: TextTokenizer, texts: Callable[[], Iterable[str]], vocab_size: int) -> TextTokenizer:
    """The tokenizer with the new corpus's words it lacks, up to ``vocab_size`` of them: ULMFiT's target-task LM
    (Howard & Ruder 2018, §3.2; :func:`sesame.tokenizer.extend_words`)."""
    return extend_words(tok, texts(), vocab_size)[0]


@dataclass(frozen=True)
class Family:
    name: str
    tokenizer: str  # wordpiece | bpe | unigram
    objective: str | None  # a key of sesame.objectives.OBJECTIVES (None: not pre-trained by `sesame pretrain`)
    causal: bool
    norm: str  # "post" (BERT, GPT) or "pre" (GPT-2: LayerNorm before each sublayer, one after the stack)
    embedding_norm: bool  # LayerNorm on the summed embeddings (BERT)
    # "cls": first token (encoders); "last": last real token (decoders; an encoder-decoder's decoder at the input's
    # end token, BART's classifier: sesame.tasks.classify.EncoderDecoderSequenceModel); "mean"; "max"; "concat" (ULMFiT)
    pooling: str
    paper: str
    arch: str = "transformer"  # transformer | recurrent | elmo | cove (sesame.models.ARCHITECTURES)
    # further backbone config fields (recurrent: cell, dropouts; transformer: activation)
    model_options: dict = field(default_factory=dict)
    embedding_size: int | None = None  # ALBERT's factorised embedding E (None: E = hidden)
    sharing: str = "none"  # ALBERT's cross-layer sharing: none | all | attention | ffn
    objective_options: dict = field(default_factory=dict)
    recipe: dict = field(default_factory=dict)  # pre-training defaults for TrainConfig fields
    finetune: dict = field(default_factory=dict)  # fine-tuning defaults for TrainConfig fields (over BERT's)
    finetune_recipe: dict = field(default_factory=dict)  # fine-tuning defaults for Recipe fields left unset
    # how its task models read their inputs (sesame.inputs): the tokenizer's template; GPT's start, delimiter and
    # extract tokens (Radford et al. 2018, §3.3; GPT-2's paper, 2019, defines no fine-tuning inputs, as it is
    # evaluated zero-shot, so gpt2 keeps the tokenizer's <s> a </s> b </s>, and GPT-2 checkpoints imported from
    # transformers keep their vocabulary); ULMFiT's: a text as its LM read a document, after the separator, with no
    # <s> (its LM trains on shards where each document follows </s>; fastai's classifier likewise starts with its
    # LM's xxbos); XLNet's ``a <sep> <cls>`` and ``a <sep> b <sep> <cls>``, <cls> in segment 2
    # (sesame.tokenizer.put_cls_last), so ``last`` pooling reads <cls>; T5's ``a </s>``, with no <s>, as its
    # pre-training's inputs end
    inputs: InputFormat = PLAIN
    context: int = 512  # learned positions (GPT and BERT: 512; GPT-2's longer context: 1024)
    # how a new task model reads its runs: its own network, fine-tuned, or frozen features (ELMo's biLM, CoVe's encoder)
    reader: Reader = OWN_NETWORK
    command: str | None = None  # the application command that makes its runs or runs its whole recipe
    # the tokenizer continued pre-training (a pretrained run on a new corpus) reads with: the run's, or with the new
    # corpus's words (ULMFiT's target-task LM)
    continued_words: Callable[[TextTokenizer, Callable[[], Iterable[str]], int], TextTokenizer] = same_words
    # the model's dropout while pre-training (None: the row's own, as AWD-LSTM's and ELMo's are part of their
    # recipes); 0 for Transformers: a model that sees its text about once underfits, so dropout only slows it
    # (Geiping & Goldstein 2022, "Cramming"; docs/results/foundation.md found the same at 20 minutes). Fine-tuning puts
    # --dropout (0.1) back.
    pretrain_dropout: float | None = 0.0
    # how a new model's token embeddings start (pretrain --embedding-init): random, as every family's paper, or ppmi,
    # the corpus's PPMI-SVD vectors (sesame.pipelines.starts.ppmi_embedding), where the 15-minute ablations chose it
    # (docs/results/time_to_quality.md)
    pretrain_embedding_init: str = "random"
    # the token table's initial standard deviation (the backbone's ``embedding_std``) when it starts from the counts
    # (None: the family's): BERT's, RoBERTa's and ALBERT's 0.1, so the counted vectors outweigh the random positions
    # added to them before the embeddings' LayerNorm, as T5's table (N(0, 1), no positions added) does
    # (docs/results/time_to_quality.md)
    counted_embedding_std: float | None = None
    # the pooling `sesame pretrain` records in a new model's run, so its fine-tunes and its scratch twin read it that
    # way (None: ``pooling``; imports and ``scratch:FAMILY:SIZE`` keep ``pooling``): T5's encoder mean, as a decoder
    # pre-trained for minutes to hours ignores its source (docs/results/time_to_quality.md); --pooling last is the
    # head transformers' T5ForSequenceClassification has
    pretrain_pooling: str | None = None
    # an encoder-decoder's first decoder input: the special role whose token it is (T5: pad, BART: sep)
    decoder_start: str | None = None
    # how an encoder-decoder's inputs start (sesame.inputs.SourceStart): BART's <s> text </s> (Lewis et al. 2020, §2.2,
    # as fairseq frames them), T5's text </s>; text2text's default ``bos`` and how `sesame generate` frames a
    # pre-trained run's sources
    source_start: SourceStart = TEXT_FIRST
    sentinels: int = 0  # the tokenizer ends with T5's sentinel tokens, this many (sesame.tokenizer.train_tokenizer)
    intermediate: float = 4.0  # a Transformer's feed-forward width per unit of hidden (T5 v1.1's gated one: 8/3)
    # transformers' model_type whose checkpoints import as this family's runs (interop.hf_seq2seq, .xlnet; several
    # rows of one type: the one whose model_options the checkpoint's configuration matches best)
    hf_model_type: str | None = None

    @property
    def maker(self) -> str:
        """The command that makes its runs: its application's, else ``sesame pretrain``."""
        return f"sesame {self.command}" if self.command else f"sesame pretrain --family {self.name}"

    @property
    def token_table(self) -> bool:
        """Whether its backbone reads tokens from a table of embeddings (``embed.tokens``), which counts can start;
        ELMo spells them from characters."""
        return not any(f.name == "max_chars" for f in fields(ARCHITECTURES[self.arch][0]))


RECURRENT_FINETUNE = {"lr": 2e-3}  # Adam's usual rate for LSTMs
# documents joined with nothing between, as T5's reduce_concat_tokens, each window read 4 tokens longer to stand in
# for the </s> it drops, so inputs are exactly --seq-len (objectives/span_corruption.py)
T5_WINDOWS = {"separators": False, "spare_tokens": 4}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        #      name        tokenizer    objective  causal norm  emb-LN pooling paper
        Family("bert", "wordpiece", "mlm_nsp", False, "post", True, "cls", "Devlin et al. 2019",
               pretrain_embedding_init="ppmi", counted_embedding_std=0.1),
        Family("roberta", "bpe", "mlm", False, "post", True, "cls", "Liu et al. 2019",
               recipe={"batch_size": 128, "accumulate": 4},  # FULL-SENTENCES, dynamic masks, large batches
               pretrain_embedding_init="ppmi", counted_embedding_std=0.1),  # BERT's start: two 15-minute seeds
        Family("albert", "unigram", "mlm_sop", False, "post", True, "cls", "Lan et al. 2020",
               embedding_size=128, sharing="all", objective_options={"masking": "phrase", "ngram": 3},
               model_options={"activation": "gelu_tanh"},  # ALBERT's released models: gelu_new
               pretrain_embedding_init="ppmi", counted_embedding_std=0.1),  # BERT's start: two 15-minute seeds
        Family("spanbert", "wordpiece", "span", False, "post", True, "cls", "Joshi et al. 2020"),
        Family("electra", "wordpiece", "electra", False, "post", True, "cls", "Clark et al. 2020"),
        Family("gpt", "bpe", "clm", True, "post", False, "last", "Radford et al. 2018", inputs=GPT_TOKENS,
               model_options={"activation": "gelu_tanh"},  # GPT's code: GELU's tanh approximation
               finetune_recipe={"lm_weight": 0.5}),  # the auxiliary LM's λ (§3.2, eq. 5; §4.1)
        Family("gpt2", "bpe", "clm", True, "pre", False, "last", "Radford et al. 2019", context=1024,
               model_options={"activation": "gelu_tanh"}),  # GPT-2's code: GELU's tanh approximation
        #      name       tokenizer objective causal norm emb-LN pooling   paper
        Family("lstm", "word", None, True, "-", False, "last", "Hochreiter & Schmidhuber 1997", arch="recurrent",
               finetune=RECURRENT_FINETUNE),
        Family("gru", "word", None, True, "-", False, "last", "Cho et al. 2014", arch="recurrent",
               model_options={"cell": "gru"}, finetune=RECURRENT_FINETUNE),
        Family("bilstm", "word", None, False, "-", False, "max", "Graves & Schmidhuber 2005", arch="recurrent",
               finetune=RECURRENT_FINETUNE),  # max pooling over a BiLSTM: Conneau et al. 2017
        Family("ulmfit", "word", "awd_lm", True, "-", False, "concat", "Howard & Ruder 2018", arch="recurrent",
               model_options={"layers": 3, "tied": True, "dropout": 0.4, "hidden_dropout": 0.3, "input_dropout": 0.4,
                              "embedding_dropout": 0.05, "weight_dropout": 0.5},
               recipe={"lr": 3e-3, "batch_size": 64, "weight_decay": 0.01, "clip": 0.25, "warmup": 0.0},
               finetune=RECURRENT_FINETUNE, command="ulmfit", continued_words=with_target_words,
               inputs=DOCUMENTS, pretrain_dropout=None),
        Family("elmo", "word", "bilm", False, "-", False, "max", "Peters et al. 2018", arch="elmo",
               objective_options={"samples": 1024},  # sampled softmax while training (Jozefowicz et al. 2016)
               recipe={"lr": 2e-3, "warmup": 0.0}, finetune=RECURRENT_FINETUNE, reader=ELMO_FEATURES,
               pretrain_dropout=None),
        Family("cove", "word", None, False, "-", False, "max", "McCann et al. 2017", arch="cove",
               finetune=RECURRENT_FINETUNE, reader=COVE_FEATURES, command="cove"),
        #      name  tokenizer  objective        causal norm  emb-LN pooling paper
        Family("t5", "unigram", "span_corruption", False, "pre", False, "last", "Raffel et al. 2020",  # BART's head,
               arch="encoder_decoder", model_options=STYLES["t5"], decoder_start="pad", sentinels=100,  # as HF's T5
               hf_model_type="t5", objective_options=T5_WINDOWS, inputs=WITHOUT_START,
               pretrain_embedding_init="ppmi", pretrain_pooling="mean"),
        # T5 v1.1 (transformers' google/t5-v1_1-*): GLU feed-forward narrowed to keep its parameters (Shazeer 2020)
        Family("t5v1_1", "unigram", "span_corruption", False, "pre", False, "last", "Raffel et al. 2020, v1.1",
               arch="encoder_decoder", model_options=STYLES["t5v1_1"], decoder_start="pad", sentinels=100,
               intermediate=8 / 3, hf_model_type="t5", objective_options=T5_WINDOWS, inputs=WITHOUT_START),
        Family("bart", "bpe", "denoising", False, "post", True, "last", "Lewis et al. 2020",  # §3.1: the decoder's
               arch="encoder_decoder", model_options=STYLES["bart"], decoder_start="sep", context=1024,  # last token
               source_start=BOS_FIRST, hf_model_type="bart"),
        #      name  tokenizer  objective causal norm emb-LN pooling paper
        Family("xlnet", "unigram", "plm", False, "post", False, "last", "Yang et al. 2019", arch="xlnet",  # §2,
               inputs=CLS_LAST, hf_model_type="xlnet",  # its relative positions read any length (sesame.models.xlnet)
               objective_options={"max_span": 5, "bi_data": True},  # §3.1's pre-training: spans, both directions
               model_options={"activation": "gelu_tanh"},  # XLNet's code (modeling.py's gelu): the tanh form
               pretrain_embedding_init="ppmi"),  # two 15-minute seeds on both tasks (docs/results/time_to_quality.md)
    ]
}
DOWNSTREAM = "bilstm"  # the task model that reads a feature extractor's (elmo, cove) output beside its own embeddings

# (embedding, hidden per direction) per size; base = AWD-LSTM's (Merity et al. 2018, §5).
RECURRENT_SIZES: dict[str, tuple[int, int]] = {
    "tiny": (64, 128),
    "mini": (200, 400),
    "small": (300, 600),
    "medium": (400, 800),
    "base": (400, 1150),
}
DROPOUT = 0.1
RECURRENT_LAYERS = 2  # the baselines'; ulmfit sets 3 (AWD-LSTM)

# (layers, hidden) per size; Turc et al. 2019, Table 6 / BERT-base.
SIZES: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
}

# Fine-tuning's peak rate for a model of each size that sesame pre-trained. BERT's 5e-5 (Devlin et al. 2019, §A.3)
# suits a model pre-trained on billions of words; small models after minutes of pre-training need larger steps (Turc
# et al. 2019 searched up to 1e-4 for their small BERTs; ELECTRA-small fine-tunes at 3e-4, Clark et al. 2020, Table 7).
# mini's is the one chosen on airline dev (docs/results/foundation.md); the other sizes follow the trend by width,
# unmeasured. Imported weights (transformers, ``minilm``) keep BERT's rate; a family's own fine-tuning rate (the
# recurrent ones) wins over this table; a model from scratch takes pre-training's rates (sesame.specs.SCRATCH_TRAINING).
FINETUNE_RATES: dict[str, float] = {"tiny": 3e-4, "mini": 2e-4, "small": 1e-4, "medium": 1e-4, "base": 5e-5}


def finetune_rate(size: str | None) -> dict:
    """``{"lr": rate}`` from :data:`FINETUNE_RATES` for pre-trained weights of ``size`` (empty for an unknown size)."""
    return {"lr": FINETUNE_RATES[size]} if size in FINETUNE_RATES else {}


def get_family(name: str, *, flag: str = "--family") -> Family:
    """The registry row of the family ``name``, which ``flag`` gave."""
    if name not in FAMILIES:
        raise SesameError(f"{flag} {name!r} is unknown; choose one of: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def run_family(config: RunConfig, where: str) -> Family:
    """The registry row of the family a run's config.json names, ``where`` naming the run if none does."""
    return get_family(config.family, flag=f"{where}: its config.json's family")


def hf_family(model_type: str, model: dict) -> Family | None:
    """The family a transformers ``model_type`` checkpoint imports as (None: no row names that type): of the rows
    whose ``hf_model_type`` it is, the one whose ``model_options`` differ from the checkpoint's model fields ``model``
    in the fewest fields, the first on a tie (a T5 with a gated feed-forward and an untied output layer: t5v1_1)."""
    rows = [f for f in FAMILIES.values() if f.hf_model_type == model_type]
    return min(rows, key=lambda f: sum(model.get(k) != v for k, v in f.model_options.items()), default=None)


def get_size(name: str) -> tuple[int, int]:
    if name not in SIZES:
        raise SesameError(f"--size {name!r} is unknown; choose one of: {', '.join(SIZES)}")
    return SIZES[name]


def backbone_config(family: str, size: str, vocab_size: int, pad_id: int, dropout: float | None = None,
                    max_positions: int | None = None, *, specials: SpecialIds | None = None):
    """The backbone configuration of ``family`` at ``size``; a Transformer's (or encoder-decoder's) has the family's
    context unless ``max_positions``. ``dropout`` overrides the family's (0.1 unless its row says otherwise; for a
    recurrent family the output's, AWD-LSTM's others coming from the row). An encoder-decoder's decoder starts from
    the token of the row's ``decoder_start`` role among the tokenizer's ``specials``."""
    fam, (layers, hidden) = get_family(family), get_size(size)
    dropout = dropout if dropout is not None else fam.model_options.get("dropout", DROPOUT)
    if fam.arch == "recurrent":
        embedding, width = RECURRENT_SIZES[size]
        return RecurrentConfig(**{"vocab_size": vocab_size, "causal": fam.causal, "embedding_size": embedding,
                                  "hidden_size": width, "layers": RECURRENT_LAYERS, "pad_id": pad_id,
                                  **fam.model_options, "dropout": dropout})
    if not issubclass(ARCHITECTURES[fam.arch][0], TransformerConfig):  # ELMo's sizes live with its model
        return ARCHITECTURES[fam.arch][0].sized(size, vocab_size, pad_id, dropout)
    start = {}
    if fam.decoder_start:
        if specials is None:
            raise ValueError(f"{family}'s decoder starts from its tokenizer's {fam.decoder_start} token: give specials")
        start = {"decoder_start_id": getattr(specials, fam.decoder_start)}
    embedding_size = fam.embedding_size if fam.embedding_size and fam.embedding_size < hidden else None
    return ARCHITECTURES[fam.arch][0](**start, **{
        "vocab_size": vocab_size, "hidden": hidden, "layers": layers, "heads": hidden // 64,
        "intermediate": round(fam.intermediate * hidden),
        "max_positions": max_positions or fam.context, "causal": fam.causal, "norm": fam.norm,
        "embedding_norm": fam.embedding_norm, "pad_id": pad_id, "layer_norm_eps": 1e-12 if fam.norm == "post" else 1e-5,
        "embedding_size": embedding_size, "sharing": fam.sharing, **fam.model_options, "dropout": dropout})


DROPOUTS = ("dropout", "hidden_dropout", "input_dropout", "embedding_dropout", "weight_dropout")  # AWD-LSTM's five


def head_dropouts(model: ModelConfig, *, head_drops: bool) -> dict[str, float]:
    """Backbone config fields a task head takes over: where the head applies a dropout of its own (``head_drops``:
    before its linear layer, or ULMFiT's concat head's first, as fastai's ``get_text_classifier``, whose AWD_LSTM
    drops nothing after the last layer), a recurrent encoder's output dropout is that one, so the backbone's is 0
    and the dropout is applied once, not twice. A Transformer's ``dropout`` is inside its layers: it keeps it."""
    return {"dropout": 0.0} if head_drops and model.arch == "recurrent" else {}


def recurrent_dropouts(family: str, dropout: float | None, drop_mult: float, *, arch: str, what: str
                       ) -> dict[str, float]:
    """fastai's ``drop_mult`` (ULMFiT's code): the five dropouts of ``family``'s recurrent model (:data:`DROPOUTS`:
    output, between layers, input, embedding, DropConnect; a feature extractor's task model has the
    ``DOWNSTREAM`` family's), the output's replaced by ``dropout`` when given, each times ``drop_mult``.

    They scale the family's row, not a run's recorded values, so a ``drop_mult`` given to each stage (fastai:
    0.3 for the target LM, 0.5 for the classifier) does not compound, as fastai scales its fixed config. A model
    of another architecture ``arch`` is refused, ``what`` naming it."""
    if arch != "recurrent":
        raise SesameError(f"--drop-mult: scales the five dropouts of a recurrent (AWD-LSTM) model, and {what} is "
                          f"a {arch} model; drop --drop-mult (use --dropout)")
    fam = get_family(family)
    row = fam.model_options if fam.arch == "recurrent" else get_family(DOWNSTREAM).model_options
    base = {name: row.get(name, 0.0) for name in DROPOUTS}
    base["dropout"] = dropout if dropout is not None else row.get("dropout", DROPOUT)
    if drop_mult < 0:
        raise SesameError(f"--drop-mult {drop_mult}: use 0 (no dropout) or more (1: the family's dropouts)")
    scaled = {name: p * drop_mult for name, p in base.items()}
    worst = max(scaled, key=scaled.get)
    if scaled[worst] >= 1:
        raise SesameError(f"--drop-mult {drop_mult}: makes {worst} {scaled[worst]:g}; every dropout must stay below "
                          f"1: use a multiplier below {1 / base[worst]:.3g}")
    return scaled


def reading_features(features: ModelConfig, size: str, dropout: float) -> RecurrentConfig:
    """The task model over a pretrained feature extractor (ELMo's biLM, CoVe's encoder): the ``DOWNSTREAM``
    family (a BiLSTM) of the same size reading [x_k; features_k], its own word embeddings beside the frozen
    extractor's output (Peters et al. 2018, §3.3; McCann et al. 2017, §4). ELMo's layers enter through a scalar
    mix the task learns; the extractor runs without dropout, as at inference. For CoVe this max-pooled BiLSTM
    stands in for the paper's biattentive classification network (BCN), which sesame does not build."""
    features = replace(features, dropout=0.0, **({"scalar_mix": True} if hasattr(features, "scalar_mix") else {}))
    size = size if size in RECURRENT_SIZES else "mini"
    task = backbone_config(DOWNSTREAM, size, features.vocab_size, features.pad_id, dropout)
    # CoVe's task model starts from the MT-LSTM's own word vectors, [GloVe(x); CoVe(x)]
    return replace(task, embedding_size=getattr(features, "embedding_size", RECURRENT_SIZES[size][0]),
                   features=features)
