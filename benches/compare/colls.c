/* One timing loop for every collective, compiled twice by benches/compare.sh from this file:
 *
 *   mpicc -O2 -DUSE_MPI colls.c -o colls_mpi              (Open MPI)
 *   cc -O2 -Iinclude colls.c -Ltarget/release -lhccn ...  (hccn's C ABI; run under hccnrun)
 *
 * so both libraries get the same buffers, the same loop, the same clock and the same checks.
 * fp32, sum where a reduction applies, root 0. S is the size a cell is labelled with:
 *   allreduce, broadcast, reduce   S = the buffer (each rank sends S)
 *   alltoall                       S = each rank's send buffer (n blocks of S/n; receives S)
 *   allgather                      S = each rank's contribution (receives n*S)
 *   reduce_scatter                 S = each rank's whole input (receives S/n)
 *   gather                         S = each rank's contribution (the root receives n*S)
 *   scatter                        S = the root's send buffer (n blocks of S/n)
 * The program starts with 0.3 s of 8-byte allreduces. Per cell: one untimed call, then warm-up batches of 1, 2, 4, ... calls until a batch lasts a
 * quarter of --rep-seconds; from the fastest batch the calls per repetition (about
 * --rep-seconds, at least 1); then --reps repetitions, each a barrier, the calls, and the slowest rank's mean
 * time per call (a max-allreduce); then one checked call: inputs refilled, outputs poisoned, every
 * output element compared with the exact value. Rank 0 prints one line per cell:
 *   op bytes calls_per_rep us_rep1 ... us_repR ok|WRONG
 * A call that returns an error ends the program (exit 1) after naming the call and the size.
 *
 * Usage: colls [--min B] [--max B] [--factor F] [--reps R] [--rep-seconds S] [--ops a,b,...] */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef USE_MPI
#include <mpi.h>
#define LIB_NAME "mpi"
#else
#include <hccn.h>
#define LIB_NAME "hccn"
#endif

enum op { ALLREDUCE, ALLGATHER, REDUCE_SCATTER, BROADCAST, ALLTOALL, REDUCE, GATHER, SCATTER, NOPS };
static const char *const OP_NAMES[NOPS] = {"allreduce", "allgather", "reduce_scatter", "broadcast",
                                           "alltoall",  "reduce",    "gather",         "scatter"};

static int rank, nranks;
static float *sendbuf, *recvbuf;

/* ---- the two libraries behind one small interface ------------------------------------------ */
#ifdef USE_MPI
static void lib_init(int *argc, char ***argv) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
}
static void lib_finalize(void) { MPI_Finalize(); }
static void lib_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); exit(code); }
static void lib_barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }
static double lib_max(double mine) {
  double out;
  MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}
