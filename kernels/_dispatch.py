"""One Triton-or-reference switch for every kernel in this package.

Each op's public entry point (`fused_logprob`, `ppo_loss`, `group_stats`) asks `use_triton(x)`: Triton
when x is a CUDA tensor or UIS1_FORCE_TRITON=1 (how the CPU tests run the kernels, in Triton's
interpreter), the op's pure-torch reference otherwise. Only then does it import its kernels/<op>_triton.py,
so a CPU run never imports triton. Those launchers call `check_runnable(kernel, x, where)`: on CPU the
kernels run only in the interpreter, which needs TRITON_INTERPRET=1 in the environment before triton is
first imported (the @triton.jit decorator reads it then); anything else is a clear RuntimeError rather
than an obscure failure inside triton.
"""

import os

import torch

FORCE_ENV = "UIS1_FORCE_TRITON"


def use_triton(x: torch.Tensor) -> bool:
    """True when an op on tensor `x` should take its Triton path (CUDA, or UIS1_FORCE_TRITON=1)."""
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
