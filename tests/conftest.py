"""Test-wide settings. TRITON_INTERPRET must be set before triton is first imported, so the
Triton kernels can run on CPU in the interpreter (tests force them with UIS1_FORCE_TRITON=1)."""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
