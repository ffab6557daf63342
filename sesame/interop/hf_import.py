"""Hugging Face checkpoints ⇄ sesame runs, for the architectures of :mod:`.architectures` (T5 and BART:
:mod:`.hf_seq2seq`; XLNet: :mod:`.xlnet`; :data:`ROUTES`).

``from_hf(DIR, RUN)`` turns a ``transformers`` model directory (config.json; model.safetensors, a
sharded model.safetensors.index.json, or pytorch_model.bin read with ``weights_only=True``; and a
tokenizer, see :mod:`.hf_tokenizer`) into a ``pretrained`` run: the backbone under sesame's names,
and BERT's or ALBERT's [CLS] pooler as ``pooler.0``, which ``finetune`` starts a ``cls`` pooler from.
A language-model head that computes what sesame's does (``*ForMaskedLM``, ``*ForPreTraining``,
``GPT2LMHeadModel``) becomes the run's objective (``mlm``, ``mlm_nsp``, ``mlm_sop``, ``clm``), so
``sesame evaluate`` reports its loss; other heads are left behind (listed in the result, with the
reason where a pre-training head does not map). A
``*ForSequenceClassification`` whose head maps (BERT, ALBERT, RoBERTa) becomes a ``finetuned``
classify (or regress) run instead, its pooler and classifier sesame's ``pooler.0`` and ``head``.
``from_hf(DIR, RUN, generator=GEN)`` makes an ``ElectraForPreTraining`` discriminator and its
``ElectraForMaskedLM`` generator one ``electra`` run.
``to_hf(RUN, DIR)`` is the reverse: a pretrained run as the class of its objective's head where one
maps (else the base model, ``BertModel``, ...; an ``electra`` run's generator in ``DIR/generator``), or the
``*ForSequenceClassification`` of a fine-tuned classify / pair / regress run where the head maps.

One generic converter follows the architecture's row. Tensor by tensor:

* query, key and value are concatenated into sesame's one ``qkv`` projection (split again on export);
  GPT-2's Conv1D weights are stored (in, out) and transposed;
* RoBERTa's positions start after its padding index: a token at position p reads row
  padding_idx + 1 + p. Import drops the first padding_idx + 1 rows; export puts back zero rows (the
  padding row is zero in RoBERTa, and real tokens never read those rows);
* one token-type row (RoBERTa) is copied to a second, since sesame encodes pairs as segments 0 and 1;
  export drops the copy while it is still equal. A causal run with token types (sesame's own GPT-2
  family) exports to GPT-2, which has none, with type row 0 added into the positions: sesame's causal
  models never pass segment ids, so every token receives row 0;
* tokens the tokenizer import appends (GPT-2 has no pad, mask, cls or sep of its own) get a copy of
  their stand-in token's embedding row; export drops them while they are still copies.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..errors import SesameError
from ..families import Family, get_family, hf_family
from ..models import TransformerConfig
from ..objectives.electra import generator_config
from ..run import FinetunedPart, PretrainedPart, RunConfig, write_config
from ..rundir import new_run
from ..tasks import make_task
from ..tokenizer import TextTokenizer
from ..train.checkpoint import save_weights, write_json
from .architectures import ARCHITECTURES, HF_ACTIVATIONS, Architecture, architecture
from .encoder_decoder import TYPES as SEQ2SEQ_TYPES, model_config as seq2seq_model
from .hf_seq2seq import EVAL_SEQ_LEN, seq2seq_run
from .hf_tokenizer import import_tokenizer
from .xlnet import MODEL_TYPE as XLNET, model_config as xlnet_model, xlnet_run
from .mapping import (Entry, GENERATOR_NAMES, Rows, check_new, check_tensors, checkpoint_config, classifier_labels,
                     classifier_max_length, classifier_task, dense_entries, discriminator_entries, export_tensors, head_shapes,
                     import_tensors, is_sequence_classifier, lm_entries, meta_backbone, name_plan, pair_entries,
                     read_weights)

# model types with a converter of their own (not one Transformer stack): model_type → convert --from-hf's route
ROUTES = {**dict.fromkeys(SEQ2SEQ_TYPES, seq2seq_run), XLNET: xlnet_run}
LEGACY = {".gamma": ".weight", ".beta": ".bias"}  # LayerNorm names of TensorFlow-converted checkpoints
BUFFERS = re.compile(r"(^|\.)(position_ids|token_type_ids)$|(^|\.)attn\.(masked_)?bias$")  # saved by old versions


def transformers_family(hf: dict, where: str) -> Family:
    """The family whose run the transformers config.json ``hf`` (read at ``where``) converts into, the one place an
    imported checkpoint's family is resolved: its architecture's (:mod:`.architectures`), or for a type several rows
    name (T5, T5 v1.1) the row its configuration matches (:func:`sesame.families.hf_family`); a type sesame does not
    convert is refused, as converting it would be."""
    model_type = hf.get("model_type")
    if model_type not in ROUTES:  # the architectures' table
        return get_family(architecture(model_type, where).family)
    return hf_family(model_type, xlnet_model(hf, where) if model_type == XLNET else seq2seq_model(hf, model_type, where))


def _backbone_names(weights: dict[str, torch.Tensor], arch: Architecture) -> dict[str, torch.Tensor]:
    """Names relative to the base model: a task model's ``prefix.`` dropped, legacy gamma/beta renamed."""
    out = {}
    for name, tensor in weights.items():
        for old, new in LEGACY.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        out[name.removeprefix(arch.prefix + ".")] = tensor
    return out


