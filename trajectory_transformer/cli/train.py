"""`tt-train`: fit a Trajectory Transformer to a Minari dataset and write checkpoint.pt.

`python -m trajectory_transformer.cli.train ...` is the same as `tt-train ...`. Under
`torchrun --nproc-per-node=N -m trajectory_transformer.cli.train ...` every process runs
this, joins the process group, and trains its share of each batch; rank 0 alone prints,
logs and writes checkpoints. From Python, `train_in_subprocess` runs it the same way (a
notebook or a script that wants a checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from trajectory_transformer.checkpoint import (
    PLANNING_MODEL,
    RUN_STATE,
    CheckpointError,
    build_payload,
    check_compatible,
    checkpoint_file,
    read_payload,
    save_atomic,
    write_planning_model,
)
from trajectory_transformer.cli.common import (
    INTERRUPTED_EXIT_CODE,
    ConfigError,
    command,
    resolve_device,
    to_container,
)
from trajectory_transformer.cli.resources import check_planning_fits, check_training_fits
from trajectory_transformer.cli.schemas import TrainConfig
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import Episodes, joint_transitions
from trajectory_transformer.data.goals import GoalLayout, GoalRelabelledWindows, env_goal_reward
from trajectory_transformer.data.minari_source import DatasetInfo, load_episodes
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.diagnostics import dimension_names
from trajectory_transformer.evaluation import check_env_matches, evaluate, make_vector_env
from trajectory_transformer.model import GPTConfig, TrajectoryGPT
from trajectory_transformer.planning import BeamPlanner, PlannerConfig
from trajectory_transformer.training.distributed import Distributed, launched_by_torchrun
from trajectory_transformer.training.trainer import EvaluateFn, Trainer

IN_TRAINING_EVAL_SEED = 10_000
EVALUATION_ENVS = 10
"""Environments played at once by the evaluations during training."""
"""First episode seed of the evaluations during training: apart from tt-eval's default seeds
(0, 1, ...), so that best.pt is not chosen on the episodes that tt-eval then scores."""

ROUND_TRIP_WARNING = 0.1
"""Round-trip error, in standard deviations of a dimension, above which tt-train warns."""


def describe_discretizer(discretizer: Discretizer, transitions: np.ndarray, names: list[str]):
    """Print the round-trip error and the bins in use per dimension (named by `names`); warn
    where either says that the tokens represent a dimension poorly or that it is (nearly)
    discrete."""
    error = discretizer.reconstruction_error(transitions)
    bins = discretizer.effective_bins.tolist()
    N = discretizer.n_bins
    cells = " ".join(f"{n}={e:.1%}" for n, e in zip(names, error, strict=True))
    print(
        f"discretizer ({discretizer.strategy}, {N} bins, decoded to bin {discretizer.bin_values}s)"
        f" round-trip error per dimension, in standard deviations: {cells}"
    )
    if any(b < N for b in bins):
        used = " ".join(f"{n}={b}" for n, b in zip(names, bins, strict=True) if b < N)
        print(f"bins in use where fewer than {N} (a point mass takes one of its own): {used}")
    poor = [f"{n} ({e:.2f})" for n, e in zip(names, error, strict=True) if e > ROUND_TRIP_WARNING]
    if poor:
        print(
            f"warning: round-trip error above {ROUND_TRIP_WARNING} standard deviations in "
            f"{', '.join(poor)}; more bins (dataset.n_bins) or dataset.bin_values=mean may help",
            file=sys.stderr,
        )
    for dim in (len(names) - 2, len(names) - 1):  # reward and value
        for mode in discretizer.rare_modes(transitions, dim):
            print(
                f"rare mode of {names[dim]} kept in bins of its own: {mode.count} values in "
                f"[{mode.low:.4g}, {mode.high:.4g}], mean {mode.mean:.4g}, decoded mean "
                f"{mode.decoded_mean:.4g}"
            )
    distinct = [len(np.unique(column)) for column in np.asarray(transitions).T]
    few = [f"{n} ({d})" for n, d in zip(names, distinct, strict=True) if d < N]
    if few:
        print(
            f"warning: fewer distinct values than the {N} bins in {', '.join(few)}: these "
            "dimensions are (nearly) discrete, so some of their tokens are never used",
            file=sys.stderr,
        )


def make_wandb_logger(cfg: TrainConfig, config: dict, run_dir: Path):
    if cfg.wandb.mode == "disabled":
        return None, None
    import wandb

    run = wandb.init(
        mode=cfg.wandb.mode,
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        name=cfg.wandb.name,
        config=config,
        dir=str(run_dir),
    )
    return (lambda metrics, step: run.log(metrics, step=step)), run


class MetricsLog:
    """The run's logged metrics, one JSON line per logged step, in `<run dir>/metrics.jsonl`:
    its loss curve. A resumed run starts from the lines of the run it resumes (read from that
    checkpoint's folder), up to the checkpoint's step, so that steps logged after the
    checkpoint and lost with the process are neither repeated nor skipped."""

    FILE = "metrics.jsonl"

    def __init__(self, run_dir: Path, resumed_from: Path | None, step: int) -> None:
        self.path = run_dir / self.FILE
        kept: list[str] = []
        source = None if resumed_from is None else resumed_from.parent / self.FILE
        if source is not None and source.is_file():
            for line in source.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a killed process
                    continue
                if record["step"] <= step:
                    kept.append(line)
        staged = self.path.with_suffix(".tmp")
        staged.write_text("".join(f"{line}\n" for line in kept))
        os.replace(staged, self.path)
        self.file = open(self.path, "a")  # noqa: SIM115 (open for the run's length)

    def __call__(self, metrics: dict, step: int) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def interrupted_message(trainer: Trainer, checkpoint: Path, resumed_from: str | None) -> str:
    """What a Ctrl-C left behind, and how to continue."""
    if trainer.saved_step is None:
        where = resumed_from or "the start (no checkpoint was written)"
        return f"\ninterrupted at step {trainer.step}; continue from {where}."
    saved = f"checkpoint of step {trainer.saved_step} in {checkpoint}"
    if trainer.saved_step != trainer.step:
        saved += f" (the save of step {trainer.step} was interrupted)"
    return (
        f"\ninterrupted at step {trainer.step}: {saved}; continue with "
        f"`tt-train <same overrides> resume={checkpoint}`"
    )


def validation_fraction(cfg: TrainConfig) -> float:
    """The configured fraction, or by default 0.1 where the stopping rule needs one."""
    if cfg.dataset.validation_fraction is not None:
        return cfg.dataset.validation_fraction
    fixed_length = cfg.trainer.max_steps is not None or cfg.trainer.epochs is not None
    return 0.0 if fixed_length else 0.1


def planner_evaluation(
    cfg: TrainConfig, discretizer: Discretizer, info, config: dict, device: torch.device
) -> tuple[EvaluateFn, object]:
    """The evaluation that the trainer calls every `trainer.eval_every` steps, and its env."""
    settings = OmegaConf.to_container(cfg.planner, resolve=True)
    if settings.get("discount") is None:
        settings["discount"] = cfg.dataset.discount
    episodes = cfg.trainer.eval_episodes
    env = make_vector_env(info, min(episodes, EVALUATION_ENVS), cfg.dataset.env_id)
    check_env_matches(info, env)

    def play(model: TrajectoryGPT) -> tuple[float, dict]:
        planner = BeamPlanner(
            model,
            discretizer,
            device=device,
            action_low=info.action_low,
            action_high=info.action_high,
            dataset=info,
            training_config=config,
            **settings,
        )
        result = evaluate(
            planner,
            env,
            episodes,
            seed=IN_TRAINING_EVAL_SEED,
            ref_scores=(info.ref_min_score, info.ref_max_score),
            progress=False,
        ).summary()
        metrics = {"eval/return": result["return_mean"]}
        score = result["return_mean"]
        if result["normalized_score_mean"] is not None:
            score = metrics["eval/normalized_score"] = result["normalized_score_mean"]
        return score, metrics

    return play, env


def relabelled_windows(
    cfg: TrainConfig,
    windows: TokenWindows,
    episodes: Episodes,
    discretizer: Discretizer,
    info: DatasetInfo,
) -> GoalRelabelledWindows:
    """The training windows with hindsight goals (`dataset.relabel_goals`), their rewards
    from the dataset's evaluation env; a dataset that is not goal-conditioned, or settings
    it cannot relabel with, are refused in one line."""
    try:
        return GoalRelabelledWindows(
            windows,
            episodes,
            discretizer,
            GoalLayout.of(info.observation_layout),
            env_goal_reward(info.make_env()),
            cfg.dataset.discount,
            cfg.dataset.relabel_goals,
            cfg.dataset.relabel_end_at_goal,
            cfg.dataset.relabel_reached,
            cfg.dataset.relabel_continuing_rewards,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None


def train(cfg: TrainConfig) -> Path | None:
    dist = Distributed.single()
    if launched_by_torchrun():
        dist = Distributed.from_environment(resolve_device(cfg.device), cfg.distributed_timeout_s)
    try:
        return train_on(cfg, dist)
    finally:
        dist.close()


def train_on(cfg: TrainConfig, dist: Distributed) -> Path | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    device = dist.device(resolve_device(cfg.device))
    config = to_container(cfg)
    torch.manual_seed(cfg.seed)  # the same initial parameters on every rank
    say = print if dist.is_main else (lambda *args, **kwargs: None)

    # Rank 0 opens the dataset first (building or downloading it if need be), the other ranks
    # once it has: they never write it at the same time.
    if dist.rank > 0:
        dist.wait_for_main()
    episodes, info = load_episodes(cfg.dataset.id, cfg.dataset.download, cfg.dataset.env_id)
    if dist.rank == 0:
        dist.wait_for_main()
    say(
        f"dataset {info.dataset_id}: {info.num_episodes} episodes, {info.num_transitions} "
        f"transitions, obs {info.observation_dim} dims, act {info.action_dim} dims, "
        f"mean return {episodes.episode_returns().mean():.1f}; content {info.fingerprint}"
    )
    fraction = validation_fraction(cfg)
    held_out, split = None, None
    if fraction > 0:
        seed = cfg.dataset.validation_seed
        episodes, held_out, indices = episodes.split(fraction, seed)
        split = {"fraction": fraction, "seed": seed, "episodes": indices.tolist()}
        say(
            f"validation: {held_out.num_episodes} episodes ({held_out.num_transitions} "
            f"transitions) held out with seed {seed}; training on {episodes.num_episodes}"
        )
    transitions = joint_transitions(episodes, cfg.dataset.discount, cfg.dataset.terminal_penalty)

    resume, resume_file = None, None
    if cfg.resume:
        resume_file = checkpoint_file(cfg.resume, to_resume=True)
        resume = read_payload(resume_file)
        if "optimizer" not in (resume.get("training") or {}):
            raise CheckpointError(
                f"{resume_file} holds a model to plan with, not a run's state: resume from the "
                f"run's {RUN_STATE} (or its run directory)."
            )
    if resume is not None:
        discretizer = Discretizer.from_state_dict(resume["discretizer"])
    else:
        discretizer = Discretizer.fit(
            transitions, cfg.dataset.n_bins, cfg.dataset.discretizer, cfg.dataset.bin_values
        )
    names = dimension_names(info.observation_dim, info.action_dim, info.eval_env_id)
    if dist.is_main:
        describe_discretizer(discretizer, transitions, names)

    model_config = GPTConfig(
        observation_dim=info.observation_dim,
        action_dim=info.action_dim,
        n_bins=discretizer.n_bins,
        **config["model"],
    )
    try:
        check_training_fits(model_config, cfg.trainer.batch_size, device)
        if cfg.trainer.eval_every is not None:
            planner = PlannerConfig(**OmegaConf.to_container(cfg.planner, resolve=True))
            envs = min(cfg.trainer.eval_episodes, EVALUATION_ENVS)
            check_planning_fits(model_config, planner, envs, device)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if resume is not None:
        check_compatible(resume, model_config, info, config["dataset"], split)
    sequence = model_config.sequence_transitions
    # Real values: the model's inputs, or the centres of Gaussian targets.
    real_values = model_config.value_inputs or cfg.trainer.target_sigma > 0
    windows = TokenWindows(transitions, episodes.lengths, discretizer, sequence, real_values)
    if cfg.dataset.relabel_goals > 0 or cfg.dataset.relabel_reached > 0:
        windows = relabelled_windows(cfg, windows, episodes, discretizer, info)
        say(
            f"goals: {cfg.dataset.relabel_goals:.0%} of the training windows relabelled with a "
            "goal their episode reaches later (dataset.relabel_goals), "
            f"{cfg.dataset.relabel_reached:.0%} with one they reach themselves "
            "(dataset.relabel_reached)"
        )
        if windows.continuing > 0 and dist.is_main:  # a check, said by rank 0 alone
            above = windows.continuing_values_above_bins()
            if above.share >= 0.01:
                say(
                    f"warning: {above.share:.0%} of the value targets of the windows "
                    "relabelled with an episode that goes on past its goal "
                    "(dataset.relabel_reached, or dataset.relabel_end_at_goal=false) lie above "
                    "the value bins (fit on the dataset's own values, up to "
                    f"{above.top:.3g}), up to {above.largest:.3g}: they are encoded as the top "
                    "bin, so these values say 'at the goal' however long the point stays "
                    "there; dataset.relabel_continuing_rewards=scaled keeps them within the bins"
                )
    validation = None
    if held_out is not None:
        held_out_transitions = joint_transitions(
            held_out, cfg.dataset.discount, cfg.dataset.terminal_penalty
        )
        validation = TokenWindows(
            held_out_transitions, held_out.lengths, discretizer, sequence, real_values
        )
    model = TrajectoryGPT(model_config).to(device)
    if model_config.value_inputs:
        model.set_value_inputs(discretizer.values, *discretizer.value_normalisation())
    if dist.rank > 0:
        torch.manual_seed(cfg.seed + dist.rank)  # dropout masks of its own on every rank
    checkpoint_path = run_dir / RUN_STATE

    def save(training_state: dict, name: str = checkpoint_path.name) -> Path:
        payload = build_payload(model, discretizer, info, config, training_state, split)
        return save_atomic(payload, run_dir / name)

    play, env = None, None
    if cfg.trainer.eval_every is not None and dist.is_main:
        play, env = planner_evaluation(cfg, discretizer, info, config, device)
    loggers, metrics_log, wandb_run = [], None, None

    def log(metrics: dict, step: int) -> None:
        for logger in loggers:
            logger(metrics, step)

    trainer = Trainer(
        model,
        windows,
        cfg.trainer,
        save,
        seed=cfg.seed,
        log=log if dist.is_main else None,
        validation=validation,
        evaluate=play,
        dist=dist,
    )
    if resume is not None:
        model.load_state_dict(resume["model"])
        try:
            trainer.load_state(resume["training"])
        except ValueError as error:  # a plan that differs from the checkpoint's: no traceback
            raise CheckpointError(f"{cfg.resume}: {error}") from error
        if trainer.extended_from is not None:
            before = " (before its cooldown)" if trainer.step < resume["training"]["step"] else ""
            say(
                f"extending the run of {resume_file} from step {trainer.step}{before} to the "
                f"longer plan: {trainer.total_steps} steps at most"
            )
        else:
            say(f"resumed from {resume_file} at step {trainer.step}/{trainer.total_steps}")
    if dist.is_main:
        # The loss curve up to where the run goes on from (for an extended WSD run, the step
        # its cooldown began), read from the folder of the checkpoint it resumes.
        metrics_log = MetricsLog(run_dir, resume_file, trainer.step)
        wandb_log, wandb_run = make_wandb_logger(cfg, config, run_dir)
        loggers = [metrics_log] + ([wandb_log] if wandb_log is not None else [])
    length = f"{trainer.total_steps} steps planned ({trainer.epochs} epochs of "
    if trainer.stopping_rule:
        length = (
            f"until the validation loss stalls for {cfg.trainer.patience} validations, at most "
            f"{trainer.total_steps} steps ({trainer.epochs} epochs of "
        )
    if cfg.trainer.time_budget is not None:
        length = f"within {cfg.trainer.time_budget} of training, {length}"
    length = f"schedule {cfg.trainer.schedule}, {length}"
    ranks = f" x {dist.world_size} ranks" if dist.active else ""
    say(
        f"model: {model.num_parameters():,} parameters, block {model_config.block_size} tokens; "
        f"{length}{trainer.steps_per_epoch} steps) on {device}{ranks}; run dir {run_dir}"
    )
    try:
        summary = trainer.train()
    except KeyboardInterrupt:
        if dist.is_main:
            print(interrupted_message(trainer, checkpoint_path, cfg.resume), file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_CODE)
    finally:
        if wandb_run is not None:
            wandb_run.finish()
        if metrics_log is not None:
            metrics_log.close()
        if env is not None:
            env.close()
    model_file = None
    if dist.is_main:
        model_file = write_planning_model(run_dir, validated=validation is not None)
    say(summary.line())
    say(f"model to plan with: {model_file} (tt-eval checkpoint={run_dir})")
    return model_file


def train_in_subprocess(
    run_dir: str | os.PathLike, overrides: Sequence[str] = (), reuse: bool = True
) -> Path:
    """Run tt-train with Hydra `overrides` in a fresh process (as a notebook or script would)
    and return the model it hands over (`model.pt`). With `reuse`, a model already in
    `run_dir` is returned without training, so re-running a notebook does not train again."""
    checkpoint = Path(run_dir) / PLANNING_MODEL
    if reuse and checkpoint.exists():
        print(f"using the checkpoint trained before: {checkpoint}")
        return checkpoint
    argv = [sys.executable, "-m", "trajectory_transformer.cli.train", *overrides]
    argv.append(f"hydra.run.dir={run_dir}")
    print("running", " ".join(argv[2:]))
    done = subprocess.run(argv, capture_output=True, text=True)
    print(done.stdout, end="")  # the run's summary; the progress bar went to its stderr
    if done.returncode != 0:
        raise RuntimeError(f"tt-train failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return checkpoint


@command("train")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
