"""Where and how a model runs: ``--device``, ``--precision``, ``--tf32`` and ``--compile``, declared once
(:class:`Runtime`) for every command that runs a model, and resolved once (:meth:`Runtime.place`) into a
:class:`Placement` that the trainer and the inference paths use.

The placement rule: batches are built on the CPU, every random draw of the data (masks, replaced tokens,
sentence pairs, batch orders) coming from CPU generators seeded by (seed, step, example), so they are the same
on every device; the trainer builds the next step's batches while a step trains and :meth:`Placement.staged` pins
them there (on CUDA), and :meth:`Placement.move` carries a whole batch to the model's device at the one point where
it is consumed (a non-blocking copy from pinned memory on CUDA). A padding mask that pads nothing is dropped in
that staging, where the host can tell without waiting for a device (:func:`unpadded`). Tensors made inside a
forward pass take the device of their inputs. Draws made inside the model (dropout, ELECTRA's sampled replacements,
ELMo's sampled softmax) use the device's own generator, seeded per step: repeatable on one kind of device, but not
the same stream on another. Weights are saved from CPU tensors and loaded onto the CPU, then copied in, so a
checkpoint does not depend on the device that wrote it.

The runtime is a choice of the machine, not of the run: ``--resume`` accepts any device, TF32 and compile
setting (a run trained on a GPU continues on a CPU), and takes the run's precision unless ``--precision`` is
given (fp16 exists only on CUDA, so moving such a run to a CPU must be able to change it). Weights and the
optimizer stay float32 under every precision, so the checkpoint is the same kind of thing; a resume is exact
when its runtime is the run's.
"""
from __future__ import annotations

import os
import re
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from .errors import SesameError, warn
from .options import option

PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@dataclass(kw_only=True)
class Runtime:
    """The flags of every command that runs a model; :meth:`place` checks them against this machine."""
    device: str = option("auto", metavar="DEVICE", help="auto (CUDA, then MPS, then the CPU), cpu, cuda, cuda:N or "
                                                        "mps; a run made on one device loads and resumes on another")
    precision: str | None = option(None, choices=PRECISIONS,
                                   help="fp32 (the default); bf16: matrix products in bfloat16 autocast (fast on CPUs "
                                        "with AVX512-BF16 or AMX and on Ampere or later GPUs); fp16: CUDA only, with "
                                        "a gradient scaler; weights and optimizer stay fp32; --resume: the run's "
                                        "unless given")
    tf32: bool = option(False, help="TF32 matrix products on NVIDIA Ampere or later GPUs (CUDA only)")
    compile: bool = option(False, help="torch.compile the model for training and inference (runs uncompiled, "
                                       "with a one-line warning, where compiling fails)")

    def record(self, placement: Placement) -> dict:
        """What config.json keeps: the device the run last used (for the record: any device may resume it), its
        precision (which --resume keeps unless told), TF32 and compile."""
        return {**asdict(self), "device": str(placement.device), "precision": placement.precision}

    def place(self) -> Placement:
        """This machine's device and precision for these flags; a device that is absent, or a precision it
        cannot run, is a :class:`SesameError` naming the flag."""
        device = resolve_device(self.device)
        precision = self.precision or "fp32"
        check_precision(device, precision)
        if self.tf32:
            if device.type != "cuda":
                raise SesameError(f"--tf32: TF32 is a mode of NVIDIA GPUs; --device is {device}; drop --tf32")
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        return Placement(device=device, precision=precision, compile=self.compile)


def given_runtime(spec: dict, fields: dict) -> Runtime:
    """The runtime of the Python API's keywords: ``spec``'s ``runtime`` (popped from it; default :class:`Runtime`'s)
    with the Runtime ``fields`` given as keywords over it (``runtime=Runtime(device="cuda"), precision="bf16"``)."""
    return replace(spec.pop("runtime", None) or Runtime(), **fields)


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))  # torchrun: one GPU per process of a machine


def resolve_device(name: str) -> torch.device:
    """``--device``'s device: ``auto`` is CUDA (this process's GPU under torchrun), then MPS, then the CPU."""
    if not DEVICE.fullmatch(name):
        raise SesameError(f"--device {name}: choose auto, cpu, cuda, cuda:N or mps")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SesameError(f"--device {name}: this machine has no CUDA GPU that PyTorch {torch.__version__} can "
                              "use; use --device cpu (or auto)")
        index = int(name.partition(":")[2] or _local_rank())
        if index >= torch.cuda.device_count():
            raise SesameError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                              f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if name == "mps" and not torch.backends.mps.is_available():
        raise SesameError("--device mps: Apple's Metal backend is not available here; use --device cpu (or auto)")
    return torch.device(name)


