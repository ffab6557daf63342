"""A batch's padding mask, as every backbone reads it: (batch, time), True at real tokens; None when nothing is padded.

Whether a mask given pads anything is a question about its values, which the host can answer only by waiting for
the device that holds them: once per forward pass, that wait would stall a GPU's every training step. So it is
asked only where it costs nothing (:func:`is_padded`), and the trainer answers it where batches are built, on the
CPU, passing None for a batch with nothing padded (:meth:`sesame.runtime.Placement.staged`); code that needs the
real positions themselves reads them through :func:`real_tokens`.
"""
from __future__ import annotations

import torch


def exporting() -> bool:
    """Whether the model is being traced for export (ONNX, ``torch.export``): a graph cannot branch on whether a
    batch holds padding, so a padding mask given is then always applied."""
    return torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting()


def host_can_read(tensor: torch.Tensor) -> bool:
    """Whether reading a value of ``tensor`` back to the host costs no wait: on the CPU, outside export (a traced
    graph would keep the value it read). Elsewhere a forward pass computes without asking (issue 35)."""
    return tensor.device.type == "cpu" and not exporting()


def is_padded(padding: torch.Tensor | None) -> bool:
    """Whether a forward pass must mask ``padding``: False for None; on the CPU, whether any position is padding
    (asking costs no wait there, and a mask that is all True is then skipped); True under export (the graph keeps
    the mask) and on an accelerator, where asking would make the host wait for the device: the caller is trusted
    to give a mask only when something is padded (the trainer drops one that is all True before the batch moves)."""
    if padding is None:
        return False
    if not host_can_read(padding):
        return True
    return not bool(padding.all())


def real_tokens(ids: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
    """The real positions of ``ids`` (batch, time): ``padding`` itself, or every position where it is None."""
    return padding if padding is not None else torch.ones_like(ids, dtype=torch.bool)
