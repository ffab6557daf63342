"""Backbones: token ids in, hidden states out. A run's ``config.model`` is its architecture's config (a
:data:`ModelConfig`), whose ``arch`` names the architecture; config.json holds its ``to_dict()``."""
from __future__ import annotations

from torch import nn

from .elmo import Elmo, ElmoConfig
from .recurrent import Recurrent, RecurrentConfig
from .transformer import Transformer, TransformerConfig
from .cove import CoveConfig, MTLSTM
from .encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from .xlnet import XLNet, XLNetConfig

ARCHITECTURES: dict[str, tuple[type, type[nn.Module]]] = {
    "transformer": (TransformerConfig, Transformer),
    "recurrent": (RecurrentConfig, Recurrent),
    "elmo": (ElmoConfig, Elmo),
    "cove": (CoveConfig, MTLSTM),
    "encoder_decoder": (EncoderDecoderConfig, EncoderDecoder),
    "xlnet": (XLNetConfig, XLNet),
}
# a run's backbone config: one of ARCHITECTURES' config classes (EncoderDecoderConfig and XLNetConfig are Transformer's)
ModelConfig = TransformerConfig | RecurrentConfig | ElmoConfig | CoveConfig


def model_config(config: dict) -> ModelConfig:
    """The config object of a run's model config dict (configs written before ``arch`` existed are Transformers); a
    recurrent model's nested ``features`` (ELMo's or CoVe's config) is parsed too."""
    config = dict(config)
    if isinstance(config.get("features"), dict):
        config["features"] = model_config(config["features"])
    return ARCHITECTURES[config.pop("arch", "transformer")][0](**config)


def position_limit(config) -> int | None:
    """The longest sequence a backbone of ``config`` (a config object) reads: ``max_positions`` where positions index a
    learned table (BERT, GPT, BART: ``learned_positions``), None where any length is read (T5's relative position
    bias, recurrent models)."""
    return config.max_positions if getattr(config, "learned_positions", False) else None


def build_model(config: ModelConfig | dict) -> nn.Module:
    """The backbone a model config (or its config.json dict) describes, without weights."""
    cfg = model_config(config) if isinstance(config, dict) else config
    extractor = getattr(cfg, "features", None)  # a recurrent model reading ELMo's or CoVe's features
    parts = {"features": build_model(extractor)} if extractor is not None else {}
    return ARCHITECTURES[cfg.arch][1](cfg, **parts)


__all__ = ["ARCHITECTURES", "CoveConfig", "MTLSTM", "Elmo", "ElmoConfig", "EncoderDecoder", "EncoderDecoderConfig",
           "ModelConfig", "Recurrent", "RecurrentConfig", "Transformer", "TransformerConfig", "XLNet", "XLNetConfig",
           "build_model", "model_config", "position_limit"]
