"""The model's decode steps besides the PyTorch one (`TrajectoryGPT.static_decoder`, the
reference for all of them): the native CPU kernel (`native.py`, its C++ source in `csrc/`),
the fused Triton step for CUDA (`fused.py`, its kernels in `fused_kernels.py`), and the CUDA
graph capture that replays a step of fixed shapes (`captured.py`)."""
