"""GPT-2's "TL;DR:" summarisation prompt (Radford et al. 2019, §3.6), for ``sesame generate --tldr``: the text appended
to each article, and the summary read from what the model generates after it (its first three sentences). The
generation itself is the library's (:mod:`sesame.generation`); the command sets the paper's top-k 2 sampling and
its 100 tokens.
"""
from __future__ import annotations

TLDR = "\nTL;DR:"  # Radford et al. 2019, §3.6


def tldr(text: str, sentences: int = 3) -> str:
    """A TL;DR prompt's summary as GPT-2 evaluated it (§3.6): the first ``sentences`` generated sentences."""
    found, cut = 0, len(text)
    for i, char in enumerate(text):
        if char in ".!?" and (i + 1 == len(text) or text[i + 1].isspace()):
            found += 1
            if found == sentences:
                cut = i + 1
                break
    return text[:cut].strip()

