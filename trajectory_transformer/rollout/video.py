"""Write rendered frames to a gif or mp4."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_video(frames: list[np.ndarray], path: str | Path, fps: int = 30) -> Path:
    """Save frames (H, W, 3) uint8; `.gif` needs only Pillow, `.mp4` needs imageio-ffmpeg."""
    import imageio.v2 as imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gif":
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    elif path.suffix == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise RuntimeError(
                "mp4 videos need imageio-ffmpeg: `pip install imageio-ffmpeg`, or use "
                "eval.video_format=gif."
            ) from None
        imageio.mimsave(path, frames, fps=fps)
    else:
        raise ValueError(f"unsupported video format {path.suffix!r}; use .gif or .mp4")
    return path
