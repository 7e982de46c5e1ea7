/* Blocking all-reduce through the braid C API.
 *
 * Every rank all-reduces a float32 array with SUM and an int32 array with MAX, prints the
 * result and checks it against the value computed locally from the ranks' known inputs.
 * Exits 0 when every element matches, 1 otherwise (2 on an API error).
 *
 * Run it under a launcher, e.g. `braidrun -np 2 ./allreduce_blocking`, or by hand with
 * BRAID_COORDINATOR=host:port BRAID_RANK=r BRAID_SIZE=n for each rank. Without any launcher
 * variable it runs as a world of one.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "braid/c_api.h"

#define N 1000

/* Prints the failed call and its message, leaves the job and exits 2. */
#define CHECK_CALL(call)                                                              \
  do {                                                                                \
    int rc_ = (call);                                                                 \
    if (rc_ != BRAID_OK) {                                                            \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, braid_error_name(rc_),           \
              braid_last_error());                                                    \
      braid_finalize();                                                               \
      return 2;                                                                       \
    }                                                                                 \
  } while (0)

/* This rank's inputs: simple functions of (rank, i), so every rank can compute the result. */
static float float_input(int rank, int i) { return (float)rank + 0.5f * (float)i; }
static int32_t int_input(int rank, int i) { return (int32_t)((i * 7 + rank * 13) % 101) - 50; }

int main(void) {
  CHECK_CALL(braid_init());
  int rank = 0, size = 0;
  CHECK_CALL(braid_rank(&rank));
  CHECK_CALL(braid_size(&size));

  static float fin[N], fout[N];
  static int32_t iin[N], iout[N];
  for (int i = 0; i < N; ++i) {
    fin[i] = float_input(rank, i);
    iin[i] = int_input(rank, i);
  }
  const int64_t shape[1] = {N};

  braid_allreduce_opts sum = BRAID_ALLREDUCE_OPTS_INIT;
  sum.op = BRAID_SUM;
  CHECK_CALL(braid_allreduce("example.float32.sum", fin, fout, shape, 1, BRAID_FLOAT32, &sum));

  braid_allreduce_opts max;
  braid_allreduce_opts_init(&max);
  max.op = BRAID_MAX;
  /* No name: "allreduce.noname.<n>", which matches across ranks because every rank makes
   * the same unnamed calls in the same order. */
  CHECK_CALL(braid_allreduce(NULL, iin, iout, shape, 1, BRAID_INT32, &max));

  int wrong = 0;
  for (int i = 0; i < N; ++i) {
    /* Every partial sum is a multiple of 0.5 below 2^23: exact in float32, in any order. */
    float fexp = 0.0f;
    int32_t iexp = INT32_MIN;
    for (int r = 0; r < size; ++r) {
      fexp += float_input(r, i);
      int32_t v = int_input(r, i);
      if (v > iexp) iexp = v;
    }
    if (fout[i] != fexp) {
      if (++wrong <= 10) {
        fprintf(stderr, "rank %d: float32 sum [%d] = %g, expected %g\n", rank, i, fout[i], fexp);
      }
    }
    if (iout[i] != iexp) {
      if (++wrong <= 10) {
        fprintf(stderr, "rank %d: int32 max [%d] = %d, expected %d\n", rank, i, (int)iout[i],
                (int)iexp);
      }
    }
  }
  printf("rank %d/%d: float32 sum [0]=%g [%d]=%g; int32 max [0]=%d [%d]=%d; %d wrong\n", rank,
         size, fout[0], N - 1, fout[N - 1], (int)iout[0], N - 1, (int)iout[N - 1], wrong);
  fflush(stdout);

  CHECK_CALL(braid_finalize());
  return wrong == 0 ? 0 : 1;
}
