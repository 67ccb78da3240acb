"""Learning-rate schedules that end annealed however a run ends, and the wall-clock budget."""

from __future__ import annotations

import signal

import pytest
import torch
from conftest import tiny_training
from test_trainer import assert_same_weights, run_to_end
from test_validation import held_out_windows

from trajectory_transformer.progress import format_duration
from trajectory_transformer.training import trainer as trainer_module
from trajectory_transformer.training.schedule import (
    Cooldown,
    RunClock,
    cooldown_due,
    parse_duration,
)
from trajectory_transformer.training.trainer import Trainer, TrainerConfig

PEAK = 1e-3


def test_durations_parse_and_bad_ones_say_what_is_expected():
    assert parse_duration("90s") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("0.5h") == 1800
    for bad in ("", "30", "m", "-5m", "0m", "30 minutes", "1m2h"):
        with pytest.raises(ValueError, match=r"duration such as 90s, 30m|longer than zero"):
            parse_duration(bad)
    assert [format_duration(s) for s in (45, 750, 3900)] == ["45s", "12m30s", "1h05m"]


def test_the_schedule_settings_are_checked():
    with pytest.raises(ValueError, match=r"trainer\.schedule must be one of cosine, wsd"):
        TrainerConfig(schedule="linear")
    with pytest.raises(ValueError, match=r"cooldown_on_interrupt needs trainer\.schedule=wsd"):
        TrainerConfig(cooldown_on_interrupt=True)
    with pytest.raises(ValueError, match="cooldown_fraction must be in"):
        TrainerConfig(schedule="wsd", cooldown_fraction=0.0)
    with pytest.raises(ValueError, match="time_budget"):
        TrainerConfig(time_budget="soon")


def test_a_cooldown_is_due_when_the_steps_left_fit_its_fraction():
    assert cooldown_due(49, 0.2, 60, 1.0) is None
    assert cooldown_due(50, 0.2, 60, 1.0) == Cooldown(50, 60)
    cooldown = Cooldown(50, 60)
    rates = [cooldown.learning_rate(1.0, 0.1, step) for step in range(48, 61)]
    assert rates[:2] == [1.0, 1.0]  # before it
    assert rates[2:] == pytest.approx([1 - 0.09 * k for k in range(1, 11)] + [0.1])


def learning_rates(trainer: Trainer) -> list[float]:
    """Train, recording the learning rate of every step."""
    rates = []
    step = trainer.train_step

    def recording(window_ids):
        rates.append(trainer.learning_rate())
        return step(window_ids)

    trainer.train_step = recording
    trainer.train()
    return rates


def make_trainer(tmp_path, validation: bool = False, **overrides) -> Trainer:
    settings = dict(learning_rate=PEAK, warmup_fraction=0.05) | overrides
    model, windows, discretizer, cfg = tiny_training(**settings)
    return Trainer(
        model,
        windows,
        cfg,
        lambda state, name="checkpoint.pt": tmp_path / name,
        progress=False,
        validation=held_out_windows(discretizer) if validation else None,
    )


def test_wsd_holds_the_peak_then_cools_down_to_the_floor_before_the_step_cap(tmp_path):
    trainer = make_trainer(tmp_path, schedule="wsd", max_steps=60, cooldown_fraction=0.2)
    rates = learning_rates(trainer)
    assert len(rates) == 60 and trainer.cooldown == Cooldown(50, 60)
    assert rates[0] == 0.0 and rates[1] < PEAK  # warm-up over 5% of the run
    assert rates[3:50] == [PEAK] * 47  # stable
    assert rates[50:] == pytest.approx([PEAK * (1 - 0.09 * k) for k in range(1, 11)])
    assert rates[-1] == pytest.approx(0.1 * PEAK)  # the last step at the floor
    summary_reason = trainer._stop_reason(None)
    assert summary_reason == (
        "the run neared its 60 planned steps, so the learning rate cooled down from step 50 to 60"
    )


@pytest.mark.parametrize("schedule", ["cosine", "wsd", "schedule_free"])
def test_the_stopping_rule_under_each_schedule(tmp_path, schedule):
    """A learning rate of zero stalls the validation loss: the rule fires after the patience
    (best at 2, then 4, 6, 8 without progress). WSD then cools down over a fifth of the 8
    steps (2 more) before it stops; the others stop at once."""
    trainer = make_trainer(
        tmp_path,
        validation=True,
        schedule=schedule,
        max_steps=None,
        learning_rate=0.0,
        validate_every=2,
        patience=3,
    )
    summary = trainer.train()
    assert trainer.stopping_rule
    if schedule == "wsd":
        assert summary.steps == 10 and trainer.cooldown == Cooldown(8, 10)
        assert summary.stop_reason.startswith("the validation loss has not improved by 0.001")
        assert summary.stop_reason.endswith("cooled down from step 8 to 10")
    else:
        assert summary.steps == 8 and trainer.cooldown is None
        assert "has not improved" in summary.stop_reason


