"""Decoding: the KV cache, greedy, sampling filters, repetition penalty, beam search, stop strings, streaming."""
from __future__ import annotations

import json
import math

import pytest
import torch

from sesame import cli
from sesame.errors import SesameError
from sesame.apps.generate import tldr
from sesame.decoding import (GenerationConfig, next_tokens, penalise_repetition, top_k_filter, top_p_filter,
                             uniform_draws)
from sesame.generation import Continuation, beam_search, decode, generate
from sesame.language_model import LanguageModel, load_language_model
from sesame.models import Transformer, TransformerConfig
from sesame.models.transformer import KVCache
from sesame.tokenizer import train_tokenizer

from .conftest import sentences

PROMPTS = ["The cat", "A happy dog runs over the old", "Green"]
PROMPTS_THAT_END = ["the cat", "on the 5th of may", "zebra", "1 2 3"]  # below: ends after 0, 2, 3, 11 tokens, none


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(sentences(400), "bpe", 300)


def tiny_lm(tokenizer, norm: str = "pre", window: int | None = None, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=tokenizer.vocab_size, hidden=32, layers=3, heads=2, intermediate=64,
                            max_positions=96, causal=True, norm=norm, embedding_norm=False, dropout=0.0,
                            pad_id=tokenizer.specials.pad, attention_window=window)
    backbone = Transformer(cfg)
    with torch.no_grad():  # larger embeddings make the untrained model's choices depend on its context
        backbone.embed.tokens.weight.mul_(20)
    return LanguageModel(backbone, tokenizer)


@pytest.mark.parametrize("norm,window", [("pre", None), ("post", None), ("pre", 3)])
def test_cached_logits_equal_a_full_forward(tokenizer, norm, window) -> None:
    lm = tiny_lm(tokenizer, norm, window)
    ids = torch.tensor([lm.encode(["A happy dog runs over the old stone near the river"])[0]])
    full = lm.backbone(ids)
    cache = KVCache(lm.backbone.config, 1, ids.shape[1])
    steps = [lm.backbone(ids[:, :4], cache=cache)] + [lm.backbone(ids[:, t: t + 1], cache=cache)
                                                      for t in range(4, ids.shape[1])]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("window", [None, 2])
def test_greedy_with_the_cache_equals_without_token_for_token(tokenizer, window) -> None:
    lm = tiny_lm(tokenizer, window=window)
    prompts = lm.encode(PROMPTS)
    cached = decode(lm, prompts, GenerationConfig(max_new_tokens=20))
    recomputed = decode(lm, prompts, GenerationConfig(max_new_tokens=20, cache=False))
    assert [c.ids for c in cached] == [c.ids for c in recomputed]
    assert any(len(c.ids) >= 10 for c in cached)
    alone = [decode(lm, [p], GenerationConfig(max_new_tokens=20))[0].ids for p in prompts]
    assert alone == [c.ids for c in cached]  # left padding in a batch changes nothing


def test_beam_search_with_one_beam_equals_greedy(tokenizer) -> None:
    lm = tiny_lm(tokenizer)
    for prompt in lm.encode(PROMPTS):
        greedy = decode(lm, [prompt], GenerationConfig(max_new_tokens=15))[0]
        beam = beam_search(lm, prompt, GenerationConfig(max_new_tokens=15, beams=1))
        assert beam.ids == greedy.ids and beam.text == greedy.text


class TableModel(LanguageModel):
    """A bigram model given as a table: the next token's logits depend on the last token only."""

    def __init__(self, lm: LanguageModel, table: dict[int, dict[int, float]]):
        super().__init__(lm.backbone, lm.tokenizer)
        self.table = table

    def logits(self, ids, padding=None, positions=None, cache=None):
        out = torch.full((ids.shape[0], self.tokenizer.vocab_size), -50.0)
        for row, last in enumerate(ids[:, -1].tolist()):
            for token, p in self.table.get(last, {}).items():
                out[row, token] = math.log(p)
        return out


