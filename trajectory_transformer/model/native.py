"""Native CPU kernels, compiled once per machine with `torch.utils.cpp_extension`.

The planner's decode steps on the CPU run one new token per row through the model: at a few
dozen rows, eager PyTorch spends more time on operator calls (the attention over a
shared-prefix cache alone is a dozen tiny ones per layer) than on arithmetic.
`csrc/cpu_kernels.cpp` holds the whole decode step as one C++ call (`Decoder.step`: embedding,
every block with that attention, final norm and head), and the attention on its own
(`decode_attention`, for tests). `decoder()` binds a model and a cache to it. The same
extension draws the training dropout (`dropout`, used by `dropout.Dropout` and
`dropout.dropout_attention`), where torch's `bernoulli_` costs a quarter of a training step.
It is built on first use (about a minute, with the machine's C++ compiler and ninja) into
torch's extension cache (`TORCH_EXTENSIONS_DIR`, by default `~/.cache/torch_extensions`) and
loaded from there afterwards; `make demo` and `make test` build them during setup (`native.main()`).

Where it cannot be built (no compiler), the model falls back to the PyTorch implementation
with one warning: decode results agree up to float rounding, and training draws its dropout
masks with `bernoulli_` (other masks from the same distribution).
`TT_NATIVE_KERNELS=0` in the environment, or `native_kernels(False)`, turns the kernels off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trajectory_transformer.model.kv_cache import SharedPrefixKVCache

if TYPE_CHECKING:
    from trajectory_transformer.model.gpt import TrajectoryGPT

SOURCE = Path(__file__).parent / "csrc" / "cpu_kernels.cpp"
ENV_SWITCH = "TT_NATIVE_KERNELS"

_enabled = os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")
_module: object | None = None
_failure: str | None = None


def _build_options() -> tuple[str, list[str]]:
    """Extension name and compiler flags for this CPU and this source.

    The name carries the instruction set, so a cache shared between machines (a cluster's home
    directory) never loads AVX2 code on a CPU without it, and a hash of the source and of the
    torch and Python it compiles against (their header paths are written into the build
    file), so that checkouts of the same source in one environment share one build, and
    other sources or environments never rebuild each other's.
    """
    capability = torch.backends.cpu.get_cpu_capability()  # "DEFAULT", "AVX2", "AVX512", ...
    flags = ["-O3", "-ffast-math", "-fopenmp"]
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and capability in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    else:
        capability = "generic"
    from torch.utils import cpp_extension

    environment = [torch.__version__, *cpp_extension.include_paths(), sysconfig.get_path("include")]
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update("\0".join([*environment, *flags]).encode())
    return f"trajectory_transformer_cpu_{capability.lower()}_{digest.hexdigest()[:10]}", flags


def _source_in_build_directory(name: str) -> Path:
    """The source, copied into the extension's build directory: torch's build file names the
    source by its path, so compiling from each checkout's own copy would rebuild every time
    another checkout had built last."""
    from torch.utils import cpp_extension

    try:
        copy = Path(cpp_extension._get_build_directory(name, verbose=False)) / SOURCE.name
    except AttributeError:  # a torch without this helper: build from the package's copy
        return SOURCE
    text = SOURCE.read_bytes()
    if not copy.is_file() or copy.read_bytes() != text:
        staged = copy.with_suffix(f".{os.getpid()}.tmp")
        staged.write_bytes(text)
        os.replace(staged, copy)  # atomic: a concurrent build never reads half a file
    return copy


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the `ninja` package's copy sits next to the interpreter of
    an environment that need not be activated."""
    if shutil.which("ninja") is None:
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _clear_stale_lock(name: str, older_than_s: float = 900.0) -> None:
    """torch guards a build with a `lock` file and waits, silently and forever, while it
    exists; a build that was killed (not interrupted) leaves it behind. One older than any
    build is removed."""
    from torch.utils import cpp_extension

    try:
        lock = Path(cpp_extension._get_build_directory(name, verbose=False)) / "lock"
        age = time.time() - lock.stat().st_mtime
    except (AttributeError, OSError):  # no lock, or a torch without this helper
        return
    if age > older_than_s:
        warnings.warn(f"removing a stale build lock {lock} ({age:.0f} s old)", stacklevel=3)
        lock.unlink(missing_ok=True)


