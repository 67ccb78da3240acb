"""What limits behaviour cloning of a dataset's policy: a small MLP trained on the data's
(observation, action) pairs with the Trajectory Transformer's choices taken one at a time,
each played in closed loop in the dataset's evaluation environment.

    python scripts/imitation_probe.py inverteddoublependulum/medium-v0 \
        --record training-budgets/what-limits-imitation-on-the-double-pendulum

The MLP (two hidden layers of 256, GELU, AdamW without decay, batches of 256) sees the
observation alone, as input:

* `real`: the observation, standardised per dimension;
* `tokens`: the observation's tokens (the project's quantile discretiser, 100 bins), each
  dimension's token through a learned embedding, summed;
* `real + tokens`: both, summed.

Its action output is a regression (squared error), or categorical over 100 bins of the action
(quantile or uniform), trained with cross-entropy against the token itself (`one-hot`) or
against a Gaussian over the bins around the action's real value (`Gaussian, sigma 1`:
`trainer.target_sigma`'s targets, `loss.GaussianTargets`). A categorical output acts with its
most likely bin, the mean of its distribution, or a sample of it. Each variant plays the
evaluation episodes (`--episodes`, from reset seeds 1000, 1001, ...) with its normalised score.
A categorical head that imitates the policy here, where the transformer does not, says that
the transformer's inputs or optimisation, not its categorical outputs, are what is missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from render_results import RECORDS, write_measured

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.scores import normalized_score
from trajectory_transformer.training.loss import GaussianTargets

BINS = 100
HIDDEN = 256
BATCH = 256


@dataclasses.dataclass(frozen=True)
class Variant:
    inputs: str  # real, tokens, real + tokens
    output: str  # regression, categorical
    bins: str = ""  # quantile, uniform (categorical outputs)
    sigma: float = 0.0  # Gaussian targets' standard deviation in bins; 0: one-hot
    steps: int = 6000
    learning_rate: float = 1e-3

    def targets(self) -> str:
        if self.output == "regression":
            return "squared error"
        return f"Gaussian, sigma {self.sigma:g}" if self.sigma > 0 else "one-hot"


VARIANTS = (
    Variant("real", "regression"),
    Variant("tokens", "regression"),
    Variant("real", "categorical", "quantile"),
    Variant("real", "categorical", "uniform"),
    Variant("real", "categorical", "uniform", learning_rate=3e-3),
    Variant("real", "categorical", "quantile", 1.0, learning_rate=3e-3),
    Variant("real", "categorical", "uniform", 1.0),
    Variant("real", "categorical", "uniform", 1.0, steps=2000, learning_rate=3e-3),
    Variant("real", "categorical", "uniform", 1.0, learning_rate=3e-3),
    Variant("real + tokens", "categorical", "uniform", 1.0, learning_rate=3e-3),
    Variant("tokens", "categorical", "uniform", 1.0, learning_rate=3e-3),
)


class Imitator(torch.nn.Module):
    def __init__(self, variant: Variant, observations: np.ndarray, outputs: int) -> None:
        super().__init__()
        self.variant = variant
        self.loc = torch.tensor(observations.mean(0))
        self.scale = torch.tensor(observations.std(0) + 1e-8)
        dims = observations.shape[1]
        self.tokens = Discretizer.fit(observations, BINS, "quantile")
        self.offsets = torch.arange(dims) * BINS
        self.linear = torch.nn.Linear(dims, HIDDEN)
        self.embedding = torch.nn.Embedding(dims * BINS, HIDDEN)
        self.body = torch.nn.Sequential(
            torch.nn.GELU(),
            torch.nn.Linear(HIDDEN, HIDDEN),
            torch.nn.GELU(),
            torch.nn.Linear(HIDDEN, outputs),
        )

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        hidden = torch.zeros(len(observations), HIDDEN)
        if "real" in self.variant.inputs:
            hidden = hidden + self.linear((observations - self.loc) / self.scale)
        if "tokens" in self.variant.inputs:
            tokens = self.tokens.encode(observations) + self.offsets
            hidden = hidden + self.embedding(tokens).sum(1)
        return self.body(hidden)


def train(variant: Variant, observations: np.ndarray, actions: np.ndarray, seed: int):
    """The trained imitator and its policy: observations (E, O) -> actions {decoding: (E, A)}."""
    torch.manual_seed(seed)
    A = actions.shape[1]
    x, y = torch.tensor(observations), torch.tensor(actions)
    categorical = variant.output == "categorical"
    model = Imitator(variant, observations, A * BINS if categorical else A)
    if categorical:
        bins = Discretizer.fit(actions, BINS, variant.bins)
        tokens = bins.encode(y)  # (M, A)
        if variant.sigma > 0:
            dims = torch.arange(A)
            targets = GaussianTargets(bins, variant.sigma, torch.device("cpu"))(tokens, y, dims)
        else:
            targets = F.one_hot(tokens, BINS).float()  # (M, A, N)
    optimizer = torch.optim.AdamW(model.parameters(), variant.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(variant.steps):
        batch = torch.randint(0, len(x), (BATCH,), generator=generator)
        out = model(x[batch])
        if categorical:
            log_probs = out.view(-1, A, BINS).log_softmax(-1)
            loss = -(targets[batch] * log_probs).sum(-1).mean()
        else:
            loss = F.mse_loss(out, y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    @torch.no_grad()
    def act(obs: np.ndarray, rng: torch.Generator) -> dict[str, np.ndarray]:
        out = model(torch.as_tensor(obs, dtype=torch.float32))
        if not categorical:
            return {"regression": out.numpy()}
        probs = out.view(-1, A, BINS).softmax(-1)
        values = bins.values  # (A, N)
        picks = {
            "most likely": probs.argmax(-1),
            "sampled": torch.multinomial(probs.flatten(0, 1), 1, generator=rng).view(-1, A),
        }
        decoded = {
            k: torch.gather(values.expand(len(v), -1, -1), 2, v[..., None])[..., 0]
            for k, v in picks.items()
        }
        decoded["mean"] = (probs * values).sum(-1)
        return {k: v.numpy() for k, v in decoded.items()}

    return act


def play(act, decoding: str, env_id: str, info, episodes: int, seed: int) -> tuple[float, float]:
    """Mean and standard error of the normalised score over `episodes`."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(episodes)])
    obs, _ = envs.reset(seed=[1000 + i for i in range(episodes)])
    low, high = np.array(info.action_low), np.array(info.action_high)
    rng = torch.Generator().manual_seed(seed)
    returns, alive = np.zeros(episodes), np.ones(episodes, bool)
    while alive.any():
        action = np.clip(act(obs.astype(np.float32), rng)[decoding], low, high)
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns += reward * alive
        alive &= ~(terminated | truncated)
    envs.close()
    scores = normalized_score(returns, info.ref_min_score, info.ref_max_score)
    return float(scores.mean()), float(scores.std(ddof=1) / np.sqrt(episodes))