/* MPI's default error handler aborts the job on any error, which names the call itself. */
static void run(enum op op, size_t count) {
  const MPI_Comm w = MPI_COMM_WORLD;
  const int c = (int)count, block = (int)(count / (size_t)nranks);
  switch (op) {
  case ALLREDUCE: MPI_Allreduce(sendbuf, recvbuf, c, MPI_FLOAT, MPI_SUM, w); break;
  case ALLGATHER: MPI_Allgather(sendbuf, c, MPI_FLOAT, recvbuf, c, MPI_FLOAT, w); break;
  case REDUCE_SCATTER:
    MPI_Reduce_scatter_block(sendbuf, recvbuf, block, MPI_FLOAT, MPI_SUM, w);
    break;
  case BROADCAST: MPI_Bcast(recvbuf, c, MPI_FLOAT, 0, w); break;
  case ALLTOALL: MPI_Alltoall(sendbuf, block, MPI_FLOAT, recvbuf, block, MPI_FLOAT, w); break;
  case REDUCE: MPI_Reduce(sendbuf, recvbuf, c, MPI_FLOAT, MPI_SUM, 0, w); break;
  case GATHER: MPI_Gather(sendbuf, c, MPI_FLOAT, recvbuf, c, MPI_FLOAT, 0, w); break;
  case SCATTER: MPI_Scatter(sendbuf, block, MPI_FLOAT, recvbuf, block, MPI_FLOAT, 0, w); break;
  default: break;
  }
}
#else
static hccn_comm *comm;
static void check(hccn_result r, const char *what, size_t bytes) {
  if (r == HCCN_SUCCESS) return;
  fprintf(stderr, "colls: rank %d: %s at %zu bytes failed: %s: %s\n", rank, what, bytes,
          hccn_get_error_string(r), hccn_get_last_error());
  exit(1);
}
static void lib_init(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  uint32_t r = 0, n = 0;
  check(hccn_init_from_env(&comm), "hccn_init_from_env", 0);
  check(hccn_comm_rank(comm, &r), "hccn_comm_rank", 0);
  check(hccn_comm_size(comm, &n), "hccn_comm_size", 0);
  rank = (int)r;
  nranks = (int)n;
}
static void lib_finalize(void) { check(hccn_comm_destroy(comm), "hccn_comm_destroy", 0); }
static void lib_abort(int code) { exit(code); }
static void lib_barrier(void) { check(hccn_barrier(comm, NULL), "hccn_barrier", 0); }
static double lib_max(double mine) {
  double out = 0;
  check(hccn_allreduce(&mine, &out, 1, HCCN_FP64, HCCN_MAX, comm, NULL), "hccn_allreduce (max)", 8);
  return out;
}
static void run(enum op op, size_t count) {
  const uint64_t c = count, block = count / (uint64_t)nranks;
  const size_t bytes = count * sizeof(float);
  switch (op) {
  case ALLREDUCE:
    check(hccn_allreduce(sendbuf, recvbuf, c, HCCN_FP32, HCCN_SUM, comm, NULL), "hccn_allreduce", bytes);
    break;
  case ALLGATHER:
    check(hccn_allgather(sendbuf, recvbuf, c, HCCN_FP32, comm, NULL), "hccn_allgather", bytes);
    break;
  case REDUCE_SCATTER:
    check(hccn_reduce_scatter(sendbuf, recvbuf, block, HCCN_FP32, HCCN_SUM, comm, NULL),
          "hccn_reduce_scatter", bytes);
    break;
  case BROADCAST:
    check(hccn_broadcast(recvbuf, c, HCCN_FP32, 0, comm, NULL), "hccn_broadcast", bytes);
    break;
  case ALLTOALL:
    check(hccn_alltoall(sendbuf, recvbuf, block, HCCN_FP32, comm, NULL), "hccn_alltoall", bytes);
    break;
  case REDUCE:
    check(hccn_reduce(sendbuf, recvbuf, c, HCCN_FP32, HCCN_SUM, 0, comm, NULL), "hccn_reduce", bytes);
    break;
  case GATHER:
    check(hccn_gather(sendbuf, recvbuf, c, HCCN_FP32, 0, comm, NULL), "hccn_gather", bytes);
    break;
  case SCATTER:
    check(hccn_scatter(sendbuf, recvbuf, block, HCCN_FP32, 0, comm, NULL), "hccn_scatter", bytes);
    break;
  default: break;
  }
}
#endif

/* ---- values: element i of rank r's input is exact in fp32, and so is any sum over ranks ---- */
static float input(int r, size_t i) { return (float)((i % 251) * 8 + (size_t)r + 1); }
static float summed(size_t i) {
  return (float)((i % 251) * 8 * (size_t)nranks + (size_t)nranks * (size_t)(nranks + 1) / 2);
}

static void fill_inputs(enum op op, size_t count) {
  if (op == BROADCAST) {
    if (rank == 0)
      for (size_t i = 0; i < count; i++) recvbuf[i] = input(0, i);
    return;
  }
  for (size_t i = 0; i < count; i++) sendbuf[i] = input(rank, i);
}

/* Elements of the output that the call defines on this rank. */
static size_t output_len(enum op op, size_t count) {
  switch (op) {
  case ALLGATHER: return count * (size_t)nranks;
  case REDUCE_SCATTER: return count / (size_t)nranks;
  case REDUCE: return rank == 0 ? count : 0;
  case GATHER: return rank == 0 ? count * (size_t)nranks : 0;
  case SCATTER: return count / (size_t)nranks;
  default: return count;
  }
}

static float expected(enum op op, size_t count, size_t i) {
  const size_t block = count / (size_t)nranks, me = (size_t)rank;
  switch (op) {
  case ALLREDUCE:
  case REDUCE: return summed(i);
  case ALLGATHER:
  case GATHER: return input((int)(i / count), i % count);
  case SCATTER: return input(0, me * block + i);
  case REDUCE_SCATTER: return summed(me * block + i);
  case BROADCAST: return input(0, i);
  case ALLTOALL: return input((int)(i / block), me * block + i % block);
  default: return 0;
  }
}

/* One call on fresh inputs and poisoned outputs; the number of wrong elements over all ranks. */
static double checked_call(enum op op, size_t count) {
  fill_inputs(op, count);
  const size_t len = output_len(op, count);
  const size_t poison = op == BROADCAST && rank == 0 ? 0 : len;
  for (size_t i = 0; i < poison; i++) recvbuf[i] = -3.0f;
  run(op, count);
  size_t wrong = 0;
  for (size_t i = 0; i < len; i++) {
    const float want = expected(op, count, i);
    if (recvbuf[i] != want && wrong++ < 3)
      fprintf(stderr, "colls: rank %d: %s of %zu bytes: element %zu is %g, want %g\n", rank,
              OP_NAMES[op], count * sizeof(float), i, (double)recvbuf[i], (double)want);
  }
  return lib_max((double)wrong);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A barrier, `calls` calls, and the slowest rank's mean seconds per call (the same on every rank,
 * so every decision taken from it is taken alike by all ranks). */