def test_beam_search_finds_the_likelier_sequence_greedy_misses(tokenizer) -> None:
    a, b, c, d = 100, 101, 102, 103  # after the prompt: a (0.6) or b (0.4); after a: flat; after b: c (0.9)
    end = tokenizer.specials.sep
    table = {end: {a: 0.6, b: 0.4}, a: {t: 0.1 for t in range(110, 120)}, b: {c: 0.9, d: 0.1},
             **{t: {end: 1.0} for t in (c, d, *range(110, 120))}}
    lm = TableModel(tiny_lm(tokenizer), table)
    prompt = [end]
    greedy = decode(lm, [prompt], GenerationConfig(max_new_tokens=5, cache=False))[0]
    beam = beam_search(lm, prompt, GenerationConfig(max_new_tokens=5, beams=2, cache=False))
    assert greedy.ids[:2] == [a, 110] and beam.ids == [b, c] and beam.finish == "end"


def test_an_end_outside_the_beam_finishes_nothing(tokenizer) -> None:
    """Beams of 2, α = 0.6. Step 2 ranks a b, d </s>, a </s>, d d: a </s> (third) is outside the beam, so it does
    not finish (transformers' rule). Admitted, it would make two finished hypotheses, and at step 3 the live
    a b c (ln .079 / 3^α) could not beat it (ln .14 / 2^α): the search would stop with d </s>, missing
    a b c </s> (ln .068 / 4^α)."""
    a, b, c, d, end = 100, 101, 102, 103, tokenizer.specials.sep
    table = {end: {a: .35, d: .34, end: .24, c: .07}, a: {b: .46, end: .40, d: .14},
             b: {c: .49, end: .13, a: .22, b: .16}, c: {end: .86, b: .07, d: .07}, d: {end: .45, d: .36, b: .19}}
    lm = TableModel(tiny_lm(tokenizer), table)
    beam = beam_search(lm, [end], GenerationConfig(max_new_tokens=4, beams=2, length_penalty=0.6, cache=False))
    assert beam.ids == [a, b, c] and beam.finish == "end"


def test_a_beam_ended_by_the_end_token_keeps_its_text(tokenizer) -> None:
    end = tokenizer.specials.sep
    words = tokenizer.encode(["The cat"], special=False)[0]
    table = {end: {words[0]: 1.0}, **{w: {n: 1.0} for w, n in zip(words, [*words[1:], end])}}
    lm = TableModel(tiny_lm(tokenizer), table)
    out = generate(lm, [""], GenerationConfig(max_new_tokens=len(words) + 2, beams=2, cache=False))[0]
    assert out["finish"] == "end" and out["text"] == "The cat" and out["new_tokens"] == len(words) + 1


def test_top_p_never_samples_outside_the_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    cfg = GenerationConfig(sample=True, top_p=0.8)
    generator = torch.Generator().manual_seed(0)
    draws = [int(next_tokens(probs.log(), cfg, torch.rand(1, generator=generator))) for _ in range(2000)]
    assert set(draws) == {0, 1}  # 0.5 + 0.3 reaches p: the nucleus is the two most likely tokens
    assert abs(draws.count(0) / 2000 - 0.5 / 0.8) < 0.04  # renormalised within the nucleus
    kept = top_p_filter(probs.log(), 0.81).isfinite()
    assert kept.tolist() == [[True, True, True, False]]
    assert top_p_filter(torch.tensor([[5.0, 0.0]]), 0.1).isfinite().tolist() == [[True, False]]


def test_top_k_and_temperature() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert top_k_filter(logits, 2).isfinite().tolist() == [[False, True, True, False]]
    cold = GenerationConfig(sample=True, temperature=0.01)
    assert int(next_tokens(logits, cold, torch.rand(1, generator=torch.Generator().manual_seed(1)))) == 1


def test_repetition_penalty_follows_ctrl() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    out = penalise_repetition(logits, torch.tensor([[0, 1, 1]]), 2.0)
    assert out.tolist() == [[1.0, -2.0, 0.5]]


