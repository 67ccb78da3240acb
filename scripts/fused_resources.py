"""Compile the fused decode step's Triton kernels for a CUDA architecture without a GPU, and
report what ptxas says of each: registers, spills, shared memory, compile time.

Triton's own ptxas does the work, so this runs on any machine where Triton is installed:

    python scripts/fused_resources.py --warps 4 --arch 90

Spills (local memory) and register counts decide how many programs share a multiprocessor,
which is what the fused step's speed on the GPU turned on (docs/results/planning-gpu.md).
"""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import tempfile
import time

os.environ["TRITON_INTERPRET"] = "0"  # compile the kernels, do not interpret them

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from trajectory_transformer.model.decode import fused, fused_kernels

INTS = {"R", "MEMBERS", "GROUPS", "P_CAP", "L_CAP", "T", "N", "C", "HID"}
FLOATS = {"eps1", "eps2", "eps_f", "scale"}
INT64_POINTERS = {"tokens_ptr", "position_ptr", "prefix_end_ptr"}


def signature(kernel, constants: dict) -> tuple[dict, dict]:
    """Triton's signature and constants for `kernel`: float32 tensors, int32 sizes."""
    params = list(inspect.signature(kernel.fn).parameters)
    types, values = {}, {}
    for index, name in enumerate(params):
        if name in constants:
            types[name] = "constexpr"
            values[(index,)] = constants[name]
        elif name in INTS:
            types[name] = "i32"
        elif name in FLOATS:
            types[name] = "fp32"
        else:
            types[name] = "*i64" if name in INT64_POINTERS else "*fp32"
    return types, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    parser.add_argument("--width", type=int, default=128, help="the model's embedding width")
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args()
    C, NH = args.width, args.heads
    base = dict(
        NH=NH,
        HS=C // NH,
        CP=fused._padded(C),
        HSP=fused._padded(C // NH),
        BR=fused.ROWS,
        KB=fused.KEYS,
        PKB=fused.PREFIX_KEYS,
        SPLITS=-(-4 * C // fused.MLP_COLUMNS),
        HB=fused.HIDDEN,
        SPLIT_COLS=fused.MLP_COLUMNS,
        PARTS=fused.PARTS,
    )
    variants = [
        (fused_kernels.qkv_kernel, dict(FIRST=True)),
        (fused_kernels.qkv_kernel, dict(FIRST=False)),
        (fused_kernels.attention_kernel, dict(SHARED_PREFIX=True)),
        (fused_kernels.attention_kernel, dict(SHARED_PREFIX=False)),
        (fused_kernels.mlp_kernel, {}),
        (fused_kernels.head_kernel, {}),
    ]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    target = GPUTarget("cuda", args.arch, 32)
    options = {"num_warps": args.warps, "num_stages": args.stages}
    for kernel, flags in variants:
        types, values = signature(kernel, {**base, **flags})
        start = time.perf_counter()
        compiled = triton.compile(ASTSource(kernel, types, constexprs=values), target, options)
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
            ptx.write(compiled.asm["ptx"])
            ptx.flush()
            arch = f"sm_{args.arch}a" if args.arch >= 90 else f"sm_{args.arch}"
            report = subprocess.run(
                [ptxas, "-v", "--gpu-name", arch, ptx.name, "-o", os.devnull],
                capture_output=True,
                text=True,
                check=True,
            ).stderr
        took = time.perf_counter() - start
        lines = [line.split(":", 1)[-1].strip() for line in report.splitlines()]
        usage = [line for line in lines if "registers" in line or "spill" in line]
        name = kernel.fn.__name__ + (f" {flags}" if flags else "")
        print(f"{name}: {took:.1f} s, shared {compiled.metadata.shared} B; {'; '.join(usage)}")


if __name__ == "__main__":
    main()