def load(verbose: bool = False) -> object | None:
    """The compiled extension (built now if needed), or None where it cannot be built."""
    global _module, _failure
    if _module is not None or _failure is not None:
        return _module
    from torch.utils.cpp_extension import load as load_extension

    name, flags = _build_options()
    # Loading a built extension takes well under a second; if this takes longer, it compiles.
    notice = threading.Timer(
        3.0,
        lambda: print(
            f"compiling the native CPU kernels ({name}; once per machine, about a minute)",
            file=sys.stderr,
            flush=True,
        ),
    )
    notice.start()
    try:
        _put_ninja_on_path()
        _clear_stale_lock(name)
        source = _source_in_build_directory(name)
        _module = load_extension(name, [str(source)], extra_cflags=flags, verbose=verbose)
    except Exception as error:  # compiler, ninja or linker missing or failing
        _failure = f"{type(error).__name__}: {str(error).strip()[-800:]}"
        warnings.warn(
            "the native CPU kernels could not be built, so planning and CPU training with "
            f"dropout use the slower PyTorch path ({_failure}); install a C++ compiler and "
            f"`pip install ninja`, or set {ENV_SWITCH}=0 to silence this",
            RuntimeWarning,
            stacklevel=2,
        )
    finally:
        notice.cancel()
    return _module


def kernels() -> object | None:
    """The compiled module (`Decoder`, `decode_attention`), or None when the kernels are
    off or cannot be built here."""
    if not _enabled:
        return None
    return _module if _module is not None else load()


def decoder(
    model: TrajectoryGPT, cache: object, module_step: Callable[[torch.Tensor, int], torch.Tensor]
) -> Callable[[torch.Tensor, int], torch.Tensor] | None:
    """`model`'s decode step over `cache` as one native call per step, or None where the
    kernels do not apply: they serve inference on the CPU in float32 over a
    `SharedPrefixKVCache`, and are off or could not be built. The parameters and the cache's
    buffers are bound once; `module_step` (the PyTorch step) writes the prefix at position 0."""
    p = model.head_weight
    if (
        not isinstance(cache, SharedPrefixKVCache)
        or model.training
        or torch.is_grad_enabled()
        or p.device.type != "cpu"
        or p.dtype != torch.float32
    ):
        return None
    module = kernels()
    if module is None:
        return None
    c = model.config
    layers: list[torch.Tensor] = []
    eps: list[float] = []
    for layer, b in enumerate(model.blocks):
        layers += [
            b.ln_1.weight,
            b.ln_1.bias,
            b.attn.c_attn.weight.t().contiguous(),  # (in, out): see csrc
            b.attn.c_attn.bias,
            b.attn.c_proj.weight.t().contiguous(),
            b.attn.c_proj.bias,
            b.ln_2.weight,
            b.ln_2.bias,
            b.mlp.c_fc.weight.t().contiguous(),
            b.mlp.c_fc.bias,
            b.mlp.c_proj.weight.t().contiguous(),
            b.mlp.c_proj.bias,
            *cache.native_layer(layer),  # prefix keys, values; own keys, values
        ]
        eps += [b.ln_1.eps, b.ln_2.eps]
    bound = module.Decoder(
        [t.detach() for t in layers],
        eps,
        model.tok_emb.weight.detach(),
        model.pos_emb.weight.detach(),
        model.ln_f.weight.detach(),
        model.ln_f.bias.detach(),
        model.ln_f.eps,
        model.head_weight.detach(),
        model.head_bias.detach(),
        c.transition_dim,
    )
    block_size = c.block_size

    def step(tokens: torch.Tensor, position: int) -> torch.Tensor:
        if position == 0:  # this token starts the shared prefix: the prefill path
            return module_step(tokens, position)
        if position >= block_size:
            raise ValueError(f"position {position} exceeds the block size {block_size}")
        own = cache.own_position(position, tokens.shape[0])
        # Each block also writes this token's key and value at own position `own`.
        return bound.step(tokens, position, cache.prefix_length, own, cache.group_of_row())

    return step


@contextlib.contextmanager
def native_kernels(enabled: bool) -> Iterator[None]:
    """Turn the native kernels on or off inside a `with` block (e.g. to compare both paths)."""
    global _enabled
    previous, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = previous


def main() -> None:
    """Build the kernels now (setup step of `make demo` and `make test`)."""
    start = time.perf_counter()
    module = load(verbose=False)
    name, flags = _build_options()
    if module is None:
        print(f"native kernels unavailable: {_failure}; the PyTorch path will be used")
    else:
        took = time.perf_counter() - start
        print(f"native kernel {name} ready ({took:.1f} s; flags {' '.join(flags)})")
