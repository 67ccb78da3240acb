"""Train the behaviour policy of an embedded dataset suite with SAC, on the CPU, and pick the
snapshots that ship with the package.

Soft actor-critic (Haarnoja et al., 2018): twin Q critics with Polyak-averaged targets, a
tanh-squashed Gaussian actor (`trajectory_transformer.suites.actors.GaussianActor`, the only
network that ships) and an automatically tuned entropy temperature. Every `--eval-every`
steps the deterministic actor plays `--eval-episodes` episodes and is saved as a snapshot with
its mean return; `--select` then copies the best snapshot (expert), the one closest to a third
of its return (medium, as D4RL's medium policies) and intermediate ones (for medium-replay)
into the package, with a README of the recipe and the returns.

    python scripts/train_behaviour_policy.py --run-dir outputs/sac-hopper            # train
    python scripts/train_behaviour_policy.py --run-dir outputs/sac-hopper --resume   # go on
    python scripts/train_behaviour_policy.py --run-dir outputs/sac-hopper --select \\
        trajectory_transformer/suites/policies/hopper
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shutil
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from trajectory_transformer.suites.actors import GaussianActor


class TwinQ(nn.Module):
    """Both critics as one batched MLP: (obs, act) -> (2, B) Q-values."""

    def __init__(self, in_dim: int, hidden: int = 256) -> None:
        super().__init__()
        shapes = [(in_dim, hidden), (hidden, hidden), (hidden, 1)]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in shapes:
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's initialisation
            self.weights.append(
                nn.Parameter(torch.empty(2, fan_in, fan_out).uniform_(-bound, bound))
            )
            self.biases.append(nn.Parameter(torch.empty(2, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        h = torch.cat([obs, act], -1).expand(2, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = F.relu(h)
        return h.squeeze(-1)


def sample_action(actor: GaussianActor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterised tanh-Gaussian action and its log-probability."""
    mean, log_std = actor(obs)
    std = log_std.exp()
    u = mean + std * torch.randn_like(mean)
    action = torch.tanh(u)
    log_prob = (-0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_prob = log_prob - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)  # tanh's Jacobian
    return action, log_prob


class SAC:
    def __init__(self, obs_dim: int, act_dim: int, args: argparse.Namespace) -> None:
        device = torch.device(args.device)
        self.actor = GaussianActor(obs_dim, act_dim, args.actor_hidden).to(device)
        self.critic = TwinQ(obs_dim + act_dim, args.critic_hidden).to(device)
        self.target = TwinQ(obs_dim + act_dim, args.critic_hidden).to(device)
        self.target.load_state_dict(self.critic.state_dict())
        self.target.requires_grad_(False)
        self.log_alpha = torch.zeros((), device=device, requires_grad=True)
        self.device = device
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=args.lr, fused=True)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=args.lr, fused=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=args.lr, fused=True)
        self.target_entropy = -float(act_dim)
        self.gamma, self.tau = args.gamma, args.tau
        self.critic_params = list(self.critic.parameters())
        self.target_params = list(self.target.parameters())

    def update(self, obs, act, rew, next_obs, terminated) -> None:
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_act, next_log_prob = sample_action(self.actor, next_obs)
            next_q = self.target(next_obs, next_act).min(0).values - alpha * next_log_prob
            target = rew + self.gamma * (1.0 - terminated) * next_q  # no bootstrap past a fall
        critic_loss = F.mse_loss(self.critic(obs, act), target.expand(2, -1), reduction="sum")
        self.critic_opt.zero_grad(set_to_none=True)
        (critic_loss / len(obs)).backward()
        self.critic_opt.step()

        # The actor's loss differentiates through the critic but not into its weights.
        self.critic.requires_grad_(False)
        new_act, log_prob = sample_action(self.actor, obs)
        q = self.critic(obs, new_act).min(0).values
        actor_loss = (alpha * log_prob - q).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        self.critic.requires_grad_(True)

        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()

        with torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.critic_params, self.tau)

    def state(self) -> dict:
        return {
            name: getattr(self, name).state_dict()
            for name in ("actor", "critic", "target", "actor_opt", "critic_opt", "alpha_opt")
        } | {"log_alpha": self.log_alpha.detach().clone()}

    def load(self, state: dict) -> None:
        for name in ("actor", "critic", "target", "actor_opt", "critic_opt", "alpha_opt"):
            getattr(self, name).load_state_dict(state[name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])


def evaluate(actor: GaussianActor, env_id: str, episodes: int, seed: int) -> tuple[float, float]:
    """Mean and standard deviation of the deterministic actor's return."""
    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(actor.act(obs[None])[0])
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns)), float(np.std(returns))


