import pytest
import torch

from sesame.models.additions import Additions
from sesame.models.caches import KVCache
from sesame.models.encoder_decoder import (STYLES, EncoderDecoder, EncoderDecoderConfig, RelativePositionBias,
                                           relative_buckets)

VOCAB = 100


def config(style: str, **fields) -> EncoderDecoderConfig:
    return EncoderDecoderConfig(vocab_size=VOCAB, hidden=32, layers=2, heads=4, intermediate=64,
                                **{"max_positions": 64, "dropout": 0.0, **STYLES[style], **fields})


def model(style: str, **fields) -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder(config(style, **fields)).eval()


def source(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source ids with their padding mask (True at real tokens)."""
    ids = torch.randint(3, VOCAB, (len(lengths), max(lengths)))
    padding = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~padding, 0), padding


@pytest.mark.parametrize("offset, bidirectional, causal", [
    (0, 0, 0), (-1, 1, 1), (1, 17, 0), (8, 24, 0), (127, 31, 0), (-1000, 15, 31)])
def test_relative_buckets_follow_t5s_table(offset, bidirectional, causal):
    offsets = torch.tensor([offset])  # key position − query position
    assert relative_buckets(offsets, buckets=32, max_distance=128, bidirectional=True).item() == bidirectional
    assert relative_buckets(offsets, buckets=32, max_distance=128, bidirectional=False).item() == causal


@pytest.mark.parametrize("bidirectional", [True, False])
def test_the_position_bias_looks_up_the_buckets_of_every_offset(bidirectional):
    # the bias clamps offsets to ±max_distance and reads buckets computed once: the same as bucketing each offset,
    # also far beyond max_distance, for full matrices (training) and a decoding step's one row
    cfg = config("t5", relative_buckets=32, relative_max_distance=20)
    bias = RelativePositionBias(cfg, bidirectional=bidirectional)
    for length, past in [(50, 0), (1, 60), (3, 7)]:
        keys = torch.arange(past + length)
        buckets = relative_buckets(keys[None, :] - keys[past:, None], buckets=32, max_distance=20,
                                   bidirectional=bidirectional)
        assert torch.equal(bias(length, past), bias.table(buckets).permute(2, 0, 1)[None])


@pytest.mark.parametrize("style", ["t5", "bart"])
def test_source_padding_changes_no_real_position(style):
    m = model(style)
    ids, _ = source([7])
    padded, padding = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1), torch.arange(11)[None] < 7
    targets = torch.randint(3, VOCAB, (1, 5))
    assert torch.allclose(m(ids, decoder_ids=targets), m(padded, padding=padding, decoder_ids=targets), atol=1e-5)


@pytest.mark.parametrize("style", ["t5", "bart"])
def test_cached_decoding_equals_the_uncached_forward(style):
    m = model(style)
    ids, padding = source([9, 5])
    memory = m.encode(ids, padding)
    cache = KVCache(m.decoder.config, 2, 8)
    tokens = torch.full((2, 1), m.config.decoder_start_id)
    steps = []
    with torch.no_grad():
        for step in range(7):  # greedy, one token at a time
            steps.append(m.logits(m.decode(tokens[:, -1:], memory, cache=cache))[:, -1])
            tokens = torch.cat([tokens, steps[-1].argmax(-1, keepdim=True)], 1)
            if step == 0:
                projected = dict(memory.keys_values)
        full = m(ids, padding=padding, decoder_ids=tokens[:, :-1])
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5)
    assert torch.equal(full.argmax(-1), tokens[:, 1:])
    assert all(memory.keys_values[i] is projected[i] for i in range(2))  # cross-attention projected once


def test_reordered_caches_decode_the_reordered_rows():
    m = model("t5")
    ids, padding = source([9, 5])
    memory, cache = m.encode(ids, padding), KVCache(m.decoder.config, 2, 4)
    first = torch.tensor([[0], [4]])
    with torch.no_grad():
        m.decode(first, memory, cache=cache)
        rows = torch.tensor([1, 0])
        memory.reorder(rows)
        cache.reorder(rows)
        step = m.logits(m.decode(torch.tensor([[7], [8]]), memory, cache=cache))
        full = m(ids[rows], padding=padding[rows], decoder_ids=torch.tensor([[4, 7], [0, 8]]))
    assert torch.allclose(step[:, 0], full[:, 1], atol=1e-5)


def test_t5s_unscaled_queries_start_as_scaled_ones():
    t5 = model("t5")
    queries = t5.encoder.attention[0].qkv.weight[:32]
    assert abs(queries.std().item() - 0.02 / 8 ** 0.5) < 0.002  # head size 8
    assert abs(t5.encoder.attention[0].qkv.weight[32:].std().item() - 0.02) < 0.004


@pytest.mark.parametrize("style", ["t5", "bart"])
def test_layer_modules_hold_every_parameter_bottom_to_top(style):
    m = model(style)
    groups = [{id(p) for module in group if module is not None for p in module.parameters()}
              for group in m.layer_modules()]
    assert set().union(*groups) == {id(p) for p in m.parameters()}
    assert len(groups) == 1 + 2 + 1 + 2  # embeddings, encoder layers, the decoder's bias (T5), decoder layers
    assert id(m.embed.tokens.weight) in groups[0] and id(m.decoder.cross_attention[1].qkv.weight) in groups[-1]


def test_decoder_inputs_start_with_the_start_token():
    bart = model("bart", decoder_start_id=2)
    assert bart.decoder_inputs(torch.tensor([[5, 6, 7]])).tolist() == [[2, 5, 6]]


@pytest.mark.parametrize("fields, message", [({"relative_buckets": 31}, "relative_buckets 31"),
                                             ({"relative_max_distance": 16}, "relative_max_distance 16"),
                                             ({"embedding_size": 16}, "embedding_size 16")])
def test_inconsistent_configs_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        config("t5", **fields)


def jittered(hf_model):
    """A transformers model with every weight moved off its initial value (norms not 1, biases not 0)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf_model.eval()


def parity(style: str, hf_model, ours: EncoderDecoder, lengths: list[int], target_length: int) -> None:
    from sesame.interop.encoder_decoder import import_weights

    ours.load_state_dict(import_weights(style, hf_model.state_dict(), ours))
    ids, padding = source(lengths)
    labels = torch.randint(3, VOCAB, (len(lengths), target_length))
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=padding.long(), labels=labels).logits
        got = ours(ids, padding=padding, decoder_ids=ours.decoder_inputs(labels))
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_t5_matches_transformers():
    transformers = pytest.importorskip("transformers")
    hf = jittered(transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, relative_attention_num_buckets=32,
        relative_attention_max_distance=128, dropout_rate=0.0, feed_forward_proj="relu", pad_token_id=0,
        eos_token_id=1, decoder_start_token_id=0)))
    # past 128 positions, so the far buckets and the clamp are exercised
    parity("t5", hf, model("t5", max_positions=256), lengths=[150, 100], target_length=140)


