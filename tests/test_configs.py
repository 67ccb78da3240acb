from importlib import resources

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from trajectory_transformer.cli.common import CONFIG_DIR, ConfigError, reject_unknown_keys

CONFIG_MODULE = CONFIG_DIR.removeprefix("pkg://")
DATASET_CONFIGS = sorted(
    p.name.removesuffix(".yaml")
    for p in resources.files(CONFIG_MODULE).joinpath("dataset").iterdir()
    if p.name.endswith(".yaml")
)


def compose_train(*overrides):
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    reject_unknown_keys(cfg)
    return cfg


def test_every_dataset_config_is_there():
    expected = {
        f"pendulum-{q}" for q in ("random", "medium", "expert", "medium-replay", "medium-expert")
    }
    expected |= {
        f"{env}-{q}"
        for env in ("halfcheetah", "hopper", "walker2d")
        for q in ("simple", "medium", "expert")
    }
    expected |= {"reacher-medium", "inverteddoublependulum-medium", "invertedpendulum-medium"}
    expected |= {
        f"{task}-embedded-{q}"
        for task in ("hopper", "walker2d")
        for q in ("medium", "medium-replay", "expert", "medium-expert")
    }
    expected |= {f"pointmaze-{m}" for m in ("umaze", "medium", "large")}
    expected |= {f"pointmaze-{m}-paper" for m in ("umaze", "medium")}
    assert set(DATASET_CONFIGS) == expected


PRECISE = {
    "model.value_inputs": True,
    "model.token_embeddings": False,
    "model.observation_vector": True,
    "dataset.discretizer": "uniform",
    "trainer.target_sigma": 1.0,
    "trainer.learning_rate": 3e-3,
}
PAPER = {
    "model.value_inputs": False,
    "model.token_embeddings": True,
    "model.observation_vector": False,
    "dataset.discretizer": "quantile",
    "trainer.target_sigma": 0.0,
    "trainer.learning_rate": 6e-4,
}


def assert_recipe(cfg, recipe: dict) -> None:
    got = {key: OmegaConf.select(cfg, key) for key in recipe}
    assert got == recipe


def test_the_paper_recipe_is_the_libraries_own_defaults():
    """recipe=paper is the model, data and trainer configs' own defaults: the published model."""
    from trajectory_transformer.cli.schemas import DatasetConfig, ModelConfig
    from trajectory_transformer.training.trainer import TrainerConfig

    defaults = {"model": ModelConfig(), "dataset": DatasetConfig(), "trainer": TrainerConfig()}
    own = {key: getattr(defaults[key.split(".")[0]], key.split(".")[1]) for key in PAPER}
    assert own == PAPER


def test_a_command_line_setting_beats_the_recipe():
    cfg = compose_train("recipe=paper", "trainer.learning_rate=1e-3", "dataset.discretizer=uniform")
    assert cfg.trainer.learning_rate == 1e-3 and cfg.dataset.discretizer == "uniform"
    assert not cfg.model.value_inputs


@pytest.mark.parametrize("name", DATASET_CONFIGS)
def test_every_dataset_config_composes(name):
    cfg = compose_train(f"dataset={name}")
    env, _, quality = name.partition("-")
    if quality.startswith("embedded-"):  # hopper, walker2d: from the shipped SAC actors
        assert cfg.dataset.id == f"{env}/{quality.removeprefix('embedded-')}-v0"
        assert cfg.model.embedding_dim == 64  # the demo-sized model
        assert cfg.trainer.max_steps == (8000 if quality.endswith("medium-expert") else 4000)
    elif env in (
        "pendulum",
        "reacher",
        "inverteddoublependulum",
        "invertedpendulum",
    ):  # embedded datasets
        assert cfg.dataset.id == f"{env}/{quality}-v0"
        assert cfg.model.embedding_dim == 64  # the demo-sized model
    elif env == "pointmaze":  # embedded; -paper: windows that fit planner=paper
        maze = quality.removesuffix("-paper")
        assert cfg.dataset.id == f"pointmaze/{maze}-v0"
        assert cfg.model.embedding_dim == 64  # the demo-sized model
        assert cfg.trainer.max_steps == {"umaze": 4000, "medium": 12000, "large": 8000}[maze]
        assert cfg.model.sequence_transitions == (20 if quality.endswith("-paper") else 10)
    else:
        assert cfg.dataset.id == f"mujoco/{env}/{quality}-v0"
        # The paper's settings for the MuJoCo datasets.
        assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.embedding_dim) == (4, 4, 128)
        assert cfg.trainer.batch_size == 256
        assert cfg.trainer.max_steps is None and cfg.trainer.reference_epochs == 50
    # Every dataset takes each recipe as it is.
    assert_recipe(cfg, PRECISE)
    assert_recipe(compose_train(f"dataset={name}", "recipe=paper"), PAPER)
    assert cfg.dataset.n_bins == 100
    assert cfg.dataset.terminal_penalty == -100.0 and cfg.dataset.discount == 0.99


