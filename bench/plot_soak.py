"""Draw a soak's lag and throughput run by run (``bench_soak --series``) as a PNG.

Two panels sharing the soak's clock: the slot's lag in bytes before each run (what the run had
to drain) and after it (what it left), and the changes drained per second of the drain step.
A healthy soak has a flat band of lag that returns near zero after every run, and throughput
that does not lake as the lake's history grows.

``python -m bench.plot_soak SERIES.jsonl docs/img/soak.png [--title TEXT]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("series", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--title", default="Soak: drain runs under a steady write load")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    runs = [json.loads(line) for line in args.series.read_text().splitlines() if line.strip()]
    runs = runs[1:]  # the first run drains the initial load: another scale altogether
    minutes = [r["at_s"] / 60 for r in runs]
    figure, (lag, rate) = plt.subplots(2, 1, sharex=True, figsize=(8, 5.5), dpi=110)
    lag.plot(minutes, [r["lag_before"] / 1024 for r in runs], label="before the run")
    lag.plot(minutes, [r["lag_after"] / 1024 for r in runs], label="after the run")
    lag.set_ylabel("slot lag (KiB)")
    lag.legend(loc="upper left")
    lag.grid(alpha=0.3)
    rate.plot(minutes, [r["changes"] / r["drain"] if r["drain"] else 0 for r in runs],
              color="tab:green")  # fmt: skip
    rate.set_ylabel("changes drained / s")
    rate.set_xlabel("minutes into the soak")
    rate.grid(alpha=0.3)
    figure.suptitle(args.title)
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out)
    print(f"{args.out}: {len(runs)} runs drawn")


if __name__ == "__main__":
    main()
