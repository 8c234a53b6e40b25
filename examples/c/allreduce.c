/* The smallest hccn program: every rank contributes its own vector, one allreduce sums them,
 * and each rank checks the sum it got against the formula. Launch with hccnrun, which sets
 * the environment that hccn_init_from_env reads:
 *
 *   hccnrun -n 2 ./allreduce
 */
#include <hccn.h>
#include <stdio.h>
#include <stdlib.h>

#define COUNT 1024

/* Prints what failed, with the library's message for this thread, and exits. */
static void check(hccn_result r, const char *what) {
  if (r != HCCN_SUCCESS) {
    fprintf(stderr, "%s failed: %s: %s\n", what, hccn_get_error_string(r), hccn_get_last_error());
    exit(1);
  }
}

int main(void) {
  hccn_comm *comm = NULL;
  uint32_t rank = 0, size = 0;
  check(hccn_init_from_env(&comm), "hccn_init_from_env");
  check(hccn_comm_rank(comm, &rank), "hccn_comm_rank");
  check(hccn_comm_size(comm, &size), "hccn_comm_size");

  /* Rank r holds (r + 1) * i: the sum over ranks is i * size * (size + 1) / 2, exact in f32. */
  float *data = malloc(COUNT * sizeof(float));
  if (data == NULL) return 1;
  for (int i = 0; i < COUNT; i++) data[i] = (float)((rank + 1) * i);

  /* In place (sendbuf == recvbuf), blocking (NULL stream). */
  check(hccn_allreduce(data, data, COUNT, HCCN_FP32, HCCN_SUM, comm, NULL), "hccn_allreduce");

  int wrong = 0;
  for (int i = 0; i < COUNT; i++) {
    float want = (float)i * (float)(size * (size + 1) / 2);
    if (data[i] != want) {
      if (wrong++ < 5) fprintf(stderr, "rank %u: element %d is %g, want %g\n", rank, i, data[i], want);
    }
  }
  printf("rank %u of %u: allreduce of %d floats %s (data[%d] = %g)\n", rank, size, COUNT,
         wrong ? "WRONG" : "ok", COUNT - 1, data[COUNT - 1]);
  free(data);
  check(hccn_comm_destroy(comm), "hccn_comm_destroy");
  return wrong ? 1 : 0;
}