static double timed(enum op op, size_t count, long calls) {
  lib_barrier();
  const double t0 = now();
  for (long i = 0; i < calls; i++) run(op, count);
  return lib_max((now() - t0) / (double)calls);
}

#define MAX_REPS 32
#define MAX_CALLS (1L << 21)

static void cell(enum op op, size_t bytes, int reps, double rep_seconds) {
  const size_t count = bytes / sizeof(float);
  fill_inputs(op, count);
  run(op, count);
  /* The fastest batch sets the pace: one batch stretched by a descheduled rank must not cut
   * the repetitions short. */
  long calls = 1;
  double last = timed(op, count, calls), per_call = last;
  while (last * (double)calls < rep_seconds / 4 && calls < MAX_CALLS) {
    calls *= 2;
    last = timed(op, count, calls);
    if (last < per_call) per_call = last;
  }
  calls = per_call > 0 ? (long)(rep_seconds / per_call) : MAX_CALLS;
  if (calls < 1) calls = 1;
  if (calls > MAX_CALLS) calls = MAX_CALLS;
  double us[MAX_REPS];
  for (int r = 0; r < reps; r++) us[r] = timed(op, count, calls) * 1e6;
  const double wrong = checked_call(op, count);
  if (rank == 0) {
    printf("%s %zu %ld", OP_NAMES[op], bytes, calls);
    for (int r = 0; r < reps; r++) printf(" %.4f", us[r]);
    printf(wrong > 0 ? " WRONG\n" : " ok\n");
    fflush(stdout);
  }
}

static int parse_ops(const char *list, int *want) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int o = 0; o < NOPS; o++)
      if (strcmp(t, OP_NAMES[o]) == 0) want[o] = found = 1;
    if (!found) return -1;
  }
  return 0;
}

static void usage_error(const char *msg) {
  if (rank == 0)
    fprintf(stderr, "colls: %s\nusage: colls [--min B] [--max B] [--factor F] [--reps R] "
                    "[--rep-seconds S] [--ops allreduce,allgather,...]\n", msg);
  lib_finalize();
  exit(2);
}

int main(int argc, char **argv) {
  lib_init(&argc, &argv);
  size_t min = 64, max = (size_t)64 << 20, factor = 4;
  int reps = 5, want[NOPS] = {0}, any = 0;
  double rep_seconds = 0.04;
  for (int a = 1; a < argc; a++) {
    const char *v = a + 1 < argc ? argv[a + 1] : NULL;
    if (!v) usage_error("every option needs a value");
    if (!strcmp(argv[a], "--min")) min = strtoull(v, NULL, 10);
    else if (!strcmp(argv[a], "--max")) max = strtoull(v, NULL, 10);
    else if (!strcmp(argv[a], "--factor")) factor = strtoull(v, NULL, 10);
    else if (!strcmp(argv[a], "--reps")) reps = atoi(v);
    else if (!strcmp(argv[a], "--rep-seconds")) rep_seconds = atof(v);
    else if (!strcmp(argv[a], "--ops")) { if (parse_ops(v, want)) usage_error("unknown op in --ops"); }
    else usage_error("unknown option");
    a++;
  }
  for (int o = 0; o < NOPS; o++) any |= want[o];
  if (!any)
    for (int o = 0; o < NOPS; o++) want[o] = 1;
  const size_t unit = sizeof(float) * (size_t)nranks;
  if (min < unit || min % unit || max < min || factor < 2 || reps < 1 || reps > MAX_REPS ||
      rep_seconds <= 0)
    usage_error("need min a multiple of 4 * ranks, max >= min, factor >= 2, 1 <= reps <= 32, "
                "rep-seconds > 0");
  /* allgather and gather receive n*max; every other output fits in max. */
  sendbuf = malloc(max);
  recvbuf = malloc(max * (size_t)nranks);
  if (!sendbuf || !recvbuf) {
    fprintf(stderr, "colls: rank %d: cannot allocate %zu bytes\n", rank, max * (nranks + 1));
    lib_abort(2);
  }
  /* Touch every page before anything is timed. */
  memset(sendbuf, 0, max);
  memset(recvbuf, 0, max * (size_t)nranks);
  /* Settle before the first cell: a third of a second of 8-byte allreduces (the ranks find
   * their cores, lazily made connections are made). */
  for (const double t0 = now(); lib_max(now() - t0) < 0.3;) {
  }
  if (rank == 0) {
    printf("# colls lib=%s ranks=%d reps=%d rep_seconds=%g\n", LIB_NAME, nranks, reps, rep_seconds);
    fflush(stdout);
  }
  for (int o = 0; o < NOPS; o++) {
    if (!want[o]) continue;
    for (size_t bytes = min; bytes <= max; bytes *= factor) {
      if (bytes % unit) continue;
      cell((enum op)o, bytes, reps, rep_seconds);
    }
  }
  free(sendbuf);
  free(recvbuf);
  lib_finalize();
  return 0;
}
