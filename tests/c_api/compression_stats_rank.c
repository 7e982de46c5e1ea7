/* One rank of the C API's compression statistics test (c_api_mp_test runs it on 2 ranks).
 *
 * All-reduces a float32 tensor of N elements with compression "fp16" and another with
 * "none", then checks braid_compression_stats() to the byte, per tensor and per method:
 * fp16 sends 2 bytes per element (payload 2N of 4N uncompressed), "none" sends the tensor
 * itself (payload = uncompressed), and the reference transport is the ring all-reduce's
 * 2(n-1)/n of the uncompressed bytes. Exits 0 when every check passed, 1 otherwise (the
 * failed checks on stderr), 2 on an API error.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "braid/c_api.h"

#define N 1000

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

static int g_rank = -1;
static int g_failures = 0;

static void expect_u64(const char* what, uint64_t got, uint64_t want) {
  if (got != want) {
    fprintf(stderr, "rank %d: %s = %llu, expected %llu\n", g_rank, what,
            (unsigned long long)got, (unsigned long long)want);
    ++g_failures;
  }
}

static void expect_str(const char* what, const char* got, const char* want) {
  if (strcmp(got, want) != 0) {
    fprintf(stderr, "rank %d: %s = \"%s\", expected \"%s\"\n", g_rank, what, got, want);
    ++g_failures;
  }
}

int main(void) {
  static float in[N], out[N];
  const int64_t shape[1] = {N};
  braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
  braid_compression_stat stats[4];
  size_t count = 0;
  int size = 0, i;
  uint64_t reference;

  CHECK_CALL(braid_init());
  CHECK_CALL(braid_rank(&g_rank));
  CHECK_CALL(braid_size(&size));
  for (i = 0; i < N; ++i) in[i] = (float)(i % 7) - 3.0f + (float)g_rank;

  o.op = BRAID_SUM;
  o.compression = "fp16";
  CHECK_CALL(braid_allreduce("stats.fp16", in, out, shape, 1, BRAID_FLOAT32, &o));
  o.compression = "none";
  CHECK_CALL(braid_allreduce("stats.none", in, out, shape, 1, BRAID_FLOAT32, &o));

  /* What a bandwidth-optimal all-reduce of 4N bytes sends per rank: 2(n-1)/n of them. */
  reference = 2u * (uint64_t)(4 * N) * (uint64_t)(size - 1) / (uint64_t)size;

  /* Per tensor, sorted by name: "stats.fp16" then "stats.none". Count first. */
  CHECK_CALL(braid_compression_stats(BRAID_COMPRESSION_STATS_BY_TENSOR, NULL, 0, &count));
  expect_u64("tensor entries (count only)", count, 2);
  for (i = 0; i < 4; ++i) braid_compression_stat_init(&stats[i]);
  CHECK_CALL(braid_compression_stats(BRAID_COMPRESSION_STATS_BY_TENSOR, stats, 4, &count));
  expect_u64("tensor entries", count, 2);
  if (count == 2) {
    expect_str("tensor[0].name", stats[0].name, "stats.fp16");
    expect_str("tensor[0].method", stats[0].method, "fp16");
    expect_u64("fp16 tensors", stats[0].tensors, 1);
    expect_u64("fp16 reductions", stats[0].reductions, 1);
    expect_u64("fp16 uncompressed_bytes", stats[0].uncompressed_bytes, 4 * N);
    expect_u64("fp16 payload_bytes", stats[0].payload_bytes, 2 * N);
    expect_u64("fp16 reference_transport_bytes", stats[0].reference_transport_bytes,
               reference);
    if (size > 1 && (stats[0].transport_bytes == 0 || stats[0].transport_bytes > reference)) {
      fprintf(stderr, "rank %d: fp16 transport_bytes = %llu, expected in (0, %llu]\n",
              g_rank, (unsigned long long)stats[0].transport_bytes,
              (unsigned long long)reference);
      ++g_failures;
    }
    expect_str("tensor[1].name", stats[1].name, "stats.none");
    expect_str("tensor[1].method", stats[1].method, "none");
    expect_u64("none uncompressed_bytes", stats[1].uncompressed_bytes, 4 * N);
    expect_u64("none payload_bytes", stats[1].payload_bytes, 4 * N);
    expect_u64("none reference_transport_bytes", stats[1].reference_transport_bytes,
               reference);
    expect_u64("stats[2] untouched", stats[2].reductions, 0);
  }

  /* Per method, sorted: "fp16" then "none". With room for one entry only the first is
   * written, and count still says how many exist. */
  for (i = 0; i < 4; ++i) braid_compression_stat_init(&stats[i]);
  stats[1].reductions = 12345;
  CHECK_CALL(braid_compression_stats(BRAID_COMPRESSION_STATS_BY_METHOD, stats, 1, &count));
  expect_u64("method entries (capacity 1)", count, 2);
  expect_str("method[0].method", stats[0].method, "fp16");
  expect_str("method[0].name", stats[0].name, "");
  expect_u64("method[0].payload_bytes", stats[0].payload_bytes, 2 * N);
  expect_u64("stats[1] untouched", stats[1].reductions, 12345);
  CHECK_CALL(braid_compression_stats(BRAID_COMPRESSION_STATS_BY_METHOD, stats, 4, &count));
  expect_u64("method entries", count, 2);
  if (count == 2) {
    expect_str("method[1].method", stats[1].method, "none");
    expect_u64("none tensors", stats[1].tensors, 1);
    expect_u64("none payload = uncompressed", stats[1].payload_bytes,
               stats[1].uncompressed_bytes);
    expect_u64("none uncompressed_bytes (method)", stats[1].uncompressed_bytes, 4 * N);
  }

  printf("rank %d/%d: compression stats: %d failed checks\n", g_rank, size, g_failures);
  fflush(stdout);
  CHECK_CALL(braid_finalize());
  return g_failures == 0 ? 0 : 1;
}
