"""The steps ``benchmarks/train_step.py`` compares (``--which``), what is measured: each builds sesame's model and
transformers' of the same configuration, one batch, and the two contenders of a variant, each one full training step
(forward, backward, AdamW step) on that batch:

* ``mlm``: a BERT-mini masked LM (4 layers, hidden 256, 4 heads, feed-forward 1024, vocabulary 30522,
  512 positions, dropout 0.1 on hidden states and attention probabilities), batch 32 x 128.
  sesame: ``Transformer`` + ``MaskedLM`` with the batch from ``MaskedLM.make_batch``; transformers:
  ``BertForMaskedLM`` on the same corrupted ids, labels -100 at the unselected positions.
* ``clm``: a GPT-2-style causal LM of the same size (pre-LayerNorm, final LayerNorm, no embedding
  LayerNorm, LayerNorm eps 1e-5, no token-type embeddings, exact GELU, tied output matrix) with
  GPT-2's real vocabulary of 50257 tokens, batch 32 x 128. sesame: ``Transformer`` + ``CausalLM``;
  transformers: ``GPT2LMHeadModel`` (``activation_function="gelu"``), fed the same 128 inputs and the
  same 128 next-token targets per row (``shift_labels``).
* ``t5``: T5 v1.0's span corruption (Raffel et al. 2020, §3.1.4: 15% noise in spans of mean length 3) with an
  encoder-decoder of the same size in each stack (4 + 4 layers, hidden 256, 4 heads, feed-forward 1024: the sizes
  of the t5 family's mini, ``sesame.families.SIZES``; 512 positions) and T5's vocabulary of 32128 tokens, batch
  32 x 128 encoder tokens (about 30 targets per row). sesame: ``EncoderDecoder`` + ``SpanCorruption``; transformers:
  ``T5ForConditionalGeneration``, fed the same corrupted ids and targets as ``labels`` (it shifts them right behind
  its start token, as sesame does).
* ``bart``: BART's denoising (Lewis et al. 2020: text infilling and sentence permutation) with the bart family's
  mini (the same sizes) and BART's vocabulary of 50265 tokens, batch 32 x 128 (encoder inputs padded to the
  longest row, an attention mask; 128 targets per row). sesame: ``EncoderDecoder`` + ``Denoising``;
  transformers: ``BartForConditionalGeneration``.
  Both encoder-decoder comparisons build transformers' configuration from sesame's with the interop's
  ``hf_config`` and copy transformers' random initial weights into sesame's model (``encoder_decoder_pair.py``),
  so both sides start from the same function; windows are random ids. Words and sentences of random ids for
  BART: a seeded draw makes 3 ids in 4 begin a word and 1 in 20 end a sentence. Dropout 0.1 on both sides,
  transformers' where its models put it: T5's also inside the feed-forward and after the final norm, where sesame
  has none (``sesame.models.encoder_decoder``'s deviations), so T5's transformers step does a little more.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from sesame.interop.encoder_decoder import POSITION_OFFSET
from sesame.models import Transformer, TransformerConfig
from sesame.objectives import CausalLM, MaskedLM
from sesame.objectives.mlm import masked_entries
from sesame.tokenizer import SpecialIds

sys.path.insert(0, str(Path(__file__).parent))
from encoder_decoder_pair import OBJECTIVES, SENTINELS, SPECIALS, build_pair  # noqa: E402
from train_step_core import BenchConfig, Contender, Variant, check_same_size, contender, generators  # noqa: E402

BERT_SPECIALS = SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103)  # bert-base-uncased ids


def sesame_model(step: str, cfg: BenchConfig) -> MaskedLM | CausalLM:
    """sesame's ``MaskedLM`` (BERT style) or ``CausalLM`` (GPT-2 style) in the benchmark's shape, training."""
    bert = step == "mlm"
    backbone = Transformer(TransformerConfig(
        vocab_size=cfg.vocab_size, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
        intermediate=cfg.intermediate, max_positions=cfg.max_positions, dropout=cfg.dropout,
        type_vocab_size=2 if bert else 0, causal=not bert, norm="post" if bert else "pre", embedding_norm=bert,
        layer_norm_eps=1e-12 if bert else 1e-5))
    if bert:
        return MaskedLM(backbone, BERT_SPECIALS).train()
    eos = cfg.vocab_size - 1  # GPT-2's <|endoftext|> is its last id
    return CausalLM(backbone, SpecialIds(pad=eos, unk=eos, cls=eos, sep=eos, mask=eos)).train()


def first_plain_id(step: str) -> int:
    """The smallest id a window may hold: above BERT's, T5's or BART's special tokens, any for GPT-2."""
    specials = {"mlm": BERT_SPECIALS, **SPECIALS}.get(step)
    return max(specials.all) + 1 if specials else 0


