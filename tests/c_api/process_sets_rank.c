/* One rank of the C API's process-set test (c_api_mp_test runs it on 4 ranks).
 *
 * Adds the sets {0, 1} and {2, 3} and checks, each against the exact value it must have:
 * the ids the coordinator hands out, braid_process_set_size / _rank / _ranks on members and
 * non-members, a SUM and an AVERAGE all-reduce of rank + 1 in each rank's own set under the
 * same name in both sets (3 and 7; 1.5 and 3.5), a broadcast and an all-gather in a set,
 * unnamed calls counted per set, the errors of a rank outside a set, of a member's call
 * refused by the C API, of a set added twice and of mismatched changes, a pending collective
 * failed by the removal of its set, calls on a removed set, and the reuse of its id by the
 * next set added. Exits 0 when every check passed, 1 otherwise (the failed checks on
 * stderr), 2 on an unexpected API error.
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
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, #call,                 \
              braid_error_name(rc_), braid_last_error());                             \
      braid_finalize();                                                               \
      return 2;                                                                       \
    }                                                                                 \
  } while (0)

static int g_rank = -1;
static int g_failures = 0;

static void expect_int(const char* what, long long got, long long want) {
  if (got != want) {
    fprintf(stderr, "rank %d: %s = %lld, expected %lld\n", g_rank, what, got, want);
    ++g_failures;
  }
}

/* `rc` is `want` and braid_last_error() contains `needle` (and `needle2`, if not NULL). */
static void expect_error(const char* what, int rc, int want, const char* needle,
                         const char* needle2) {
  const char* msg = braid_last_error();
  if (rc != want) {
    fprintf(stderr, "rank %d: %s returned %s, expected %s (%s)\n", g_rank, what,
            braid_error_name(rc), braid_error_name(want), msg);
    ++g_failures;
    return;
  }
  if (strstr(msg, needle) == NULL || (needle2 != NULL && strstr(msg, needle2) == NULL)) {
    fprintf(stderr, "rank %d: %s: message \"%s\" lacks \"%s\"%s%s\n", g_rank, what, msg,
            needle, needle2 != NULL ? " or " : "", needle2 != NULL ? needle2 : "");
    ++g_failures;
  }
}

/* Every element of out[0..n) is `want`, exactly. */
static void expect_all(const char* what, const float* out, int n, float want) {
  int i;
  for (i = 0; i < n; ++i) {
    if (out[i] != want) {
      fprintf(stderr, "rank %d: %s[%d] = %g, expected %g\n", g_rank, what, i, (double)out[i],
              (double)want);
      ++g_failures;
      return;
    }
  }
}

