#!/usr/bin/env python3
"""Run a throwaway ZooKeeper on loopback for demos: a standalone server or a 3-node ensemble.

Prints the connect string (for ``coordinator serve --zookeeper``), then serves until Ctrl-C or
SIGTERM, and kills every server and removes its directory on the way out. Needs java and Debian's
``zookeeper`` package (``scripts/bootstrap.sh`` installs them when run as root).

    python scripts/zookeeper.py                  # standalone
    python scripts/zookeeper.py --servers 3      # an ensemble
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from launch.zookeeper import open_ensemble  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1, help="1 (standalone) or an odd number")
    parser.add_argument("--dir", type=Path, help="keep the servers' files here (default: temp)")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the servers are killed either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with open_ensemble(args.servers, base_dir=args.dir) as ensemble:
            print(ensemble.hosts, flush=True)
            signal.pause()
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:
        print(f"zookeeper: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
