"""SQuAD's context windows and span candidates (BERT's ``run_squad.py``, Devlin et al. 2019), which
:mod:`.span_qa` reads: the windows a long context is cut into, each token's window of maximum context, a gold
answer's tokens and the n-best spans of one window."""
from __future__ import annotations


def trimmed_offsets(text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character spans of tokens without surrounding whitespace (byte-level BPE and Metaspace pieces
    carry the space before a word)."""
    out = []
    for start, end in offsets:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        out.append((start, end))
    return out


def context_windows(n_tokens: int, room: int, doc_stride: int) -> list[tuple[int, int]]:
    """(first token, token count) of each window over a context of ``n_tokens``: ``room`` tokens wide,
    starting ``doc_stride`` tokens apart (never more than a window), the last ending at the context's
    end (``run_squad.py``'s doc spans)."""
    windows, start = [], 0
    while True:
        length = min(n_tokens - start, room)
        windows.append((start, length))
        if start + length >= n_tokens:
            return windows
        start += min(length, doc_stride)


def max_context(windows: list[tuple[int, int]]) -> list[list[bool]]:
    """Per window, per token: whether this window gives the token its maximum context, min(tokens
    left, tokens right) + 0.01 · window length, the first window winning ties (``_check_is_max_context``)."""
    best: dict[int, tuple[float, int]] = {}
    for w, (start, length) in enumerate(windows):
        for t in range(start, start + length):
            score = min(t - start, start + length - 1 - t) + 0.01 * length
            if t not in best or score > best[t][0]:
                best[t] = (score, w)
    return [[best[t][1] == w for t in range(start, start + length)] for w, (start, length) in enumerate(windows)]


def answer_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """First and last context token overlapping the characters [start, end), or None."""
    covered = [t for t, (s, e) in enumerate(offsets) if s < end and e > start]
    return (covered[0], covered[-1]) if covered else None


def window_candidates(context: str, feature: dict, logits: list[list[float]], n_best: int,
                      max_answer_length: int) -> list[dict]:
    """Spans of one window (BERT's ``write_predictions``): a start among the ``n_best`` highest start
    logits of context tokens in their window of maximum context, an end among the ``n_best`` highest
    end logits of context tokens, end ≥ start, at most ``max_answer_length`` tokens; score start + end."""
    k, offsets = feature["context_start"], feature["offsets"]
    start = [logits[k + t][0] for t in range(len(offsets))]
    end = [logits[k + t][1] for t in range(len(offsets))]
    starts = sorted((t for t in range(len(offsets)) if feature["max_context"][t]), key=lambda t: -start[t])[:n_best]
    ends = sorted(range(len(offsets)), key=lambda t: -end[t])[:n_best]
    return [{"text": context[offsets[s][0]: offsets[e][1]], "score": start[s] + end[e], "start": offsets[s][0]}
            for s in starts for e in ends if s <= e < s + max_answer_length]
