"""KL controllers: fixed, adaptive (Ziegler et al.), scheduled; exact resume through state_dict."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.algorithms import (
    KL_CONTROLLER_KINDS,
    AdaptiveKLController,
    FixedKLController,
    ScheduledKLController,
    build_kl_controller,
)

FAST = settings(max_examples=30, deadline=None)
SCHEDULE = dict(init_kl_coef=0.1, ramp_kl_coef=0.5, target_kl_coef=0.02, total_steps=1000, warmup_end=0.2,
                ramp_end=0.6, oscillation_amplitude=0.5, oscillation_cycles=2)


def test_fixed_never_moves():
    controller = FixedKLController(kl_coef=0.05)
    for kl in (0.0, 1.0, 100.0):
        controller.update(current_kl=kl, n_steps=256)
    assert controller.value == 0.05


def test_adaptive_update_by_hand():
    controller = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10_000)
    controller.update(current_kl=12.0, n_steps=256)  # error 12/6 - 1 = 1, clipped to 0.2
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10_000))
    controller.update(current_kl=4.5, n_steps=1000)  # error -0.25 -> -0.2
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10_000) * (1 - 0.2 * 1000 / 10_000))
    controller.update(current_kl=6.6, n_steps=1000)  # error 0.1, inside the clip
    assert controller.value == pytest.approx(0.1 * 1.00512 * 0.98 * 1.01)


@FAST
@given(kl=st.floats(0.0, 100.0), n_steps=st.integers(1, 5000))
def test_adaptive_moves_in_the_direction_that_corrects_the_kl(kl, n_steps):
    controller = AdaptiveKLController(init_kl_coef=0.2, target_kl=1.0, horizon=10_000)
    controller.update(current_kl=kl, n_steps=n_steps)
    if kl > 1.0:
        assert controller.value > 0.2  # too much KL: penalise harder
    elif kl < 1.0:
        assert controller.value < 0.2
    else:
        assert controller.value == 0.2


def test_adaptive_closed_loop_converges_to_target():
    """A toy policy whose KL falls as the coefficient rises (KL = 0.5 / coef) settles at the target KL."""
    controller = AdaptiveKLController(init_kl_coef=0.01, target_kl=2.0, horizon=1000)
    for _ in range(2000):
        controller.update(current_kl=0.5 / controller.value, n_steps=100)
    assert 0.5 / controller.value == pytest.approx(2.0, rel=1e-3)


def test_schedule_phases_by_hand():
    controller = ScheduledKLController(**SCHEDULE)
    c0, c1, c2 = 0.1, 0.5, 0.02
    assert controller.coef_at(0.0) == pytest.approx(c0)
    assert controller.coef_at(0.025) == pytest.approx(c0 * 1.5)  # a quarter of the first of two cycles
    assert controller.coef_at(0.075) == pytest.approx(c0 * 0.5)
    assert controller.coef_at(0.2) == pytest.approx(c0)  # warm-up ends where it began
    assert controller.coef_at(0.3) == pytest.approx(c0 + (c1 - c0) * math.sqrt(0.25))
    assert controller.coef_at(0.6) == pytest.approx(c1)
    assert controller.coef_at(0.8) == pytest.approx(c2 + (c1 - c2) * 0.25)
    assert controller.coef_at(1.0) == pytest.approx(c2)
    assert controller.coef_at(7.0) == pytest.approx(c2)  # clamped past the end


@pytest.mark.parametrize(
    "overrides", [{}, {"warmup_end": 0.0}, {"ramp_end": 0.2}, {"ramp_end": 1.0}, {"warmup_end": 1.0, "ramp_end": 1.0}]
)
def test_schedule_is_continuous_and_positive(overrides):
    controller = ScheduledKLController(**{**SCHEDULE, **overrides})
    for boundary in (controller.warmup_end, controller.ramp_end):
        eps = 1e-10  # the square-root ramp is steep at its start: approach the joints closely
        assert controller.coef_at(boundary - eps) == pytest.approx(controller.coef_at(boundary + eps), abs=1e-4)
    grid = [controller.coef_at(i / 20_000) for i in range(20_001)]
    assert min(grid) > 0
    assert max(abs(a - b) for a, b in zip(grid, grid[1:])) < 1e-2  # values span 0.02..0.5: a jump would show


def test_schedule_advances_with_n_steps_and_ignores_kl():
    controller = ScheduledKLController(**SCHEDULE)
    controller.update(current_kl=123.0, n_steps=300)
    assert controller.progress == pytest.approx(0.3)
    assert controller.value == pytest.approx(controller.coef_at(0.3))
    controller.update(current_kl=0.0, n_steps=5000)
    assert controller.progress == 1.0 and controller.value == pytest.approx(0.02)


@pytest.mark.parametrize(
    "kind,kwargs",
    [
        ("fixed", {"kl_coef": 0.05}),
        ("adaptive", {"init_kl_coef": 0.05, "target_kl": 1.0, "horizon": 500}),
        ("scheduled", SCHEDULE),
    ],
)
def test_state_dict_round_trip_resumes_exactly(kind, kwargs):
    kls = [3.0, 0.2, 1.7, 0.9, 5.0, 0.1]
    straight = build_kl_controller(kind, **kwargs)
    first = build_kl_controller(kind, **kwargs)
    for kl in kls[:3]:
        straight.update(kl, 100)
        first.update(kl, 100)
    resumed = build_kl_controller(kind, **kwargs)
    resumed.load_state_dict(first.state_dict())
    assert resumed.value == straight.value
    for kl in kls[3:]:
        straight.update(kl, 100)
        resumed.update(kl, 100)
        assert resumed.value == straight.value
    if kind != "fixed":
        assert straight.value != build_kl_controller(kind, **kwargs).value  # the state did carry something


def test_loading_another_kinds_state_is_refused():
    with pytest.raises(ValueError, match="adaptive"):
        FixedKLController(0.1).load_state_dict(AdaptiveKLController(0.1, 1.0, 10).state_dict())


def test_factory_kinds_and_errors():
    assert KL_CONTROLLER_KINDS == ("fixed", "adaptive", "scheduled")
    adaptive = build_kl_controller("adaptive", init_kl_coef=0.1, target_kl=1.0, horizon=10)
    assert isinstance(adaptive, AdaptiveKLController)
    with pytest.raises(ValueError) as excinfo:
        build_kl_controller("pid", kl_coef=0.1)
    assert "'pid'" in str(excinfo.value) and "scheduled" in str(excinfo.value)
    with pytest.raises(TypeError):
        build_kl_controller("fixed", init_kl_coef=0.1)


@pytest.mark.parametrize(
    "bad",
    [{"total_steps": 0}, {"warmup_end": 0.7}, {"ramp_end": 1.5}, {"oscillation_amplitude": 1.0},
     {"oscillation_cycles": 1.5}],
)
def test_invalid_schedules_are_refused(bad):
    with pytest.raises(ValueError):
        ScheduledKLController(**{**SCHEDULE, **bad})


def test_invalid_adaptive_config_is_refused():
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, target_kl=1.0, horizon=0)