def _model_config(hf: dict, arch: Architecture, where: str) -> dict:
    """TransformerConfig fields of a Hugging Face config (vocabulary and pad id still the checkpoint's)."""
    hf = {**arch.defaults, **hf}
    missing = [k for k in arch.config.values() if k not in hf]
    if missing:
        raise SesameError(f"{where}: lacks {', '.join(missing)}")
    wrong = [f"{k} {hf[k]!r} (sesame supports {v!r})" for k, v in arch.hf_fixed.items() if hf.get(k, v) != v]
    activation = arch.config["activation"]
    if hf[activation] not in HF_ACTIVATIONS:
        wrong.append(f"{activation} {hf[activation]!r} (sesame supports {', '.join(HF_ACTIVATIONS)})")
    if wrong:
        raise SesameError(f"{where}: " + "; ".join(wrong))
    model = {**arch.fixed, **{f: hf[k] for f, k in arch.config.items()}}
    model["activation"] = HF_ACTIVATIONS[model["activation"]]
    model["intermediate"] = model["intermediate"] or 4 * model["hidden"]  # GPT-2's n_inner None
    if model.get("embedding_size") == model["hidden"]:
        model["embedding_size"] = None
    if arch.position_offset:
        model["max_positions"] -= hf["pad_token_id"] + 1
    if model["type_vocab_size"] == 1:
        model["type_vocab_size"] = 2
    if arch.groups:
        groups = {1: "all", model["layers"]: "none"}
        if hf["num_hidden_groups"] not in groups:
            raise SesameError(f"{where}: num_hidden_groups {hf['num_hidden_groups']}: sesame shares all layers (1) "
                              f"or none ({model['layers']})")
        model["sharing"] = groups[hf["num_hidden_groups"]]
    return model


def _check_tensors(weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], arch: Architecture,
                   path: Path) -> list[str]:
    """Fail on missing, mis-shaped or unknown tensors (:func:`check_tensors`; buffers and the architecture's heads
    are known); return the heads left behind."""
    others = [n for n in weights if n not in expected and not BUFFERS.search(n)]
    heads = [n for n in others if n.split(".")[0] in arch.heads]
    check_tensors(weights, expected, where=f"{path} ({arch.model_type})",
                  known={*expected, *heads, *(n for n in weights if BUFFERS.search(n))})
    return sorted({n.split(".")[0] for n in others})


def sequence_task(hf: dict, arch: Architecture) -> tuple[str | None, str]:
    """The task a checkpoint's config.json makes it: ``classify``, or ``regress`` (``problem_type``
    regression, or one label), for a ``*ForSequenceClassification`` whose head maps onto sesame's;
    else ``(None, the reason)``."""
    if not is_sequence_classifier(hf):
        names = ", ".join(hf.get("architectures") or [arch.base_class])
        return None, f"a {names} checkpoint, without a sequence-classification head"
    if arch.classifier is None:
        return None, f"{arch.model_type}'s sequence classifier does not match sesame's: {arch.not_classifier}"
    return classifier_task(hf)


