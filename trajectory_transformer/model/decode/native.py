"""Native CPU kernels, compiled once per machine with `torch.utils.cpp_extension`.

The planner's decode steps on the CPU run one new token per row through the model: at a few
dozen rows, eager PyTorch spends more time on operator calls (the attention over a
shared-prefix cache alone is a dozen tiny ones per layer) than on arithmetic.
`csrc/cpu_kernels.cpp` holds the whole decode step as one C++ call (`Decoder.step`: embedding,
every block with that attention, final norm and head), and the attention on its own
(`decode_attention`, for tests). `decoder()` binds a model and a cache to it; the weights it
needs in another layout (the Linear weights transposed) are prepared once per version of the
model's parameters, not per plan call. The same extension draws the training dropout
(`dropout`, used by `dropout.Dropout` and `dropout.dropout_attention`), where torch's
`bernoulli_` is a large part of a training step.

Building. On first use (about a minute, with the machine's C++ compiler and ninja; `make demo`
and `make test` do it during setup with `native.main()`), the extension is built into
`<root>/trajectory_transformer/<name>`, the root being `TORCH_EXTENSIONS_DIR` or torch's
default (`~/.cache/torch_extensions`), and afterwards imported from there without running
the build again. The name carries the instruction set and a hash of the source, the flags,
torch and Python, so checkouts of the same source share one build, and other sources, CPUs
or environments never load each other's binaries. A finished build is never modified: each
build runs in a fresh temporary directory beside it and is renamed into place in one step.
So a build that is killed leaves only its temporary directory behind (nothing waits on it,
unlike torch's own build lock), and of two processes building at once, the first to finish
publishes its build and the other keeps the module it built for itself.

Where it cannot be built (no compiler), the model falls back to the PyTorch implementation
with one warning: decode results agree up to float rounding, and training draws its dropout
masks with `bernoulli_` (other masks from the same distribution).
`TT_NATIVE_KERNELS=0` in the environment, or `native_kernels(False)`, turns the kernels off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
    directory) never loads AVX2 code on a CPU without it, and a hash of the source, the flags
    and the torch and Python it compiles against, so that checkouts of the same source in one
    environment share one build, and other sources or environments never load each other's.
    """
    capability = torch.backends.cpu.get_cpu_capability()  # "DEFAULT", "AVX2", "AVX512", ...
    flags = ["-O3", "-fopenmp"]
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


def build_directory(name: str) -> Path:
    """Where the extension `name` is built: `<root>/trajectory_transformer/<name>`, the root
    being `TORCH_EXTENSIONS_DIR` or torch's default for extensions."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / "trajectory_transformer" / name


def _library(directory: Path, name: str) -> Path:
    """The compiled module that `cpp_extension.load` leaves in `directory`."""
    return directory / f"{name}{'.pyd' if sys.platform == 'win32' else '.so'}"


def _import_library(name: str, path: Path) -> object:
    """Import the compiled module at `path` (a finished build) without building anything."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the `ninja` package's copy sits next to the interpreter of
    an environment that need not be activated."""
    if shutil.which("ninja") is None:
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _build_or_import(name: str, flags: list[str], verbose: bool) -> object:
    """The extension `name`: imported from its finished build, or built (see the module
    docstring) in a temporary directory that is then renamed to the build directory."""
    from torch.utils import cpp_extension

    final = build_directory(name)
    if _library(final, name).is_file():
        return _import_library(name, _library(final, name))
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{name}.building-", dir=final.parent))
    try:
        _put_ninja_on_path()
        module = cpp_extension.load(
            name, [str(SOURCE)], build_directory=str(staging), extra_cflags=flags, verbose=verbose
        )
        with contextlib.suppress(OSError):  # another process published the same build first
            os.rename(staging, final)
        return module  # already imported, from wherever its file now is
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already if it was renamed


def load(verbose: bool = False) -> object | None:
    """The compiled extension (built now if needed), or None where it cannot be built."""
    global _module, _failure
    if _module is not None or _failure is not None:
        return _module
    name, flags = _build_options()
    # Importing a finished build takes well under a second; if this takes longer, it compiles.
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
        _module = _build_or_import(name, flags, verbose)
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


@dataclass(frozen=True)
class PreparedWeights:
    """A model's parameters as `Decoder` takes them: the Linear weights transposed to
    (in, out) and contiguous (see csrc), the others detached views of the parameters."""

    layers: list[list[torch.Tensor]]
    """Per block: ln_1 weight, bias; attention in (C, 3C), bias; attention out (C, C), bias;
    ln_2 weight, bias; MLP in (C, 4C), bias; MLP out (4C, C), bias."""
    eps: list[float]
    """Per block: ln_1's and ln_2's epsilon."""
    tok_emb: torch.Tensor
    """`model.embedding_table()`: with value inputs, each token's decoded value included."""
    pos_emb: torch.Tensor
    ln_f_weight: torch.Tensor
    ln_f_bias: torch.Tensor
    ln_f_eps: float
    head_weight: torch.Tensor
    head_bias: torch.Tensor


