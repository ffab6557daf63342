"""Hugging Face checkpoint import and export: ``from_hf`` (a transformers model directory → a
``pretrained`` run, or a ``finetuned`` one for a sequence classifier; an ELECTRA discriminator with its
generator → one ``electra`` run; a T5 or BART model → a ``t5`` / ``bart`` run; an XLNet → an ``xlnet`` run),
``to_hf`` (a run → a directory transformers loads) and ``resolve``
(a run, a transformers directory or ``minilm`` → a run directory, converting on the fly). See
docs/interop.md."""
from .hf_export import to_hf
from .hf_import import from_hf
from .sources import minilm_dir, resolve

__all__ = ["from_hf", "to_hf", "resolve", "minilm_dir"]
