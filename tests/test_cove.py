"""CoVe's MT-LSTM (McCann et al. 2017): attention, padding, decoding, a copy task, files, resume, GloVe."""
from __future__ import annotations

import json
import math
import random
import shutil

import pytest
import torch

from sesame.cli import main
from sesame.errors import SesameError
from sesame.models.cove import CoveConfig, MTLSTM
from sesame.objectives import build_objective
from sesame.tokenizer import train_tokenizer
from sesame.train.checkpoint import load_weights, read_json
from sesame.decoding import GenerationConfig, beam_search, greedy
from sesame.metrics import bleu
from sesame.apps.cove import CoveSpec, Translator, collate, read_parallel, train_cove

WORDS = "alpha beta gamma delta eps zeta eta theta".split()


def tiny_model(seed: int = 0) -> MTLSTM:
    torch.manual_seed(seed)
    return MTLSTM(CoveConfig(vocab_size=20, target_vocab_size=12, embedding_size=8, hidden_size=6, dropout=0.0)).eval()


def parallel(tmp_path, n_train: int = 1000, n_valid: int = 60) -> dict:
    """A copy task: each target line is its source line."""
    rng = random.Random(0)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        lines = "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) + "\n" for _ in range(n))
        for side in ("src", "tgt"):
            paths[f"{split}_{side}"] = tmp_path / f"{split}.{side}"
            paths[f"{split}_{side}"].write_text(lines)
    return paths


def files(paths: dict) -> dict:
    """CoveSpec's four file fields from :func:`parallel`'s paths."""
    return {name: str(path) for name, path in paths.items()}


def test_attention_sums_to_one_over_real_source_positions():
    model = tiny_model()
    ids = torch.tensor([[2, 7, 8, 9, 3], [2, 5, 3, 0, 0]])
    padding = ids != 0
    state = model.start(ids, padding)
    for _ in range(3):
        _, state, alpha = model.attention_step(torch.tensor([2, 2]), state)
        assert torch.allclose(alpha.sum(-1), torch.ones(2))
        assert (alpha[~padding] == 0).all() and (alpha[padding] > 0).all()


def test_padding_does_not_change_a_rows_encoder_outputs():
    model = tiny_model()
    short = torch.tensor([[2, 5, 6, 3]])
    batch = torch.tensor([[2, 5, 6, 3, 0, 0], [2, 7, 8, 9, 10, 3]])
    alone = model.features(short, short != 0)
    together = model.features(batch, batch != 0)
    assert together.shape[-1] == model.config.feature_width == 12
    assert torch.allclose(alone[0], together[0, :4], atol=1e-6)
    assert torch.equal(model(batch, padding=batch != 0), together)  # the backbone contract
    assert len(model.layer_modules()) == 3 and model.embed.tokens.num_embeddings == 20


def test_translation_objective_is_the_teacher_forced_cross_entropy_of_the_decoder_steps(tmp_path, capsys):
    model = tiny_model(2)
    objective = build_objective("translation", model, train_tokenizer(WORDS * 3, "word", 100))
    assert all(k.startswith("backbone.") for k in objective.state_dict())  # a run's weight names
    source, target = [[2, 7, 8, 3], [2, 5, 3]], [[2, 4, 9, 6, 3], [2, 11, 3]]
    batch = collate(source, target, 0, 0)
    expected = 0.0
    with torch.no_grad():
        state = model.start(batch["ids"], batch["padding"])
        for t in range(batch["target"].shape[1] - 1):
            log_probs, state = model.step(batch["target"][:, t], state)
            real = batch["target_padding"][:, t + 1]
            expected -= float(log_probs[real].gather(1, batch["target"][real, t + 1, None]).sum())
    assert objective(batch).item() == pytest.approx(expected, rel=1e-5)
    (tmp_path / "corpus.txt").write_text(" ".join(WORDS) + "\n")
    assert main(["pretrain", "--corpus", str(tmp_path / "corpus.txt"), "--out", str(tmp_path / "run"), "--family",
                 "bert", "--size", "tiny", "--objective", "translation", "--vocab-size", "100"]) == 2
    assert "sesame cove" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_beam_of_one_is_greedy():
    model = tiny_model(1)
    ids = torch.randint(5, 20, (6, 7))
    state = model.start(ids, ids != 0)
    start = torch.full((6,), 2)
    greedy_hyps = greedy(model.step, state, start, eos=3, max_len=9)
    beam_hyps = beam_search(model.step, state, start, GenerationConfig(max_new_tokens=9, beams=1), eos=3)
    assert [h.tokens for h in beam_hyps] == [h.tokens for h in greedy_hyps]
    assert all(math.isclose(b.log_prob, g.log_prob, rel_tol=1e-5) and b.length == g.length
               for b, g in zip(beam_hyps, greedy_hyps))


