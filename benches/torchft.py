"""torchft over hccn against torchft's own Gloo group, in the same run: one replica group of two
killed or frozen in the middle of an allreduce, and what the surviving group sees.

    /opt/hccn/venvs/torch/bin/python benches/torchft.py [--repeat N] [--faults kill,freeze,freeze-kill]

Each case is a job of its own (bindings/python/tests/torchft_scenario.py): one Lighthouse
(heartbeat timeout 1 s, quorum tick 100 ms), two replica groups of one process training 40 steps
with torchft's Manager, DDP and Optimizer; at step 10 replica 1, while replica 0 waits in the
allreduce, is SIGKILLed and restarted 1 s later (``kill``), or SIGSTOPped for 10 s and then
resumed (``freeze``) or SIGKILLed and restarted (``freeze-kill``). Process groups and Managers
have torchft's default timeout, 60 s. On Gloo the DDP is hccn.torchft's (torchft 0.2.0's
crashes the surviving replica when a Gloo collective fails, examples/torchft/README.md); on hccn it is
torchft's own.

Columns, in seconds from the fault: ``error`` when the survivor's step failed; ``next commit``
when the survivor next committed a step; ``heal`` from the victim's return (its restarted
process up, or the resume) to its first committed step, which continued the survivor's state
(``healed``); ``lost`` the survivor's steps not committed in between; ``equal`` whether both
replicas ended with the same parameters.
"""

import argparse
import os
import statistics
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python", "tests"))
# The replica processes use this tree's package and library, as the tests do.
os.environ["PYTHONPATH"] = os.path.join(ROOT, "bindings", "python")
os.environ.setdefault("HCCN_LIB", os.path.join(ROOT, "target", "release", "libhccn.so"))

import torchft_scenario  # noqa: E402

FAULTS = {
    "kill": ["--fault", "kill", "--restart-after", "1"],
    "freeze": ["--fault", "freeze", "--freeze-s", "10", "--then", "resume"],
    "freeze-kill": ["--fault", "freeze", "--freeze-s", "10", "--then", "kill", "--restart-after", "0"],
}
COLUMNS = [("error", "error_s"), ("next commit", "next_commit_s"), ("heal", "heal_s"), ("lost", "steps_lost")]


def case(pg, fault):
    args = ["--pg", pg, "--replicas", "2", "--steps", "40", "--fault-step", "10", "--heartbeat-ms", "1000"]
    args += ["--timeout-s", "60", "--limit-s", "240"] + FAULTS[fault]
    return torchft_scenario.run(torchft_scenario.parse(args))


def cell(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    f = (lambda v: f"{v:.3f}") if any(isinstance(v, float) for v in values) else (lambda v: f"{v:g}")
    if len(values) == 1:
        return f(values[0])
    return f"{f(statistics.median(values))} ({f(min(values))}-{f(max(values))})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--faults", default="kill,freeze,freeze-kill")
    a = p.parse_args()
    rows = {}
    for i in range(a.repeat):
        for fault in a.faults.split(","):
            for pg in ("hccn", "gloo"):  # interleaved: the same machine load for both
                s = case(pg, fault)
                print(f"# run {i + 1} {fault} {pg}: {s}", flush=True)
                rows.setdefault((fault, pg), []).append(s)
    print()
    print("| fault | group | " + " | ".join(c for c, _ in COLUMNS) + " | healed | equal | finished |")
    print("|---|---|" + "---|" * (len(COLUMNS) + 3))
    for (fault, pg), runs in rows.items():
        cells = [cell([r.get(k) for r in runs]) for _, k in COLUMNS]
        flags = [
            f"{sum(1 for r in runs if r.get(k))}/{len(runs)}" for k in ("healed", "equal_weights", "ok")
        ]
        print(f"| {fault} | {pg} | " + " | ".join(cells + flags) + " |")
    for fault in a.faults.split(","):
        h = [r.get("next_commit_s") for r in rows.get((fault, "hccn"), [])]
        g = [r.get("next_commit_s") for r in rows.get((fault, "gloo"), [])]
        pairs = [(x, y) for x, y in zip(h, g) if x is not None and y is not None]
        if pairs:
            ratios = ", ".join(f"{x / y:.2f}" for x, y in pairs)
            print(f"{fault}: hccn's next commit / Gloo's, per run: {ratios}")


if __name__ == "__main__":
    main()
