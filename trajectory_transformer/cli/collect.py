"""`tt-collect`: build the embedded Pendulum datasets into the local Minari folder."""

from __future__ import annotations

import hydra
import numpy as np
from omegaconf import DictConfig

from trajectory_transformer.cli.common import CONFIG_DIR, friendly_errors
from trajectory_transformer.data import pendulum
from trajectory_transformer.data.minari_source import DatasetError, episodes_from_minari


@hydra.main(config_path=CONFIG_DIR, config_name="collect", version_base="1.3")
@friendly_errors
def main(cfg: DictConfig) -> None:
    unknown = [d for d in cfg.datasets if not pendulum.is_embedded(d)]
    if unknown:
        raise DatasetError(
            f"not embedded datasets: {', '.join(unknown)}; tt-collect builds "
            f"{', '.join(pendulum.EMBEDDED_DATASETS)}."
        )
    for dataset_id in cfg.datasets:
        dataset = pendulum.build_embedded_dataset(
            dataset_id, overwrite=cfg.overwrite, episodes=cfg.episodes, seed=cfg.seed
        )
        returns = episodes_from_minari(dataset).episode_returns()
        metadata = dataset.storage.metadata
        low, high = metadata["ref_min_score"], metadata["ref_max_score"]
        score = 100 * (returns.mean() - low) / (high - low)
        print(
            f"{dataset_id}: {dataset.total_episodes} episodes, {dataset.total_steps} steps, "
            f"return {returns.mean():.1f} ± {returns.std() / np.sqrt(len(returns)):.1f}, "
            f"normalised score {score:.1f}"
        )


if __name__ == "__main__":
    main()