def _pretraining_heads(weights: dict[str, torch.Tensor], given: dict, arch: Architecture
                       ) -> tuple[str | None, list[Entry], list[Entry], list[str]]:
    """What a checkpoint's pre-training heads import as: ``(objective, entries, checked, notes)``;
    ``checked`` are tensors whose shape is checked but which are not imported (tied copies, a pooler
    left behind), under the :func:`head_shapes` name of their shape.

    The language-model head (:class:`~.architectures.LMHead`) becomes sesame's ``mlm`` or ``clm`` head
    where it computes the same function: the backbone's GELU, and an output layer tied to the token embeddings
    (a stored copy must equal them). With BERT's NSP or ALBERT's SOP head and the pooler it reads, the
    objective is ``mlm_nsp`` / ``mlm_sop``; without them an ``mlm`` run cannot hold the pooler, which
    is then left behind. ``objective`` is None (the pooler kept) when no head maps; notes say why."""
    head, notes = arch.lm, []
    pooler = dense_entries("pooler.0", arch.pooler) if arch.pooler and f"{arch.pooler}.weight" in weights else []
    if arch.discriminator and any(n.startswith("discriminator_predictions.") for n in weights):
        notes.append("ELECTRA's discriminator head is left behind: sesame's electra objective also needs the "
                     "generator, which transformers keeps in a checkpoint of its own; give that directory with "
                     "--generator to import both as one electra run")
    table, decoder = weights.get(f"{arch.modules['embed.tokens']}.weight"), f"{head.decoder}.weight" if head else ""
    # a masked LM with an output layer of its own (a stored decoder unlike the table: tie_word_embeddings false) imports
    # untied (--objective-option decoder=untied), scoring with its decoder's bias as transformers' untied head does
    untied = bool(head) and head.objective == "mlm" and decoder in weights and table is not None and not torch.equal(
        weights[decoder], table)
    named = (f"{head.decoder}.bias", head.bias) if untied else (head.bias, f"{head.decoder}.bias") if head else ()
    bias = next((n for n in named if n in weights), None) if head and head.bias else None
    if head is None or not (bias or not head.bias and head.hf_class in (given.get("architectures") or [])):
        return None, pooler, [], notes
    tied = {} if untied else {decoder: table, f"{head.decoder}.bias": weights.get(bias)}  # a stored copy → its value
    copies = [Entry(f"decoder.{n.rsplit('.', 1)[1]}", (n,)) for n in tied if n in weights and n != bias]
    unused = [Entry("bias", (head.bias,))] if untied and head.bias != bias and head.bias in weights else []
    activation = given[head.activation] if head.activation else "gelu"
    backbone_activation = given[arch.config["activation"]]
    why = ""
    if not head.same_activation(HF_ACTIVATIONS.get(activation, activation), HF_ACTIVATIONS[backbone_activation]):
        why = (f"its head applies {activation!r} where sesame's {head.objective} head applies the backbone's "
               f"{backbone_activation!r}")
    elif any(tied[e.hf[0]] is not None and not torch.equal(weights[e.hf[0]], tied[e.hf[0]]) for e in copies) or (
            decoder not in weights and given.get("tie_word_embeddings") is False):
        why = "its output layer is not tied to the token embeddings, as sesame's is"
    if why:
        return None, pooler, [], [*notes, f"{head.hf_class}'s language-model head is left behind: {why}"]
    entries = lm_entries(arch, bias) + ([Entry("decoder", (decoder,))] if untied else [])
    pairs = arch.pairs
    if pairs and pooler and f"{pairs.hf_module}.weight" in weights:
        return pairs.objective, entries + pair_entries(arch), copies + unused, notes
    if pooler:
        notes.append(f"the [CLS] pooler is left behind: sesame's {head.objective} objective has none "
                     "(fine-tuning with pooling cls starts a fresh one)")
    return head.objective, entries, copies + unused + pooler, notes


