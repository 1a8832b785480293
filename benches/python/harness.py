"""The timing harness the Python benches share: calibrated ``timeit`` cases run interleaved,
repetition by repetition, and reported as medians.

Method: each case is a ``timeit`` statement (a string with its globals, or a callable); after a
warm-up call its loop count is calibrated so one repetition takes at least ``min_seconds``; the
cases of a row then run interleaved, repetition by repetition (so load drifts hit them alike),
and the median seconds per call is reported.
"""

import statistics
import timeit


def calibrate(timer: timeit.Timer, min_seconds: float) -> int:
    timer.timeit(1)  # warm-up: first-use costs (device discovery, imports) are not measured
    number = 1
    while timer.timeit(number) < min_seconds:
        number *= 2
    return number


def run_row(cases: dict, reps: int, min_seconds: float = 2e-3) -> dict:
    """Median seconds per call of each `name: (statement, globals)`, interleaved."""
    timers = {name: timeit.Timer(stmt, globals=g) for name, (stmt, g) in cases.items()}
    numbers = {name: calibrate(t, min_seconds) for name, t in timers.items()}
    samples = {name: [] for name in cases}
    for _ in range(reps):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(numbers[name]) / numbers[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def fmt(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    return f"{seconds * 1e3:.2f} ms"