def test_learns_to_copy_and_translate_reports_bleu(tmp_path, one_thread, capsys):
    p = parallel(tmp_path)
    out = tmp_path / "run"
    metrics = train_cove(CoveSpec(**files(p), out=str(out), size="tiny", dropout=0.0, progress=False,
                                  training=dict(max_steps=250, eval_every=250, batch_size=32, lr=1e-2)))
    assert metrics["bleu"] > 90
    config = read_json(out / "config.json")
    assert (config["kind"], config["family"], config["model"]["arch"]) == ("pretrained", "cove", "cove")
    assert all(k.startswith("backbone.") for k in load_weights(out / "model.safetensors"))
    sources = p["valid_src"].read_text().splitlines()
    translations = Translator(out).translate(sources, beam=3)
    assert sum(t == s for t, s in zip(translations, sources)) / len(sources) > 0.9
    assert main(["--no-progress", "translate", "--model", str(out), "--input", str(p["valid_src"]), "--reference",
                 str(p["valid_tgt"]), "--output", str(tmp_path / "out.txt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bleu"] > 90
    assert len((tmp_path / "out.txt").read_text().splitlines()) == len(sources)


def test_bleu_is_case_insensitive_on_joined_words():
    assert bleu(["ein mann , der läuft ."], ["Ein Mann, der läuft."]) == pytest.approx(100.0)


def test_file_errors_name_file_and_line(tmp_path):
    a, b = tmp_path / "a.en", tmp_path / "b.de"
    a.write_text("one\ntwo\n")
    b.write_text("eins\n")
    with pytest.raises(SesameError, match=r"--train-tgt .*b\.de: 1 lines, but --train-src .*a\.en has 2"):
        read_parallel(a, b, "--train-src", "--train-tgt")
    b.write_text("eins\n\n")
    with pytest.raises(SesameError, match=r"b\.de:2: blank line"):
        read_parallel(a, b, "--train-src", "--train-tgt")
    b.write_bytes(b"eins\nzw\xffei\n")
    with pytest.raises(SesameError, match=r"b\.de:2: not valid UTF-8"):
        read_parallel(a, b, "--train-src", "--train-tgt")
    assert main(["cove", "--train-src", str(a), "--train-tgt", str(tmp_path / "none.de"), "--valid-src", str(a),
                 "--valid-tgt", str(a), "--out", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    assert not (tmp_path / "run").exists()


def test_resume_continues_the_run(tmp_path, one_thread):
    p = parallel(tmp_path, 200, 10)
    options = dict(files(p), out=str(tmp_path / "run"), size="tiny", progress=False)
    training = dict(batch_size=16, eval_every=2, save_every=2)
    train_cove(CoveSpec(**options, training=dict(training, max_steps=4)))
    first = load_weights(tmp_path / "run" / "checkpoint" / "model.safetensors")
    with pytest.raises(SesameError, match="--resume"):
        train_cove(CoveSpec(**options, training=dict(training, max_steps=4)))
    for contradiction, message in (({"size": "mini"}, "--size mini: the run .* was made with tiny"),
                                   ({"dropout": 0.5}, "--dropout 0.5: the run .* was made with 0.2"),
                                   ({"train_src": str(p["valid_src"])}, "--train-src .*: the run .* was made with")):
        with pytest.raises(SesameError, match=message):  # --resume changes only the budget
            train_cove(CoveSpec(**{**options, **contradiction}, training=dict(training, max_steps=8), resume=True))
    train_cove(CoveSpec(**options, training=dict(training, max_steps=8), resume=True))
    assert read_json(tmp_path / "run" / "checkpoint" / "trainer_state.json")["step"] == 8
    later = load_weights(tmp_path / "run" / "checkpoint" / "model.safetensors")
    assert not torch.equal(first["backbone.out.weight"], later["backbone.out.weight"])
    dev_steps = [r["step"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
                 if r["split"] == "dev"]
    assert dev_steps == [2, 4, 6, 8]


def test_a_run_killed_before_its_first_checkpoint_resumes_from_step_0(tmp_path, one_thread):
    """With config.json and tokenizers but no checkpoint (a kill before the first save), --resume starts the run
    again from its initial weights, as an uninterrupted run would, instead of refusing it."""
    p = parallel(tmp_path, 200, 10)
    training = dict(batch_size=16, eval_every=2, save_every=2, max_steps=4)
    for name in ("straight", "killed"):
        train_cove(CoveSpec(**files(p), out=str(tmp_path / name), size="tiny", progress=False, training=training))
    shutil.rmtree(tmp_path / "killed" / "checkpoint")
    (tmp_path / "killed" / "model.safetensors").unlink()
    (tmp_path / "killed" / "metrics.jsonl").unlink()
    train_cove(CoveSpec(**files(p), out=str(tmp_path / "killed"), size="tiny", progress=False, training=training,
                        resume=True))
    straight, resumed = (load_weights(tmp_path / name / "model.safetensors") for name in ("straight", "killed"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_vectors_initialise_a_fixed_source_embedding(tmp_path, one_thread):
    p = parallel(tmp_path, 200, 10)
    glove = tmp_path / "glove.txt"
    glove.write_text("alpha 1 2 3 4\nbeta -1 0.5 0 2\n")
    metrics = train_cove(CoveSpec(**files(p), out=str(tmp_path / "run"), size="tiny", vectors=str(glove),
                                  progress=False, training=dict(max_steps=3, batch_size=16)))
    assert metrics["vector_coverage"] == pytest.approx(2 / len(WORDS))
    translator = Translator(tmp_path / "run")
    embedding = translator.model.embed.tokens.weight
    assert embedding.shape[1] == 4 and not embedding.requires_grad
    alpha = translator.source.backend.token_to_id("alpha")
    assert torch.equal(embedding[alpha], torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_a_classifier_reads_glove_and_cove(tmp_path, one_thread):
    """Fine-tuning from a CoVe run builds the BiLSTM task model over [GloVe(x); CoVe(x)] (McCann et al. 2017,
    §4): its own embedding starts as the MT-LSTM's word vectors and the encoder stays frozen."""
    import sesame

    p = parallel(tmp_path, 200, 10)
    train_cove(CoveSpec(**files(p), out=str(tmp_path / "cove"), size="tiny", progress=False,
                        training=dict(max_steps=3, batch_size=16)))
    rows = ["text,label"] + [f"{' '.join(WORDS[i % 3:][:3])},{'a' if i % 2 else 'b'}" for i in range(24)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    result = sesame.finetune(str(tmp_path / "cove"), str(tmp_path / "train.csv"), str(tmp_path / "train.csv"),
                             str(tmp_path / "clf"), epochs=1, batch_size=8, progress=False, lr=1e-9)
    assert result["trainable_parameters"] < result["parameters"]
    weights = load_weights(tmp_path / "clf" / "model.safetensors")
    cove = load_weights(tmp_path / "cove" / "model.safetensors")
    encoder = {k: v for k, v in cove.items() if k.startswith("backbone.encoder.")}
    assert encoder and all(torch.equal(weights["backbone.features." + k[len("backbone."):]], v)
                           for k, v in encoder.items())  # frozen
    assert torch.allclose(weights["backbone.embed.tokens.weight"], cove["backbone.encoder.embed.tokens.weight"],
                          atol=1e-5)  # lr 1e-9: still the MT-LSTM's word vectors
