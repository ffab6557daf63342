"""ULMFiT: AWD-LSTM's variable-length BPTT, and the three-stage pipeline end to end, resumed at any stage."""
import functools
import hashlib
import json
import random
import signal

import pytest
import torch

from sesame import api
from sesame.cli import main
from sesame.errors import SesameError
from sesame.families import DROPOUTS, FAMILIES
from sesame.models.recurrent import Recurrent, RecurrentConfig
from sesame.objectives import build_objective
from sesame.objectives.clm import AwdLM, bptt_length
from sesame.tokenizer import SpecialIds
from sesame.train import Interrupted, Trainer
from sesame.apps.ulmfit import STAGES, UlmfitSpec, classifier_recipe, ulmfit

from .conftest import sentences

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest on a shared CPU

SETTINGS = dict(size="tiny", vocab_size=100, seq_len=16, lm_minutes=None, lm_steps=4, target_epochs=2,
                classifier_epochs=5, batch_size=16, max_length=32, progress=False)
STAGE_NAMES = ["general-domain LM", "fine-tune LM", "classifier: head only", "classifier: unfreeze last 1",
               "classifier: unfreeze last 2", "classifier: all"]


def draws(seq_len: int, n: int) -> torch.Tensor:
    return torch.tensor([bptt_length(seq_len, torch.Generator().manual_seed(i)) for i in range(n)])


def test_lengths_are_near_seq_len_95_percent_of_the_time_and_near_half_otherwise():
    lengths = draws(70, 4000).float()
    full = lengths > 52.5  # halfway between the two bases: N(70, 5) and N(35, 5) never meet there in practice
    assert 0.935 < full.float().mean() < 0.965
    assert 66 < lengths[full].mean() < 69  # N(70, 5) clipped at 70
    assert abs(lengths[~full].mean() - 35) < 1.5 and lengths[~full].std() < 7
    assert lengths.max() == 70 and (lengths == 70).float().mean() > 0.4
    assert draws(8, 500).min() >= 5 and draws(8, 500).max() == 8  # clipped to [5, seq_len]


def awd_lm(vocab: int = 30) -> AwdLM:
    torch.manual_seed(0)
    backbone = Recurrent(RecurrentConfig(vocab_size=vocab, embedding_size=16, hidden_size=24, layers=2, tied=True))
    return AwdLM(backbone, SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4))


