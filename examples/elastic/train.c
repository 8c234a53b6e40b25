/*
 * Elastic data-parallel training with hccn: linear regression by SGD on synthetic data.
 *
 *   hccnrun --elastic -n 4 ./train [STEPS]
 *
 * Each step processes one global batch of BATCH samples, shared among the ranks alive at that
 * moment; the gradient is the sum over the batch (an allreduce SUM) divided by BATCH, so the run
 * computes the same model whatever the number of ranks, up to floating-point summation order.
 * When a rank dies, the survivors' allreduce fails; they call hccn_comm_rebuild, which agrees on
 * who is left and admits the replacement hccnrun starts; rank 0 then broadcasts the model and the
 * step, and the interrupted step is done again. A replacement learns it is one from its epoch.
 *
 * For tests: TRAIN_KILL="RANK:STEP,RANK:STEP" makes the process launched as RANK kill itself
 * (SIGKILL) when it reaches STEP.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hccn.h"

enum { DIM = 16, BATCH = 256 };

/* Features have variance 1/12, so the loss shrinks by about (1 - rate/12)^2 per step. */
static const float LEARNING_RATE = 1.5f;

/* Sample i of the endless synthetic data set: features x and target y = w_true . x + noise. */
static void sample(uint64_t i, float x[DIM], float *y)
{
    uint64_t s = i * 0x9e3779b97f4a7c15ull + 1;
    float dot = 0.0f;
    for (int d = 0; d < DIM; d++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        x[d] = (float)((s * 0x2545f4914f6cdd1dull) >> 40) / (float)(1 << 24) - 0.5f;
        dot += (float)(d % 5 - 2) * x[d];
    }
    *y = dot + 0.01f * x[0] * x[1];
}

/* This rank's share of the batch at `step`: gradient sum (DIM) and squared-error sum. */
static void local_gradient(uint64_t step, uint32_t rank, uint32_t size, const float w[DIM], float out[DIM + 1])
{
    memset(out, 0, sizeof(float) * (DIM + 1));
    for (uint32_t k = rank; k < BATCH; k += size) {
        float x[DIM], y, err = 0.0f;
        sample(step * BATCH + k, x, &y);
        for (int d = 0; d < DIM; d++)
            err += w[d] * x[d];
        err -= y;
        for (int d = 0; d < DIM; d++)
            out[d] += err * x[d];
        out[DIM] += err * err;
    }
}

static int must_die(uint32_t rank, uint64_t step)
{
    const char *plan = getenv("TRAIN_KILL");
    for (const char *p = plan; p && *p;) {
        unsigned r, s;
        if (sscanf(p, "%u:%u", &r, &s) == 2 && r == rank && s == step)
            return 1;
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
    }
    return 0;
}

/* Survivors: agree, admit the replacement, and continue on the new communicator. */
static hccn_comm *recover(hccn_comm *comm)
{
    hccn_comm *next = NULL;
    hccn_result r = hccn_comm_rebuild(comm, 20000, &next);
    if (r != HCCN_SUCCESS) {
        fprintf(stderr, "rebuild failed: %s (%s)\n", hccn_get_error_string(r), hccn_get_last_error());
        exit(1);
    }
    hccn_comm_destroy(comm);
    return next;
}

int main(int argc, char **argv)
{
    uint64_t steps = argc > 1 ? strtoull(argv[1], NULL, 10) : 100, step = 0, epoch = 0;
    hccn_comm *comm;
    if (hccn_init_from_env(&comm) != HCCN_SUCCESS) {
        fprintf(stderr, "init: %s\n", hccn_get_last_error());
        return 1;
    }
    uint32_t rank, size, launch_rank;
    hccn_comm_rank(comm, &launch_rank);
    hccn_comm_epoch(comm, &epoch);
    int original = epoch == 0, synced = original;
    float w[DIM] = {0}, grad[DIM + 1], loss = 0.0f;

    while (step < steps) {
        hccn_comm_rank(comm, &rank);
        hccn_comm_size(comm, &size);
        if (!synced) {
            /* Joined or rebuilt: everyone takes rank 0's model and step. */
            uint64_t state[2] = {step, 0};
            if (hccn_broadcast(w, DIM, HCCN_FP32, 0, comm, NULL) != HCCN_SUCCESS ||
                hccn_broadcast(state, 2, HCCN_UINT64, 0, comm, NULL) != HCCN_SUCCESS) {
                comm = recover(comm);
                continue;
            }
            step = state[0];
            synced = 1;
            hccn_comm_epoch(comm, &epoch);
            printf("rank %u of %u: training from step %llu at epoch %llu\n", rank, size,
                   (unsigned long long)step, (unsigned long long)epoch);
        }
        if (original && must_die(launch_rank, step))
            raise(SIGKILL);
        local_gradient(step, rank, size, w, grad);
        if (hccn_allreduce(grad, grad, DIM + 1, HCCN_FP32, HCCN_SUM, comm, NULL) != HCCN_SUCCESS) {
            uint32_t failed[8], n = 0;
            hccn_comm_failed_ranks(comm, failed, 8, &n);
            printf("rank %u: step %llu failed (%u rank(s) lost), rebuilding\n", rank, (unsigned long long)step, n);
            comm = recover(comm);
            synced = 0;
            continue;
        }
        for (int d = 0; d < DIM; d++)
            w[d] -= LEARNING_RATE * grad[d] / BATCH;
        loss = grad[DIM] / BATCH;
        if (rank == 0 && step % 20 == 0)
            printf("step %4llu  loss %.6f  ranks %u\n", (unsigned long long)step, loss, size);
        step++;
    }
    if (rank == 0)
        printf("final loss %.9f after %llu steps\n", loss, (unsigned long long)steps);
    hccn_comm_destroy(comm);
    return 0;
}
