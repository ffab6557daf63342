"""Text-to-text end to end on tiny models and files made here: `finetune --task text2text` from a pre-trained t5 or
bart run (dev metrics of generated text after each epoch, the best kept), `evaluate` and `predict` of the fine-tuned
run, `--resume` after a kill giving the uninterrupted model, `--from scratch:t5:tiny`, a `--mixture` of two real tasks
(Multi30k and SST-2 slices: per-task dev metrics, exact resume, changed mixing refused), and `sesame generate` from a
t5 run (pre-trained and fine-tuned) giving generate_seq2seq's output."""
import json
from pathlib import Path

import pytest

from sesame.generation import load_generator
from sesame.cli import main
from sesame.decoding import GenerationConfig
from sesame.run import load_backbone, load_tokenizer, read_config
from sesame.seq2seq import generate_seq2seq
from sesame.tasks import make_task

from .conftest import documents, refused, sentences, shared_data
from .test_interrupted import Killed, kill_at_step, logged, same_weights

pytestmark = pytest.mark.usefixtures("one_thread")
Q = ["--no-progress"]
ANIMALS = ("cat", "dog", "bird", "fish")
TOKENIZERS = {"t5": ["--kind", "unigram", "--sentinels", "100"], "bart": ["--kind", "bpe"]}


def write_copy_task(folder: Path) -> tuple[Path, Path]:
    """train.csv (24 rows) and dev.csv (6): the target is the first animal the source names, or "tree" (one word
    of the pre-training text: a few steps teach a tiny model to write it, so the outputs compared are not all
    empty)."""
    paths = []
    for split, n, seed in (("train", 24, 1), ("dev", 6, 2)):
        rows = ["source,target"]
        for s in sentences(n, seed):
            animal = next((w for w in s.lower().rstrip(".").split() if w in ANIMALS), None)
            rows.append(f'"{s}","{animal or "tree"}"')
        paths.append(folder / f"{split}.csv")
        paths[-1].write_text("\n".join(rows) + "\n", encoding="utf-8")
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> dict[str, Path]:
    """A t5 and a bart run pre-trained for two steps on a tiny corpus, with their tokenizers."""
    root = tmp_path_factory.mktemp("pretrained")
    corpus = root / "corpus.txt"
    corpus.write_text(documents(sentences(200)))
    runs = {}
    for family, kind in TOKENIZERS.items():
        assert main(Q + ["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "300", *kind,
                         "--out", str(root / f"{family}.json")]) == 0
        runs[family] = root / family
        assert main(Q + ["pretrain", "--family", family, "--size", "tiny", "--corpus", str(corpus), "--tokenizer",
                         str(root / f"{family}.json"), "--seq-len", "32", "--batch-size", "8", "--max-steps", "2",
                         "--out", str(runs[family])]) == 0
    return runs


def finetune_argv(base: str, train: Path, dev: Path, out: Path, *, epochs: int = 2, options: tuple = ()
                  ) -> list[str]:
    return Q + ["finetune", "--from", base, "--task", "text2text", "--train", str(train), "--dev", str(dev),
                "--out", str(out), "--epochs", str(epochs), "--batch-size", "8", "--max-length", "24",
                "--task-option", "max_target_length=6", *[x for o in options for x in ("--task-option", o)]]


