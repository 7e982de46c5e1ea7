/* Asynchronous collectives through the braid C API.
 *
 * Every rank enqueues 8 all-reduces of different sizes and dtypes at once (they overlap and
 * may be fused), polls them, then waits for each under a timeout; then all-gathers a tensor
 * whose first dimension differs per rank, and broadcasts from the last rank. Every element
 * is checked against values computed locally. Exits 0 when all match, 1 otherwise (2 on an
 * API error).
 *
 * Run it like allreduce_blocking (braidrun, or BRAID_COORDINATOR / BRAID_RANK / BRAID_SIZE).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid/c_api.h"

#define NUM_TENSORS 8
#define WAIT_SECONDS 60.0

#define CHECK_CALL(call)                                                              \
  do {                                                                                \
    int rc_ = (call);                                                                 \
    if (rc_ != BRAID_OK) {                                                            \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call,                   \
              braid_error_name(rc_), braid_last_error());                             \
      braid_finalize();                                                               \
      return 2;                                                                       \
    }                                                                                 \
  } while (0)

static int wrong = 0;
static void expect(int ok, int rank, const char* what, long index, double got, double want) {
  if (ok) return;
  if (++wrong <= 20) {
    fprintf(stderr, "rank %d: %s [%ld] = %.17g, expected %.17g\n", rank, what, index, got,
            want);
  }
}

/* Element counts: below and above the ring all-reduce's threshold (256 KiB), odd sizes, and
 * an empty tensor. */
static const int64_t kCounts[NUM_TENSORS] = {1, 7, 64, 1000, 4097, 65539, 300000, 0};