# Per model: the parameters' versions when its weights were prepared, and those weights.
_prepared: weakref.WeakKeyDictionary[TrajectoryGPT, tuple[tuple, PreparedWeights]] = (
    weakref.WeakKeyDictionary()
)


def _parameter_versions(model: TrajectoryGPT) -> tuple | None:
    """Changes whenever a parameter or buffer does: an in-place change (an optimiser step,
    `load_state_dict`, an edit under `no_grad`) bumps its version counter, and a new tensor
    (`.to()`, `.data = ...`) has another address. Like autograd, it cannot see writes through
    `.data`. None where a parameter was made under `inference_mode`: such tensors keep no
    version counter."""
    parameters = [*model.parameters(), *model.buffers()]
    if any(p.is_inference() for p in parameters):
        return None
    return tuple((p._version, p.data_ptr()) for p in parameters)


def _prepare(model: TrajectoryGPT) -> PreparedWeights:
    layers, eps = [], []
    for b in model.blocks:
        layers.append(
            [
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
            ]
        )
        eps += [b.ln_1.eps, b.ln_2.eps]
    return PreparedWeights(
        layers=[[t.detach() for t in layer] for layer in layers],
        eps=eps,
        tok_emb=model.embedding_table().detach(),
        pos_emb=model.pos_emb.weight.detach(),
        ln_f_weight=model.ln_f.weight.detach(),
        ln_f_bias=model.ln_f.bias.detach(),
        ln_f_eps=model.ln_f.eps,
        head_weight=model.head_weight.detach(),
        head_bias=model.head_bias.detach(),
    )


def prepared_weights(model: TrajectoryGPT) -> PreparedWeights:
    """`model`'s weights for the native decoder, prepared once per version of its parameters:
    a planner's plan calls share them, and training or `load_state_dict` in between makes the
    next call prepare them again. Parameters made under `inference_mode` are prepared anew
    for every call."""
    versions = _parameter_versions(model)
    if versions is None:  # nothing to tell a change by: prepared for this call only
        return _prepare(model)
    entry = _prepared.get(model)
    if entry is None or entry[0] != versions:
        # Normal tensors even when called under inference_mode: they outlive this call.
        with torch.inference_mode(False), torch.no_grad():
            entry = (versions, _prepare(model))
        _prepared[model] = entry
    return entry[1]


def decoder(
    model: TrajectoryGPT,
    cache: object,
    module_step: Callable[..., torch.Tensor],
) -> Callable[..., torch.Tensor] | None:
    """`model`'s decode step over `cache` as one native call per step, or None where the
    kernels do not apply: they serve inference on the CPU in float32 over a
    `SharedPrefixKVCache`, and are off or could not be built. The weights (`prepared_weights`)
    and the cache's buffers are bound once; `module_step` (the PyTorch step) writes the prefix
    at position 0."""
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
    weights = prepared_weights(model)
    layers: list[torch.Tensor] = []
    for layer, parameters in enumerate(weights.layers):
        layers += [*parameters, *cache.native_layer(layer)]  # then prefix k, v; own k, v
    bound = module.Decoder(
        layers,
        weights.eps,
        weights.tok_emb,
        weights.pos_emb,
        weights.ln_f_weight,
        weights.ln_f_bias,
        weights.ln_f_eps,
        weights.head_weight,
        weights.head_bias,
        model.config.transition_dim,
    )
    config = model.config
    block_size, T = config.block_size, config.transition_dim
    no_extra = torch.empty(0)

    def step(
        tokens: torch.Tensor, position: int | torch.Tensor, observation: torch.Tensor | None = None
    ) -> torch.Tensor:
        # The kernel takes the position as an int: on the CPU, reading one waits for nothing.
        position = int(position)
        if position == 0 or (config.observation_vector and observation is None):
            # The prefill path starts the shared prefix; a missing observation vector is
            # refused there.
            return module_step(tokens, position, observation)
        if position >= block_size:
            raise ValueError(f"position {position} exceeds the block size {block_size}")
        own = cache.own_position(position, tokens.shape[0])
        taken = config.observation_vector and position % T >= config.observation_dim - 1
        extra = observation.contiguous() if taken else no_extra
        # Each block also writes this token's key and value at own position `own`.
        return bound.step(tokens, position, cache.prefix_length, own, cache.group_of_row(), extra)

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
