"""Encoder-decoder generation (sesame.seq2seq): transformers' generate tokens on tiny random T5 and BART models,
the caches, batches with padding, sampling's draws, stop conditions and bad inputs."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sesame.decoding import GenerationConfig, top_k_filter, uniform_draws
from sesame.errors import SesameError
from sesame.models.encoder_decoder import STYLES, EncoderDecoder, EncoderDecoderConfig
from sesame.seq2seq import generate_seq2seq, right_pad, start, stepper

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 100
IDS = {"t5": {"pad": 0, "eos": 1, "start": 0}, "bart": {"pad": 1, "eos": 2, "start": 2}}
torch.manual_seed(5)
SOURCES = [torch.randint(3, VOCAB, (n,)).tolist() for n in (9, 5, 7, 12)]  # a batch needs padding


def hf_model(style: str) -> torch.nn.Module:
    ids = IDS[style]
    if style == "t5":
        config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
                                       dropout_rate=0.0, feed_forward_proj="relu", pad_token_id=ids["pad"],
                                       eos_token_id=ids["eos"], decoder_start_token_id=ids["start"])
        return transformers.T5ForConditionalGeneration(config)
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
                                     attention_dropout=0.0, activation_dropout=0.0, pad_token_id=ids["pad"],
                                     bos_token_id=0, eos_token_id=ids["eos"], decoder_start_token_id=ids["start"])
    return transformers.BartForConditionalGeneration(config)


def pair(style: str) -> tuple[torch.nn.Module, EncoderDecoder]:
    """A random transformers model and sesame's copy of its weights. Every weight is moved off its initial value,
    and the decoder's sublayer outputs are scaled up (×10 T5, ×3 BART): otherwise the tied embeddings make a random
    decoder repeat its input token, and every hypothesis is one token over and over."""
    from sesame.interop.encoder_decoder import import_weights

    torch.manual_seed(0)
    hf = hf_model(style).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.add_(torch.randn_like(p) * 0.2)
            if name.startswith(("decoder.", "model.decoder.")) and name.endswith(("o.weight", "wo.weight",
                                                                                   "out_proj.weight", "fc2.weight")):
                p.mul_(10.0 if style == "t5" else 3.0)
    ids = IDS[style]
    ours = EncoderDecoder(EncoderDecoderConfig(vocab_size=VOCAB, hidden=32, layers=2, heads=4, intermediate=64,
                                               max_positions=64, dropout=0.0, pad_id=ids["pad"],
                                               decoder_start_id=ids["start"], **STYLES[style])).eval()
    ours.load_state_dict(import_weights(style, hf.state_dict(), ours))
    return hf, ours


# T5 ends at its own </s> (1); BART's random decoder never writes its </s> (2), so its test ends at token 68, which
# it writes after two tokens for the first source and never for the others
END = {"t5": 1, "bart": 68}


def transformers_tokens(hf: torch.nn.Module, style: str, sources: list[list[int]], cfg: GenerationConfig
                        ) -> list[tuple[list[int], bool]]:
    """transformers' ``generate`` tokens per source, cut before the end token, and whether it ended there. Set so it
    does what sesame does: no forced first or last token (BART's configuration forces </s> at the length limit; a
    None passed to ``generate`` would fall back to it, so it is unset on the model), no minimum length, no n-gram
    ban, ``max_new_tokens``, transformers' default ``early_stopping=False``, and the same end, pad and start ids."""
    ids = IDS[style]
    hf.generation_config.forced_eos_token_id = hf.generation_config.forced_bos_token_id = None
    padded, padding = right_pad(sources, ids["pad"])
    out = hf.generate(input_ids=padded, attention_mask=padding.long(), max_new_tokens=cfg.max_new_tokens,
                      min_length=0, do_sample=False, num_beams=cfg.beams, length_penalty=cfg.length_penalty,
                      early_stopping=False, repetition_penalty=cfg.repetition_penalty, no_repeat_ngram_size=0,
                      eos_token_id=END[style], pad_token_id=ids["pad"], decoder_start_token_id=ids["start"])
    rows = [row[1:] for row in out.tolist()]  # after the start token
    return [(row[: row.index(END[style])], True) if END[style] in row else (row, False) for row in rows]


