"""`tt-eval`: plan with a checkpoint in its environment and score the episodes."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from trajectory_transformer import suites
from trajectory_transformer.checkpoint import (
    CheckpointError,
    behaviour_name,
    checkpoint_file,
    is_pretrained,
    pretrained_name,
    value_targets_of,
)
from trajectory_transformer.cli.common import (
    ConfigError,
    command,
    override_key,
    resolve_device,
)
from trajectory_transformer.cli.resources import check_planning_fits
from trajectory_transformer.cli.schemas import EvaluateConfig
from trajectory_transformer.critic import IQLAgent
from trajectory_transformer.data import reference_scores
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.evaluation import (
    EpisodeJournal,
    EpisodeRecord,
    check_env_matches,
    evaluate,
    make_vector_env,
    write_video,
)
from trajectory_transformer.planning import BeamPlanner
from trajectory_transformer.planning.waypoints import WaypointAgent


def run(cfg: EvaluateConfig) -> dict:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    device = resolve_device(cfg.device)
    envs = min(cfg.eval.num_envs, cfg.eval.episodes)
    behaviour = behaviour_name(cfg.checkpoint) is not None
    manifest_planner = False  # planned with a pretrained checkpoint's manifest settings
    # A pretrained checkpoint is installed with the package: its evaluations are listed in
    # their run directories alone.
    listed_beside_checkpoint = not (is_pretrained(cfg.checkpoint) or behaviour)
    if behaviour:
        planner = behaviour_agent(cfg)
    elif cfg.planner.agent == "iql":
        planner = with_waypoints(cfg, iql_agent(cfg, device))
    else:
        source = cfg.checkpoint
        try:  # a run dir: its model.pt; pretrained:<dataset id>: that checkpoint
            cfg.checkpoint = str(checkpoint_file(source))
        except CheckpointError as error:  # a pretrained name not installed: the known ones
            raise ConfigError(str(error)) from None
        settings = planner_overrides(cfg, source)
        manifest_planner = settings is not None
        if settings is None:
            source, settings = cfg.checkpoint, OmegaConf.to_container(cfg.planner, resolve=True)
        planner = beam_planner(cfg, source, settings, device, envs)  # heads for waypoints itself
    info = planner.dataset
    # Settled before any env starts, so that a request that cannot be honoured fails first.
    scores, no_score_reason, warning = reference_scores.resolve(
        dataset_scores=(info.ref_min_score, info.ref_max_score),
        env_id=cfg.eval.env_id or info.eval_env_id,
        dataset_id=info.dataset_id,
        ref_min_score=cfg.eval.ref_min_score,
        ref_max_score=cfg.eval.ref_max_score,
        reference=cfg.eval.reference,
    )
    if warning:
        print(warning, file=sys.stderr)
    # Episodes this run directory has finished already (an interrupted evaluation) are kept.
    journal = EpisodeJournal(run_dir / "episodes.jsonl", evaluation_identity(cfg, planner))
    if journal.finished:
        print(f"continuing the evaluation in {run_dir}: {len(journal.finished)} episodes done")
    episodes = cfg.eval.episodes
    env = make_vector_env(
        info,
        envs,
        cfg.eval.env_id,
        cfg.eval.asynchronous,
        render=cfg.eval.video,
        max_episode_steps=cfg.eval.max_episode_steps,
    )
    try:
        check_env_matches(info, env)
        record = None
        if cfg.eval.video or cfg.eval.save_plots:
            steps = tuple(cfg.eval.plot_steps) if cfg.eval.save_plots else ()
            record = EpisodeRecord(plan_steps=steps, render=cfg.eval.video)
            journal.forget(cfg.eval.seed)  # the video and figures show episode 0: play it
        result = evaluate(
            planner,
            env,
            episodes,
            seed=cfg.eval.seed,
            ref_scores=(None, None)
            if scores is None
            else (scores.ref_min_score, scores.ref_max_score),
            progress=cfg.eval.progress,
            observers=[] if record is None else [record],
            no_score_reason=no_score_reason or "",
            reference_source=None if scores is None else scores.source,
            journal=journal,
        )
    finally:
        env.close()
    preset = HydraConfig.get().runtime.choices.get("planner", "custom")
    if behaviour:
        preset = "behaviour"  # the dataset's own policy: no planner setting applies
    elif manifest_planner:
        preset = "manifest"
    result.settings = {
        "checkpoint": cfg.checkpoint if behaviour else str(Path(cfg.checkpoint).resolve()),
        "dataset": info.dataset_id,
        "dataset_fingerprint": info.fingerprint,  # the numbers the model was trained on
        "env": cfg.eval.env_id or info.eval_env_id,
        "planner_preset": preset,
        "planner": planner_settings(cfg, planner),
        "eval": OmegaConf.to_container(cfg.eval, resolve=True),
        "device": str(device),
    }
    result.write(run_dir / "results.json")
    listed = ""
    if listed_beside_checkpoint:
        index = record_evaluation(Path(cfg.checkpoint), run_dir, result.summary())
        listed = f", listed in {index}"
    if cfg.eval.video:
        video = write_video(record.frames, run_dir / f"video.{cfg.eval.video_format}")
        print(f"video of episode 0: {video}")
    if cfg.eval.save_plots:
        from trajectory_transformer.viz import save_episode_figures  # matplotlib only here

        figures = save_episode_figures(record, planner, run_dir)
        print(f"{len(figures)} figures of episode 0 in {run_dir}: {figures[0].name}, ...")
    print(f"{info.dataset_id} | planner {preset} | {result.line()}")
    print(f"results: {run_dir / 'results.json'}{listed}")
    return result.summary()


def planner_overrides(cfg: EvaluateConfig, source: str) -> dict | None:
    """For a pretrained checkpoint (`source` is `pretrained:<name>`) planned with no preset on
    the command line (`planner=<name>`), the `planner.<key>=` values given there alone:
    `from_checkpoint` lays them over the settings its manifest's planner score was measured
    with. None otherwise (the composed `cfg.planner` is the planner's)."""
    given = {override_key(o) for o in HydraConfig.get().overrides.task}
    if pretrained_name(source) is None or "planner" in given:
        return None
    planner = OmegaConf.to_container(cfg.planner, resolve=True)
    return {key: value for key, value in planner.items() if f"planner.{key}" in given}


def beam_planner(
    cfg: EvaluateConfig, source: str, settings: dict, device: torch.device, envs: int
) -> BeamPlanner:
    """The beam search over the model of `source` (a checkpoint file, or `pretrained:<name>`
    whose manifest settings `settings` override), with those planner settings."""
    try:
        planner = BeamPlanner.from_checkpoint(source, device=device, **settings)
    except CheckpointError:
        raise  # a missing or unreadable file, or a critic of another dataset, says so itself
    except ValueError as error:
        raise ConfigError(f"planner settings do not fit this checkpoint: {error}") from None
    try:
        check_planning_fits(planner.model.config, planner.config, envs, device)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    trained_discount, _ = value_targets_of(planner.training_config)
    if planner.critic is None and planner.config.discount != trained_discount:
        print(
            f"note: planner.discount={planner.config.discount} differs from the discount "
            f"{trained_discount} that this checkpoint's value tokens were trained with, so the "
            "plan's rewards and its terminal value are discounted differently",
            file=sys.stderr,
        )
    if planner.critic is not None and planner.critic.discount != trained_discount:
        print(
            f"note: planner.value=critic discounts by the critic's {planner.critic.discount}; "
            f"the model's value tokens, trained with {trained_discount}, are not used",
            file=sys.stderr,
        )
    return planner


def with_waypoints(cfg: EvaluateConfig, policy: IQLAgent) -> IQLAgent | WaypointAgent:
    """A critic's `policy` headed for waypoints on the way to its goal where
    `planner.waypoint_lead` is set (a beam search heads for them itself)."""
    if cfg.planner.waypoint_lead is None:
        return policy
    try:
        return WaypointAgent.of(policy, cfg.planner.waypoint_lead, cfg.planner.waypoint_cell)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def iql_agent(cfg: EvaluateConfig, device: torch.device) -> IQLAgent:
    """The IQL policy of the critic checkpoint given as `checkpoint`."""
    if cfg.planner.critic is not None and cfg.planner.critic != cfg.checkpoint:
        raise ConfigError(
            "planner=iql plays the policy of the critic given as `checkpoint`; leave "
            f"planner.critic unset (got {cfg.planner.critic})"
        )
    if cfg.eval.save_plots:
        raise ConfigError("eval.save_plots draws a planner's searches; planner=iql has none")
    return IQLAgent.from_checkpoint(cfg.checkpoint, device)


def behaviour_agent(cfg: EvaluateConfig):
    """The behaviour policy of the embedded dataset that `checkpoint=behaviour:<id>` names,
    its noise drawn by `planner.seed`: the reference a learned agent is measured against."""
    dataset_id = behaviour_name(cfg.checkpoint)
    if cfg.planner.agent != "beam" or cfg.planner.critic is not None:
        raise ConfigError(
            f"checkpoint={cfg.checkpoint} plays the dataset's own policy, with no model or "
            "critic; leave planner.agent and planner.critic unset"
        )
    if cfg.planner.waypoint_lead is not None:
        raise ConfigError(
            f"checkpoint={cfg.checkpoint} plays the dataset's own policy, which steers to the "
            "goal itself; leave planner.waypoint_lead unset"
        )
    if cfg.eval.save_plots:
        raise ConfigError(
            "eval.save_plots draws a planner's searches; the behaviour policy has none"
        )
    try:
        agent = suites.behaviour_agent(dataset_id, cfg.planner.seed)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    _, agent.dataset = load_episodes(dataset_id)  # its env and reference scores
    return agent


def planner_settings(cfg: EvaluateConfig, planner: BeamPlanner | IQLAgent | WaypointAgent) -> dict:
    if behaviour_name(cfg.checkpoint) is not None:  # the dataset's policy, its seed's noise
        return {"agent": "behaviour", "seed": cfg.planner.seed}
    waypoints = isinstance(planner, WaypointAgent)
    agent = planner.agent if waypoints else planner
    if not isinstance(agent, IQLAgent):
        return dataclasses.asdict(agent.config)
    settings = {"agent": "iql", "critic": str(Path(cfg.checkpoint).resolve())}
    if waypoints:
        settings.update(waypoint_lead=planner.lead, waypoint_cell=planner.graph.cell)
    return settings


def evaluation_identity(
    cfg: EvaluateConfig, planner: BeamPlanner | IQLAgent | WaypointAgent
) -> dict:
    """What decides how an episode plays, for an `EpisodeJournal`: the checkpoint (as it is on
    disk now), the agent's settings and the environment. The number of envs, the device and
    the reference scores are left out: an interrupted evaluation may continue on others."""
    if behaviour_name(cfg.checkpoint) is not None:
        return {
            "checkpoint": cfg.checkpoint,
            "dataset_fingerprint": planner.dataset.fingerprint,
            "planner": planner_settings(cfg, planner),
            "env_id": cfg.eval.env_id or planner.dataset.eval_env_id,
            "max_episode_steps": cfg.eval.max_episode_steps,
        }
    checkpoint = Path(cfg.checkpoint).resolve()
    stat = checkpoint.stat()
    return {
        "checkpoint": str(checkpoint),
        "checkpoint_bytes": stat.st_size,
        "checkpoint_mtime_ns": stat.st_mtime_ns,
        "planner": planner_settings(cfg, planner),
        "env_id": cfg.eval.env_id or planner.dataset.eval_env_id,
        "max_episode_steps": cfg.eval.max_episode_steps,
    }


def record_evaluation(checkpoint: Path, run_dir: Path, summary: dict) -> Path:
    """Add one line about this evaluation to `evaluations.jsonl` beside the checkpoint: every
    evaluation of a checkpoint stays on record (a short check never replaces a long one), its
    full results in its own run directory."""
    index = checkpoint.parent / "evaluations.jsonl"
    line = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "checkpoint": checkpoint.name,
        "results": str((run_dir / "results.json").resolve()),
        "planner_preset": summary["settings"]["planner_preset"],
        "episodes": len(summary["returns"]),
        "first_episode_seed": summary["settings"]["eval"]["seed"],
        "return_mean": summary["return_mean"],
        "normalized_score_mean": summary["normalized_score_mean"],
    }
    with open(index, "a") as file:  # one short append: lines of concurrent runs stay whole
        file.write(json.dumps(line) + "\n")
    return index


@command("eval")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
