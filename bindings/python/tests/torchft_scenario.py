"""A torchft job on one machine with one fault, and what the surviving replica saw of it.

    python torchft_scenario.py --pg hccn --replicas 2 --fault kill --steps 40

starts one Lighthouse (torchft's ``torchft_lighthouse``, next to this interpreter) and
``--replicas`` replica groups of one process each (torchft_replica.py). Replica ``--victim``
(the last by default) injects ``--fault`` at ``--fault-step`` while the others are inside the
allreduce: ``kill`` (SIGKILL; restarted ``--restart-after`` seconds later, it heals from a live
replica), ``freeze`` (SIGSTOP for ``--freeze-s`` seconds, then SIGCONT, or with ``--then kill``
SIGKILL and a restart) or ``stall`` (it sleeps ``--stall-s`` seconds in user code). Every
process is ended on the way out, whatever happens, and the whole run has a hard ``--limit-s``.

The last line printed is a JSON summary (times in seconds from the fault, on CLOCK_MONOTONIC):
``error_s`` when the survivor's step failed, ``next_commit_s`` when it next committed a step,
``steps_lost`` its steps not committed in between, ``heal_s`` from the victim's return (its
restarted process up, or the resume) to its first committed step and ``healed`` whether that
step continued a live replica's state, ``final_steps`` per replica, ``equal_weights`` whether every replica ended with the same
parameters, ``ok`` whether every replica finished. ``--out DIR`` keeps every process's output
and the final parameters there.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pg", choices=["hccn", "gloo"], default="hccn")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--min-replicas", type=int, default=1, help="the Lighthouse's --min_replicas")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fault", choices=["none", "kill", "freeze", "stall"], default="none")
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--victim", type=int, default=None, help="replica that fails (default: the last)")
    p.add_argument("--restart-after", type=float, default=1.0)
    p.add_argument("--freeze-s", type=float, default=10.0)
    p.add_argument("--then", choices=["resume", "kill"], default="resume", help="after a freeze")
    p.add_argument("--stall-s", type=float, default=5.0)
    p.add_argument("--heartbeat-ms", type=int, default=1000, help="the Lighthouse's heartbeat timeout")
    p.add_argument("--join-ms", type=int, default=2000, help="the Lighthouse's join timeout")
    p.add_argument("--timeout-s", type=float, default=10.0, help="process groups' and Managers' timeout")
    p.add_argument("--ddp", choices=["torchft", "hccn"], default=None, help="default: torchft's on hccn, hccn's on gloo")
    p.add_argument("--transport", choices=["http", "pg"], default="http")
    p.add_argument("--buckets", type=int, default=1)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--limit-s", type=float, default=240.0, help="hard limit of the whole run")
    p.add_argument("--out", default=None, help="directory for the logs and final parameters")
    return p.parse_args(argv)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """The Lighthouse and the replica processes, with every event they printed."""

    def __init__(self, a, out):
        self.a, self.out = a, out
        self.events = []  # (replica, incarnation, event)
        self.lock = threading.Lock()
        self.procs = {}  # replica -> (incarnation, Popen)
        self.lighthouse = None
        self.readers = []

    def start_lighthouse(self, until):
        port = free_port()
        exe = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
        log = open(os.path.join(self.out, "lighthouse.log"), "w")
        self.lighthouse = subprocess.Popen(
            [exe, "--bind", f"127.0.0.1:{port}", "--min_replicas", str(self.a.min_replicas),
             "--quorum_tick_ms", "100", "--join_timeout_ms", str(self.a.join_ms),
             "--heartbeat_timeout_ms", str(self.a.heartbeat_ms)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        # torchft_lighthouse is a Python entry point: it imports torch first (seconds, tens of
        # them on a loaded machine).
        while time.monotonic() < until:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return f"http://127.0.0.1:{port}"
            except OSError:
                if self.lighthouse.poll() is not None:
                    break
                time.sleep(0.05)
        raise RuntimeError(f"the Lighthouse did not start (see {self.out}/lighthouse.log)")

    def start_replica(self, r, fault, lighthouse, go_file=None):
        incarnation = self.procs[r][0] + 1 if r in self.procs else 0
        a = self.a
        ddp = a.ddp or ("torchft" if a.pg == "hccn" else "hccn")
        cmd = [sys.executable, os.path.join(HERE, "torchft_replica.py"), "--pg", a.pg, "--replica", str(r),
               "--lighthouse", lighthouse, "--steps", str(a.steps), "--replicas", str(a.replicas), "--ddp", ddp, "--transport", a.transport,
               "--out", os.path.join(self.out, f"params-{r}.f64"), "--timeout-s", str(a.timeout_s),
               "--buckets", str(a.buckets), "--step-s", str(a.step_s), "--fault", fault,
               "--fault-step", str(a.fault_step), "--stall-s", str(a.stall_s)]
        if go_file:
            cmd += ["--go-file", go_file]
        err = open(os.path.join(self.out, f"replica-{r}.{incarnation}.log"), "w")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True)
        self.procs[r] = (incarnation, p)
        t = threading.Thread(target=self._read, args=(r, incarnation, p), daemon=True)
        t.start()
        self.readers.append(t)

    def _read(self, r, incarnation, p):
        with open(os.path.join(self.out, f"replica-{r}.{incarnation}.events"), "w") as f:
            for line in p.stdout:
                f.write(line)
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                with self.lock:
                    self.events.append((r, incarnation, ev))

    def find(self, pred):
        with self.lock:
            return [e for e in self.events if pred(*e)]

    def wait_for(self, pred, until, alive):
        """The first event for which `pred` holds, waiting until `until` while `alive()`."""
        while time.monotonic() < until:
            found = self.find(pred)
            if found:
                return found[0]
            if not alive():
                time.sleep(0.5)  # its last lines may still be in the pipe
                found = self.find(pred)
                return found[0] if found else None
            time.sleep(0.01)
        return None

    def stop(self):
        for _, p in self.procs.values():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
            p.wait()
        if self.lighthouse is not None and self.lighthouse.poll() is None:
            self.lighthouse.kill()
            self.lighthouse.wait()


def inject(job, a, victim, lighthouse, until):
    """Follows the victim's fault; returns (fault time, when the victim came back or None)."""
    _, p = job.procs[victim]
    ev = job.wait_for(lambda r, i, e: r == victim and e["ev"] == "fault", until, lambda: p.poll() is None)
    if ev is None:
        return None, None
    t_fault = ev[2]["t"]
    if a.fault == "kill":
        p.wait()
        time.sleep(max(0.0, t_fault + a.restart_after - time.monotonic()))
        job.start_replica(victim, "none", lighthouse)
        return t_fault, time.monotonic()
    if a.fault == "freeze":
        time.sleep(max(0.0, t_fault + a.freeze_s - time.monotonic()))
        if a.then == "resume":
            p.send_signal(signal.SIGCONT)
            return t_fault, time.monotonic()
        p.kill()
        p.wait()
        job.start_replica(victim, "none", lighthouse)
        return t_fault, time.monotonic()
    return t_fault, None


