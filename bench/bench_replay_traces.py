"""The recorded Triton traces (tests/data/triton_traces) replayed through Triton's rule:
the table of docs/load-and-validate.md, "The batch race".

For each trace: the completion race's share as read from the trace, the share of
batches that left an older request behind (rule / Triton), and the rule's errors on
mean batch, queue p50 and (resampling the measured per-batch spread) queue p99, with
each batch holding its instance for its size's compute and turnaround. A last column
gives the source's order alone (no race) on the left-behind share and queue p50.

    python bench/bench_replay_traces.py [--data tests/data/triton_traces]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.test_triton_traces_recorded import recorded  # noqa: E402

from servelab.measure.replay import replay  # noqa: E402
from servelab.scenario import BatchingPolicy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "triton_traces")
    a = ap.parse_args()
    policy = BatchingPolicy(max_batch_size=32, max_queue_delay_microseconds=2000)
    print("| trace | race read | left behind (rule / Triton) | mean batch | queue p50 | "
          "queue p99 (spread) | source's order: left behind, p50 |")
    print("|---|---|---|---|---|---|---|")
    for path in sorted(a.data.glob("*.csv.gz"), key=lambda p: (p.name.split("_")[0],
                                                               int(p.name.split("_")[1][:-7]))):
        r = replay(recorded(path), policy, 1)
        m = r["measured"]
        got = r["rules"]["triton, measured race"]
        spread = r["rules"]["triton, measured race, measured spread"]
        src = r["rules"]["triton"]
        e = got["error"]
        print(f"| {path.name[:-7]} | {r['batcher_first']:.3f} | "
              f"{got['left_behind_share']:.3f} / {m['left_behind_share']:.3f} | "
              f"{e['mean_batch']:+.1%} | {e['queue_p50_ms']:+.1%} | "
              f"{spread['error']['queue_p99_ms']:+.1%} | "
              f"{src['left_behind_share']:.3f}, {src['error']['queue_p50_ms']:+.1%} |")


if __name__ == "__main__":
    main()
