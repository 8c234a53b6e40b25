/* The NCCL way, which needs nothing from the launcher: rank 0 makes a unique id, the application
 * sends it to the others (here with MPI_Bcast), and every rank joins with hccn_comm_init_rank.
 *
 *   mpicc -I include examples/launchers/unique_id_mpi.c -L target/release -lhccn -o unique_id_mpi
 *   mpirun -n 4 ./unique_id_mpi
 *
 * The id carries the address of a store that rank 0 listens on, on HCCN_BIND_ADDR (127.0.0.1
 * unless set): for ranks on several hosts, set HCCN_BIND_ADDR on every rank to its host's
 * address (mpirun -x HCCN_BIND_ADDR does not fit: each host has its own). */
#include <hccn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define COUNT 1024

static void check(hccn_result r, const char *what) {
  if (r != HCCN_SUCCESS) {
    fprintf(stderr, "%s failed: %s: %s\n", what, hccn_get_error_string(r), hccn_get_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

int main(int argc, char **argv) {
  int rank = 0, size = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  hccn_unique_id id;
  if (rank == 0) check(hccn_get_unique_id(&id), "hccn_get_unique_id");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  hccn_comm *comm = NULL;
  check(hccn_comm_init_rank(&comm, (uint32_t)size, &id, (uint32_t)rank), "hccn_comm_init_rank");

  float *x = malloc(COUNT * sizeof *x);
  if (x == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int i = 0; i < COUNT; i++) x[i] = (float)(rank + 1);
  check(hccn_allreduce(x, x, COUNT, HCCN_FP32, HCCN_SUM, comm, NULL), "hccn_allreduce");
  int wrong = 0;
  for (int i = 0; i < COUNT; i++) wrong += x[i] != (float)(size * (size + 1) / 2);
  printf("rank %d of %d: unique id over MPI_Bcast: %s\n", rank, size, wrong ? "WRONG" : "ok");
  check(hccn_comm_destroy(comm), "hccn_comm_destroy");
  free(x);
  MPI_Finalize();
  return wrong != 0;
}