def dev_records(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").open()) if r["split"] == "dev"]


@pytest.mark.parametrize("family, options", [("t5", ()), ("bart", ("beams=2",))])
def test_finetune_evaluate_predict(family, options, pretrained, tmp_path, capsys):
    train, dev = write_copy_task(tmp_path)
    run = tmp_path / "ft"
    argv = finetune_argv(str(pretrained[family]), train, dev, run, epochs=8, options=options)
    assert main(argv + ["--lr", "0.003", "--select", "exact", "--json"]) == 0
    kept = json.loads(capsys.readouterr().out)
    config = json.loads((run / "config.json").read_text())
    assert config["task"] == "text2text" and config["family"] == family
    assert config["task_options"]["beams"] == (2 if "beams=2" in options else 1)  # evaluate and predict reuse it
    # BART's inputs start with <s> without --task-option bos (its family row's source_start), T5's do not
    assert config["task_options"]["bos"] is (family == "bart")
    tok = load_tokenizer(run)
    [feature] = make_task("text2text", config["task_options"]).features([{"source": "a cat", "target": "cat"}], tok,
                                                                         24, [], False)
    assert (feature["ids"][0] == tok.specials.cls) is (family == "bart") and feature["ids"][-1] == tok.specials.sep
    records = dev_records(run)
    assert [r["step"] for r in records] == list(range(3, 25, 3))  # 24 examples, batches of 8: dev after each epoch
    assert all({"bleu", "exact"} <= r.keys() for r in records)
    assert kept["exact"] == max(r["exact"] for r in records) > 0  # the best epoch's weights are kept
    assert main(["evaluate", "--model", str(run), "--data", str(dev), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["bleu"], report["exact"]) == (kept["bleu"], kept["exact"])  # the kept weights, decoded alike
    assert main(["predict", "--model", str(run), "--input", str(dev), "--output", str(tmp_path / "p.jsonl")]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    written = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [p["output"] for p in printed] == [w["output"] for w in written] and len(written) == 6
    golds = [line.split('","')[1].rstrip('"') for line in dev.read_text().splitlines()[1:]]
    assert sum(w["output"] == g for w, g in zip(written, golds)) / 6 == report["exact"]
    source = next(p for p in printed if p["output"])["source"]  # an input with a non-empty output
    assert main(Q + ["generate", "--model", str(run), "--prompt", source, "--json", "--max-new-tokens", "6",
                     *(["--beams", "2"] if "beams=2" in options else [])]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == next(p["output"] for p in printed if p["source"] == source)


def test_max_length_past_max_positions_is_t5s_but_not_barts(pretrained, tmp_path, capsys):
    """T5's relative positions read a source longer than its max_positions (512): fine-tuning on one works; BART's
    learned positions cap --max-length and max_target_length at theirs (1024), refused before anything is written."""
    train, dev = write_copy_task(tmp_path)
    long = " ".join(sentences(60, 3))
    train.write_text(train.read_text() + f'"{long}","tree"\n', encoding="utf-8")
    t5 = pretrained["t5"]
    positions = read_config(t5, "--model").model.max_positions
    assert len(load_tokenizer(t5).encode([long], special=False)[0]) > positions + 100
    argv = finetune_argv(str(t5), train, dev, tmp_path / "t5", epochs=1, options=("max_target_length=2",))
    assert main(argv + ["--max-length", str(positions + 100), "--batch-size", "25", "--json"]) == 0
    assert read_config(tmp_path / "t5", "--model").max_length == positions + 100
    bart = read_config(pretrained["bart"], "--model").model.max_positions
    refused(finetune_argv(str(pretrained["bart"]), train, dev, tmp_path / "bart") + ["--max-length", str(bart + 1)],
            capsys, tmp_path, f"--max-length {bart + 1} exceeds the model's {bart} positions")
    refused(finetune_argv(str(pretrained["bart"]), train, dev, tmp_path / "bart",
                          options=(f"max_target_length={bart + 1}",)),  # its decoder's positions too
            capsys, tmp_path, f"--task-option max_target_length={bart + 1} exceeds the model's {bart} positions")


def test_resume_after_a_kill_gives_the_uninterrupted_run(tmp_path, monkeypatch):
    """From scratch (a tokenizer trained on the training texts): killed in the second epoch, after the first
    epoch's checkpoint and dev scores, and resumed, it ends with the same weights and the same log."""
    train, dev = write_copy_task(tmp_path)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(finetune_argv("scratch:t5:tiny", train, dev, straight)) == 0
    kill_at_step(monkeypatch, 4)
    with pytest.raises(Killed):
        main(finetune_argv("scratch:t5:tiny", train, dev, killed))
    monkeypatch.undo()
    assert [r["step"] for r in dev_records(killed)] == [3]
    assert main(finetune_argv("scratch:t5:tiny", train, dev, killed) + ["--resume"]) == 0
    assert same_weights(killed, straight) and logged(killed) == logged(straight)
    assert [r["bleu"] for r in dev_records(killed)] == [r["bleu"] for r in dev_records(straight)]


def write_mixture(folder: Path) -> Path:
    """mix.json over slices of two real tasks: Multi30k en→de (16 training pairs, 4 dev) and SST-2 as text (16, 4)."""
    data = shared_data()
    for task, files in (("mt", [(f"{split}.{lang}", data / "multi30k" / f"{source}.{lang}", n)
                                for split, source, n in (("train", "train", 16), ("val", "val", 4))
                                for lang in ("en", "de")]),
                        ("sst2", [(f"{split}.tsv", data / "glue" / "SST-2" / f"{split}.tsv", n + 1)  # + header
                                  for split, n in (("train", 16), ("dev", 4))])):
        (folder / task).mkdir()
        for name, source, n in files:
            lines = source.read_text(encoding="utf-8").splitlines()[:n]
            (folder / task / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    mixture = {"mt": {"train": "mt/train.en", "dev": "mt/val.en", "languages": "en-de",
                      "prefix": "translate English to German:"},
               "sst2": {"train": "sst2/train.tsv", "dev": "sst2/dev.tsv", "cast": "classify", "prefix": "sst2",
                        "label_words": {"0": "negative", "1": "positive"}}}
    (folder / "mix.json").write_text(json.dumps(mixture), encoding="utf-8")
    return folder / "mix.json"


def test_a_mixture_of_two_tasks_reports_each_resumes_exactly_and_refuses_changed_mixing(tmp_path, monkeypatch,
                                                                                         capsys):
    """T5's multi-task fine-tuning from scratch over Multi30k and SST-2 slices: config.json records the mixture (each
    task's files, options and labels) and the mixing options; dev reports each task's metrics and their mean on a
    0–100 scale, which picks the kept weights; killed in the second epoch and resumed, it ends as the uninterrupted
    run; --resume with another cap, or with a task's options changed in the file, is refused before anything is
    written."""
    mixture = write_mixture(tmp_path)
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    def argv(out: Path) -> list[str]:
        return Q + ["finetune", "--from", "scratch:t5:tiny", "--task", "text2text", "--mixture", str(mixture),
                    "--out", str(out), "--epochs", "2", "--batch-size", "8", "--max-length", "24",
                    "--task-option", "max_target_length=5", "--mixing-temperature", "2"]

    assert main(argv(straight)) == 0
    config = json.loads((straight / "config.json").read_text())
    assert config["mixture"]["sst2"]["labels"] == ["negative", "positive"] and not (straight / "labels.json").exists()
    assert config["mixture"]["mt"]["options"] == {"languages": "en-de", "prefix": "translate English to German:"}
    assert config["mixture"]["mt"]["train"] == str(tmp_path / "mt" / "train.en")
    assert (config["setup"]["mixing_cap"], config["setup"]["mixing_temperature"]) == (2 ** 19, 2.0)
    assert config["select"] == "mean" and config["task_options"]["max_target_length"] == 5
    assert set(config["task_options"]) == {"max_target_length", "bos", "beams", "length_penalty"}  # the shared ones
    records = dev_records(straight)
    assert [r["step"] for r in records] == [4, 8]  # 32 examples in batches of 8: an epoch is 4 steps
    for r in records:
        assert r["mean"] == pytest.approx((r["mt_bleu"] + 100 * r["sst2_accuracy"]) / 2)
        assert {"mt_exact", "sst2_macro_f1", "sst2_invalid"} <= r.keys()
    kill_at_step(monkeypatch, 6)
    with pytest.raises(Killed):
        main(argv(killed))
    monkeypatch.undo()
    refused(argv(killed) + ["--resume", "--mixing-cap", "100"], capsys, tmp_path, "--mixing-cap 100", str(2 ** 19))
    kept = mixture.read_text()
    mixture.write_text(kept.replace('"prefix": "sst2"', '"prefix": "sentiment"'))
    refused(argv(killed) + ["--resume"], capsys, tmp_path, f"--mixture {mixture}: task 'sst2'", "'prefix': 'sentiment'")
    mixture.write_text(kept)
    assert main(argv(killed) + ["--resume"]) == 0
    assert same_weights(killed, straight) and logged(killed) == logged(straight)
    assert [{k: v for k, v in r.items() if k != "elapsed"} for r in dev_records(killed)] == \
        [{k: v for k, v in r.items() if k != "elapsed"} for r in records]


@pytest.mark.parametrize("flags, config", [([], GenerationConfig(max_new_tokens=8)),
                                           (["--beams", "3", "--length-penalty", "0.5"],
                                            GenerationConfig(max_new_tokens=8, beams=3, length_penalty=0.5)),
                                           (["--sample", "--seed", "3", "--top-k", "5"],
                                            GenerationConfig(max_new_tokens=8, sample=True, seed=3, top_k=5))])
def test_generate_from_a_pretrained_t5_run(flags, config, pretrained, capsys):
    run = pretrained["t5"]
    sources = ["the cat sleeps", "a bird sings over the old river"]
    argv = ["generate", "--model", str(run), "--max-new-tokens", "8", "--json", *flags]
    assert main(argv + [x for s in sources for x in ("--prompt", s)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    tok = load_tokenizer(run)
    ids = [e + [tok.specials.sep] for e in tok.encode(sources, special=False)]  # T5 reads "pieces </s>"
    hyps = generate_seq2seq(load_backbone(run), ids, config, eos=tok.specials.sep)
    assert [r["text"] for r in records] == [tok.decode(h.tokens) for h in hyps]
    assert [r["prompt"] for r in records] == sources
    assert [r["finish"] for r in records] == [h.finish for h in hyps]
    assert main(["generate", "--model", str(run), "--prompt", sources[0], "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out == records[0]["text"] + "\n"  # the output alone, not after the source


def test_generate_reads_bart_sources_with_bos_and_refuses_tldr(pretrained, capsys):
    model = load_generator(str(pretrained["bart"]))
    tok = model.tokenizer
    assert model.encode(["a cat"]) == [[tok.specials.cls, *tok.encode(["a cat"], special=False)[0], tok.specials.sep]]
    t5 = load_generator(str(pretrained["t5"]))
    assert t5.encode(["a cat"]) == [[*t5.tokenizer.encode(["a cat"], special=False)[0], t5.tokenizer.specials.sep]]
    assert main(["generate", "--model", str(pretrained["bart"]), "--prompt", "a cat", "--tldr"]) == 2
    assert "--tldr" in capsys.readouterr().err


@pytest.mark.parametrize("model_type", ["t5", "bart"])
def test_generate_from_a_transformers_directory(model_type, tmp_path, capsys):
    """A T5 or BART directory is imported and reads its sources as its own tokenizer makes them (BART: <s> first);
    the output is generate_seq2seq's on those ids (whose parity with transformers is tests/test_seq2seq.py's)."""
    import transformers

    from .test_encoder_decoder_interop import checkpoint

    checkpoint(model_type, tmp_path / "hf")
    source = "the cat sleeps near the river"
    ids = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(source)["input_ids"]
    model = load_generator(str(tmp_path / "hf"))
    assert model.encode([source]) == [ids]
    assert main(Q + ["generate", "--model", str(tmp_path / "hf"), "--prompt", source, "--max-new-tokens", "6",
                     "--beams", "2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    hyp = generate_seq2seq(model.backbone, [ids], GenerationConfig(max_new_tokens=6, beams=2),
                           eos=model.tokenizer.specials.sep)[0]
    assert (record["text"], record["finish"]) == (model.tokenizer.decode(hyp.tokens), hyp.finish)
