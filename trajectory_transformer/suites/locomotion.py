"""Embedded offline datasets for terminating MuJoCo locomotion (``Hopper-v5``,
``Walker2d-v5``), collected from shipped SAC policies.

The D4RL recipe on tasks that end when the agent falls, built on demand and offline like the
Pendulum and Reacher suites. The behaviour policies are small actors trained once with SAC by
``scripts/train_behaviour_policy.py`` and shipped in ``suites/policies/<task>/`` (their README
gives the recipe and the returns). Episodes are stepped by gymnasium's own env (MuJoCo; a
synchronous vector env of ``NUM_ENVS`` envs, each starting the next reset seed as soon as its
episode ends: :func:`~trajectory_transformer.suites.collect.rollout`). An episode ends by
**termination** when the body falls (unhealthy height or angle) or by **truncation** at the
1,000-step time limit; Minari stores the two flags apart, as the environment returned them.
The data is what gymnasium and MuJoCo compute on the machine that builds it, so returns may
differ between CPUs in the last digits.

Datasets of each task ``<task>`` (the actors' tanh-mean actions plus Gaussian noise, clipped
to ``[-1, 1]``):

* ``<task>/medium-v0``: the medium actor (about a third of the expert's return), noise
  ``NOISE["medium"]``, until ``TRANSITIONS["medium"]`` transitions.
* ``<task>/medium-replay-v0``: noisy rollouts of the intermediate snapshots of the same SAC
  run (at about a quarter, a half and three quarters of the medium return) and of the medium
  actor, equal shares of ``TRANSITIONS["medium-replay"]``. D4RL's medium-replay is the replay
  buffer of the medium policy's training; that buffer is not shipped, so its stages are
  sampled again from snapshots.
* ``<task>/expert-v0``: the expert actor, noise ``NOISE["expert"]``.
* ``<task>/medium-expert-v0``: the episodes of ``medium-v0`` followed by those of
  ``expert-v0`` (the same seeds, so the same episodes).

Reference scores, stored in every dataset's metadata: ``ref_min_score`` is the mean return of
the uniform random policy and ``ref_max_score`` that of the deterministic expert actor, each
over 100 seeded episodes (:meth:`Locomotion.reference_scores`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trajectory_transformer.suites import collect
from trajectory_transformer.suites.actors import GaussianActor, one_thread

POLICIES = Path(__file__).parent / "policies"
REFERENCE_EPISODES = 100
NOISE = {"medium": 0.1, "medium-replay": 0.1, "expert": 0.05}
"""Standard deviation of the Gaussian action noise of each dataset's rollouts."""
TRANSITIONS = {"medium": 100_000, "medium-replay": 60_000, "expert": 100_000}
"""Each dataset is collected until it holds at least this many transitions."""
NUM_ENVS = 25  # episodes stepped together in one vector env
_STAGE_SEEDS = 100_000  # medium-replay: each snapshot's seeds start this far after the last's
_KIND_OFFSET = {"medium": 1, "medium-replay": 2, "expert": 3}  # each kind's block of seeds