def _discriminator_head(weights: dict[str, torch.Tensor], given: dict, arch: Architecture, where: Path
                        ) -> list[Entry]:
    """``ElectraForPreTraining``'s head as sesame's ``discriminator_head`` (dense → exact GELU → Linear(H, 1),
    objectives/electra.py), which it computes only with ``hidden_act`` gelu; anything else is refused."""
    entries = discriminator_entries(arch)
    if entries[0].hf[0] not in weights:
        names = ", ".join(given.get("architectures") or [arch.base_class])
        raise SesameError(f"{where}: {names} has no ELECTRA discriminator head ({entries[0].hf[0]}); --generator "
                          "needs the ElectraForPreTraining discriminator of the pair")
    activation = given[arch.config["activation"]]
    if activation != "gelu":
        raise SesameError(f"{where}: hidden_act {activation!r}: ElectraForPreTraining's head applies it where sesame's "
                          "electra discriminator head applies exact GELU ('gelu'), so the pair cannot become an "
                          "electra run; import the discriminator alone (without --generator)")
    return entries


def _drop_identity_projection(weights: dict[str, torch.Tensor], arch: Architecture, path: Path) -> None:
    """An E == H checkpoint's projection, removed from ``weights`` if it is the identity (sesame has none then)."""
    name = arch.modules["project"]
    if name + ".weight" not in weights:
        return  # reported as missing by the tensor check
    weight, bias = weights.pop(name + ".weight"), weights.pop(name + ".bias", None)
    if not (torch.equal(weight.float(), torch.eye(*weight.shape)) and (bias is None or not bias.any())):
        raise SesameError(f"{path}: {name} is not the identity, but embedding_size equals hidden_size and sesame's "
                          "stack has no projection then; this checkpoint cannot be converted")


@dataclass(frozen=True)
class Imported:
    """A converted checkpoint before it is written: the run's config.json, tensors, tokenizer, labels and summary."""

    config: RunConfig
    state: dict[str, torch.Tensor]
    tok: TextTokenizer
    labels: list[str]
    summary: dict