int main(void) {
  int rank = -1, size = 0;
  CHECK_CALL(braid_init());
  CHECK_CALL(braid_rank(&rank));
  CHECK_CALL(braid_size(&size));

  /* --- 8 overlapping all-reduces: float32 sums, except tensor 3 (float64 average) --- */
  void* in[NUM_TENSORS];
  void* out[NUM_TENSORS];
  braid_handle* handles[NUM_TENSORS];
  for (int t = 0; t < NUM_TENSORS; ++t) {
    const int is_f64 = t == 3;
    const size_t elem = braid_dtype_size(is_f64 ? BRAID_FLOAT64 : BRAID_FLOAT32);
    in[t] = malloc(kCounts[t] * elem + 1);
    out[t] = malloc(kCounts[t] * elem + 1);
    if (in[t] == NULL || out[t] == NULL) return 2;
    for (int64_t i = 0; i < kCounts[t]; ++i) {
      /* (rank + 1) * small integer: exact in float32 whatever the summation order. */
      const double v = (double)(rank + 1) * (double)((i + t) % 17);
      if (is_f64) {
        ((double*)in[t])[i] = v;
      } else {
        ((float*)in[t])[i] = (float)v;
      }
    }
    char name[64];
    snprintf(name, sizeof(name), "async.%d", t);
    braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
    o.op = is_f64 ? BRAID_AVERAGE : BRAID_SUM;
    const int64_t shape[1] = {kCounts[t]};
    CHECK_CALL(braid_allreduce_async(name, in[t], out[t], shape, 1,
                                     is_f64 ? BRAID_FLOAT64 : BRAID_FLOAT32, &o, &handles[t]));
  }
  /* Poll once (never blocks), then wait for each with a timeout. */
  int done_now = 0;
  for (int t = 0; t < NUM_TENSORS; ++t) {
    int done = 0;
    CHECK_CALL(braid_poll(handles[t], &done));
    done_now += done;
  }
  for (int t = 0; t < NUM_TENSORS; ++t) {
    CHECK_CALL(braid_wait(handles[t], WAIT_SECONDS));
    braid_handle_free(handles[t]);
  }
  const double rank_sum = (double)size * (double)(size + 1) / 2.0; /* sum of (rank + 1) */
  for (int t = 0; t < NUM_TENSORS; ++t) {
    char what[64];
    snprintf(what, sizeof(what), "async.%d", t);
    for (int64_t i = 0; i < kCounts[t]; ++i) {
      const double base = (double)((i + t) % 17);
      if (t == 3) {
        /* sum / size, or sum * (1 / size): within an ulp or two either way. */
        const double want = rank_sum * base / size;
        const double got = ((double*)out[t])[i];
        expect(fabs(got - want) <= 1e-12 * fabs(want), rank, what, (long)i, got, want);
      } else {
        const float want = (float)(rank_sum * base);
        const float got = ((float*)out[t])[i];
        expect(got == want, rank, what, (long)i, got, want);
      }
    }
    free(in[t]);
    free(out[t]);
  }

  /* --- all-gather, first dim rank + 2 rows of 3 int32 columns --- */
  enum { kCols = 3 };
  const int64_t my_rows = rank + 2;
  /* Size the output first: all-gather every rank's row count (the recommended pattern). */
  int64_t* rows = malloc(sizeof(int64_t) * size);
  if (rows == NULL) return 2;
  const int64_t one[1] = {1};
  int64_t rows_first_dim = -1;
  CHECK_CALL(braid_allgather("gather.rows", &my_rows, one, 1, BRAID_INT64, rows,
                             sizeof(int64_t) * size, &rows_first_dim, NULL));
  expect(rows_first_dim == size, rank, "gather.rows first dim", 0, (double)rows_first_dim, size);
  int64_t total_rows = 0;
  for (int r = 0; r < size; ++r) {
    expect(rows[r] == r + 2, rank, "gather.rows", r, (double)rows[r], r + 2);
    total_rows += rows[r];
  }
  int32_t* mine = malloc(sizeof(int32_t) * my_rows * kCols);
  int32_t* gathered = malloc(sizeof(int32_t) * total_rows * kCols);
  if (mine == NULL || gathered == NULL) return 2;
  for (int64_t i = 0; i < my_rows * kCols; ++i) mine[i] = (int32_t)(rank * 1000 + i);
  const int64_t gshape[2] = {my_rows, kCols};
  int64_t first_dim = -1;
  braid_handle* gh = NULL;
  braid_allgather_opts go = BRAID_ALLGATHER_OPTS_INIT;
  CHECK_CALL(braid_allgather_async("gather.values", mine, gshape, 2, BRAID_INT32, gathered,
                                   sizeof(int32_t) * total_rows * kCols, &first_dim, &go, &gh));
  CHECK_CALL(braid_wait(gh, WAIT_SECONDS));
  braid_handle_free(gh);
  expect(first_dim == total_rows, rank, "gather.values first dim", 0, (double)first_dim,
         (double)total_rows);
  int64_t at = 0;
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < (r + 2) * kCols; ++i, ++at) {
      expect(gathered[at] == r * 1000 + i, rank, "gather.values", (long)at, gathered[at],
             (double)(r * 1000 + i));
    }
  }
  free(rows);
  free(mine);
  free(gathered);

  /* --- broadcast from the last rank, in place --- */
  double bcast[5];
  for (int i = 0; i < 5; ++i) bcast[i] = rank == size - 1 ? 3.25 * i : -1.0;
  const int64_t bshape[1] = {5};
  braid_broadcast_opts bo = BRAID_BROADCAST_OPTS_INIT;
  bo.root_rank = size - 1;
  braid_handle* bh = NULL;
  CHECK_CALL(braid_broadcast_async("bcast", bcast, bshape, 1, BRAID_FLOAT64, &bo, &bh));
  CHECK_CALL(braid_wait(bh, WAIT_SECONDS));
  braid_handle_free(bh);
  for (int i = 0; i < 5; ++i) expect(bcast[i] == 3.25 * i, rank, "bcast", i, bcast[i], 3.25 * i);

  CHECK_CALL(braid_barrier());
  printf("rank %d/%d: %d all-reduces (%d done at first poll), all-gather of %lld rows, "
         "broadcast from rank %d: %d wrong\n",
         rank, size, NUM_TENSORS, done_now, (long long)total_rows, size - 1, wrong);
  fflush(stdout);
  CHECK_CALL(braid_finalize());
  return wrong == 0 ? 0 : 1;
}
