"""ExactClock: waits for a known time land SimPy's clock on that float, bit for bit."""
from sim.clock import ExactClock

NOW_S, TARGET_S = 0.03571043019722563, 0.12098615525431265   # now + (target - now) != target here


def _clock_after(start_s: float, target_s: float, exact: bool) -> float:
    env = ExactClock()
    seen = []

    def proc():
        yield env.timeout(start_s)
        yield env.timeout_until(target_s) if exact else env.timeout(target_s - env.now)
        seen.append(env.now)

    env.process(proc())
    env.run()
    return seen[0]


def test_plain_delay_misses_the_target_by_rounding():
    assert NOW_S + (TARGET_S - NOW_S) != TARGET_S
    assert _clock_after(NOW_S, TARGET_S, exact=False) != TARGET_S


def test_timeout_until_lands_exactly_and_keeps_event_order():
    assert _clock_after(NOW_S, TARGET_S, exact=True) == TARGET_S
    env, order = ExactClock(), []

    def waiter(name, t_s):
        yield env.timeout_until(t_s)
        order.append((name, env.now))

    env.process(waiter("late", 0.3))
    env.process(waiter("early", 0.1))
    env.process(waiter("past", -1.0))            # a time already passed fires at once
    env.run()
    assert order == [("past", 0.0), ("early", 0.1), ("late", 0.3)]
