/* MPI and hccn_init_from_env in one process under mpirun, where both talk to mpirun's PMIx
 * server: `mpi-first` (MPI_Init, then hccn), `hccn-first` (hccn, then MPI_Init: Open MPI fails
 * after a PMIx_Init and PMIx_Finalize of its own process), `no-destroy` (no MPI, and no
 * hccn_comm_destroy: mpirun fails a process that connected to PMIx and never finalized),
 * `worlds` (no MPI: two worlds at once, both destroyed, then a third; under any launcher). */
#include <hccn.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

static hccn_comm *join(void) {
  hccn_comm *c = NULL;
  if (hccn_init_from_env(&c) != HCCN_SUCCESS) {
    fprintf(stderr, "hccn_init_from_env: %s\n", hccn_get_last_error());
    return NULL;
  }
  return c;
}

/* Sums rank + 1 over `c`: 1 when the sum is right. */
static int sums(hccn_comm *c) {
  uint32_t rank = 0, size = 0;
  hccn_comm_rank(c, &rank);
  hccn_comm_size(c, &size);
  double x = rank + 1;
  if (hccn_allreduce(&x, &x, 1, HCCN_FP64, HCCN_SUM, c, NULL) != HCCN_SUCCESS) return 0;
  return x == size * (size + 1) / 2.0;
}

static int worlds(void) {
  hccn_comm *a = join(), *b = a ? join() : NULL;
  if (b == NULL) return 1;
  int ok = sums(b) && sums(a);
  hccn_comm_destroy(a);
  hccn_comm_destroy(b);
  hccn_comm *c = join();
  if (c == NULL) return 1;
  ok = ok && sums(c);
  uint32_t rank = 0, size = 0;
  hccn_comm_rank(c, &rank);
  hccn_comm_size(c, &size);
  printf("[%u] worlds: rank %u of %u %s\n", rank, rank, size, ok ? "ok" : "WRONG");
  hccn_comm_destroy(c);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "mpi-first";
  if (strcmp(mode, "worlds") == 0) return worlds();
  int mpi = strcmp(mode, "no-destroy") != 0;
  hccn_comm *c = NULL;
  if (mpi && strcmp(mode, "mpi-first") == 0) MPI_Init(&argc, &argv);
  if ((c = join()) == NULL) return 1;
  if (mpi && strcmp(mode, "hccn-first") == 0) MPI_Init(&argc, &argv);
  uint32_t rank = 0, size = 0;
  hccn_comm_rank(c, &rank);
  hccn_comm_size(c, &size);
  int ok = sums(c);
  if (mpi) {
    int mrank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &mrank);
    ok = ok && mrank == (int)rank;
    MPI_Barrier(MPI_COMM_WORLD);
  }
  printf("[%u] %s: rank %u of %u %s\n", rank, mode, rank, size, ok ? "ok" : "WRONG");
  if (strcmp(mode, "no-destroy") != 0) hccn_comm_destroy(c);
  if (mpi) MPI_Finalize();
  return ok ? 0 : 1;
}