def summarize(job, a, victim, t_fault, t_back):
    s = {"pg": a.pg, "fault": a.fault, "replicas": a.replicas}
    done = {r: job.find(lambda rr, i, e: rr == r and e["ev"] == "done") for r in range(a.replicas)}
    s["final_steps"] = {r: (d[-1][2]["step"] if d else None) for r, d in done.items()}
    s["ok"] = all(d for d in done.values())
    survivor = 0 if victim != 0 else 1
    if t_fault is not None:
        fault_step = job.find(lambda r, i, e: r == victim and e["ev"] == "fault")[0][2]["step"]
        s["fault_step"] = fault_step
        mine = [e for r, i, e in job.find(lambda r, i, e: r == survivor) if e["t"] >= t_fault - 1]
        err = next((e for e in mine if e["ev"] == "error" and e["step"] >= fault_step), None)
        s["error_s"] = round(err["t"] - t_fault, 4) if err else None
        steps = [e for e in mine if e["ev"] == "step" and e["step"] >= fault_step]
        commit = next((e for e in steps if e["committed"]), None)
        s["next_commit_s"] = round(commit["t"] - t_fault, 4) if commit else None
        s["steps_lost"] = sum(1 for e in steps if not e["committed"] and (commit is None or e["t"] < commit["t"]))
        s["survivor_steps_after_fault"] = sum(1 for e in steps if e["committed"])
    if t_back is not None:
        # The victim after the restart or the resume: when it is back in the training (its
        # process up: the start event, or the resume), its first committed step, and whether
        # that step continued a live replica's state (its step jumped) or its own.
        before = [e["now"] for r, i, e in job.find(lambda r, i, e: r == victim and e["ev"] == "step" and e["t"] < t_back)]
        own = before[-1] if a.fault == "freeze" and a.then == "resume" and before else 0
        mine = [e for r, i, e in job.find(lambda r, i, e: r == victim and e["t"] >= t_back)]
        up = next((e["t"] for e in mine if e["ev"] == "start"), t_back)
        first = next((e for e in mine if e["ev"] == "step" and e["committed"]), None)
        s["heal_s"] = round(first["t"] - up, 4) if first else None
        s["healed"] = bool(first) and first["now"] - 1 > own
    params = []
    for r in range(a.replicas):
        path = os.path.join(job.out, f"params-{r}.f64")
        params.append(open(path, "rb").read() if os.path.exists(path) else None)
    s["equal_weights"] = all(p is not None and p == params[0] for p in params)
    return s


def run(a):
    out = a.out or tempfile.mkdtemp(prefix="hccn-torchft-")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.startswith("params-"):
            os.remove(os.path.join(out, f))
    victim = a.replicas - 1 if a.victim is None else a.victim
    job = Job(a, out)
    until = time.monotonic() + a.limit_s
    try:
        lighthouse = job.start_lighthouse(until)
        go = os.path.join(out, "go")
        if os.path.exists(go):
            os.remove(go)
        for r in range(a.replicas):
            job.start_replica(r, a.fault if r == victim else "none", lighthouse, go)
        for r in range(a.replicas):
            _, p = job.procs[r]
            if job.wait_for(lambda rr, i, e, r=r: rr == r and e["ev"] == "ready", until, lambda p=p: p.poll() is None) is None:
                raise RuntimeError(f"replica {r} did not get ready (see {out}/replica-{r}.0.log)")
        open(go, "w").close()
        t_fault = t_back = None
        if a.fault != "none":
            t_fault, t_back = inject(job, a, victim, lighthouse, until)
        for r in range(a.replicas):
            while job.procs[r][1].poll() is None and time.monotonic() < until:
                time.sleep(0.05)
        for t in job.readers:
            t.join(timeout=max(0.1, until - time.monotonic()))
        summary = summarize(job, a, victim, t_fault, t_back)
        summary["timed_out"] = time.monotonic() >= until
        summary["exit_codes"] = {r: p.poll() for r, (_, p) in job.procs.items()}
        summary["out"] = out
        return summary
    finally:
        job.stop()


def main():
    a = parse()
    print(json.dumps(run(a)), flush=True)


if __name__ == "__main__":
    main()