@pytest.mark.parametrize("style", ["t5", "bart"])
def test_greedy_and_beam_search_give_transformers_tokens(style):
    hf, ours = pair(style)
    ends: dict[int, list[int]] = {1: [], 3: []}  # the lengths of the targets that ended, by beams
    for setting in ({}, {"repetition_penalty": 1.5}, {"beams": 3, "length_penalty": 0.6},
                    {"beams": 3, "length_penalty": 2.0}):
        cfg = GenerationConfig(max_new_tokens=12, **setting)
        with torch.no_grad():
            expected = transformers_tokens(hf, style, SOURCES, cfg)
        got = generate_seq2seq(ours, SOURCES, cfg, eos=END[style])
        assert [(h.tokens, h.finish == "end") for h in got] == expected, setting
        assert not all(len(set(tokens)) == 1 for tokens, _ in expected)  # not one token over and over
        ends[cfg.beams] += [len(tokens) for tokens, ended in expected if ended]
    assert max(ends[1]) > 0 and max(ends[3]) > 0  # targets that end after some tokens, greedy and beam searched


@pytest.mark.parametrize("style", ["t5", "bart"])
@pytest.mark.parametrize("setting", [{}, {"beams": 3, "length_penalty": 0.6}, {"sample": True, "top_k": 5, "seed": 1}])
def test_uncached_decoding_and_each_source_alone_give_the_batchs_tokens(style, setting):
    _, ours = pair(style)
    cfg = GenerationConfig(max_new_tokens=10, **setting)
    batch = generate_seq2seq(ours, SOURCES, cfg, eos=END[style])
    uncached = generate_seq2seq(ours, SOURCES, replace(cfg, cache=False), eos=END[style])
    alone = [generate_seq2seq(ours, [source], cfg, eos=END[style], first=i)[0] for i, source in enumerate(SOURCES)]
    in_parts = generate_seq2seq(ours, SOURCES, cfg, eos=END[style], batch_size=3)  # a batch of 3, then of 1
    for other in (uncached, alone, in_parts):
        assert [(h.tokens, h.finish) for h in other] == [(h.tokens, h.finish) for h in batch]
        assert [h.log_prob for h in other] == pytest.approx([h.log_prob for h in batch], abs=1e-4)
    assert len({tuple(h.tokens) for h in batch}) > 1  # the targets depend on the source


def test_sampling_draws_each_token_from_its_steps_filtered_distribution():
    """Every sampled token is the inverse-CDF draw of uniform_draws(seed, input, step) from the teacher-forced
    distribution after temperature and top-k, and sampling is not greedy decoding."""
    _, ours = pair("t5")
    cfg = GenerationConfig(max_new_tokens=8, sample=True, temperature=2.0, top_k=4, seed=7)
    sampled = generate_seq2seq(ours, SOURCES, cfg, eos=None, first=10)
    targets = torch.tensor([h.tokens for h in sampled])  # no end token: all 8 long
    ids, padding = right_pad(SOURCES, IDS["t5"]["pad"])
    with torch.no_grad():
        logits = ours(ids, padding=padding, decoder_ids=ours.decoder_inputs(targets))
    cdf = top_k_filter(logits.log_softmax(-1) / cfg.temperature, cfg.top_k).softmax(-1).cumsum(-1)
    for t in range(8):
        drawn = uniform_draws(cfg.seed, range(10, 10 + len(SOURCES)), t)[:, None] * cdf[:, t, -1:]
        assert targets[:, t].tolist() == (cdf[:, t] <= drawn).sum(-1).tolist(), t
    log_probs = logits.log_softmax(-1).gather(2, targets[..., None]).sum((1, 2))
    assert [h.log_prob for h in sampled] == pytest.approx(log_probs.tolist(), abs=1e-4)
    greedy = generate_seq2seq(ours, SOURCES, GenerationConfig(max_new_tokens=8), eos=None)
    assert [h.tokens for h in greedy] != [h.tokens for h in sampled]
    again = generate_seq2seq(ours, SOURCES, cfg, eos=None, first=10)
    other_seed = generate_seq2seq(ours, SOURCES, replace(cfg, seed=8), eos=None, first=10)
    assert [h.tokens for h in again] == [h.tokens for h in sampled] != [h.tokens for h in other_seed]


