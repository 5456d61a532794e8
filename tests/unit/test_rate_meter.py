"""The coordinators' count-and-rate meter (offset-commit-count / offset-commit-rate)."""

from broker.coordinator.rate_meter import RateMeter


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_count_and_rate_over_the_window() -> None:
    clock = Clock()
    m = RateMeter(clock, window_s=10)
    for _ in range(10):
        m.record(5)
        clock.t += 1
    assert m.count == 50
    assert m.rate() == 45 / 10  # at 1010 the window is (1000, 1010]: the first second left it
    clock.t += 5  # five more seconds leave it
    assert m.count == 50
    assert m.rate() == 20 / 10


def test_a_young_meter_divides_by_its_age_and_an_idle_one_reads_zero() -> None:
    clock = Clock()
    m = RateMeter(clock, window_s=30)
    m.record(4)
    clock.t += 2
    assert m.rate() == 2.0
    clock.t += 60
    assert m.rate() == 0.0
    assert m.count == 4