def test_wsd_cools_down_from_where_the_warm_up_stands_when_the_rule_fires_early(tmp_path):
    """The rule fires at step 4, still in the warm-up (a twentieth of 20 epochs): the cooldown
    starts from the rate reached, never back up at the peak."""
    trainer = make_trainer(
        tmp_path,
        validation=True,
        schedule="wsd",
        max_steps=None,
        validate_every=2,
        patience=1,
        min_delta=10.0,  # no validation counts as progress: the rule fires at the 2nd one
    )
    rates = learning_rates(trainer)
    level = trainer.cooldown.level
    assert (trainer.cooldown.start, trainer.cooldown.end) == (4, 5) and 0 < level < 1
    assert rates[:4] == sorted(rates[:4]) and rates[4] == pytest.approx(0.1 * level * PEAK)
    assert level * PEAK == pytest.approx(rates[3] * 4 / 3)  # where the warm-up had got to


def fake_clock(monkeypatch, trainer: Trainer, seconds_per_step: float) -> None:
    """The trainer's perf_counter, as if each step took `seconds_per_step`."""
    monkeypatch.setattr(
        trainer_module.time, "perf_counter", lambda: trainer.step * seconds_per_step
    )


@pytest.mark.parametrize("schedule", ["cosine", "wsd", "schedule_free"])
def test_a_time_budget_ends_the_run_within_it(tmp_path, monkeypatch, schedule):
    trainer = make_trainer(tmp_path, schedule=schedule, max_steps=1000, time_budget="3s")
    fake_clock(monkeypatch, trainer, 0.1)  # 30 steps fit
    rates = learning_rates(trainer)
    assert trainer.step == 30 and trainer.clock.elapsed == pytest.approx(3.0)
    reason = trainer._stop_reason(None)
    assert reason.endswith("(time budget 3s: 3s used, 30 steps)")
    if schedule == "wsd":
        assert trainer.cooldown == Cooldown(25, 30)
        assert rates[-1] == pytest.approx(0.1 * PEAK)
        assert reason.startswith("the time budget of 3s drew near, so the learning rate cooled")
    elif schedule == "cosine":  # the cosine's span follows the budget, not the 1000 steps
        assert trainer.planned_tokens == 30 * trainer.tokens_per_step
        assert rates[-1] < 0.2 * PEAK
        assert reason.startswith("the time budget of 3s was used")


def test_a_time_budget_replans_when_the_pace_changes(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, schedule="wsd", max_steps=1000, time_budget="6s")
    # 10 steps at 0.1 s, then 0.2 s a step: the plan of 60 steps shrinks to 35.
    step = lambda: trainer.step  # noqa: E731
    clock = lambda: 0.1 * step() if step() <= 10 else 1.0 + 0.2 * (step() - 10)  # noqa: E731
    monkeypatch.setattr(trainer_module.time, "perf_counter", clock)
    trainer.train()
    assert trainer.step == 35 and trainer.cooldown.end == 35
    assert trainer.clock.elapsed == pytest.approx(6.0)


def test_a_resumed_run_counts_the_time_already_spent(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, schedule="wsd", max_steps=1000, time_budget="3s")
    trainer.load_state(trainer.state() | {"elapsed_seconds": 2.0})
    fake_clock(monkeypatch, trainer, 0.1)
    trainer.train()
    assert trainer.step == 10 and trainer.clock.elapsed == pytest.approx(3.0)


def test_a_first_ctrl_c_starts_the_cooldown_under_cooldown_on_interrupt(tmp_path):
    trainer = make_trainer(
        tmp_path, schedule="wsd", max_steps=1000, cooldown_on_interrupt=True, log_every=1
    )
    handler = {}
    trainer.log = lambda metrics, step: handler["ctrl_c"](None, None) if step == 20 else None
    catch = trainer._catch_interrupt

    def keep_handler():
        previous = catch()
        handler["ctrl_c"] = signal.getsignal(signal.SIGINT)
        return previous

    trainer._catch_interrupt = keep_handler
    rates = learning_rates(trainer)
    cooldown = trainer.cooldown
    assert (cooldown.start, cooldown.end) == (20, 24) and trainer.step == 24
    assert 0.35 < cooldown.level < 0.45  # 20 of the 50 warm-up steps
    assert rates[-1] == pytest.approx(0.1 * cooldown.level * PEAK)
    assert trainer._stop_reason(None).startswith("a Ctrl-C asked for a cooldown")