def test_command_line_beats_the_dataset_defaults():
    cfg = compose_train("dataset=hopper-medium", "model.embedding_dim=32", "model=demo")
    assert cfg.model.embedding_dim == 32 and cfg.model.n_layer == 3


def test_any_minari_id_can_be_named_directly():
    cfg = compose_train("dataset.id=D4RL/door/human-v2", "dataset.download=true")
    assert cfg.dataset.id == "D4RL/door/human-v2" and cfg.dataset.download is True


def test_the_demo_budget_applies_to_the_demo_datasets_only():
    from trajectory_transformer.cli.train import validation_fraction

    demo = compose_train()
    assert demo.trainer.max_steps == 1500 and validation_fraction(demo) == 0.0
    other = compose_train("dataset.id=mujoco/hopper/medium-v0")
    assert other.trainer.max_steps is None and validation_fraction(other) == 0.1
    fixed = compose_train("dataset.id=mujoco/hopper/medium-v0", "trainer.max_steps=300")
    assert fixed.trainer.max_steps == 300 and validation_fraction(fixed) == 0.0
    chosen = compose_train("dataset.validation_fraction=0.05")
    assert chosen.trainer.max_steps == 1500 and validation_fraction(chosen) == 0.05
    paper = compose_train("dataset=hopper-medium")
    assert paper.trainer.max_steps is None and validation_fraction(paper) == 0.1


@pytest.mark.parametrize(
    "override", ["trainer.learning_rat=1e-3", "+model.width=3", "+bogus=1", "bogus=1"]
)
def test_unknown_keys_are_rejected(override):
    with pytest.raises((ConfigCompositionException, ConfigKeyError, ConfigError)):
        compose_train(override)


def test_wrong_types_are_rejected():
    with pytest.raises(ConfigCompositionException):
        compose_train("trainer.batch_size=lots")


def test_every_registered_schema_survives_pickling():
    """Hydra's joblib and cluster launchers pickle the config store into their workers."""
    import pickle

    from hydra.core.config_store import ConfigStore

    def nodes(repo):
        for value in repo.values():
            if isinstance(value, dict):
                yield from nodes(value)
            else:
                yield value

    stored = list(nodes(ConfigStore.instance().repo))
    assert len(stored) >= 9
    for node in stored:
        assert pickle.loads(pickle.dumps(node.node)) == node.node, node.name


COMPARE_CONFIGS = sorted(
    p.name.removesuffix(".yaml")
    for p in resources.files(CONFIG_MODULE).joinpath("compare").iterdir()
    if p.name.endswith(".yaml")
)


@pytest.mark.parametrize("name", COMPARE_CONFIGS)
def test_every_compare_config_composes_and_its_agents_would_run(name):
    """Every agent's tt-train, tt-train-critic and tt-eval configs compose and fit together,
    as tt-compare checks them before any job (nothing runs here)."""
    from trajectory_transformer.cli.compare import check_agents, comparison_dataset, spec_of

    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = compose("compare", overrides=[f"compare={name}"])
        reject_unknown_keys(cfg)
        spec = spec_of(cfg.compare)
        spec.validate()
        check_agents(spec, comparison_dataset(spec))
    if name.startswith("critic-"):
        needs = {agent.name: agent.needs for agent in spec.agents}
        assert needs.pop("planner_critic_full", ("model", "critic")) == ("model", "critic")
        assert needs == {
            "bc": ("model",),
            "planner": ("model",),
            "planner_critic": ("model", "critic"),
            "iql": ("critic",),
        }
        maze = name.startswith("critic-pointmaze-")
        assert ("critic=maze" in spec.critic) == maze
        dataset = {"critic-hopper-medium": "hopper-embedded-medium"}.get(name)
        assert spec.dataset == (dataset or name.removeprefix("critic-"))