def write_record(name: str, rows: list[list[str]], dataset: str, data_score: float) -> Path:
    """The table as the results record `name` (docs/results/records/<name>.json)."""
    path = RECORDS / f"{name}.json"
    columns = [
        "inputs",
        "action output",
        "targets",
        "steps, learning rate",
        "most likely action",
        "mean action",
        "sampled action",
    ]
    note = f"The data's own score: {data_score:.1f}."
    title = f"What limits imitation on {dataset}"
    write_measured(path, title, "imitation_probe.py", note, columns, rows)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="a Minari dataset id")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", type=int, nargs="*", help="indices into VARIANTS")
    parser.add_argument("--record", help="write the table as this results record")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    episodes, info = load_episodes(args.dataset)
    observations = episodes.observations.astype(np.float32)
    actions = episodes.actions.astype(np.float32)
    data_score = float(
        normalized_score(episodes.episode_returns(), info.ref_min_score, info.ref_max_score).mean()
    )
    print(f"{args.dataset}: {len(actions):,} transitions, the data scores {data_score:.1f}")
    chosen = range(len(VARIANTS)) if args.variants is None else args.variants
    rows = []
    for index in chosen:
        variant = VARIANTS[index]
        start = time.perf_counter()
        act = train(variant, observations, actions, args.seed)
        seconds = time.perf_counter() - start
        decodings = (
            ("regression",)
            if variant.output == "regression"
            else ("most likely", "mean", "sampled")
        )
        scores = {
            d: play(act, d, info.eval_env_id, info, args.episodes, args.seed) for d in decodings
        }
        cell = {d: f"{m:.1f} ± {s:.1f}" for d, (m, s) in scores.items()}
        output = (
            variant.output
            if variant.output == "regression"
            else (f"categorical, {variant.bins} bins")
        )
        rows.append(
            [
                variant.inputs,
                output,
                variant.targets(),
                f"{variant.steps:,}, {variant.learning_rate:g}",
                cell.get("most likely", cell.get("regression")),
                cell.get("mean", ""),
                cell.get("sampled", ""),
            ]
        )
        print(" | ".join(rows[-1]) + f" | trained in {seconds:.0f} s", flush=True)
    if args.record:
        print(f"wrote {write_record(args.record, rows, args.dataset, data_score)}")


if __name__ == "__main__":
    main()
