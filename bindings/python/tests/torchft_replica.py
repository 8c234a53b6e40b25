"""One replica group (one process) of torchft's DDP training, on ProcessGroupHccn or torchft's
own ProcessGroupGloo, reporting what happens as JSON lines on stdout for torchft_scenario.py:

    {"ev": "ready", "replica": 1, "t": ...}                  (with --go-file: waits for it to exist)
    {"ev": "start", "replica": 1, "t": ...}                  (t: CLOCK_MONOTONIC, shared by the host)
    {"ev": "step", "step": 7, "committed": true, "participants": 2, "t": ...}
    {"ev": "error", "step": 7, "t": ..., "error": "..."}    (a step whose collective failed)
    {"ev": "fault", "kind": "kill", "step": 10, "t": ...}   (just before it kills or stops itself)
    {"ev": "done", "step": 40, "t": ...}

torchft's documented pieces only: Manager, DistributedDataParallel (torchft's, or with
``--ddp hccn`` hccn.torchft's, which survives a failed step on any group), OptimizerWrapper.
The data of a step depend only on the step and the replica's index, so two runs that commit the
same steps with the same participants end with the same weights. ``--fault kill|freeze|stall
--fault-step K``: in its gradient hook at step K or the first after it in which every replica
group takes part (``--replicas``), while the other replicas are inside the
allreduce, the process kills itself (SIGKILL), stops itself (SIGSTOP; the scenario resumes or
kills it) or sleeps ``--stall-s`` seconds without entering the collective (alive, heartbeating:
stuck in user code). It trains ``--steps`` steps, and on until a step commits with ``--replicas``
replica groups (a restarted one has healed and joined). At the end it writes its parameters (float64, little-endian) to ``--out``.
"""

import argparse
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn, optim

import torchft
import torchft.ddp
from torchft.checkpointing.pg_transport import PGTransport


def say(**event):
    event["t"] = time.monotonic()
    print(json.dumps(event), flush=True)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--pg", choices=["hccn", "gloo"], default="hccn")
    p.add_argument("--replica", type=int, required=True)
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--replicas", type=int, default=1, help="go on past --steps until a step commits with this many")
    p.add_argument("--out", default=None)
    p.add_argument("--ddp", choices=["torchft", "hccn"], default="torchft")
    p.add_argument("--transport", choices=["http", "pg"], default="http", help="how a recovering replica heals")
    p.add_argument("--fault", choices=["none", "kill", "freeze", "stall"], default="none")
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--stall-s", type=float, default=5.0)
    p.add_argument("--step-s", type=float, default=0.05, help="time a step's compute takes at least")
    p.add_argument("--timeout-s", type=float, default=10.0, help="the process group's and the Manager's timeout")
    p.add_argument("--buckets", type=int, default=1, help="gradient buckets per step (DDP's bucket_cap_mb)")
    p.add_argument("--go-file", default=None, help="say ready, then train once this file exists")
    return p.parse_args()


def make_pg(kind, timeout):
    if kind == "hccn":
        from hccn.torchft import ProcessGroupHccn

        return ProcessGroupHccn(timeout=timeout)
    return torchft.ProcessGroupGloo(timeout=timeout)


def batch(step, replica):
    g = torch.Generator().manual_seed(1000 * step + replica)
    x = torch.randn(32, 64, generator=g)
    return x, x[:, :8].sum(dim=1, keepdim=True).tanh()


def with_fault(ddp_class, a, armed):
    """`ddp_class` whose gradient hook first injects the fault of `a`, once, when `armed[0]`
    (set by the loop once every replica is in the job and the fault's step has come)."""

    class Faulty(ddp_class):
        @staticmethod
        def _comm_hook(state, bucket):
            if armed[0]:
                armed[0] = False
                time.sleep(0.2)  # the others are inside the allreduce by now
                say(ev="fault", kind=a.fault, step=state.current_step())
                if a.fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif a.fault == "freeze":
                    os.kill(os.getpid(), signal.SIGSTOP)
                else:
                    time.sleep(a.stall_s)
            return ddp_class._comm_hook(state, bucket)

    return Faulty


def main():
    a = parse()
    timeout = datetime.timedelta(seconds=a.timeout_s)
    torch.manual_seed(0)  # every replica starts from the same weights; init_sync checks nothing more
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    inner = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    pg = make_pg(a.pg, timeout)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    transport = None
    if a.transport == "pg":
        transport = PGTransport(pg, timeout=timeout, device=torch.device("cpu"))
    manager = torchft.Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"replica_{a.replica}",
        lighthouse_addr=a.lighthouse,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        hostname="127.0.0.1",
        timeout=timeout,
        quorum_timeout=datetime.timedelta(seconds=120),  # the first waits for the others to import torch
        connect_timeout=timeout,
        checkpoint_transport=transport,
    )
    ddp_class = torchft.ddp.DistributedDataParallel
    if a.ddp == "hccn":
        from hccn.torchft import DistributedDataParallel as ddp_class
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    cap_mb = params / a.buckets / 2**20 * 1.01
    armed, pending = [False], a.fault != "none"
    ddp = with_fault(ddp_class, a, armed)(manager, model, bucket_cap_mb=cap_mb)
    opt = torchft.Optimizer(manager, inner)

    if a.go_file:
        # The first replicas start together: a slow import in one must not let another train
        # every step alone (the fault would never find them all in the job).
        say(ev="ready", replica=a.replica)
        while not os.path.exists(a.go_file):
            time.sleep(0.01)
    say(ev="start", replica=a.replica, pg=a.pg)
    loss_fn = nn.MSELoss()
    participants = 0
    while manager.current_step() < a.steps or (participants < a.replicas and manager.current_step() < 20 * a.steps):
        t0 = time.monotonic()
        opt.zero_grad()
        step = manager.current_step()
        x, y = batch(step, a.replica)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        rest = a.step_s - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
        error = manager.errored()
        if error is not None:
            say(ev="error", step=step, error=str(error.original_exception)[:300])
        opt.step()
        if manager.current_step() > step:
            participants = manager.num_participants()
            if pending and participants == a.replicas and manager.current_step() >= a.fault_step:
                armed[0], pending = True, False
        say(
            ev="step",
            step=step,
            now=manager.current_step(),
            committed=manager.current_step() > step,
            participants=manager.num_participants(),
            loss=float(loss),
        )
    say(ev="done", step=manager.current_step())
    if a.out:
        flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
        with open(a.out, "wb") as f:
            f.write(flat.numpy().tobytes())
    manager.shutdown(wait=False)
    sys.stdout.flush()
    os._exit(0)  # torchft's threads and servers need not be joined


if __name__ == "__main__":
    main()
