"""One Triton-or-reference switch for every kernel in this package (`use_triton`); `check_runnable`
turns a kernel that cannot run (CPU without TRITON_INTERPRET=1) into a RuntimeError.
"""

import os

import torch

FORCE_ENV = "UIS1_FORCE_TRITON"


def use_triton(x: torch.Tensor) -> bool:
    """True when an op on tensor `x` should take its Triton path: a CUDA tensor, or UIS1_FORCE_TRITON=1
    (the CPU tests run the kernels in Triton's interpreter); only then is kernels/<op>_triton.py (and
    triton) imported."""
    return x.is_cuda or os.environ.get(FORCE_ENV, "0") == "1"


def interpreted(kernel) -> bool:
    """True when `kernel` and triton's own library (tl.sum, ...) were built for the CPU interpreter."""
    import triton.language as tl  # only a Triton launcher asks, after its module has imported triton
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction) and isinstance(tl.sum, InterpretedFunction)


def check_runnable(kernel, x: torch.Tensor, where: str) -> None:
    """Raise RuntimeError naming `where` when `kernel` cannot run on `x`'s device: a CPU tensor
    without the interpreter, or a device that is neither CUDA nor CPU."""
    if x.is_cuda or (x.device.type == "cpu" and interpreted(kernel)):
        return
    if x.device.type == "cpu":
        raise RuntimeError(
            f"{where}: the Triton path on CPU needs TRITON_INTERPRET=1 set before triton is first imported "
            f"(or unset {FORCE_ENV} to use the torch reference)"
        )
    raise RuntimeError(f"{where}: the Triton path runs on CUDA (or CPU in the interpreter), got {x.device}")
