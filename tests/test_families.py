"""Every family in the registry pre-trains on tiny data (its loss goes down), and every task and every
fine-tuning recipe starts from its export."""
import json
import random
from dataclasses import asdict

import pytest

import sesame
from sesame.errors import SesameError
from sesame.families import FAMILIES
from sesame.run import read_config
from sesame.tasks import TASKS

from .conftest import sentences
from .test_multiple_choice import choice_rows, write_jsonl

ANIMALS = {"cat", "dog", "bird", "fish"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    for i in range(3):  # three documents, for next-sentence negatives
        (root / f"doc{i}.txt").write_text("\n".join(sentences(150, seed=i)) + "\n")
    for split, seed in (("train", 5), ("dev", 6)):
        rows = ["text,label"] + [f"{s},{'animal' if ANIMALS & set(words(s)) else 'none'}" for s in sentences(40, seed)]
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")
        write_task_files(root, split, seed)
    return root


def words(sentence: str) -> list[str]:
    return sentence.lower()[:-1].split()


def write_task_files(root, split: str, seed: int) -> None:
    """One small file per task kind (see TASK_FILES): the label always says something about animals."""
    texts, others = sentences(24, seed), sentences(24, seed + 50)
    (root / f"{split}-pair.csv").write_text("\n".join(["sentence1,sentence2,label"] + [
        f"{a},{b},{'both' if ANIMALS & set(words(a)) and ANIMALS & set(words(b)) else 'not'}"
        for a, b in zip(texts, others)]) + "\n")
    (root / f"{split}-regress.csv").write_text("\n".join(["text,label"] + [
        f"{t},{sum(w in ANIMALS for w in words(t))}" for t in texts]) + "\n")
    (root / f"{split}-tag.txt").write_text("\n\n".join("\n".join(
        f"{w} {'B-ANI' if w.lower().strip('.') in ANIMALS else 'O'}" for w in t.split()) for t in texts) + "\n")
    rng, paragraphs = random.Random(seed), []
    for i, t in enumerate(texts):
        answer = rng.choice(t[:-1].split())
        paragraphs.append({"context": t, "qas": [{"id": f"{split}{i}", "question": f"Where is {answer.lower()}?",
                                                  "answers": [{"text": answer, "answer_start": t.index(answer)}]}]})
    (root / f"{split}-span_qa.json").write_text(json.dumps({"version": "1.1", "data": [
        {"title": "t", "paragraphs": paragraphs}]}))
    write_jsonl(root / f"{split}-multiple_choice.jsonl", choice_rows(24, seed))
    (root / f"{split}-text2text.csv").write_text("\n".join(["source,target"] + [f"{t},{t}" for t in texts]) + "\n")


TASK_FILES = {"classify": "{split}.csv", "pair": "{split}-pair.csv", "regress": "{split}-regress.csv",
              "tag": "{split}-tag.txt", "span_qa": "{split}-span_qa.json",
              "multiple_choice": "{split}-multiple_choice.jsonl", "text2text": "{split}-text2text.csv"}
RECIPES = {"discriminative+stlr": {"discriminative": 2.6, "schedule": "stlr"},
           "gradual unfreezing": {"gradual_unfreezing": True}, "adapters": {"adapters": 8},
           "features": {"features": True}, "auxiliary lm": {"lm_weight": 0.5}}


PRETRAINED = [name for name, f in FAMILIES.items() if f.objective]  # the others: baselines from scratch, and cove
# cove trains on translation (test_cove.py); t5 and bart (encoder-decoders) fine-tune classify, pair, regress and
# text2text only (tests/test_encoder_decoder_heads.py, test_text2text.py)
BUILT_HERE = [name for name, f in FAMILIES.items() if f.arch not in ("cove", "encoder_decoder")]


@pytest.fixture(scope="module")
def pretrained(data, tmp_path_factory):
    """``pretrained(family)``: a tiny run of the family, made on first use and shared by the tests below (a
    baseline without pre-training: its ``scratch:FAMILY:tiny`` spec)."""
    runs = {}

    def make(family: str):
        if not FAMILIES[family].objective:
            return f"scratch:{family}:tiny"
        if family not in runs:
            run = tmp_path_factory.mktemp(family) / "pre"
            sesame.pretrain([str(data / f"doc{i}.txt") for i in range(3)], str(run), family=family, size="tiny",
                            vocab_size=300, seq_len=32, batch_size=16, max_steps=40, lr=2e-3, warmup=0.1,
                            dropout=0.0, eval_every=40, progress=False)
            runs[family] = run
        return runs[family]
    return make


@pytest.mark.parametrize("family", PRETRAINED)
def test_family_pretrains_and_fine_tunes(family, pretrained, data, tmp_path, one_thread):
    run = pretrained(family)
    config = read_config(run, "--out", ("pretrained",))
    assert config.pretrained.objective == FAMILIES[family].objective
    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if r["split"] == "train"]
    limit = 0.8 if FAMILIES[family].arch == "transformer" else 0.9  # LSTMs learn slower in 40 steps (and AWD's
    # dropouts stay on)
    assert losses[-1] < limit * losses[0], f"{family}: loss {losses[0]:.2f} → {losses[-1]:.2f}"
    if family not in BUILT_HERE:  # t5, bart: their heads read an encoder-decoder for classify, pair and regress
        with pytest.raises(SesameError, match="--task tag's head reads one stack's states"):  # before writing
            sesame.finetune(str(run), str(data / "train-tag.txt"), str(data / "dev-tag.txt"), str(tmp_path / "tag"),
                            task="tag")
        assert not (tmp_path / "tag").exists()
    metrics = sesame.finetune(str(run), str(data / "train.csv"), str(data / "dev.csv"), str(tmp_path / "clf"),
                              epochs=1, batch_size=8, max_length=32, progress=False)
    assert 0.0 <= metrics["accuracy"] <= 1.0