def test_wsd_resume_keeps_the_cooldown(tmp_path):
    trainer = make_trainer(tmp_path, schedule="wsd", max_steps=60)
    trainer.cooldown = Cooldown(50, 60)
    state = trainer.state()
    resumed = make_trainer(tmp_path, schedule="wsd", max_steps=60)
    resumed.load_state(state)
    assert resumed.cooldown == Cooldown(50, 60)
    with pytest.raises(ValueError, match=r"resume with trainer\.schedule=wsd"):
        make_trainer(tmp_path, schedule="cosine", max_steps=60).load_state(state)


def test_schedule_free_checkpoints_hold_the_averaged_weights_and_resume_the_same_run(tmp_path):
    settings = dict(schedule="schedule_free", checkpoint_every=10)
    reference, trainer = run_to_end(tmp_path / "a", **settings)
    # The model that leaves training, and the final checkpoint, are the averaged weights x.
    assert not trainer.optimizer.param_groups[0]["train_mode"]
    saved = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)["model"]
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(saved[name], tensor, rtol=0, atol=0, msg=name)
    with pytest.raises(KeyboardInterrupt):
        run_to_end(tmp_path / "b", stop_at=10, **settings)
    # A checkpoint of a run in progress holds the average as its model, and the point the
    # steps are taken at apart, for the resume.
    payload = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    steps_point = payload["training"]["steps_weights"]
    assert any(not torch.equal(steps_point[name], x) for name, x in payload["model"].items())
    resumed, resumed_trainer = run_to_end(
        tmp_path / "c", resume_from=tmp_path / "b" / "checkpoint.pt", **settings
    )
    assert resumed_trainer.step == 40
    assert_same_weights(reference, resumed)


def test_a_clock_without_a_budget_plans_nothing():
    clock = RunClock(None)
    clock.started(0)
    clock.tick(10.0)
    assert clock.steps_that_fit(100) is None and not clock.out_of_time and clock.left is None


def test_under_the_stopping_rule_the_progress_shows_the_rule_not_the_caps_end(tmp_path):
    """No time estimate from a cap of thousands of steps that the rule will never reach: the
    validations since the best against the patience, the best loss and its step, the cap."""
    trainer = make_trainer(tmp_path, validation=True, max_steps=None, validate_every=2)
    assert trainer.stopping_rule and trainer._bar_total() is None
    trainer.best_validation, trainer.validations_since_best = (2.5, 250), 3
    fields = trainer._progress(loss="2.7")
    assert fields == {
        "loss": "2.7",
        "best": "2.5000@250",
        "since_best": "3/8",
        "cap": str(trainer.total_steps),
    }
    budgeted = make_trainer(
        tmp_path, validation=True, max_steps=None, validate_every=2, time_budget="10m"
    )
    assert budgeted._progress()["left"] == "10m00s"
    fixed = make_trainer(tmp_path, max_steps=60)
    assert fixed._bar_total() == 60 and fixed._progress() == {}


def test_schedule_free_warms_up_over_the_steps_the_budget_fits(tmp_path, monkeypatch):
    trainer = make_trainer(
        tmp_path, schedule="schedule_free", max_steps=1000, time_budget="3s", warmup_fraction=0.1
    )
    assert trainer.optimizer.param_groups[0]["warmup_steps"] == 100  # a tenth of the cap
    fake_clock(monkeypatch, trainer, 0.1)  # 30 steps fit
    trainer.train()
    assert trainer.step == 30
    assert trainer.optimizer.param_groups[0]["warmup_steps"] == 3  # a tenth of those


