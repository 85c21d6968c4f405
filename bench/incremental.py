"""Incremental rebalancing and static membership against the eager protocol, both measured in
the same run (broker ``serve --rebalance-protocol incremental|eager``).

Two parts, each run once per protocol on a fresh broker:

* **load generator**: one group of ``--members`` (1,000) simulated consumers over one topic of
  ``--partitions`` (10,000), in :mod:`bench.loadgen` workers that answer the coordinator and
  stamp, per partition, each StopFetcher answer and each StartFetcher that hands it on.
  Scenarios: ``join`` (one more member registers) and ``leave`` (one closes its connection
  cleanly).
* **consumers**: ``--consumers`` (10) real consumer processes (:mod:`bench.incremental_consumer`,
  the ``consumer`` library, printing their revoke and assign callbacks with times) over one topic
  of ``--consumer-partitions`` (900), records flowing from a producer (``--rate`` records/s).
  Scenarios: ``join``, ``leave`` (SIGTERM: the library stops, commits, leaves), ``kill``
  (SIGKILL), ``freeze`` (SIGSTOP until its partitions are handed on, past its session), and on a
  second group of static members (``instance_id``), ``rolling_restart`` (each member in turn
  stopped cleanly and started again with its instance id, the next once it fetches again).

Per scenario and protocol, one JSON line per figure (the issue's targets in ``target``):

* ``<part>_<scenario>_settle``: the trigger (join command, close, signal) to the last Stop answer
  or Start arrival it caused (ms). Baseline: the bare round trips (a StopFetcher-sized and a
  StartFetcher-sized frame, as in bench/rebalance.py) to the members involved, plus the sticky
  assignor's and the embedded store's time on the same group, measured in this run; for the
  incremental protocol also the eager protocol's time (``eager``).
* ``<part>_<scenario>_unowned``: unowned partition-seconds, the sum over partitions of the time no
  member may fetch it: from its Stop answer (or clean close, or the fault for a kill or freeze)
  until the StartFetcher that hands it on arrives. For the incremental protocol the baseline is
  (partitions moved / all partitions) x the eager protocol's figure; ``outside_moved`` is the
  part of partitions that did not move; ``unowned_outside_departed`` lists, for a kill or freeze,
  every partition ever unowned that the departed member did not hold.
* ``<part>_<scenario>_moved``: partitions whose owner changed; baseline the departed or joined
  member's share, the least a rebalance can move.
* ``<part>_<scenario>_contacted``: members (the departed one aside) that got a Stop or Start;
  baseline the members whose assignment changed; ``uninvolved`` counts the others.

The rolling restart's figures cover the whole roll: ``moved`` (by instance id), ``contacted``
(members other than the one restarting at the time), ``unowned`` and the roll's duration.

The load generator's join and leave are repeated ``--repeats`` times (default 3); the sample of
median time stands for each, the others are listed (``samples_ms``). For a kill or a freeze the
departed member's partitions count as unowned from the signal: the end of its lease is the
coordinator's to know, so the figure is an upper bound (a kill's clean close ends the lease at
once). With ``--work-dir`` each scenario's holdings and handoffs stay there as JSON.

    python -m bench.incremental [--quick] [--work-dir DIR] [--parts loadgen,consumers]
        [--protocols eager,incremental] [--repeats N] [--profile SECONDS]
"""

from __future__ import annotations

from bench.harness import (
    bench_arguments,
    run,
    work_area,
)
from bench.incremental_figures import BENCH, PROTOCOLS, broker_protocols
from bench.incremental_library import consumers_part
from bench.incremental_loadgen import loadgen_part


async def main() -> None:
    parser = bench_arguments(__doc__ or BENCH)
    parser.add_argument("--parts", default="loadgen,consumers")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.sized("--members", quick=20, full=1000, kind=int)
    parser.sized("--partitions", quick=200, full=10_000, kind=int)
    parser.sized("--consumers", quick=4, full=10, kind=int)
    parser.sized("--consumer-partitions", quick=40, full=900, kind=int)
    parser.sized("--session", quick=3.0, full=6.0, help="consumers' T")
    parser.sized(
        "--static-session",
        quick=10.0,
        full=20.0,
        help="the static members' T: a restart must fit in it, even on a busy machine where an "
        "interpreter takes seconds to start",
    )
    parser.sized("--rate", quick=30.0, full=300.0, help="records/s")
    parser.add_argument("--fetch-idle-interval", type=float, default=0.5)
    parser.add_argument(
        "--profile", type=float, default=0, help="py-spy seconds on one more loadgen join"
    )
    parser.sized("--repeats", quick=1, full=3, kind=int, help="loadgen joins and leaves")
    args = parser.parse()
    protocols = [p for p in args.protocols.split(",") if p]
    parts = [p for p in args.parts.split(",") if p]
    supported = broker_protocols()
    with work_area(args.work_dir, BENCH) as work:
        if "loadgen" in parts:
            await loadgen_part(work, protocols, supported, args)
        if "consumers" in parts:
            await consumers_part(work, protocols, supported, args)


if __name__ == "__main__":
    run(main)