def _import(src: Path, hf_config: dict, discriminator: bool = False, flag: str = "--from-hf") -> Imported:
    """The run the model directory ``src`` (its config.json ``hf_config``) converts to (:func:`from_hf`); with
    ``discriminator``, an ``ElectraForPreTraining`` whose head becomes the ``electra`` objective's (its generator still
    to add)."""
    config_path = src / "config.json"
    arch = architecture(hf_config.get("model_type"), str(config_path))
    if discriminator and not arch.discriminator:
        raise SesameError(f"{config_path}: a {arch.model_type} checkpoint; --generator pairs an ELECTRA discriminator "
                          "(ElectraForPreTraining) with its generator (ElectraForMaskedLM)")
    model = _model_config(hf_config, arch, str(config_path))
    tok, record, aliases = import_tokenizer(src, builder=arch.tokenizer, defaults=arch.special_tokens,
                                           model_vocab=model["vocab_size"])
    given = {**arch.defaults, **hf_config}
    if arch.position_offset and tok.specials.pad != given["pad_token_id"]:
        raise SesameError(f"{config_path}: pad_token_id {given['pad_token_id']} is not the tokenizer's pad token "
                          f"({tok.specials.pad}); RoBERTa's positions count from the padding index, so they must agree")
    rows = Rows(offset=given["pad_token_id"] + 1 if arch.position_offset else 0,
                type_rows=given.get("type_vocab_size", 0), vocab=model["vocab_size"], aliases=tuple(aliases.values()))
    model.update(vocab_size=model["vocab_size"] + len(aliases), pad_id=tok.specials.pad)
    try:
        backbone = TransformerConfig(**model)
    except ValueError as err:
        raise SesameError(f"{config_path}: {err}") from None
    model = backbone.to_dict()
    weights, path = read_weights(src, flag)
    weights = _backbone_names(weights, arch)
    if arch.always_projects and model["embedding_size"] is None:
        _drop_identity_projection(weights, arch, path)
    meta = meta_backbone(model)
    plan = name_plan(arch, meta)
    expected = export_tensors(meta.state_dict(), plan, rows)
    task, why_not = sequence_task(hf_config, arch)
    labels = classifier_labels(hf_config, str(config_path)) if task == "classify" else []
    objective, checked, notes = None, [], []
    if task:  # the exact inverse of export's head: names relative to the base model, as the weights now are
        extra = [Entry(e.sesame, (e.hf[0].removeprefix(arch.prefix + "."),))
                 for module, name in arch.classifier.items() for e in dense_entries(module, name)]
        with torch.device("meta"):  # the shapes of sesame's own pooler and head
            shapes = make_task(task).build(meta, max(1, len(labels)), "cls", 0.0).state_dict()
    else:
        objective, extra, checked, notes = (("electra", _discriminator_head(weights, given, arch, config_path), [], [])
                                            if discriminator else _pretraining_heads(weights, given, arch))
        shapes = head_shapes(model, rows.vocab)
        if is_sequence_classifier(hf_config):
            notes.insert(0, f"{why_not}; its backbone alone is imported")
    expected.update({e.hf[0]: shapes[e.sesame] for e in extra + checked})
    dropped = _check_tensors(weights, expected, arch, path)
    state = {"backbone." + k: v for k, v in import_tensors(weights, plan, rows).items()}
    state.update({e.sesame: weights[e.hf[0]].contiguous() for e in extra})
    for name in ("bias", "decoder"):  # the output layer has a row per token, like the embeddings: appended tokens
        if name in state:               # copy theirs
            state[name] = torch.cat([state[name], state[name][list(rows.aliases)]])
    if objective and rows.aliases:
        notes.append(f"the appended tokens {', '.join(record['aliases'])} share the output rows of the tokens they "
                     f"copy ({', '.join(sorted(set(record['aliases'].values())))}), so sesame's {objective} "
                     "probabilities are transformers' divided by 1 + the copies' probability: its loss and "
                     "perplexity come out slightly above transformers'")
    origin = {"model_type": arch.model_type, "source": str(src.resolve()), "config": hf_config, "tokenizer": record}
    if task:
        job = make_task(task)
        config = RunConfig(kind="finetuned", family=arch.family, pooling="cls", model=backbone,
                           max_length=classifier_max_length(src, model), hf=origin,
                           finetuned=FinetunedPart(task=task, task_options=job.options(), select=job.select))
    else:
        # with an objective, the window `sesame evaluate` reads by default (--seq-len overrides it)
        seq_len = min(EVAL_SEQ_LEN, model["max_positions"]) if objective else None
        options = {"decoder": "untied"} if any(e.sesame == "decoder" for e in extra) else {}
        config = RunConfig(kind="pretrained", family=arch.family,
                           pooling=transformers_family(hf_config, str(config_path)).pooling, model=backbone,
                           hf=origin, pretrained=PretrainedPart(objective=objective, seq_len=seq_len,
                                                               objective_options=options))
    summary = {"model_type": arch.model_type, "family": arch.family, "kind": config.kind, "task": task,
               "objective": objective, "labels": labels, "layers": model["layers"], "hidden": model["hidden"],
               "vocab_size": model["vocab_size"], "pooler": any(e.sesame.startswith("pooler.") for e in extra),
               "dropped_heads": dropped, "renamed_tokens": record["renamed"],
               "appended_tokens": list(record["aliases"]), "notes": notes}
    return Imported(config, state, tok, labels, summary)