def mlm_contenders(cfg: BenchConfig, seed: int, variant: Variant) -> list[Contender]:
    """sesame ``MaskedLM`` and ``BertForMaskedLM`` on one masked batch."""
    torch.manual_seed(seed)
    sesame = sesame_model("mlm", cfg)
    hf = BertForMaskedLM(BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.max_positions, type_vocab_size=2, hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout, layer_norm_eps=1e-12,
        attn_implementation="sdpa")).train()
    check_same_size(sesame, hf)

    windows = torch.randint(first_plain_id("mlm"), cfg.vocab_size, (cfg.batch, MaskedLM.window_length(cfg.seq_len)),
                            generator=torch.Generator().manual_seed(seed))
    batch = sesame.make_batch(windows, generators(cfg.batch, seed))
    n_targets = batch["masked"]
    labels = torch.full((cfg.batch * cfg.seq_len,), -100, dtype=torch.long)
    labels[masked_entries(batch, "positions")] = masked_entries(batch, "targets")
    batch, labels = variant.placement().move((batch, labels.view(cfg.batch, cfg.seq_len)))

    h, v = cfg.hidden, cfg.vocab_size
    head = 6 * (h * h + h * v)
    return [
        contender("sesame", variant, sesame, lambda forward: forward(batch).float() / n_targets,
                  cfg.block_flops() + head * n_targets),
        contender("transformers", variant, hf, lambda forward: forward(input_ids=batch["ids"], labels=labels).loss,
                  cfg.block_flops() + head * cfg.tokens),
    ]


def clm_contenders(cfg: BenchConfig, seed: int, variant: Variant) -> list[Contender]:
    """sesame ``CausalLM`` (GPT-2 family) and ``GPT2LMHeadModel`` on one batch of next-token targets."""
    torch.manual_seed(seed)
    sesame = sesame_model("clm", cfg)
    hf = GPT2LMHeadModel(GPT2Config(
        vocab_size=cfg.vocab_size, n_embd=cfg.hidden, n_layer=cfg.layers, n_head=cfg.heads,
        n_inner=cfg.intermediate, n_positions=cfg.max_positions, activation_function="gelu",
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=1e-5,
        attn_implementation="sdpa")).train()
    check_same_size(sesame, hf)

    windows = torch.randint(0, cfg.vocab_size, (cfg.batch, CausalLM.window_length(cfg.seq_len)),
                            generator=torch.Generator().manual_seed(seed))
    batch = variant.placement().move(sesame.make_batch(windows, generators(cfg.batch, seed)))
    n_targets = batch["targets"].numel()
    ids, targets = batch["ids"].contiguous(), batch["targets"].contiguous()

    flops = cfg.block_flops() + 6 * cfg.hidden * cfg.vocab_size * cfg.tokens
    return [
        contender("sesame", variant, sesame, lambda forward: forward(batch).float() / n_targets, flops),
        contender("transformers", variant, hf,
                  lambda forward: forward(input_ids=ids, labels=ids, shift_labels=targets).loss, flops),
    ]


def seq2seq_contenders(style: str, cfg: BenchConfig, seed: int, variant: Variant) -> list[Contender]:
    """sesame's ``SpanCorruption`` (t5) or ``Denoising`` (bart) and ``T5ForConditionalGeneration`` or
    ``BartForConditionalGeneration`` of the configuration the interop derives from sesame's, both from the same
    weights (``encoder_decoder_pair.build_pair``), on one batch of sesame's corruption of random windows."""
    backbone, hf = build_pair(style, vocab_size=cfg.vocab_size, hidden=cfg.hidden, layers=cfg.layers,
                              heads=cfg.heads, intermediate=cfg.intermediate, max_positions=cfg.max_positions,
                              dropout=cfg.dropout, seed=seed)
    sesame = OBJECTIVES[style](backbone, cfg.vocab_size, seed).train()
    check_same_size(sesame, hf, unused=2 * POSITION_OFFSET[style] * cfg.hidden)

    windows = torch.randint(first_plain_id(style), cfg.vocab_size - SENTINELS, (cfg.batch, sesame.window_length(
        cfg.seq_len)), generator=torch.Generator().manual_seed(seed))  # below T5's sentinels
    batch = variant.placement().move(sesame.make_batch(windows, generators(cfg.batch, seed)))
    ids, targets, padding = batch["ids"], batch["targets"], batch.get("padding")
    mask = None if padding is None else padding.long()
    n_targets = targets.numel()

    source, target = ids.shape[1], targets.shape[1]
    flops = (cfg.block_flops(source) + cfg.block_flops(target) + cfg.cross_attention_flops(source, target)
             + 6 * cfg.hidden * cfg.vocab_size * n_targets)
    return [
        contender("sesame", variant, sesame, lambda forward: forward(batch).float() / n_targets, flops),
        contender("transformers", variant, hf,
                  lambda forward: forward(input_ids=ids, attention_mask=mask, labels=targets).loss, flops),
    ]