def test_bart_matches_transformers():
    transformers = pytest.importorskip("transformers")
    hf = jittered(transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2)))
    hf.final_logits_bias.zero_()
    parity("bart", hf, model("bart", pad_id=1, decoder_start_id=2), lengths=[30, 20], target_length=25)


def test_a_checkpoint_with_an_output_bias_is_refused():
    from sesame.errors import SesameError
    from sesame.interop.encoder_decoder import export_weights, import_weights

    bart = model("bart")
    weights = export_weights("bart", bart.state_dict(), bart)
    assert set(import_weights("bart", weights, bart)) == set(bart.state_dict())
    with pytest.raises(SesameError, match="final_logits_bias is not zero"):
        import_weights("bart", {**weights, "final_logits_bias": torch.ones(1, VOCAB)}, bart)


def test_xavier_draws_the_stacks_linear_weights_and_nothing_else():
    normal, xavier = model("bart"), model("bart", weight_init="xavier")
    for adapted in (normal, xavier):
        torch.manual_seed(1)
        Additions(adapter_size=4).insert(adapted)
    for weight, fans in ((xavier.encoder.attention[0].qkv.weight, 32 + 96),
                         (xavier.decoder.cross_attention[1].out.weight, 32 + 32),
                         (xavier.decoder.feed_forward[1].inp.weight, 32 + 64)):
        assert abs(weight.std().item() - (2 / fans) ** 0.5) < 0.15 * (2 / fans) ** 0.5  # Glorot & Bengio's uniform
        assert weight.abs().max().item() <= (6 / fans) ** 0.5
    assert abs(normal.encoder.attention[0].qkv.weight.std().item() - 0.02) < 0.004
    assert abs(xavier.embed.tokens.weight.std().item() - 0.02) < 0.002  # the embeddings keep BART's start
    for a, b in zip(normal.encoder.attention[0].adapter.parameters(), xavier.encoder.attention[0].adapter.parameters()):
        assert torch.equal(a, b)  # adapters keep their start near the identity


def test_xavier_is_refused_where_the_start_is_rescaled():
    with pytest.raises(ValueError, match="weight_init 'xavier': only for stacks with scaled scores"):
        config("t5", weight_init="xavier")
    assert config("bart", norm="pre", weight_init="xavier").norm == "pre"  # torch's norm_first Transformer's start
    with pytest.raises(ValueError, match="weight_init 'glorot'"):
        config("bart", weight_init="glorot")