def train(args: argparse.Namespace) -> None:
    run = Path(args.run_dir)
    (run / "snapshots").mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # small networks: threads cost more than they give
    env = gym.make(args.env)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    assert np.allclose(env.action_space.low, -1) and np.allclose(env.action_space.high, 1)
    sac = SAC(obs_dim, act_dim, args)
    buffer = {
        "obs": np.zeros((args.steps, obs_dim), np.float32),
        "act": np.zeros((args.steps, act_dim), np.float32),
        "rew": np.zeros(args.steps, np.float32),
        "next_obs": np.zeros((args.steps, obs_dim), np.float32),
        "terminated": np.zeros(args.steps, np.float32),
    }
    step, episode, seconds = 0, 0, 0.0
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    checkpoint = run / "checkpoint.pt"
    if args.resume and checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False, map_location=args.device)
        sac.load(saved["sac"])
        step, episode, seconds = saved["step"], saved["episode"], saved.get("seconds", 0.0)
        for key in buffer:
            buffer[key][:step] = saved["buffer"][key]
        rng = saved["rng"]
        torch.set_rng_state(saved["torch_rng"].cpu())
        progress(f"resumed at step {step}")
    machine = f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}"
    (run / "config.json").write_text(json.dumps(vars(args) | {"machine": machine}, indent=2))
    with open(run / "log.jsonl", "a") as log:
        run_steps(args, env, sac, buffer, rng, step, episode, seconds, log, checkpoint)


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def run_steps(args, env, sac, buffer, rng, step, episode, seconds, log, checkpoint) -> None:
    """Steps the env and updates SAC once a step until `args.steps`, evaluating, saving a
    snapshot and a resumable checkpoint every `args.eval_every` steps."""
    run = Path(args.run_dir)
    act_dim = env.action_space.shape[0]
    obs, _ = env.reset(seed=args.seed + episode)
    episode_return, recent_returns = 0.0, []
    start, last_step, last_time = time.perf_counter() - seconds, step, time.perf_counter()
    while step < args.steps:
        if step < args.random_steps:
            action = rng.uniform(-1, 1, act_dim)
        else:
            with torch.no_grad():
                observation = torch.as_tensor(obs[None], dtype=torch.float32, device=sac.device)
                action = sample_action(sac.actor, observation)[0][0].cpu().numpy()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(
            buffer, (obs, action, reward, next_obs, float(terminated)), strict=True
        ):
            buffer[key][step] = value
        step += 1
        obs, episode_return = next_obs, episode_return + float(reward)
        if terminated or truncated:
            episode += 1
            recent_returns = [*recent_returns[-9:], episode_return]
            obs, _ = env.reset(seed=args.seed + episode)
            episode_return = 0.0
        if step >= args.random_steps:
            index = rng.integers(0, step, args.batch_size)
            sac.update(*(torch.from_numpy(buffer[key][index]).to(sac.device) for key in buffer))
        if step % args.log_every == 0:
            now = time.perf_counter()
            progress(
                f"step {step}: {(step - last_step) / (now - last_time):.0f} steps/s, "
                f"last {len(recent_returns)} training episodes' return "
                f"{np.mean(recent_returns) if recent_returns else float('nan'):.0f}"
            )
            last_step, last_time = step, now
        if step % args.eval_every == 0:
            actor = copy.deepcopy(sac.actor).cpu()  # snapshots are CPU actors
            mean, std = evaluate(actor, args.env, args.eval_episodes, seed=10_000)
            seconds = time.perf_counter() - start
            actor.save(
                run / "snapshots" / f"step_{step:07d}.pt",
                step=step,
                mean_return=mean,
                std_return=std,
                eval_episodes=args.eval_episodes,
            )
            record = {
                "step": step,
                "return": mean,
                "std": std,
                "episodes": episode,
                "alpha": float(sac.log_alpha.detach().exp()),
                "seconds": round(seconds, 1),
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            progress(json.dumps(record))
            torch.save(
                {
                    "sac": sac.state(),
                    "step": step,
                    "episode": episode,
                    "seconds": seconds,
                    "rng": rng,
                    "torch_rng": torch.get_rng_state(),
                    "buffer": {key: value[:step] for key, value in buffer.items()},
                },
                checkpoint.with_suffix(".tmp"),
            )
            checkpoint.with_suffix(".tmp").replace(checkpoint)
            last_step, last_time = step, time.perf_counter()  # steps/s leaves evaluations out


def select(args: argparse.Namespace) -> None:
    """Copy the expert, medium and intermediate snapshots into `args.select` with a README."""
    run, target = Path(args.run_dir), Path(args.select)
    snapshots = []
    for path in sorted((run / "snapshots").glob("step_*.pt")):
        actor = GaussianActor.load(path)
        snapshots.append((actor.metadata["step"], actor.metadata["mean_return"], path, actor))
    if not snapshots:
        raise SystemExit(f"no snapshots under {run / 'snapshots'}")
    expert = max(snapshots, key=lambda s: s[1])
    before_expert = [s for s in snapshots if s[0] < expert[0]]
    if not before_expert:
        raise SystemExit("the best snapshot is the first one: train longer before selecting")
    medium = min(before_expert, key=lambda s: abs(s[1] - expert[1] / 3))
    # Intermediate policies for medium-replay: spaced in return below the medium one.
    earlier = [s for s in snapshots if s[0] < medium[0]]
    if not earlier:
        raise SystemExit("no snapshot precedes the medium one: evaluate more often (--eval-every)")
    replay = []
    for fraction in (0.25, 0.5, 0.75):
        pick = min(earlier, key=lambda s: abs(s[1] - fraction * medium[1]))
        if pick not in replay:
            replay.append(pick)
    target.mkdir(parents=True, exist_ok=True)
    chosen = {"expert": expert, "medium": medium} | {
        f"replay_{i}": s for i, s in enumerate(sorted(replay, key=lambda s: s[0]))
    }
    rows = []
    for name, (step, mean, path, actor) in chosen.items():
        shutil.copyfile(path, target / f"{name}.pt")
        rows.append(f"| `{name}.pt` | {step:,} | {mean:.1f} ± {actor.metadata['std_return']:.1f} |")
    print("\n".join(rows))
    config = json.loads((run / "config.json").read_text())
    defaults = vars(parser().parse_args(["--run-dir", config["run_dir"]]))
    options = [
        f"--{key.replace('_', '-')} {value}"
        for key, value in config.items()
        if key not in ("run_dir", "resume", "select", "machine") and value != defaults[key]
    ]
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    last = max(records, key=lambda r: r["step"])
    every = [
        f"| {step:,} | {mean:.1f} ± {actor.metadata['std_return']:.1f} |"
        for step, mean, _, actor in snapshots
    ]
    (target / "README.md").write_text(
        README.format(
            env=config["env"],
            hidden=config["actor_hidden"],
            train=" ".join(["--run-dir", config["run_dir"], *options]),
            run_dir=config["run_dir"],
            target=args.select,
            steps=last["step"],
            stopped=""
            if last["step"] >= config.get("steps", 0)
            else f" (of the {config['steps']:,} asked for: the run was stopped there)",
            minutes=last["seconds"] / 60,
            rate=last["step"] / last["seconds"],
            machine=config.get("machine", "a machine not recorded"),
            episodes=config["eval_episodes"],
            rows="\n".join(rows),
            every="\n".join(every),
            config=json.dumps(config, indent=1),
        )
    )


README = """# Behaviour policies for {env}

Actors (`trajectory_transformer.suites.actors.GaussianActor`, 2 hidden layers of {hidden})
trained by `scripts/train_behaviour_policy.py`: SAC with twin critics, on the CPU, one thread.
Each file is a plain state dict with the actor's shape and its evaluation, loaded with
`torch.load(..., weights_only=True)`; running it needs torch only.

```bash
python scripts/train_behaviour_policy.py {train}
python scripts/train_behaviour_policy.py --run-dir {run_dir} --select {target}
```

{steps:,} environment steps{stopped}, one update each, in {minutes:.0f} minutes of wall time on
{machine} ({rate:.0f} steps/s, evaluations included).

| file | SAC step | return of the deterministic actor ({episodes} episodes, seeds 10,000+) |
|---|---|---|
{rows}

`expert` is the best snapshot, `medium` the earlier one closest to a third of its return
(D4RL's medium level), and the `replay_*` ones earlier snapshots at about a quarter, a half and
three quarters of the medium return, whose noisy rollouts make `medium-replay` with the medium
actor's.

Every evaluation of the run (mean ± standard deviation over its episodes):

| step | return |
|---|---|
{every}

Training settings:

```json
{config}
```
"""


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--steps", type=int, default=250_000)
    parser.add_argument("--random-steps", type=int, default=5_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--tau", type=float, default=0.005)
    parser.add_argument("--actor-hidden", type=int, default=128)
    parser.add_argument("--critic-hidden", type=int, default=128)
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--log-every", type=int, default=2_000, help="progress line period")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to update on a GPU")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--select", metavar="DIR", help="copy the chosen snapshots to DIR")
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.select:
        select(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
