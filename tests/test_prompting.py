"""In-context classification (sesame/apps/prompting.py): demonstrations, prompt assembly, scoring, the whole
evaluation."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sesame import SesameError, prompt_eval
from sesame.apps.prompting import (CONTENT_FREE, Template, assemble, calibrate, content_free, demonstration_indices,
                                   parse_verbalizers)
from sesame.families import backbone_config
from sesame.language_model import LanguageModel, continuation_logprobs
from sesame.models import Transformer
from sesame.run import PretrainedPart, RunConfig, load_backbone, load_tokenizer, write_config
from sesame.tokenizer import train_tokenizer
from sesame.train.checkpoint import save_weights

from .conftest import sentences


def make_run(run: Path, family: str, seq_len: int = 48) -> Path:
    """A pretrained run with random weights, moved off their initial values so the model has preferences."""
    tok = train_tokenizer(sentences(200), "bpe", 600)
    torch.manual_seed(0)
    cfg = backbone_config(family, "tiny", tok.vocab_size, tok.specials.pad, 0.0, 64)
    backbone = Transformer(cfg)
    with torch.no_grad():
        for p in backbone.parameters():
            p.add_(0.3 * torch.randn_like(p))
    run.mkdir(parents=True)
    tok.save(run / "tokenizer.json")
    save_weights(run / "model.safetensors", {"backbone." + k: v for k, v in backbone.state_dict().items()})
    write_config(run, RunConfig(kind="pretrained", family=family, size="tiny", model=cfg,
                                pooling="last" if cfg.causal else "cls",
                                pretrained=PretrainedPart(objective="clm" if cfg.causal else "mlm", seq_len=seq_len)))
    return run


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("prompting") / "gpt2", "gpt2")


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text,label\n" + "".join(f'"{text}",{label}\n' for text, label in rows))
    return path


def animal_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """Sentences labeled by whether they mention a cat or a dog."""
    return [(s, "animal" if {"cat", "dog"} & set(s.lower().rstrip(".").split()) else "none")
            for s in sentences(n, seed)]


def direct(backbone: Transformer, prompt: list[int], continuation: list[int]) -> float:
    """log P(continuation | prompt) from one forward pass over the whole sequence, alone."""
    with torch.no_grad():
        hidden = backbone(torch.tensor([prompt + continuation]))[0]
        logp = (hidden @ backbone.embed.tokens.weight.T).log_softmax(-1)
    return sum(float(logp[len(prompt) - 1 + t, token]) for t, token in enumerate(continuation))


def test_demonstrations_never_include_the_evaluated_example() -> None:
    """The training texts contain every evaluated text (once, twice, with spaces around): none is ever drawn
    for itself, even when k takes every other row."""
    texts = sentences(6, seed=1)
    train = sentences(10, seed=2) + texts + [texts[0], f"  {texts[1]} "]
    for k in (1, 3, len(train) - 2):  # 16: every row but the two copies of texts[0]
        for draw in range(20):
            for i, chosen in enumerate(demonstration_indices(train, texts, k=k, seed=0, draw=draw)):
                assert len(chosen) == len(set(chosen)) == k
                assert texts[i].strip() not in {train[j].strip() for j in chosen}
    with pytest.raises(SesameError, match=r"--k 17: --train t.csv has only 16 rows whose text differs from evaluated "
                                          r"example 1"):
        demonstration_indices(train, texts, k=17, seed=0, draw=0, train="--train t.csv")


def test_demonstrations_are_seeded_and_differ_across_draws() -> None:
    texts, train = sentences(8, seed=1), sentences(50, seed=2)
    first = demonstration_indices(train, texts, k=4, seed=0, draw=0)
    assert first == demonstration_indices(train, texts, k=4, seed=0, draw=0)
    assert first[:3] == demonstration_indices(train, texts[:3], k=4, seed=0, draw=0)  # per example, not per batch
    assert first != demonstration_indices(train, texts, k=4, seed=0, draw=1)
    assert first != demonstration_indices(train, texts, k=4, seed=1, draw=0)
    assert demonstration_indices(train, texts, k=0, seed=0, draw=0) == [[]] * len(texts)


def test_assembly_drops_the_oldest_demonstrations_and_keeps_the_example() -> None:
    demos, query = [[1, 1], [2, 2, 2], [3]], [7, 8, 9]
    assert assemble([0], demos, query, 100) == ([0, 1, 1, 2, 2, 2, 3, 7, 8, 9], 0, False)
    assert assemble([0], demos, query, 8) == ([0, 2, 2, 2, 3, 7, 8, 9], 1, False)
    assert assemble([0], demos, query, 6) == ([0, 3, 7, 8, 9], 2, False)
    assert assemble([0], [[3], [1, 1]], query, 5) == ([0, 7, 8, 9], 2, False)  # only a contiguous suffix stays
    assert assemble([0], demos, query, 3) == ([0, 8, 9], 3, True)  # the example alone too long: its end stays


def test_template_and_verbalizers() -> None:
    form = Template.parse(r"Review: {text}\nSentiment: {label}\n\n")
    assert form.demonstration("fine", "good") == "Review: fine\nSentiment: good\n\n"
    assert (form.query("fine"), form.continuation("good")) == ("Review: fine\nSentiment:", " good")
    assert Template.parse("{{{text}}} {label}").query("x") == "{x}"
    for bad in ("{label} {text}", "{text}", "{text} {label} {text}", "{text} {label:>3}", "{text} {mood}", "{text"):
        with pytest.raises(SesameError, match="--template"):
            Template.parse(bad)
    assert parse_verbalizers("negative=bad, neutral = so so,positive=good") == {
        "negative": "bad", "neutral": "so so", "positive": "good"}
    for bad in ("negative", "negative=", "=bad", "a=x,a=y"):
        with pytest.raises(SesameError, match="--verbalizers"):
            parse_verbalizers(bad)


def test_scores_match_a_direct_computation(gpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared rows, padding and batching change nothing: each score is the full sequence's log-probability."""
    backbone = load_backbone(gpt)
    lm = LanguageModel(backbone, load_tokenizer(gpt))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 300, (n,), generator=generator).tolist() for n in (1, 9, 4, 20, 13)]
    continuations = [[40], [41, 42], [41, 43, 44], [41, 43], [45, 46, 47, 48]]
    expected = torch.tensor([[direct(backbone, p, c) for c in continuations] for p in prompts])
    for budget in (8192, 60):  # everything in one forward pass, or one prompt at a time
        monkeypatch.setattr("sesame.language_model.BATCH_TOKENS", budget)
        torch.testing.assert_close(continuation_logprobs(lm, prompts, continuations), expected,
                                   atol=1e-4, rtol=1e-4)