@dataclass(eq=False)
class Locomotion:
    """One task's suite: its env, its shipped actors (in `policy_dir`) and how its datasets
    are played from them. `suite` is what the registry builds with."""

    env_id: str
    task: str
    """The datasets' namespace (``hopper``: ``hopper/medium-v0``) and the actors' folder."""
    action_dim: int
    policy_dir: Path
    """Where the shipped actors are: `POLICIES / task`."""
    _actors: dict[str, GaussianActor] = field(default_factory=dict, repr=False)
    _references: dict[tuple[int, int], tuple[float, float]] = field(
        default_factory=dict, repr=False
    )

    def clear_caches(self) -> None:
        """Forget loaded actors and reference scores (after `policy_dir` changes)."""
        self._actors.clear()
        self._references.clear()

    def actor(self, name: str) -> GaussianActor:
        """A shipped actor: `expert`, `medium` or `replay_<i>` (loaded once)."""
        if name not in self._actors:
            path = self.policy_dir / f"{name}.pt"
            if not path.is_file():
                run = f"outputs/sac-{self.task}"
                raise FileNotFoundError(
                    f"the {self.env_id} behaviour policy {path} is missing: train and select "
                    f"the actors with `python scripts/train_behaviour_policy.py --env "
                    f"{self.env_id} --run-dir {run}`, then `... --run-dir {run} --select "
                    f"{self.policy_dir}`"
                )
            self._actors[name] = GaussianActor.load(path)
        return self._actors[name]

    def replay_actors(self) -> list[str]:
        """The intermediate snapshots, earliest first, then the medium actor."""
        return [p.stem for p in sorted(self.policy_dir.glob("replay_*.pt"))] + ["medium"]

    def noisy(self, name: str, noise: float) -> collect.Policy:
        policy = self.actor(name)
        return lambda obs, rng: policy.act(obs, noise, rng)

    def uniform_random(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(-1.0, 1.0, size=(len(obs), self.action_dim))

    def episodes_of(self, kind: str, episodes: int | None, seed: int) -> collect.Rollout:
        """The episodes of one policy kind (`medium`, `medium-replay`, `expert`): `episodes`
        of them (per snapshot for medium-replay), or by default the first ones (by seed) that
        hold `TRANSITIONS[kind]` transitions (an equal share per snapshot)."""
        names = self.replay_actors() if kind == "medium-replay" else [kind]
        budget = TRANSITIONS[kind] // len(names)
        parts = []
        with one_thread():
            for stage, name in enumerate(names):
                parts.append(
                    collect.play(
                        self.env_id,
                        self.noisy(name, NOISE[kind]),
                        seed=seed,
                        kind=_KIND_OFFSET[kind],
                        episodes=episodes,
                        first=stage * _STAGE_SEEDS,
                        transitions=None if episodes is not None else budget,
                        num_envs=NUM_ENVS,
                    )
                )
        return collect.Rollout.concatenate(parts)

    def reference_scores(
        self, seed: int = 0, episodes: int = REFERENCE_EPISODES
    ) -> tuple[float, float]:
        """(uniform random, deterministic expert) mean returns over `episodes` seeded
        episodes (computed once per process)."""
        if (seed, episodes) not in self._references:
            with one_thread():
                self._references[seed, episodes] = collect.reference_scores(
                    self.env_id,
                    self.uniform_random,
                    self.noisy("expert", 0.0),
                    seed,
                    episodes,
                    num_envs=NUM_ENVS,
                )
        return self._references[seed, episodes]

    def describe(self, collected: collect.Collected) -> str:
        kinds = collected.dataset.kinds
        noise = (
            ", ".join(f"{k} {NOISE[k]}" for k in kinds) if len(kinds) > 1 else str(NOISE[kinds[0]])
        )
        return (
            f"{collect.describe_terminating(collected)}; action noise {noise}, base seed "
            f"{collected.seed}. Behaviour policies: "
            f"trajectory_transformer/suites/policies/{self.task} (SAC)."
        )

    @property
    def datasets(self) -> dict[str, collect.Dataset]:
        env, task = self.env_id, self.task
        return {
            f"{task}/medium-v0": collect.Dataset(
                f"{env}, the SAC medium actor (a third of the expert) with noise.",
                "SAC actor, medium",
                ("medium",),
            ),
            f"{task}/medium-replay-v0": collect.Dataset(
                f"{env}, noisy SAC snapshots from early training to medium.",
                "SAC actor, medium-replay",
                ("medium-replay",),
            ),
            f"{task}/expert-v0": collect.Dataset(
                f"{env}, the SAC expert actor with small noise.", "SAC actor, expert", ("expert",)
            ),
            f"{task}/medium-expert-v0": collect.Dataset(
                f"{env}, {task}/medium-v0 and {task}/expert-v0 together.",
                "SAC actor, medium-expert",
                ("medium", "expert"),
            ),
        }

    @functools.cached_property
    def suite(self) -> collect.Suite:
        return collect.Suite(
            env_id=self.env_id,
            datasets=self.datasets,
            episodes_of=self.episodes_of,
            reference_scores=self.reference_scores,
            describe=self.describe,
            namespace_description=f"{self.env_id} datasets built locally from shipped SAC "
            "policies.",
            default_episodes=None,  # TRANSITIONS
            reference_episodes=REFERENCE_EPISODES,
        )


HOPPER = Locomotion("Hopper-v5", "hopper", 3, POLICIES / "hopper")
WALKER2D = Locomotion("Walker2d-v5", "walker2d", 6, POLICIES / "walker2d")