def test_positions_past_a_rows_length_carry_no_target_and_no_loss():
    obj = awd_lm()
    windows = torch.randint(5, 30, (6, 21))

    def generators():
        return [torch.Generator().manual_seed(100 + i) for i in range(6)]

    lengths = [bptt_length(20, g) for g in generators()]
    batch = obj.make_batch(windows, generators())
    assert batch["ids"].shape == (6, max(lengths))  # cropped to the longest draw
    assert batch["targets"].numel() == sum(lengths)  # the trainer averages over these
    by_row = sum(obj({"ids": windows[i:i + 1, :n], "targets": windows[i:i + 1, 1:n + 1]})
                 for i, n in enumerate(lengths))
    assert torch.allclose(obj(batch), by_row, atol=1e-4)
    changed = windows.clone()
    for i, n in enumerate(lengths):
        changed[i, n + 1:] = 7  # tokens past a row's length: neither inputs that count nor targets
    assert torch.allclose(obj(obj.make_batch(changed, generators())), obj(batch), atol=1e-5)
    alone = obj.make_batch(windows[2:3], generators()[2:3])  # a row's length is its own generator's draw
    assert alone["targets"].numel() == lengths[2]
    obj.eval()  # evaluation scores whole windows, as the plain causal LM does
    assert obj.make_batch(windows, generators())["targets"].shape == (6, 20)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A general corpus and a labeled task (does the text name an animal?)."""
    root = tmp_path_factory.mktemp("ulmfit-data")
    (root / "corpus.txt").write_text("\n".join(sentences(400)) + "\n")
    animals = {"cat", "dog", "bird", "fish"}
    for split, seed, n in (("train", 10, 120), ("dev", 11, 40)):
        rows = ["text,label"] + [f'"{s}",{"animal" if animals & set(s.lower()[:-1].split()) else "none"}'
                                 for s in sentences(n, seed)]
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return root


def run_pipeline(data, out, **extra):
    return ulmfit(UlmfitSpec(train=str(data / "train.csv"), dev=str(data / "dev.csv"), out=str(out),
                             corpus=[str(data / "corpus.txt")], **{**SETTINGS, **extra}))


def without_time(rows):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


@pytest.fixture(scope="module")
def done(data, tmp_path_factory):
    """The uninterrupted pipeline, on one thread as the tests that compare with it (a module fixture is set up
    before the function-scoped ``one_thread``; sums over two threads differ in the last bits)."""
    out = tmp_path_factory.mktemp("ulmfit") / "out"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return out, run_pipeline(data, out)
    finally:
        torch.set_num_threads(threads)


def test_the_pipeline_writes_the_table_of_its_stages_and_unfreezing_epochs(done):
    out, result = done
    rows = result["rows"]
    assert [r["stage"] for r in rows] == STAGE_NAMES
    assert [r["epochs"] for r in rows[1:]] == [2, 1, 2, 3, 5]
    assert all(r["dev_accuracy"] is None for r in rows[:2]) and all(0 <= r["dev_accuracy"] <= 1 for r in rows[2:])
    assert all(r["dev_loss"] > 0 and r["train_loss"] > 0 for r in rows)
    seconds = [r["seconds"] for r in rows[2:]]
    assert seconds == sorted(seconds)  # the classifier's rows are successive epochs of one run
    assert all((out / stage / "compare.json").is_file() for stage in STAGES)
    assert json.loads((out / "results.json").read_text())["rows"] == rows
    table = (out / "results.md").read_text()
    assert "| stage | epochs | time | train loss | dev loss | dev accuracy |" in table
    assert "| fine-tune LM | 2 |" in table and table.count("n/a") == 2
    config = json.loads((out / "target-lm" / "config.json").read_text())
    assert config["objective"] == "awd_lm" and config["discriminative"] == 2.6
    assert config["train"]["schedule"] == "stlr" and config["train"]["warmup"] == 0.1
    row = FAMILIES["ulmfit"].model_options  # stage (b) at fastai's drop_mult 0.3 (the general LM at the row's)
    assert {k: config["model"][k] for k in DROPOUTS} == pytest.approx({k: 0.3 * row[k] for k in DROPOUTS})
    general = json.loads((out / "general-lm" / "config.json").read_text())
    assert {k: general["model"][k] for k in DROPOUTS} == {k: row[k] for k in DROPOUTS}
    recipe = json.loads((out / "classifier" / "config.json").read_text())
    assert recipe["pooling"] == "concat" and recipe["recipe"]["gradual_unfreezing"]
    assert recipe["recipe"]["discriminative"] == 2.6 and recipe["train"]["schedule"] == "stlr"


def snapshot(out):
    return {s: hashlib.sha256((out / s / "compare.json").read_bytes()).hexdigest()
            for s in STAGES if (out / s / "compare.json").is_file()}


@pytest.mark.parametrize("stage", STAGES)
def test_an_interruption_at_any_stage_resumes_to_the_uninterrupted_result(stage, done, data, tmp_path, monkeypatch):
    out = tmp_path / "out"
    step = Trainer._train_step

    def ctrl_c_at_step_two(self, wrapped):
        result = step(self, wrapped)
        if self.run.name == stage and self.step == 2:
            self._request_stop(signal.SIGINT, None)
        return result

    monkeypatch.setattr(Trainer, "_train_step", ctrl_c_at_step_two)
    with pytest.raises(Interrupted, match="run the same command again"):
        run_pipeline(data, out)
    monkeypatch.setattr(Trainer, "_train_step", step)
    finished = snapshot(out)
    assert list(finished) == list(STAGES[:STAGES.index(stage)])

    calls = []
    for name in ("pretrain", "finetune"):
        real = getattr(api, name)

        @functools.wraps(real)
        def spy(*a, _real=real, **k):
            calls.append((k["out"], k["resume"]))
            return _real(*a, **k)
        monkeypatch.setattr(api, name, spy)
    result = run_pipeline(data, out)
    ran = [(s, s == stage) for s in STAGES[STAGES.index(stage):]]
    assert [(p.split("/")[-1], resume) for p, resume in calls] == ran  # finished stages are not run again
    assert {s: h for s, h in snapshot(out).items() if s in finished} == finished
    assert without_time(result["rows"]) == without_time(done[1]["rows"])


def test_the_command_starts_from_a_pretrained_run_and_prints_the_table(done, data, tmp_path, capsys):
    out, _ = done
    code = main(["--no-progress", "ulmfit", "--train", str(data / "train.csv"), "--dev", str(data / "dev.csv"),
                 "--lm", str(out / "general-lm"), "--out", str(tmp_path / "from-lm"), "--seq-len", "16",
                 "--target-epochs", "1", "--batch-size", "16", "--max-length", "32"])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("| stage | epochs | time | train loss | dev loss | dev accuracy |")
    assert "| general-domain LM |" in printed and "| classifier: all | 5 |" in printed
    assert not (tmp_path / "from-lm" / "general-lm").exists()


@pytest.mark.parametrize("extra, message", [
    ({"lm": "x"}, "--corpus or --lm"),
    ({"classifier_epochs": 4}, "--classifier-epochs 4: use at least 5"),
    ({"target_epochs": 0}, "--target-epochs 0: must be positive"),
    ({"text_column": "tweet"}, "tweet"),
])
def test_bad_input_is_a_sesame_error_naming_the_flag(extra, message, data, tmp_path):
    with pytest.raises(SesameError, match=message):
        run_pipeline(data, tmp_path / "out", **extra)
    assert not (tmp_path / "out").exists()


def test_the_lm_must_be_a_pretrained_ulmfit_run(done, data, tmp_path):
    out, _ = done
    with pytest.raises(SesameError, match="--lm .*finetuned"):
        ulmfit(UlmfitSpec(train=str(data / "train.csv"), dev=str(data / "dev.csv"), out=str(tmp_path / "o"),
                          lm=str(out / "classifier")))


def test_the_family_pretrains_with_variable_length_bptt(done):
    out, _ = done
    config = json.loads((out / "general-lm" / "config.json").read_text())
    assert config["objective"] == "awd_lm"
    from sesame.run import build_backbone, load_tokenizer, read_config
    obj = build_objective(config["objective"], build_backbone(read_config(out / "general-lm", "--lm")),
                          load_tokenizer(out / "general-lm"))
    assert isinstance(obj, AwdLM)


CUES = {"good": "pos", "great": "pos", "bad": "neg", "awful": "neg", "maybe": "mid", "perhaps": "mid"}


def cue_task(path, n: int, seed: int) -> list[str]:
    """``n`` texts of 3 to 10 random filler words (100 of them) with one cue word of :data:`CUES` inserted at a
    random place, which alone decides the label (three classes, about a third each); returns the labels."""
    rng = random.Random(seed)
    rows, labels = ["text,label"], []
    for _ in range(n):
        cue = rng.choice(list(CUES))
        words = [f"w{rng.randrange(100)}" for _ in range(rng.randint(3, 10))]
        words.insert(rng.randrange(len(words) + 1), cue)
        rows.append(" ".join(words) + "," + CUES[cue])
        labels.append(CUES[cue])
    path.write_text("\n".join(rows) + "\n")
    return labels


def test_the_full_classifier_recipe_from_scratch_learns_a_word_cue_task(tmp_path):
    """A collapse check (issue 16): ULMFiT's whole classifier recipe (concat pooling, gradual unfreezing, ÷2.6
    rates, STLR, the family's dropouts scaled as fastai's classifier scales them) on a random AWD-LSTM must learn
    which word decides the label, as fastai's recipe does on the same data (benchmarks/ulmfit_vs_fastai.py
    --smoke). On the recipe as it was (all five dropouts at the LM's rates, the output dropout applied twice)
    it stayed at the majority class."""
    cue_task(tmp_path / "train.csv", 2000, seed=1)
    dev = cue_task(tmp_path / "dev.csv", 200, seed=2)
    majority = max(dev.count(label) for label in set(dev)) / len(dev)
    assert majority < 0.4
    metrics = api.finetune("scratch:ulmfit:tiny", str(tmp_path / "train.csv"), str(tmp_path / "dev.csv"),
                           str(tmp_path / "clf"), progress=False, batch_size=32, max_length=16, seed=0,
                           **classifier_recipe(epochs=5, lr=0.01, dropout=0.4))
    assert metrics["accuracy"] > majority + 0.3, metrics