def test_prompt_eval(gpt: Path, tmp_path: Path) -> None:
    data = write_csv(tmp_path / "dev.csv", animal_rows(12, seed=3))
    train = write_csv(tmp_path / "train.csv", animal_rows(40, seed=4))
    report = prompt_eval(str(gpt), str(data), train=str(train), ks=(0, 1, 4), draws=3, progress=False)
    assert [(r["k"], r["draws"], r["n"]) for r in report["results"]] == [(0, 1, 12), (1, 3, 12), (4, 3, 12)]
    for r in report["results"]:
        assert len(r["accuracies"]) == r["draws"] and r["min"] <= r["mean"] <= r["max"]
        assert sum(r["predicted"].values()) == pytest.approx(1.0)
    assert report["results"][2]["shortened"] > 0  # 48 positions cannot hold four demonstrations
    assert report["results"][2]["cut"] == 0
    assert report["verbalizers"] == {"animal": "animal", "none": "none"}
    labels = [label for _, label in animal_rows(12, seed=3)]
    assert report["majority"]["accuracy"] == max(labels.count("animal"), labels.count("none")) / 12
    assert prompt_eval(str(gpt), str(data), train=str(train), ks=(0, 1, 4), draws=3, progress=False) == report

    # zero-shot, recomputed by hand: [sep] + "text\nSentiment:" then " yes" or " no", per-token mean or
    # calibrated: the labels' normalised probabilities over p_cf, their mean after "N/A", "" and "[MASK]", normalised
    backbone, tok = load_backbone(gpt), load_tokenizer(gpt)
    words = {"animal": "yes", "none": "no"}
    continuations = dict(zip(words, tok.encode([" longer yes", " no"], special=False)))
    references = [[tok.specials.sep] + ids for ids in tok.encode(["N/A\nSentiment:", "\nSentiment:",
                                                                   "[MASK]\nSentiment:"], special=False)]
    p_cf = torch.tensor([[direct(backbone, r, ids) for ids in continuations.values()] for r in references],
                        dtype=torch.float64).exp()  # (float64: a verbaliser's probability can be below float32's)
    p_cf = p_cf.mean(0) / p_cf.mean(0).sum()
    for scoring in ("mean", "calibrated"):
        zero = prompt_eval(str(gpt), str(data), verbalizers={"animal": "longer yes", "none": "no"}, ks=(0,),
                           scoring=scoring, progress=False)["results"][0]
        guesses = []
        for text, _ in animal_rows(12, seed=3):
            prompt = [tok.specials.sep] + tok.encode([f"{text}\nSentiment:"], special=False)[0]
            p = torch.tensor([direct(backbone, prompt, ids) for ids in continuations.values()], dtype=torch.float64).exp()
            scores = dict(zip(words, (p / p.sum() / p_cf).tolist() if scoring == "calibrated" else
                              [direct(backbone, prompt, ids) / len(ids) for ids in continuations.values()]))
            guesses.append(max(scores, key=scores.get))
        assert zero["accuracies"] == [sum(g == label for g, label in zip(guesses, labels)) / 12]
        assert zero["predicted"] == {label: guesses.count(label) / 12 for label in words}
        assert 0 < zero["predicted"]["animal"] < 1  # both labels predicted: the comparison tells something


