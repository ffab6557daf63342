import pytest
import torch

from sesame.models import Transformer, TransformerConfig
from sesame.tasks.classify import POOLINGS, SequenceModel, collate


def classifier(pooling: str, causal: bool) -> SequenceModel:
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=50, hidden=16, layers=1, heads=2, intermediate=32, max_positions=32,
                            causal=causal, dropout=0.0)
    return SequenceModel(Transformer(cfg), n_out=3, pooling=pooling).eval()


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_text_scores_the_same_alone_and_padded_in_a_batch(pooling):
    """Every pooling reads only real tokens, so padding to a longer neighbour changes nothing."""
    m = classifier(pooling, causal=pooling == "last")
    short, long = [5, 6, 7], [8, 9, 10, 11, 12, 13, 14]
    alone = m.outputs(collate([short], pad_id=0))
    batched = m.outputs(collate([short, long], pad_id=0))
    assert torch.allclose(alone[0], batched[0], atol=1e-5)


def test_mean_pooling_is_the_average_of_real_final_states():
    m = classifier("mean", causal=False)
    batch = collate([[5, 6, 7], [8, 9, 10, 11, 12]], pad_id=0)
    hidden = m.backbone(batch["ids"], padding=batch["padding"])
    expected = m.head(hidden[0, :3].mean(0))
    assert torch.allclose(m.outputs(batch)[0], expected, atol=1e-5)


def test_concat_heads_dropouts_are_fastais_the_given_one_then_a_tenth():
    """fastai's get_text_classifier: ps = [output_p × drop_mult, 0.1], not the given dropout twice."""
    head = SequenceModel(classifier("concat", causal=True).backbone, n_out=3, pooling="concat", dropout=0.4).head
    assert [m.p for m in head if isinstance(m, torch.nn.Dropout)] == [0.4, 0.1]


def test_a_training_batch_of_one_passes_the_concat_heads_batch_norm():
    """A last training batch (or micro-batch) of one row has no batch statistics: it is normalised with the
    running ones instead of raising, and leaves them as they were."""
    m = classifier("concat", causal=True).train()
    norms = [x for x in m.head if isinstance(x, torch.nn.BatchNorm1d)]
    before = [(n.running_mean.clone(), n.running_var.clone()) for n in norms]
    loss = m({**collate([[5, 6, 7]], pad_id=0), "targets": torch.tensor([1])})
    loss.backward()
    assert torch.isfinite(loss) and m.head[-1].weight.grad is not None
    assert all(torch.equal(n.running_mean, mean) and torch.equal(n.running_var, var)
               for n, (mean, var) in zip(norms, before))
    m({**collate([[5, 6, 7], [8, 9]], pad_id=0), "targets": torch.tensor([1, 0])})  # larger batches: batch statistics
    assert not torch.equal(norms[0].running_mean, before[0][0])


def test_fine_tuning_starts_from_the_pretrained_backbone_and_nsp_pooler(tmp_path):
    """BERT's classifier begins from the pre-trained encoder and the pooler NSP trained (Devlin et al. 2019, §4.1);
    the NSP head itself and ELECTRA-style generators are left behind."""
    from sesame.pipelines.finetune import load_pretrained as _load_pretrained
    from sesame.objectives import BertPretraining
    from sesame.tokenizer import SpecialIds
    from sesame.train.checkpoint import save_weights

    torch.manual_seed(1)
    cfg = TransformerConfig(vocab_size=50, hidden=16, layers=1, heads=2, intermediate=32, max_positions=32)
    pretrained = BertPretraining(Transformer(cfg), SpecialIds(0, 1, 2, 3, 4))
    save_weights(tmp_path / "model.safetensors", pretrained.state_dict())
    for pooling, copies_pooler in (("cls", True), ("mean", False)):
        torch.manual_seed(2)
        model = SequenceModel(Transformer(cfg), n_out=3, pooling=pooling)
        fresh_head = model.head.weight.clone()
        _load_pretrained(model, tmp_path)
        for name, value in pretrained.backbone.state_dict().items():
            assert torch.equal(model.backbone.state_dict()[name], value), name
        if copies_pooler:
            assert torch.equal(model.pooler[0].weight, pretrained.pooler[0].weight)
        assert torch.equal(model.head.weight, fresh_head)
