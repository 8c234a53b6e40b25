"""Pipeline parallel: a 4-layer MLP cut into one stage per rank (2 or 4), trained with the 1F1B
schedule over hccn send/recv.

Each global batch is cut into micro-batches. Stage s runs (stages - s - 1) warm-up forwards,
then alternates one forward and one backward, then drains the remaining backwards; activations
travel forward and their gradients backward with send/recv, and gradients accumulate over the
micro-batches before one optimizer step. Every rank also trains the unsplit model on the whole
batch in one process; the run fails unless its stage's parameters match within 1e-5.

    hccnrun -n 2 /opt/hccn/venvs/torch/bin/python examples/pytorch/pipeline.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn

import hccn.torch  # noqa: F401 - registers the "hccn" backend

STEPS, BATCH, MICRO, WIDTH, LAYERS, TOL, LR = 6, 16, 4, 24, 4, 1e-5, 0.1

torch.set_num_threads(1)
dist.init_process_group("hccn")
stage, stages = dist.get_rank(), dist.get_world_size()
assert LAYERS % stages == 0, "the layers must split evenly over the stages"


def make_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


full = make_model()  # the single-process reference
per = 2 * LAYERS // stages
mine = make_model()[stage * per : (stage + 1) * per]  # this stage's layers, same start values
opt = torch.optim.SGD(mine.parameters(), lr=LR)
ref_opt = torch.optim.SGD(full.parameters(), lr=LR)
first, last = stage == 0, stage == stages - 1
mb = BATCH // MICRO
data = torch.Generator().manual_seed(11)

for step in range(STEPS):
    x = torch.randn(BATCH, WIDTH, generator=data)  # every rank draws the same batch
    y = torch.randn(BATCH, WIDTH, generator=data)
    inputs, outputs, losses = {}, {}, []

    def forward(i):
        if first:
            inp = x[i * mb : (i + 1) * mb]
        else:
            inp = torch.empty(mb, WIDTH)
            dist.recv(inp, src=stage - 1)
            inp.requires_grad_()
        out = mine(inp)
        if last:
            out = nn.functional.mse_loss(out, y[i * mb : (i + 1) * mb]) / MICRO
            losses.append(out.item())
        else:
            dist.send(out.detach(), dst=stage + 1)
        inputs[i], outputs[i] = inp, out

    def backward(i):
        if last:
            outputs[i].backward()
        else:
            grad = torch.empty(mb, WIDTH)
            dist.recv(grad, src=stage + 1)
            outputs[i].backward(grad)
        if not first:
            dist.send(inputs[i].grad, dst=stage - 1)
        del inputs[i], outputs[i]

    opt.zero_grad()
    warmup = min(stages - stage - 1, MICRO)
    for i in range(warmup):
        forward(i)
    for i in range(MICRO - warmup):  # steady state: one forward, one backward
        forward(warmup + i)
        backward(i)
    for i in range(MICRO - warmup, MICRO):  # cool-down
        backward(i)
    opt.step()

    ref_opt.zero_grad()
    ref_loss = nn.functional.mse_loss(full(x), y)
    ref_loss.backward()
    ref_opt.step()
    if last:
        print(f"step {step}: loss {sum(losses):.6f} (unsplit {ref_loss.item():.6f})", flush=True)

ref_stage = full[stage * per : (stage + 1) * per]
diff = max((a - b).abs().max().item() for a, b in zip(mine.parameters(), ref_stage.parameters()))
print(f"stage {stage}: max parameter difference from the unsplit model {diff:.2e} (tolerance {TOL:g})", flush=True)
assert diff <= TOL, f"stage {stage} diverged from the unsplit model"
dist.barrier()
if last:
    print("pipeline: MATCH")
dist.destroy_process_group()