def test_calibration_divides_by_the_mean_content_free_probabilities() -> None:
    """Zhao et al. 2021, eq. 1 with W = diag(p_cf)⁻¹: p_cf is the mean of the labels' probabilities over the
    content-free inputs, normalised; a label the prompt favours whatever the text loses that advantage."""
    after = torch.tensor([[0.6, 0.1, 0.1], [0.2, 0.1, 0.1], [0.4, 0.4, 0.1]])  # 3 inputs × 3 labels, unnormalised
    mean = torch.tensor([0.4, 0.2, 0.1])
    torch.testing.assert_close(content_free(after.log()).exp(), mean / mean.sum())
    example = torch.tensor([0.5, 0.3, 0.1])  # the biased label first, by probability
    calibrated = calibrate(example.log(), content_free(after.log())).exp()
    torch.testing.assert_close(calibrated, example / example.sum() / (mean / mean.sum()))
    assert calibrated.argmax() == 1 and example.argmax() == 0
    assert CONTENT_FREE == ("N/A", "", "[MASK]")


def test_content_free_prompts_are_scored_once_per_demonstration_set(gpt: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Zero-shot, every example has the same (empty) demonstration set: three content-free prompts for all 12."""
    data = write_csv(tmp_path / "dev.csv", animal_rows(12, seed=3))
    scored = []

    def counted(lm, prompts, candidates, **kwargs):
        scored.append(len(prompts))
        return continuation_logprobs(lm, prompts, candidates, **kwargs)

    monkeypatch.setattr("sesame.apps.prompting.continuation_logprobs", counted)
    prompt_eval(str(gpt), str(data), ks=(0,), scoring="calibrated", progress=False)
    assert scored == [12 + len(CONTENT_FREE)]


def test_calibrated_few_shot_by_hand(gpt: Path, tmp_path: Path) -> None:
    """k = 2 in 64 tokens, calibrated: the content-free prompts keep exactly the demonstrations the
    example's prompt kept, then "N/A", "" or "[MASK]"."""
    rows, train_rows = animal_rows(8, seed=3), animal_rows(20, seed=4)
    data, train = write_csv(tmp_path / "dev.csv", rows), write_csv(tmp_path / "train.csv", train_rows)
    report = prompt_eval(str(gpt), str(data), train=str(train), ks=(2,), draws=1, scoring="calibrated", limit=6,
                         max_length=64, progress=False)
    backbone, tok = load_backbone(gpt), load_tokenizer(gpt)
    words = tok.encode([" animal", " none"], special=False)
    budget = 64 - max(map(len, words)) + 1
    demos = tok.encode([f"{text}\nSentiment: {label}\n\n" for text, label in train_rows], special=False)
    free = tok.encode([f"{text}\nSentiment:" for text in CONTENT_FREE], special=False)
    picks = demonstration_indices([t for t, _ in train_rows], [t for t, _ in rows[:6]], k=2, seed=0, draw=0)
    right, shortened, kept = 0, 0, 0
    for (text, label), chosen in zip(rows, picks):
        query = tok.encode([f"{text}\nSentiment:"], special=False)[0]
        prompt, dropped, _ = assemble([tok.specials.sep], [demos[j] for j in chosen], query, budget)
        references = [assemble([tok.specials.sep], [demos[j] for j in chosen[dropped:]], q, budget)[0] for q in free]
        p_cf = torch.tensor([[direct(backbone, r, ids) for ids in words] for r in references],
                            dtype=torch.float64).exp().mean(0)
        p = torch.tensor([direct(backbone, prompt, ids) for ids in words], dtype=torch.float64).exp()
        scores = (p / p_cf).tolist()  # normalising either changes no argmax
        right += ("animal", "none")[scores.index(max(scores))] == label
        shortened, kept = shortened + (dropped > 0), kept + 2 - dropped
    result = report["results"][0]
    assert (report["n"], result["accuracies"], result["shortened"]) == (6, [right / 6], shortened)
    assert shortened > 0 and kept > 0  # some demonstrations dropped, some kept


def test_a_transformers_gpt2_scores_as_transformers_does(tmp_path: Path) -> None:
    """A GPT2LMHeadModel directory: zero-shot predictions from GPT-2's own logits after <|endoftext|>, and
    its full n_positions as the context."""
    transformers = pytest.importorskip("transformers")
    from .test_interop import make_hf

    model = make_hf(tmp_path / "hf", "gpt2", "AutoModelForCausalLM").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    rows = [("the cat", "animal"), ("a tree", "none"), ("old dog", "animal"), ("blue sky", "none"), ("fish", "animal")]
    data = write_csv(tmp_path / "dev.csv", rows)
    words = {"animal": "cat", "none": "dog"}
    report = prompt_eval(str(tmp_path / "hf"), str(data), verbalizers=words, template="{text} = {label}", ks=(0,),
                         scoring="sum", progress=False)
    guesses = []
    for text, _ in rows:
        prompt = [tok.eos_token_id] + tok(f"{text} =")["input_ids"]
        scores = {}
        for label, word in words.items():
            ids = tok(f" {word}")["input_ids"]
            with torch.no_grad():
                logp = model(torch.tensor([prompt + ids])).logits[0].log_softmax(-1)
            scores[label] = sum(float(logp[len(prompt) - 1 + t, i]) for t, i in enumerate(ids))
        guesses.append(max(scores, key=scores.get))
    assert report["max_length"] == model.config.n_positions
    assert report["results"][0]["predicted"] == {label: guesses.count(label) / len(rows) for label in words}
    assert report["results"][0]["accuracies"] == [sum(g == label for g, (_, label) in zip(guesses, rows)) / len(rows)]
    assert 0 < report["results"][0]["predicted"]["animal"] < 1


def test_prompt_eval_errors(gpt: Path, tmp_path: Path) -> None:
    data = write_csv(tmp_path / "dev.csv", animal_rows(6, seed=3))
    bert = make_run(tmp_path / "bert", "bert")
    cases = [
        ({"model": str(bert)}, "--model .*bert: a bidirectional bert model; generation and prompting need a causal"),
        ({"text_column": "review"}, "no column 'review' for --text-column"),
        ({"verbalizers": {"animal": "yes"}}, r"--data .*dev.csv:\d+: label 'none' has no verbaliser"),
        ({"verbalizers": {"animal": "yes", "none": "yes"}}, "distinct, non-empty"),
        ({"ks": (0, 1)}, "--k 1: demonstrations come from a --train file"),
        ({"ks": (7,), "train": str(data)}, r"--k 7: --train .*dev.csv has only 5 rows"),
        ({"max_length": 4}, "--max-length 4: use 8 to 64"),
        ({"scoring": "max"}, "--scoring 'max'"),
        ({"draws": 0}, "--draws 0"),
        ({"limit": 0}, "--limit 0"),
    ]
    for options, message in cases:
        with pytest.raises(SesameError, match=message):
            prompt_eval(**{"model": str(gpt), "data": str(data), "ks": (0,), "progress": False, **options})


def test_cli_prompt_eval_prints_a_table_or_json(gpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from sesame import cli
    import json

    data = write_csv(tmp_path / "dev.csv", animal_rows(12, seed=5))
    train = write_csv(tmp_path / "train.csv", animal_rows(40, seed=6))
    args = ["--no-progress", "prompt-eval", "--model", str(gpt), "--data", str(data), "--train", str(train),
            "--k", "0", "2", "--draws", "2", "--verbalizers", "animal=yes,none=no"]
    assert cli.main(args) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].startswith("majority class") and [line.split()[0] for line in table[4:]] == ["0", "2"]
    assert cli.main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["k"] for r in report["results"]] == [0, 2] and report["verbalizers"] == {"animal": "yes", "none": "no"}
    assert f"{report['results'][1]['mean']:.4f}" == table[5].split()[1]
    assert cli.main(args[:-2] + ["--verbalizers", "animal"]) == 2
    assert "--verbalizers" in capsys.readouterr().err