def test_a_time_budget_keeps_room_for_the_closing_validation_evaluation_and_saves(tmp_path):
    """Steps of 0.1 s, planner evaluations of 1 s every 10 steps, saves of 0.05 s: the last
    evaluation and saves, after the last step, still end within the budget plus one step."""
    now = [0.0]
    model, windows, _, cfg = tiny_training(
        max_steps=1000, time_budget="10s", eval_every=10, checkpoint_every=1000
    )

    def evaluate(model):
        now[0] += 1.0
        return 0.0, {}

    def save(state, name="checkpoint.pt"):
        now[0] += 0.05
        return tmp_path / name

    trainer = Trainer(model, windows, cfg, save, progress=False, evaluate=evaluate)
    step = trainer.train_step

    def timed_step(window_ids):
        now[0] += 0.1
        return step(window_ids)

    trainer.train_step = timed_step
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module.time, "perf_counter", lambda: now[0])
        trainer.train()
    assert now[0] <= 10 + 0.1 + 1e-9
    # At step 40, 7.05 s in: 8 steps, the evaluation due after step 40 and the closing one,
    # and the two closing saves fit; step 50's evaluation would not.
    assert trainer.step == 48 and now[0] == pytest.approx(9.9)
    assert trainer.clock.elapsed <= 10 + 0.1


def straight_and_extended(tmp_path, schedule: str, **settings) -> tuple[Trainer, Trainer, dict]:
    """A run of 40 steps; a run of 20 steps extended to 40 by a resume with the larger cap;
    and the finished 20-step run's state."""
    settings = dict(schedule=schedule, warmup_fraction=0.0, **settings)
    straight = make_trainer(tmp_path, max_steps=40, **settings)
    straight.train()
    short = make_trainer(tmp_path, max_steps=20, **settings)
    short.train()
    state = short.state(finished=True)
    extended = make_trainer(tmp_path, max_steps=40, **settings)
    extended.model.load_state_dict(short.model.state_dict())
    extended.load_state(state)
    return straight, extended, state


def test_a_wsd_run_extends_from_before_its_cooldown_and_ends_annealed_again(tmp_path):
    """The 20-step run cooled down from step 17: extended to 40, it goes on from step 17's
    weights and optimiser at the peak, cools down from step 34, and ends as the 40-step run
    does (no warm-up, so the two plans agree on every earlier step)."""
    straight, extended, state = straight_and_extended(tmp_path, "wsd")
    assert state["cooldown"] == {"start": 17, "end": 20, "level": 1.0}
    assert extended.step == 17 and extended.extended_from == 17 and extended.cooldown is None
    for name, tensor in extended.model.state_dict().items():
        torch.testing.assert_close(tensor, state["before_cooldown"]["model"][name], rtol=0, atol=0)
    rates = learning_rates(extended)
    assert extended.step == 40 and extended.cooldown == Cooldown(34, 40)
    assert rates[:17] == [PEAK] * 17 and rates[-1] == pytest.approx(0.1 * PEAK)
    assert_same_weights(straight.model, extended.model)


def test_a_schedule_free_run_extends_from_where_it_ended(tmp_path):
    """Its average is a finished model at every step: the extended run takes 20 more steps
    from the finished run's state, the same as the 40-step run up to rounding (the point its
    steps are taken at is recomputed from the saved average)."""
    straight, extended, _ = straight_and_extended(tmp_path, "schedule_free")
    assert extended.step == 20 and extended.extended_from == 20
    extended.train()
    assert extended.step == 40
    assert_same_weights(straight.model, extended.model, rtol=1e-4, atol=1e-5)


def test_a_longer_cosine_run_is_refused_and_says_why(tmp_path):
    trainer = make_trainer(tmp_path, schedule="cosine", max_steps=20)
    state = trainer.state()
    with pytest.raises(ValueError, match="a cosine run cannot be extended: its learning rate"):
        make_trainer(tmp_path, schedule="cosine", max_steps=40).load_state(state)
    with pytest.raises(ValueError, match=r"or a larger trainer\.max_steps or trainer\.time_budget"):
        make_trainer(tmp_path, schedule="wsd", max_steps=10).load_state(
            make_trainer(tmp_path, schedule="wsd", max_steps=20).state()
        )
    budget = make_trainer(tmp_path, schedule="wsd", max_steps=20, time_budget="1m").state()
    with pytest.raises(ValueError, match="planned 20 steps within 60 s, this config plans 20 "):
        make_trainer(tmp_path, schedule="wsd", max_steps=20, time_budget="30s").load_state(budget)


def test_resuming_a_finished_wsd_run_says_why_it_stopped(tmp_path):
    trainer = make_trainer(tmp_path, schedule="wsd", max_steps=20)
    trainer.train()
    resumed = make_trainer(tmp_path, schedule="wsd", max_steps=20)
    resumed.load_state(trainer.state(finished=True))
    summary = resumed.train()
    assert summary.steps == 20 and resumed.extended_from is None
    assert summary.stop_reason == (
        "the run neared its 20 planned steps, so the learning rate cooled down from step 17 to 20"
    )