def test_sampling_is_repeatable_under_a_seed(tokenizer) -> None:
    lm = tiny_lm(tokenizer)
    runs = [generate(lm, PROMPTS, GenerationConfig(sample=True, seed=seed, max_new_tokens=12)) for seed in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_sampling_draws_are_a_function_of_seed_prompt_and_step_alone(tokenizer) -> None:
    assert torch.equal(uniform_draws(3, [2], 5), uniform_draws(3, range(4), 5)[2:3])
    assert len({float(uniform_draws(3, [p], s)) for p in range(3) for s in range(3)}) == 9
    lm, cfg = tiny_lm(tokenizer), GenerationConfig(sample=True, seed=3, max_new_tokens=12)
    together = generate(lm, PROMPTS, cfg, batch_size=len(PROMPTS))
    assert [generate(lm, [p], cfg, first=i)[0] for i, p in enumerate(PROMPTS)] == together  # any batching


def test_inverse_cdf_sampling_never_picks_a_token_of_probability_zero() -> None:
    logits = torch.tensor([[0.0, 0.0, float("-inf")]] * 3)
    drawn = torch.tensor([0.0, 0.49, 1.0])  # 1.0: where u · total rounds up to the total
    assert next_tokens(logits, GenerationConfig(sample=True), drawn).tolist() == [0, 0, 1]


def test_stop_strings_cut_the_text_and_streaming_adds_up(tokenizer) -> None:
    pieces = {"text": ""}
    stream = Continuation(tokenizer, ("river",), tokenizer.specials.sep)
    for token in tokenizer.encode(["The cat sleeps near the river and the dog"], special=False)[0]:
        if stream.finish:
            break
        stream.add(token)
        pieces["text"] += stream.fresh()
    assert stream.finish == "stop" and stream.text == "The cat sleeps near the " == pieces["text"]
    held = Continuation(tokenizer, ("river",), tokenizer.specials.sep)
    for token in tokenizer.encode(["near the ri"], special=False)[0]:
        held.add(token)
    assert held.fresh() == "near the "  # "ri" may begin the stop string: held back


def test_tldr_keeps_three_sentences() -> None:
    assert tldr(" One. Two! Three? Four.") == "One. Two! Three?"
    assert tldr("No end") == "No end"


def test_generation_errors(tokenizer) -> None:
    lm = tiny_lm(tokenizer)
    with pytest.raises(SesameError, match="--max-new-tokens 90"):
        generate(lm, ["The cat " * 10], GenerationConfig(max_new_tokens=90))
    with pytest.raises(SesameError, match="--beams with --sample"):
        generate(lm, ["x"], GenerationConfig(beams=2, sample=True))
    with pytest.raises(SesameError, match="--top-p"):
        generate(lm, ["x"], GenerationConfig(sample=True, top_p=0.0))
    bidirectional = TransformerConfig(vocab_size=tokenizer.vocab_size, hidden=32, layers=1, heads=2, intermediate=64)
    with pytest.raises(SesameError, match="causal"):
        LanguageModel(Transformer(bidirectional), tokenizer)


def test_generate_refuses_an_encoder_naming_the_families_it_reads(tmp_path, capsys) -> None:
    """A bert run is neither a causal language model nor an encoder-decoder: the refusal names both kinds' families
    (it named gpt and gpt2 alone, as if an encoder-decoder could not generate)."""
    from sesame.families import backbone_config
    from sesame.run import PretrainedPart, RunConfig, write_config

    run = tmp_path / "bert"
    run.mkdir()
    write_config(run, RunConfig(kind="pretrained", family="bert", size="tiny", pooling="cls",
                                pretrained=PretrainedPart(objective="mlm"),
                                model=backbone_config("bert", "tiny", 64, 0)))
    assert cli.main(["generate", "--model", str(run), "--prompt", "The cat"]) == 2
    err = capsys.readouterr().err
    assert f"--model {run}: a bidirectional bert model" in err
    assert "causal language model (family gpt, gpt2)" in err and "encoder-decoder (family t5, t5v1_1, bart)" in err


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    import sesame

    folder = tmp_path_factory.mktemp("gen")
    (folder / "corpus.txt").write_text("\n".join(sentences(400)) + "\n")
    sesame.pretrain([str(folder / "corpus.txt")], str(folder / "run"), family="gpt2", size="tiny", vocab_size=300,
                    seq_len=32, batch_size=8, max_steps=30, progress=False, lr=3e-3)
    return folder / "run"


def test_cli_streams_one_prompt_and_writes_json_lines_for_many(gpt2_run, tmp_path, capsys) -> None:
    assert cli.main(["generate", "--model", str(gpt2_run), "--prompt", "The cat", "--max-new-tokens", "8"]) == 0
    streamed = capsys.readouterr().out
    assert streamed.startswith("The cat") and streamed.endswith("\n")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The dog\n\nA bird\n")
    assert cli.main(["--no-progress", "generate", "--model", str(gpt2_run), "--prompts", str(prompts), "--sample",
                     "--top-p", "0.9", "--max-new-tokens", "6", "--beams", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in lines] == ["The dog", "A bird"]
    assert all(r["finish"] in ("end", "stop", "length") and r["new_tokens"] <= 6 for r in lines)
    assert streamed == "The cat" + generate(str(gpt2_run), ["The cat"], GenerationConfig(max_new_tokens=8))[0]["text"] + "\n"


def test_cli_generate_errors(gpt2_run, tmp_path, capsys) -> None:
    assert cli.main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert "--model" in capsys.readouterr().err
    assert cli.main(["generate", "--model", str(gpt2_run), "--prompts", str(tmp_path / "missing.txt")]) == 2
    assert "--prompts" in capsys.readouterr().err


def test_greedy_and_beam_search_match_transformers_generate(tmp_path) -> None:
    """A GPT2LMHeadModel directory: sesame's greedy and beam outputs are transformers' generate outputs,
    token for token (both start after <|endoftext|> and stop at it)."""
    transformers = pytest.importorskip("transformers")
    from .test_interop import make_hf

    model = make_hf(tmp_path / "hf", "gpt2", "AutoModelForCausalLM").eval()
    with torch.no_grad():  # sharper next-token distributions than the random initialisation gives
        model.transformer.wte.weight.mul_(30)
    model.save_pretrained(tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    lm = load_language_model(str(tmp_path / "hf"))
    for prompt in ("the cat", "a tree near the river"):
        ids = torch.tensor([[tok.eos_token_id] + tok(prompt)["input_ids"]])
        for beams in (1, 3):
            theirs = model.generate(ids, max_new_tokens=12, do_sample=False, num_beams=beams, early_stopping=False,
                                    eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)[0, ids.shape[1]:]
            ours = generate(lm, [prompt], GenerationConfig(max_new_tokens=12, beams=beams))[0]
            expected = theirs.tolist()
            if tok.eos_token_id in expected:
                expected = expected[: expected.index(tok.eos_token_id)]
            assert ours["text"] == tok.decode(expected), (prompt, beams)


def test_beam_search_with_ends_and_length_penalties_matches_transformers(tmp_path) -> None:
    """Beams that end, ranked with α ≠ 1: the same tokens as transformers' ``generate(num_beams=...,
    early_stopping=False)``. The end token's logit is made a constant (a final-LayerNorm dimension fixed at 1,
    which only the end token's embedding reads), so hypotheses end at varied lengths."""
    transformers = pytest.importorskip("transformers")
    from .test_interop import make_hf

    model = make_hf(tmp_path / "hf", "gpt2", "AutoModelForCausalLM").eval()
    eos = model.config.eos_token_id
    with torch.no_grad():
        model.transformer.wte.weight.mul_(5)
        model.transformer.ln_f.weight[0], model.transformer.ln_f.bias[0] = 0.0, 1.0
        model.transformer.wte.weight[eos] = 0.0
        model.transformer.wte.weight[eos, 0] = 12.0
    model.save_pretrained(tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    lm = load_language_model(str(tmp_path / "hf"))
    ended = []
    for prompt in PROMPTS_THAT_END:
        ids = torch.tensor([[eos] + tok(prompt)["input_ids"]])
        for beams in (2, 3, 4):
            for alpha in (0.6, 2.0):
                theirs = model.generate(ids, max_new_tokens=12, do_sample=False, num_beams=beams, early_stopping=False,
                                        length_penalty=alpha, eos_token_id=eos, pad_token_id=eos)[0, ids.shape[1]:]
                ours = generate(lm, [prompt], GenerationConfig(max_new_tokens=12, beams=beams, length_penalty=alpha))[0]
                expected = theirs.tolist()
                if eos in expected:
                    expected = expected[: expected.index(eos)]
                    ended.append(len(expected))
                assert ours["text"] == tok.decode(expected), (prompt, beams, alpha)
                assert (ours["finish"] == "end") == (eos in theirs.tolist()), (prompt, beams, alpha)
    assert len(set(ended)) >= 3  # beams that end at once and later
