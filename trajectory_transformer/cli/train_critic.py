"""`tt-train-critic`: fit an IQL critic and policy to a Minari dataset and write critic.pt.

`python -m trajectory_transformer.cli.train_critic ...` is the same. The run directory,
resume, progress bar, metrics.jsonl and wandb work as tt-train's. The critic scores the
planner's beams (`tt-eval planner.value=critic planner.critic=<run dir>/critic.pt`), and its
policy is a baseline agent (`tt-eval planner=iql planner.critic=<run dir>/critic.pt`)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from trajectory_transformer.checkpoint import CheckpointError, save_atomic
from trajectory_transformer.cli.common import (
    INTERRUPTED_EXIT_CODE,
    ConfigError,
    command,
    resolve_device,
    to_container,
)
from trajectory_transformer.cli.schemas import TrainCriticConfig
from trajectory_transformer.cli.train import MetricsLog, make_wandb_logger
from trajectory_transformer.critic.model import (
    IQLCritic,
    build_critic_payload,
    check_critic_matches,
    critic_from_payload,
    read_critic_payload,
)
from trajectory_transformer.critic.training import (
    CriticTrainer,
    GoalRelabelledTransitions,
    Transitions,
    critic_transitions,
    new_critic,
)
from trajectory_transformer.data.episodes import Episodes
from trajectory_transformer.data.goals import GoalLayout, env_goal_reward
from trajectory_transformer.data.minari_source import DatasetInfo, load_episodes

CHECKPOINT = "critic.pt"


def goal_transitions(
    transitions: Transitions, episodes: Episodes, info: DatasetInfo, critic: IQLCritic, share: float
) -> GoalRelabelledTransitions:
    """`transitions` conditioned on hindsight goals (`critic.relabel_goals`, `share`), their
    rewards from the dataset's evaluation env, scaled as `critic` records; a dataset that is
    not goal-conditioned is refused in one line."""
    try:
        return GoalRelabelledTransitions(
            transitions,
            episodes,
            GoalLayout.of(info.observation_layout),
            env_goal_reward(info.make_env()),
            share,
            critic.discount,
            critic.reward_scale,
            critic.reward_bias,
        )
    except ValueError as error:
        raise ConfigError(
            str(error).replace("dataset.relabel_goals=0", "critic.relabel_goals=0")
        ) from None


def train_critic(cfg: TrainCriticConfig) -> Path:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    device = resolve_device(cfg.device)
    config = to_container(cfg)
    torch.manual_seed(cfg.seed)
    episodes, info = load_episodes(cfg.dataset.id, cfg.dataset.download, cfg.dataset.env_id)
    print(
        f"dataset {info.dataset_id}: {info.num_episodes} episodes, {info.num_transitions} "
        f"transitions ({int(episodes.terminated.sum())} terminated, "
        f"{int(episodes.truncated.sum())} truncated episodes)"
    )
    resume = read_critic_payload(cfg.resume) if cfg.resume else None
    if resume is not None:
        critic, policy, trained_on = critic_from_payload(resume)
        check_critic_matches(trained_on, info, cfg.resume)
        # A critic from before hindsight goals trained on the dataset's own.
        saved = {"relabel_goals": 0.0} | resume["config"]["critic"]
        differences = [
            f"critic.{key}: checkpoint {saved.get(key)!r}, now {value!r}"
            for key, value in config["critic"].items()
            if key not in ("time_budget", "checkpoint_every", "log_every")
            and saved.get(key) != value
        ]
        if differences:
            raise CheckpointError(
                f"{cfg.resume} was trained with other settings ({'; '.join(differences)}); "
                "resume with the same ones, or start a new run."
            )
    else:
        critic, policy = new_critic(episodes, cfg.critic, info.action_low, info.action_high)
    critic, policy = critic.to(device), policy.to(device)
    transitions = critic_transitions(critic, episodes, device)
    if cfg.critic.relabel_goals > 0:
        transitions = goal_transitions(
            transitions, episodes, info, critic, cfg.critic.relabel_goals
        )
        print(
            f"goals: {cfg.critic.relabel_goals:.0%} of every batch conditioned on a goal its "
            "episode reaches later (critic.relabel_goals); reaching a goal terminates with "
            "the return of staying there"
        )
    checkpoint = run_dir / CHECKPOINT

    def save(training_state: dict) -> Path:
        payload = build_critic_payload(critic, policy, info, config, training_state)
        return save_atomic(payload, checkpoint)

    resumed_step = resume["training"]["step"] if resume is not None else 0
    metrics_log = MetricsLog(run_dir, cfg.resume and Path(cfg.resume), resumed_step)
    wandb_log, wandb_run = make_wandb_logger(cfg, config, run_dir)
    loggers = [metrics_log] + ([wandb_log] if wandb_log is not None else [])

    def log(metrics: dict, step: int) -> None:
        for logger in loggers:
            logger(metrics, step)

    trainer = CriticTrainer(critic, policy, transitions, cfg.critic, save, cfg.seed, log)
    if resume is not None:
        trainer.load_state(resume["training"])
        print(f"resumed from {cfg.resume} at step {trainer.step}/{cfg.critic.steps}")
    print(
        f"IQL: expectile {cfg.critic.expectile}, discount {cfg.critic.discount}, beta "
        f"{cfg.critic.beta}, rewards (terminations {critic.terminal_penalty:+g}) x "
        f"{critic.reward_scale:.4g} + {critic.reward_bias:g}; "
        f"{cfg.critic.steps} steps of {cfg.critic.batch_size} on {device}; run dir {run_dir}"
    )
    try:
        summary = trainer.train()
    except KeyboardInterrupt:
        saved = f"checkpoint of step {trainer.saved_step} in {checkpoint}"
        print(
            f"\ninterrupted at step {trainer.step}: {saved}; continue with "
            f"`tt-train-critic <same overrides> resume={checkpoint}`",
            file=sys.stderr,
        )
        sys.exit(INTERRUPTED_EXIT_CODE)
    finally:
        if wandb_run is not None:
            wandb_run.finish()
        metrics_log.close()
    print(summary.line())
    return checkpoint


@command("train_critic")
def main(cfg: DictConfig) -> None:
    train_critic(cfg)


if __name__ == "__main__":
    main()
