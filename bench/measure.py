"""What every benchmark's figures are made of, in the parent and in the load generator's workers
alike: the one clock processes share, the percentile, and the JSON line a figure is printed as.

Times that cross processes (a trigger in one, a receipt in another) are read from
``time.monotonic()``: CLOCK_MONOTONIC is one clock for every process on the machine, which trio's
per-run clock is not.
"""

from __future__ import annotations

import json
import math
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def now() -> float:
    # real-clock: compared across processes (CLOCK_MONOTONIC is shared, trio's clock is not)
    return time.monotonic()


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (a value that was measured); NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def rounded(value: float | int | None) -> float | int | None:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    return value


def figure(
    benchmark: str,
    name: str,
    value: float | int | None,
    unit: str,
    baseline: float | int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One figure as the JSON line every benchmark prints (and flushes, so a pipe sees it now)."""
    ratio = None
    if value is not None and baseline and not math.isnan(float(baseline)):
        ratio = round(float(value) / float(baseline), 3)
    line: dict[str, Any] = {
        "benchmark": benchmark,
        "figure": name,
        "value": rounded(value),
        "unit": unit,
        "baseline": rounded(baseline),
        "ratio": ratio,
        **extra,
        # The machine is shared: its 1-minute load average says how much the figure competed.
        "load_average": float(Path("/proc/loadavg").read_text().split()[0]),
    }
    print(json.dumps(line), flush=True)
    return line


@contextmanager
def reporting_errors(benchmark: str, name: str, **extra: Any) -> Iterator[None]:
    """A size that fails (a server that fell over, a condition never reached) prints a "skipped"
    line with the reason, and the benchmark goes on with the next size."""
    try:
        yield
    except Exception as exc:  # any failure is reported, and the run goes on
        reason = repr(exc)
        if isinstance(exc, BaseExceptionGroup):
            reason = "; ".join(repr(e) for e in _leaves(exc))
        traceback.print_exc(file=sys.stderr)
        line = {"benchmark": benchmark, "figure": name, "skipped": f"error: {reason[:1500]}"}
        print(json.dumps({**line, **extra}), flush=True)


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def micros_per(seconds: float, count: int) -> float | None:
    """``seconds`` (CPU) per one of ``count`` (round trips), in microseconds; None for none."""
    return seconds / count * 1e6 if count else None
