/* MPI_Allreduce sweep for benches/compare.sh: fp32 sum, sizes min..max by a factor, each size
 * checked once, then timed (iterations chosen so a repetition lasts ~0.15 s, agreed by all
 * ranks; median of 3 repetitions; the slowest rank's time). Rank 0 prints "bytes microseconds".
 * Usage: mpirun -np N allreduce_mpi [min_bytes max_bytes factor] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static double median3(double a, double b, double c) {
    if (a > b) { double t = a; a = b; b = t; }
    if (b > c) { b = c; }
    return a > b ? a : b;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t min = argc > 1 ? strtoull(argv[1], NULL, 10) : 4;
    size_t max = argc > 2 ? strtoull(argv[2], NULL, 10) : (size_t)256 << 20;
    size_t factor = argc > 3 ? strtoull(argv[3], NULL, 10) : 4;
    float *send = malloc(max), *recv = malloc(max);
    if (!send || !recv) {
        fprintf(stderr, "allreduce_mpi: cannot allocate %zu bytes\n", max);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (size_t i = 0; i < max / 4; i++) send[i] = (float)(rank + 1);
    const float want = (float)size * (float)(size + 1) / 2.0f;
    for (size_t bytes = min; bytes <= max; bytes *= factor) {
        int count = (int)(bytes / 4);
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (recv[0] != want || recv[count - 1] != want) {
            fprintf(stderr, "allreduce_mpi: wrong result at %zu bytes\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double t0 = MPI_Wtime();
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double once = MPI_Wtime() - t0;
        int iters = once > 0 ? (int)(0.15 / once) : 10000, agreed;
        if (iters < 1) iters = 1;
        if (iters > 10000) iters = 10000;
        MPI_Allreduce(&iters, &agreed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        double reps[3];
        for (int r = 0; r < 3; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            for (int i = 0; i < agreed; i++)
                MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double mine = (MPI_Wtime() - t0) / agreed, slowest;
            MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            reps[r] = slowest;
        }
        if (rank == 0) {
            printf("%zu %.3f\n", bytes, median3(reps[0], reps[1], reps[2]) * 1e6);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