def _add_generator(run: Imported, gen: Imported, where: str) -> Imported:
    """The discriminator ``run`` (``_import(..., discriminator=True)``) with the imported
    ``ElectraForMaskedLM`` ``gen`` as its ``electra`` objective's generator.

    sesame's generator (objectives/electra.py) reads the discriminator's embeddings and is the size
    :func:`generator_config` gives for ``generator_fraction`` = its width / the discriminator's. The
    released ELECTRA pairs were trained with tied embeddings, and their configs fit: discriminator /
    generator width small 256/256 (fraction 1), base 768/256, large 1024/256, at 64 per head and 4·width
    feed-forward."""
    g = gen.summary
    if (g["model_type"], g["objective"]) != ("electra", "mlm"):
        found = ", ".join(gen.config.hf["config"].get("architectures") or [f"a {g['model_type']} model"])
        why = "".join(f" ({n})" for n in g["notes"] if n.startswith("ElectraForMaskedLM's"))  # its head's reason
        raise SesameError(f"{where}: the generator is {found}, not an ElectraForMaskedLM whose head imports{why}; "
                          "give the generator checkpoint of this discriminator")
    got = gen.config.model.to_dict()
    fraction = got["hidden"] / run.config.model.hidden
    needed = generator_config(run.config.model, fraction).to_dict()
    for m in (needed, got):
        m["embedding_size"] = m["embedding_size"] or m["hidden"]
    differ = [f"{k} {got[k]!r} (needs {v!r})" for k, v in needed.items() if got[k] != v]
    if differ:
        raise SesameError(f"{where}: the generator does not fit sesame's electra generator of this discriminator "
                          f"(generator_fraction {fraction:g}, its hidden size / the discriminator's: as deep, heads = "
                          "width // 64, feed-forward 4·width, the same embeddings and settings): " + "; ".join(differ)
                          + "; import the two separately (without --generator) instead")
    if gen.tok.backend.get_vocab() != run.tok.backend.get_vocab():
        raise SesameError(f"{where}: the two checkpoints' vocabularies differ; give the generator trained with this "
                          "discriminator")
    modules = ARCHITECTURES["electra"].modules
    differ = [modules[k.removeprefix("backbone.").rsplit(".", 1)[0]] + "." + k.rsplit(".", 1)[1]
              for k in run.state if k.startswith("backbone.embed.") and not torch.equal(run.state[k], gen.state[k])]
    if differ:
        raise SesameError(f"{where}: the generator's embeddings differ from the discriminator's ({', '.join(differ)}); "
                          "sesame's electra generator reads the discriminator's, as the released ELECTRA pairs "
                          "(trained tied) do: give the generator trained with this discriminator")
    state = dict(run.state)
    for name, tensor in gen.state.items():
        if not name.startswith("backbone.embed."):
            ours, mlm = next((o, m) for o, m in GENERATOR_NAMES.items() if name.startswith(m))
            state[ours + name.removeprefix(mlm)] = tensor
    config = replace(run.config, pretrained=replace(run.config.pretrained,
                                                    objective_options={"generator_fraction": fraction}),
                     hf={**run.config.hf, "generator": {"source": gen.config.hf["source"],
                                                        "config": gen.config.hf["config"]}})
    return replace(run, config=config, state=state, summary={
        **run.summary, "generator_fraction": fraction,
        "notes": run.summary["notes"] + [f"generator: {note}" for note in g["notes"]]})


def from_hf(src: str | Path, out: str | Path, generator: str | Path | None = None, *, hf: dict | None = None) -> dict:
    """Convert the Hugging Face model directory ``src`` into the run ``out``: ``pretrained``, or
    ``finetuned`` for a sequence classifier whose head maps (:func:`sequence_task`). With ``generator``
    (an ``ElectraForMaskedLM`` directory) ``src`` must be its ``ElectraForPreTraining`` discriminator,
    and the run is one ``electra`` run holding both (:func:`_add_generator`). ``hf``: ``src``'s config.json, where
    the caller has read it (else it is read here, once, and passed down). Returns a summary."""
    src, out = Path(src), Path(out)
    check_new(out)
    hf = checkpoint_config(src) if hf is None else hf
    model_type = hf.get("model_type") if isinstance(hf, dict) else None
    route = ROUTES.get(model_type)
    if route is not None:
        if generator is not None:
            raise SesameError(f"--generator: {src} is a {model_type} model; --generator pairs an ELECTRA "
                              "discriminator with its generator. Drop --generator")
        return route(src, out, family=transformers_family(hf, str(src / "config.json")), hf=hf)
    imported = _import(src, hf, discriminator=generator is not None)
    if generator is not None:
        given = Path(generator)
        imported = _add_generator(imported, _import(given, checkpoint_config(given, "--generator"), flag="--generator"),
                                  f"--from-hf {src} --generator {generator}")
    with new_run(out, imported.config.kind, resume=False) as run:
        imported.tok.save(run / "tokenizer.json")
        save_weights(run / "model.safetensors", imported.state)
        if imported.labels:
            write_json(run / "labels.json", imported.labels)
        write_config(run, imported.config)
    return imported.summary