def test_a_stop_string_ends_a_hypothesis_with_its_tokens():
    _, ours = pair("t5")
    whole = generate_seq2seq(ours, SOURCES[:1], GenerationConfig(max_new_tokens=12), eos=None)[0]
    assert whole.tokens[:4] == [90, 90, 65, 64] and whole.finish == "length"

    def text(ids: list[int]) -> str:
        return " ".join(f"<{i}>" for i in ids)

    stopped = generate_seq2seq(ours, SOURCES[:1], GenerationConfig(max_new_tokens=12, stop=("<65>",)), eos=None,
                               text=text)[0]
    assert stopped.tokens == [90, 90, 65] and stopped.finish == "stop"
    with pytest.raises(ValueError, match="text="):
        generate_seq2seq(ours, SOURCES, GenerationConfig(stop=("x",)), eos=None)


def test_the_encoder_runs_once_per_batch():
    _, ours = pair("t5")
    calls = []
    hook = ours.encoder.register_forward_hook(lambda *_: calls.append(1))
    generate_seq2seq(ours, SOURCES, GenerationConfig(max_new_tokens=6, beams=3), eos=1, batch_size=2)
    hook.remove()
    assert len(calls) == 2


def test_a_selection_follows_its_rows_and_moves_the_memory_only_when_a_source_changes():
    _, ours = pair("t5")
    ids, padding = right_pad(SOURCES, IDS["t5"]["pad"])
    step, first, second = stepper(ours), torch.tensor([3, 4, 5, 6]), torch.tensor([7, 8, 9, 10])
    with torch.no_grad():
        # rows of other sources; then hypotheses of the same sources reordered, as beam search does
        for sources, rows in (([0, 1, 2, 3], [2, 2, 0, 3]), ([0, 0, 2, 2], [1, 0, 3, 2])):
            _, state = step(first, start(ours, ids, padding, capacity=2).select(torch.tensor(sources)))
            memory = state.memory.states
            selected = state.select(torch.tensor(rows))
            got, _ = step(second, selected)
            picked = torch.tensor(sources)[rows]
            _, alone = step(first[rows], start(ours, ids[picked], padding[picked], capacity=2))
            torch.testing.assert_close(got, step(second, alone)[0], atol=1e-5, rtol=1e-5)
            assert (selected.memory.states is memory) == (picked.tolist() == sources)


def test_bad_inputs_are_refused_naming_the_input_or_the_flag():
    _, bart = pair("bart")
    with pytest.raises(SesameError, match="input 2 is empty"):
        generate_seq2seq(bart, [[5], []], eos=2)
    with pytest.raises(SesameError, match="input 1 has 65 tokens"):
        generate_seq2seq(bart, [[5] * 65], eos=2)
    with pytest.raises(SesameError, match="--max-new-tokens 65"):
        generate_seq2seq(bart, [[5]], GenerationConfig(max_new_tokens=65), eos=2)
    with pytest.raises(SesameError, match="--beams with --sample"):
        generate_seq2seq(bart, [[5]], GenerationConfig(beams=2, sample=True), eos=2)
    assert len(generate_seq2seq(bart, [[5] * 64], GenerationConfig(max_new_tokens=64), eos=None)[0].tokens) == 64


def test_t5_reads_past_max_positions_as_transformers_does_and_writes_up_to_them():
    """T5's relative position bias has no cap (BART's learned table has: above): an 80-token source on a model of 64
    positions decodes to transformers' T5 tokens. What it writes is held to its max_positions as GPT's and BART's
    outputs are (GenerationConfig.check_room): 64 new tokens, not 65, so that no request decodes without end."""
    hf, t5 = pair("t5")
    source = [torch.randint(3, VOCAB, (80,), generator=torch.Generator().manual_seed(1)).tolist()]
    cfg = GenerationConfig(max_new_tokens=64)
    [hyp] = generate_seq2seq(t5, source, cfg, eos=END["t5"])
    assert t5.config.max_positions == 64 and len(hyp.tokens) == 64
    assert [(hyp.tokens, hyp.finish == "end")] == transformers_tokens(hf, "t5", source, cfg)
    with pytest.raises(SesameError, match="--max-new-tokens 100000 exceeds the model's 64 positions"):
        generate_seq2seq(t5, source, GenerationConfig(max_new_tokens=100_000), eos=END["t5"])


@pytest.mark.parametrize("setting", [{}, {"beams": 2}, {"sample": True, "top_p": 0.9}])
def test_generation_makes_no_tensor_off_the_models_device(setting):
    from .test_placement import SameDevice

    _, ours = pair("bart")
    with torch.device("meta"), SameDevice():
        hyps = generate_seq2seq(ours, SOURCES, GenerationConfig(max_new_tokens=4, **setting), eos=END["bart"])
    assert len(hyps) == len(SOURCES)