def fine_tune(run, data, out, task: str = "classify", **options) -> dict:
    files = {split: str(data / TASK_FILES[task].format(split=split)) for split in ("train", "dev")}
    return sesame.finetune(str(run), files["train"], files["dev"], str(out), task=task, epochs=2, batch_size=8,
                           max_length=32, lr=1e-3, progress=False, **options)


@pytest.mark.parametrize("task", list(TASK_FILES))
@pytest.mark.parametrize("family", BUILT_HERE)
def test_every_task_starts_from_every_family(family, task, pretrained, data, tmp_path, one_thread):
    assert set(TASK_FILES) == set(TASKS)  # a new task joins this test
    if task == "text2text" and FAMILIES[family].arch != "encoder_decoder":  # text to text needs a decoder of text
        with pytest.raises(SesameError, match="--task text2text needs an encoder-decoder"):
            fine_tune(pretrained(family), data, tmp_path / "tuned", task)
        assert not (tmp_path / "tuned" / "config.json").exists()
        return
    metrics = fine_tune(pretrained(family), data, tmp_path / "tuned", task)
    config = read_config(tmp_path / "tuned", "--model", ("finetuned",))
    assert (config.finetuned.task, config.family) == (task, family)
    assert metrics[TASKS[task].select] == pytest.approx(
        sesame.evaluate(str(tmp_path / "tuned"), str(data / TASK_FILES[task].format(split="dev")))[TASKS[task].select])


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("family", BUILT_HERE)
def test_every_recipe_starts_from_every_family(family, recipe, pretrained, data, tmp_path, one_thread):
    options, fam = RECIPES[recipe], FAMILIES[family]
    stacks = fam.arch in ("transformer", "xlnet")  # Transformer stacks, which adapters and a scalar mix join
    refusal = {"adapters": not stacks and "--adapters/--features: recipes for Transformer",
               "features": not stacks and "--adapters/--features: recipes for Transformer",
               "auxiliary lm": (not fam.causal and "--lm-weight: the auxiliary LM needs a causal backbone") or
               (fam.arch == "recurrent" and not fam.model_options.get("tied") and "embedding width differs")}
    if refusal.get(recipe):
        with pytest.raises(SesameError, match=refusal[recipe]):
            fine_tune(pretrained(family), data, tmp_path / "tuned", **options)
        assert not (tmp_path / "tuned").exists()
        return
    metrics = fine_tune(pretrained(family), data, tmp_path / "tuned", **options)
    config = read_config(tmp_path / "tuned", "--model", ("finetuned",))
    recorded = {**asdict(config.finetuned.recipe), "schedule": config.train["schedule"]}
    assert {k: recorded[k] for k in options} == options
    frozen = "adapters" in options or "features" in options or fam.arch == "elmo"  # ELMo's biLM is read frozen
    assert (metrics["trainable_parameters"] < metrics["parameters"]) == frozen


def test_gpt2_has_the_longer_context_and_pre_layer_norm():
    from sesame.families import backbone_config

    gpt, gpt2 = backbone_config("gpt", "tiny", 100, 0), backbone_config("gpt2", "tiny", 100, 0)
    assert (gpt.max_positions, gpt.norm, gpt2.max_positions, gpt2.norm) == (512, "post", 1024, "pre")
    assert backbone_config("gpt2", "tiny", 100, 0, max_positions=2048).max_positions == 2048


def test_gpt_gpt2_and_albert_use_gelus_tanh_approximation_and_old_runs_keep_theirs():
    """GPT, GPT-2 and ALBERT were trained with 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (transformers' gelu_new),
    BERT with exact GELU; config.json records the activation, so a run written with exact GELU keeps it."""
    import math

    import torch

    from sesame.families import backbone_config
    from sesame.models import build_model

    families = ("gpt", "gpt2", "albert", "xlnet", "bert")
    assert {f: backbone_config(f, "tiny", 100, 0).to_dict()["activation"] for f in families} == {
        "gpt": "gelu_tanh", "gpt2": "gelu_tanh", "albert": "gelu_tanh", "xlnet": "gelu_tanh", "bert": "gelu"}
    x = torch.linspace(-4, 4, 33)
    tanh_form = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    for activation, expected in (("gelu_tanh", tanh_form), ("gelu", torch.nn.functional.gelu(x))):
        model = {**backbone_config("gpt2", "tiny", 100, 0).to_dict(), "activation": activation}
        ffn = build_model(model).feed_forward[0].eval()
        with torch.no_grad():  # f(x) = out(act(inp(x))): identity projections leave the activation
            for linear in (ffn.inp, ffn.out):
                linear.weight.zero_(), linear.bias.zero_()
                linear.weight[: len(x), : len(x)] = torch.eye(len(x))
        got = ffn(torch.nn.functional.pad(x, (0, 128 - len(x)))[None, None])[0, 0, : len(x)]
        assert torch.allclose(got, expected, atol=1e-6) and not torch.allclose(got, tanh_form if activation == "gelu"
                                                                                else torch.nn.functional.gelu(x))