int main(void) {
  static float in[N], out[N];
  static float pending_in[N], pending_out[N]; /* must outlive the pending collective */
  const int64_t shape[1] = {N};
  const int32_t low[2] = {0, 1};
  const int32_t high[2] = {3, 2}; /* any order: kept ascending */
  const int32_t mixed[3] = {2, 1, 3};
  braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
  braid_broadcast_opts b = BRAID_BROADCAST_OPTS_INIT;
  braid_allgather_opts g = BRAID_ALLGATHER_OPTS_INIT;
  braid_handle* pending = NULL;
  int32_t low_id = -1, high_id = -1, mine, other, id, v, count;
  int32_t buf[4];
  int32_t gathered[2] = {-1, -1};
  int64_t first_dim = -1;
  int size = 0, i, in_low, rc;
  char what[128];

  CHECK_CALL(braid_init());
  CHECK_CALL(braid_rank(&g_rank));
  CHECK_CALL(braid_size(&size));
  if (size != 4) {
    fprintf(stderr, "rank %d: needs a world of 4 ranks, got %d\n", g_rank, size);
    braid_finalize();
    return 2;
  }
  in_low = g_rank < 2;

  /* Every rank adds both sets (the lowest free ids: 1, then 2). */
  CHECK_CALL(braid_add_process_set(low, 2, &low_id));
  CHECK_CALL(braid_add_process_set(high, 2, &high_id));
  expect_int("id of {0, 1}", low_id, 1);
  expect_int("id of {3, 2}", high_id, 2);
  mine = in_low ? low_id : high_id;
  other = in_low ? high_id : low_id;

  /* Size, rank and ranks, on members and non-members. */
  v = -7;
  CHECK_CALL(braid_process_set_size(mine, &v));
  expect_int("size of my set", v, 2);
  CHECK_CALL(braid_process_set_size(0, &v));
  expect_int("size of set 0", v, 4);
  CHECK_CALL(braid_process_set_rank(mine, &v));
  expect_int("my rank in my set", v, g_rank % 2);
  CHECK_CALL(braid_process_set_rank(other, &v));
  expect_int("my rank in the other set", v, -1);
  CHECK_CALL(braid_process_set_rank(0, &v));
  expect_int("my rank in set 0", v, g_rank);
  for (i = 0; i < 4; ++i) buf[i] = -7;
  count = -7;
  CHECK_CALL(braid_process_set_ranks(high_id, buf, 4, &count));
  expect_int("ranks of {3, 2}: count", count, 2);
  expect_int("ranks of {3, 2}: [0]", buf[0], 2);
  expect_int("ranks of {3, 2}: [1]", buf[1], 3);
  expect_int("ranks of {3, 2}: [2] untouched", buf[2], -7);
  CHECK_CALL(braid_process_set_ranks(low_id, buf, 2, &count));
  expect_int("ranks of {0, 1}: count", count, 2);
  expect_int("ranks of {0, 1}: [0]", buf[0], 0);
  expect_int("ranks of {0, 1}: [1]", buf[1], 1);
  buf[0] = -7;
  count = -7;
  rc = braid_process_set_ranks(low_id, buf, 1, &count);
  expect_error("ranks with capacity 1", rc, BRAID_INVALID_ARGUMENT, "has 2 ranks", NULL);
  expect_int("ranks with capacity 1: count untouched", count, -7);
  expect_int("ranks with capacity 1: [0] untouched", buf[0], -7);

  /* A SUM of rank + 1 in each rank's own set, under the same name in both sets. */
  for (i = 0; i < N; ++i) in[i] = (float)(g_rank + 1);
  o.op = BRAID_SUM;
  o.process_set_id = mine;
  CHECK_CALL(braid_allreduce("ps.sum", in, out, shape, 1, BRAID_FLOAT32, &o));
  expect_all("sum in my set", out, N, in_low ? 3.0f : 7.0f);
  /* AVERAGE divides by the set's size (2), not the world's (4). */
  o.op = BRAID_AVERAGE;
  CHECK_CALL(braid_allreduce("ps.avg", in, out, shape, 1, BRAID_FLOAT32, &o));
  expect_all("average in my set", out, N, in_low ? 1.5f : 3.5f);

  /* Unnamed calls count per set: {0, 1} makes one, {2, 3} two, then the world's unnamed
   * call must agree on its name on every rank (one counter for all sets would not). */
  o.op = BRAID_SUM;
  CHECK_CALL(braid_allreduce(NULL, in, out, shape, 1, BRAID_FLOAT32, &o));
  if (!in_low) CHECK_CALL(braid_allreduce(NULL, in, out, shape, 1, BRAID_FLOAT32, &o));
  o.process_set_id = 0;
  CHECK_CALL(braid_allreduce(NULL, in, out, shape, 1, BRAID_FLOAT32, &o));
  expect_all("unnamed sum in the world", out, N, 10.0f);

  /* A broadcast from a rank of the job in the set, an all-gather in set-rank order. */
  for (i = 0; i < N; ++i) out[i] = (float)(g_rank * 10);
  b.root_rank = in_low ? 1 : 3;
  b.process_set_id = mine;
  CHECK_CALL(braid_broadcast("ps.bcast", out, shape, 1, BRAID_FLOAT32, &b));
  expect_all("broadcast in my set", out, N, in_low ? 10.0f : 30.0f);
  v = g_rank * 100;
  g.process_set_id = mine;
  {
    const int64_t one[1] = {1};
    CHECK_CALL(braid_allgather("ps.gather", &v, one, 1, BRAID_INT32, gathered,
                               sizeof(gathered), &first_dim, &g));
  }
  expect_int("allgather first dim", first_dim, 2);
  expect_int("allgather [0]", gathered[0], in_low ? 0 : 200);
  expect_int("allgather [1]", gathered[1], in_low ? 100 : 300);

  /* A rank outside a set gets INVALID_ARGUMENT naming the set, from the call itself. */
  sprintf(what, "process set %d", (int)other);
  for (i = 0; i < N; ++i) out[i] = -1.0f;
  o.process_set_id = other;
  rc = braid_allreduce("ps.outside", in, out, shape, 1, BRAID_FLOAT32, &o);
  expect_error("allreduce outside the set", rc, BRAID_INVALID_ARGUMENT, what, "not in");
  expect_all("allreduce outside the set: output untouched", out, N, -1.0f);
  b.process_set_id = other;
  rc = braid_broadcast("ps.outside", out, shape, 1, BRAID_FLOAT32, &b);
  expect_error("broadcast outside the set", rc, BRAID_INVALID_ARGUMENT, what, "not in");
  g.process_set_id = other;
  rc = braid_allgather_async("ps.outside", in, shape, 1, BRAID_FLOAT32, NULL, 0, NULL, &g,
                             &pending);
  expect_error("allgather_async outside the set", rc, BRAID_INVALID_ARGUMENT, what, "not in");
  if (pending != NULL) {
    fprintf(stderr, "rank %d: a refused call returned a handle\n", g_rank);
    ++g_failures;
    pending = NULL;
  }

  /* A member's call that the C API itself refuses (here for its dtype) is reported in its
   * set: the other member's call fails too, naming the refusing rank and why, instead of
   * waiting for it (INVALID_ARGUMENT when it was submitted before the report arrived,
   * FAILED_PRECONDITION after: Note [Resynchronization], coordinator/negotiation.h). */
  if (g_rank == 0) {
    o.process_set_id = low_id;
    rc = braid_allreduce("ps.refused", in, out, shape, 1, (braid_dtype)42, &o);
    expect_error("a call refused on rank 0", rc, BRAID_INVALID_ARGUMENT, "unknown dtype 42",
                 NULL);
  } else if (g_rank == 1) {
    o.process_set_id = low_id;
    rc = braid_allreduce("ps.refused", in, out, shape, 1, BRAID_FLOAT32, &o);
    expect_error("a call refused on rank 0, seen on rank 1", rc,
                 rc == BRAID_FAILED_PRECONDITION ? BRAID_FAILED_PRECONDITION
                                                 : BRAID_INVALID_ARGUMENT,
                 "failed on rank 0", "unknown dtype 42");
  }

  /* A set with the same ranks is refused on every rank, naming the existing one. */
  id = -7;
  rc = braid_add_process_set(low, 2, &id);
  expect_error("adding {0, 1} again", rc, BRAID_ALREADY_EXISTS, "process set 1", NULL);
  expect_int("adding {0, 1} again: id untouched", id, -7);

  /* Ranks asking for different changes: refused on every rank, naming what each asked. */
  {
    const int32_t a[2] = {0, 2}, c[2] = {1, 3};
    rc = braid_add_process_set(g_rank == 0 ? a : c, 2, &id);
    expect_error("mismatched adds", rc, BRAID_INVALID_ARGUMENT, "add_process_set([0, 2])",
                 "add_process_set([1, 3])");
    expect_int("mismatched adds: id untouched", id, -7);
  }

  /* Removing {2, 3} fails its collective still pending on rank 2 (rank 3 never submits it),
   * naming the set. */
  for (i = 0; i < N; ++i) pending_in[i] = 1.0f;
  if (g_rank == 2) {
    o.process_set_id = high_id;
    CHECK_CALL(braid_allreduce_async("ps.pending", pending_in, pending_out, shape, 1,
                                     BRAID_FLOAT32, &o, &pending));
  }
  CHECK_CALL(braid_remove_process_set(high_id));
  if (pending != NULL) {
    rc = braid_wait(pending, 60);
    expect_error("pending collective of the removed set", rc, BRAID_FAILED_PRECONDITION,
                 "process set 2", "removed");
    braid_handle_free(pending);
    pending = NULL;
  }

  /* The removed set is gone on every rank: queries and calls fail naming it. */
  v = -7;
  rc = braid_process_set_size(high_id, &v);
  expect_error("size of the removed set", rc, BRAID_INVALID_ARGUMENT, "process set 2",
               "does not exist");
  expect_int("size of the removed set: untouched", v, -7);
  rc = braid_process_set_rank(high_id, &v);
  expect_error("rank in the removed set", rc, BRAID_INVALID_ARGUMENT, "process set 2",
               "does not exist");
  o.process_set_id = high_id;
  rc = braid_allreduce("ps.sum", in, out, shape, 1, BRAID_FLOAT32, &o);
  expect_error("allreduce in the removed set", rc, BRAID_INVALID_ARGUMENT, "process set 2",
               "does not exist");
  rc = braid_remove_process_set(high_id);
  expect_error("removing it again", rc, BRAID_INVALID_ARGUMENT, "process set 2",
               "does not exist");
  rc = braid_remove_process_set(0);
  expect_error("removing set 0", rc, BRAID_INVALID_ARGUMENT, "cannot be removed", NULL);

  /* The next set added reuses id 2, and its unnamed calls start counting at 0 on every
   * member: rank 1 made none in set 2 before, ranks 2 and 3 made two. */
  CHECK_CALL(braid_add_process_set(mixed, 3, &id));
  expect_int("id of {2, 1, 3} (reused)", id, 2);
  if (g_rank != 0) {
    CHECK_CALL(braid_process_set_rank(id, &v));
    expect_int("my rank in {1, 2, 3}", v, g_rank - 1);
    o.process_set_id = id;
    CHECK_CALL(braid_allreduce(NULL, in, out, shape, 1, BRAID_FLOAT32, &o));
    expect_all("unnamed sum in {1, 2, 3}", out, N, 9.0f);
  }
  /* {0, 1} still works. */
  if (in_low) {
    o.process_set_id = low_id;
    CHECK_CALL(braid_allreduce("ps.sum", in, out, shape, 1, BRAID_FLOAT32, &o));
    expect_all("sum in {0, 1} at the end", out, N, 3.0f);
  }

  CHECK_CALL(braid_barrier());
  printf("rank %d/%d: process sets: %d failed checks\n", g_rank, size, g_failures);
  fflush(stdout);
  CHECK_CALL(braid_finalize());
  return g_failures == 0 ? 0 : 1;
}
