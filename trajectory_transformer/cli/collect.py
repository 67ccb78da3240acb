"""`tt-collect`: build embedded datasets (by default the Pendulum suite) into the local Minari
folder."""

from __future__ import annotations

from omegaconf import DictConfig

from trajectory_transformer import suites
from trajectory_transformer.cli.common import command
from trajectory_transformer.data.minari_source import DatasetError, episodes_from_minari
from trajectory_transformer.scores import mean_and_stderr, normalized_score


@command("collect")
def main(cfg: DictConfig) -> None:
    unknown = [d for d in cfg.datasets if not suites.is_embedded(d)]
    if unknown:
        raise DatasetError(
            f"not embedded datasets: {', '.join(unknown)}; tt-collect builds "
            f"{', '.join(suites.EMBEDDED_DATASETS)}."
        )
    for dataset_id in cfg.datasets:
        dataset = suites.build_embedded_dataset(
            dataset_id, overwrite=cfg.overwrite, episodes=cfg.episodes, seed=cfg.seed
        )
        returns = episodes_from_minari(dataset).episode_returns()
        metadata = dataset.storage.metadata
        low, high = metadata["ref_min_score"], metadata["ref_max_score"]
        mean, stderr = mean_and_stderr(returns)
        line = (
            f"{dataset_id}: {dataset.total_episodes} episodes, {dataset.total_steps} steps, "
            f"return {mean:.1f} ± {stderr:.1f}, "
            f"normalised score {float(normalized_score(mean, low, high)):.1f}"
        )
        behaviour = metadata.get("behaviour_policy")  # episodes that are not the eval task's
        if behaviour is not None:
            line += (
                f" (each episode ends at a random goal); behaviour policy in the evaluation "
                f"env: return {behaviour['return']:.1f}, normalised score "
                f"{behaviour['normalized_score']:.1f}"
            )
        print(line)


if __name__ == "__main__":
    main()