def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); elsewhere bf16 runs, but slowly."""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse a precision ``device`` cannot run: fp16 off CUDA, bf16 on a GPU without it; warn when a CPU
    runs bf16 without native support (it works, slower than fp32)."""
    if precision not in PRECISIONS:
        raise SesameError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device.type != "cuda":
        raise SesameError(f"--precision fp16: float16 training needs a CUDA GPU (--device is {device}); use "
                          "--precision bf16 or fp32")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise SesameError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bfloat16; use --precision "
                          "fp16 (with a gradient scaler) or fp32")
    if precision == "bf16" and device.type == "cpu" and not native_bf16_cpu():
        warn("--precision bf16: this CPU has no native bfloat16 (AVX512-BF16 or AMX); it runs, but slower than fp32")


@dataclass(frozen=True)
class Placement:
    """A resolved :class:`Runtime`: where the model lives and how its forward passes compute."""
    device: torch.device
    precision: str = "fp32"
    compile: bool = False

    @classmethod
    def cpu(cls) -> Placement:
        """The CPU in float32, uncompiled: what code that is given no runtime uses."""
        return cls(device=torch.device("cpu"))

    def autocast(self) -> ContextManager:
        """Mixed precision for forward passes: with bf16 or fp16, matrix products run in that type while
        parameters, gradients and the optimizer stay float32, and losses and normalisations stay float32
        (autocast's op lists; the trainer adds the losses up in float32)."""
        if self.precision == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.precision])

    @property
    def dtype(self) -> torch.dtype:
        """The type autocast's matrix products give (float32 in fp32): what a KV cache stores."""
        return DTYPES.get(self.precision, torch.float32)

    def scaler(self) -> torch.amp.GradScaler:
        """fp16's gradient scaler (a step whose gradients overflow is skipped and the scale halved); a disabled
        one, which passes everything through, in the other precisions."""
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def model(self, module: nn.Module) -> nn.Module:
        """``module`` moved to the device (in place, as :meth:`torch.nn.Module.to` does)."""
        return module.to(self.device)

    def move(self, batch: Any) -> Any:
        """``batch`` on the device (:func:`to_device`)."""
        return to_device(batch, self.device)

    def staged(self, batch: Any) -> Any:
        """``batch`` made ready for :meth:`move` off the training thread: a padding mask that pads nothing dropped
        (:func:`unpadded`), and on CUDA its CPU tensors in pinned memory, which :meth:`move` then copies without
        waiting."""
        batch = unpadded(batch)
        if self.device.type != "cuda":
            return batch
        return map_tensors(batch, lambda t: t.pin_memory() if t.device.type == "cpu" else t)

    def compiled(self, fn: Callable, what: str) -> Callable:
        """``fn`` (a module or function) through torch.compile when ``--compile`` was given, else ``fn``. Shapes
        that change (another batch length) recompile, up to torch's limit, then run uncompiled; a failure to
        compile (no C compiler, a backend missing on this device) is one warning and ``fn`` runs as it is."""
        if not self.compile:
            return fn
        return _Fallback(fn, torch.compile(fn), what)


def unpadded(batch: Any) -> Any:
    """``batch`` with its ``padding`` mask (True at real tokens) set to None, as backbones read a batch with nothing
    padded, when it is a CPU tensor that pads nothing. Asked here, on the host where the batch was built, the question
    costs no wait; a model on an accelerator does not ask it (:func:`sesame.models.padding.is_padded`: the host would
    wait for the device every step), and SDPA then runs without a mask (pairs or denoised rows that fill their
    window, a fine-tuning batch of one length)."""
    padding = batch.get("padding") if isinstance(batch, dict) else None
    if isinstance(padding, torch.Tensor) and padding.device.type == "cpu" and bool(padding.all()):
        return {**batch, "padding": None}
    return batch


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` (tensors, in dicts, lists and tuples, beside other values) with ``fn`` of each tensor."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {key: map_tensors(value, fn) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(value, fn) for value in batch)
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """A batch (tensors, in dicts, lists and tuples, beside other values) on ``device``; on CUDA from pinned
    memory (as :meth:`Placement.staged` leaves it, else pinned here) without waiting for the copy (kernels queued
    after it on the stream wait for it)."""
    def move(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == device:
            return tensor
        if device.type == "cuda" and tensor.device.type == "cpu":
            return tensor.pin_memory().to(device, non_blocking=True)  # pin_memory: itself when already pinned
        return tensor.to(device)

    return map_tensors(batch, move)


def device_of(model: nn.Module) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a model without any)."""
    return next(model.parameters(), torch.empty(0)).device


class _Fallback:
    """Calls the compiled function; the first time compiling fails, warns once and calls the original from then on."""

    def __init__(self, eager: Callable, compiled: Callable, what: str):
        self.eager, self.compiled, self.what = eager, compiled, what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except torch._dynamo.exc.TorchDynamoException as err:
                first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
                warn(f"--compile: torch.compile failed for the {self.what} ({type(err).__name__}: {first}); "
                     "running it uncompiled")
                self.compiled = None
        return self.eager(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # DDP's no_sync and the like reach the module
        return getattr(self.eager, name)
