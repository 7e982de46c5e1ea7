// In-process tests of the C API (bindings/c/include/braid/c_api.h): error paths before
// braid_init, argument checks, the options structs' size prefix (older and newer callers),
// duplicate names, all-gather output sizing and handle semantics, on a world of one (no
// launcher variables: braid_init starts a private coordinator). Uses only the C API, linked
// against libbraid_c.so like any C caller.
#include "braid/c_api.h"

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace {

bool Contains(const char* haystack, const char* needle) {
  return haystack != nullptr && std::strstr(haystack, needle) != nullptr;
}

#define EXPECT_CODE(expected, call)                                                      \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    EXPECT_EQ(rc_, expected) << #call << " returned " << braid_error_name(rc_) << ": "  \
                             << braid_last_error();                                      \
  } while (0)

// A world of one, whatever the test's environment says.
void UseWorldOfOne() {
  for (const char* v : {"BRAID_COORDINATOR", "BRAID_RANK", "BRAID_SIZE", "BRAID_LOCAL_RANK",
                        "BRAID_LOCAL_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                        "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    unsetenv(v);
  }
  setenv("BRAID_TIMEOUT_S", "30", 1);
  setenv("UCX_TLS", "sm,self", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
}

const int64_t kShape3[1] = {3};

// --- before braid_init ---------------------------------------------------------------

// Tests in this group also pass after another test of this binary ran init + finalize
// (then the runtime is "shut down", which is a FailedPrecondition too).
TEST(CApiNotInitialized, EveryCallFailsWithFailedPrecondition) {
  ASSERT_EQ(braid_is_initialized(), 0);
  int v = -7;
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_rank(&v));
  EXPECT_TRUE(Contains(braid_last_error(), "init")) << braid_last_error();
  EXPECT_EQ(v, -7);  // untouched on failure
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_size(&v));
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_local_rank(&v));
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_local_size(&v));
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_start_timeline("/tmp/braid-never.json"));
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_stop_timeline());

  float in[3] = {1, 2, 3}, out[3] = {0, 0, 0};
  EXPECT_CODE(BRAID_FAILED_PRECONDITION,
              braid_allreduce("x", in, out, kShape3, 1, BRAID_FLOAT32, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "init")) << braid_last_error();
  braid_handle* h = reinterpret_cast<braid_handle*>(0x1);
  EXPECT_CODE(BRAID_FAILED_PRECONDITION,
              braid_allreduce_async("x", in, out, kShape3, 1, BRAID_FLOAT32, nullptr, &h));
  EXPECT_EQ(h, reinterpret_cast<braid_handle*>(0x1));  // no handle on failure
  EXPECT_CODE(BRAID_FAILED_PRECONDITION,
              braid_broadcast("b", in, kShape3, 1, BRAID_FLOAT32, nullptr));
  EXPECT_CODE(BRAID_FAILED_PRECONDITION,
              braid_allgather("g", in, kShape3, 1, BRAID_FLOAT32, out, sizeof(out), nullptr,
                              nullptr));
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_barrier());

  const int32_t ranks[1] = {0};
  int32_t id = -7, n = -7, members[4] = {-7, -7, -7, -7};
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_add_process_set(ranks, 1, &id));
  EXPECT_TRUE(Contains(braid_last_error(), "init")) << braid_last_error();
  EXPECT_EQ(id, -7);
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_remove_process_set(1));
  EXPECT_TRUE(Contains(braid_last_error(), "init")) << braid_last_error();
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_process_set_size(0, &n));
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_process_set_rank(0, &n));
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_process_set_ranks(0, members, 4, &n));
  EXPECT_TRUE(Contains(braid_last_error(), "init")) << braid_last_error();
  EXPECT_EQ(n, -7);
  EXPECT_EQ(members[0], -7);
  EXPECT_CODE(BRAID_OK, braid_finalize());  // finalize without init is fine
}

TEST(CApiNotInitialized, NullPointersAreInvalidArgument) {
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_rank(nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "NULL")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_wait(nullptr, 0));
  int done = 0;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_poll(nullptr, &done));
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_handle_copy_output(nullptr, nullptr, 0, nullptr));
  braid_handle_free(nullptr);  // ignored
  float in[3] = {1, 2, 3};
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce_async("x", in, in, kShape3, 1, BRAID_FLOAT32, nullptr, nullptr));

  // Process sets: argument checks come first, initialized or not.
  const int32_t ranks[1] = {0};
  int32_t id = -7, n = -7, members[2] = {-7, -7};
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_add_process_set(nullptr, 1, &id));
  EXPECT_TRUE(Contains(braid_last_error(), "braid_add_process_set: ranks is NULL"))
      << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_add_process_set(ranks, 1, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "process_set_id is NULL")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_add_process_set(ranks, 0, &id));
  EXPECT_TRUE(Contains(braid_last_error(), "count is 0")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_add_process_set(ranks, -1, &id));
  EXPECT_TRUE(Contains(braid_last_error(), "count is -1")) << braid_last_error();
  EXPECT_EQ(id, -7);
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_size(0, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "braid_process_set_size: size is NULL"))
      << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_rank(0, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "braid_process_set_rank: rank is NULL"))
      << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_ranks(0, nullptr, 2, &n));
  EXPECT_TRUE(Contains(braid_last_error(), "ranks is NULL")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_ranks(0, members, 2, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "count is NULL")) << braid_last_error();
  EXPECT_EQ(n, -7);
  EXPECT_EQ(members[0], -7);
}

TEST(CApiNotInitialized, NamesSizesAndDefaults) {
  EXPECT_STREQ(braid_error_name(BRAID_OK), "OK");
  EXPECT_STREQ(braid_error_name(BRAID_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_STREQ(braid_error_name(BRAID_UNAVAILABLE), "UNAVAILABLE");
  EXPECT_STREQ(braid_error_name(12345), "UNKNOWN");
  EXPECT_EQ(braid_dtype_size(BRAID_FLOAT32), 4u);
  EXPECT_EQ(braid_dtype_size(BRAID_FLOAT64), 8u);
  EXPECT_EQ(braid_dtype_size(BRAID_FLOAT16), 2u);
  EXPECT_EQ(braid_dtype_size(BRAID_BFLOAT16), 2u);
  EXPECT_EQ(braid_dtype_size(BRAID_INT32), 4u);
  EXPECT_EQ(braid_dtype_size(BRAID_INT64), 8u);
  EXPECT_EQ(braid_dtype_size(BRAID_UINT8), 1u);
  EXPECT_EQ(braid_dtype_size(7), 0u);
  EXPECT_EQ(braid_dtype_size(-1), 0u);

  braid_allreduce_opts a = BRAID_ALLREDUCE_OPTS_INIT, a2;
  std::memset(&a2, 0xff, sizeof(a2));
  braid_allreduce_opts_init(&a2);
  EXPECT_EQ(a.struct_size, sizeof(braid_allreduce_opts));
  EXPECT_EQ(a2.struct_size, a.struct_size);
  EXPECT_EQ(a.op, BRAID_AVERAGE);
  EXPECT_EQ(a2.op, BRAID_AVERAGE);
  EXPECT_EQ(a2.compression, nullptr);
  EXPECT_EQ(a2.process_set_id, 0);
  EXPECT_EQ(a.device_type, BRAID_DEVICE_CPU);
  EXPECT_EQ(a2.device_type, BRAID_DEVICE_CPU);
  EXPECT_EQ(a2.device_id, 0);
  EXPECT_EQ(a2.stream, nullptr);
  braid_broadcast_opts b = BRAID_BROADCAST_OPTS_INIT, b2;
  std::memset(&b2, 0xff, sizeof(b2));
  braid_broadcast_opts_init(&b2);
  EXPECT_EQ(b2.struct_size, b.struct_size);
  EXPECT_EQ(b2.root_rank, 0);
  EXPECT_EQ(b2.process_set_id, 0);
  EXPECT_EQ(b2.device_type, BRAID_DEVICE_CPU);
  EXPECT_EQ(b2.device_id, 0);
  EXPECT_EQ(b2.stream, nullptr);
  braid_allgather_opts g = BRAID_ALLGATHER_OPTS_INIT, g2;
  std::memset(&g2, 0xff, sizeof(g2));
  braid_allgather_opts_init(&g2);
  EXPECT_EQ(g2.struct_size, g.struct_size);
  EXPECT_EQ(g2.process_set_id, 0);
  EXPECT_EQ(g2.device_type, BRAID_DEVICE_CPU);
  EXPECT_EQ(g2.device_id, 0);
  EXPECT_EQ(g2.stream, nullptr);
  braid_allreduce_opts_init(nullptr);  // ignored
}

TEST(CApiNotInitialized, LastErrorIsPerThread) {
  int v = 0;
  ASSERT_NE(braid_rank(&v), BRAID_OK);
  const std::string main_message = braid_last_error();
  ASSERT_FALSE(main_message.empty());
  std::string before, after;
  std::thread t([&] {
    before = braid_last_error();
    braid_rank(nullptr);
    after = braid_last_error();
  });
  t.join();
  EXPECT_EQ(before, "");
  EXPECT_TRUE(Contains(after.c_str(), "NULL")) << after;
  EXPECT_EQ(main_message, braid_last_error());
  // A successful call does not clear it.
  EXPECT_EQ(braid_finalize(), BRAID_OK);
  EXPECT_EQ(main_message, braid_last_error());
}

TEST(CApiNotInitialized, CompressionStatsNeedInitAndValidArguments) {
  size_t count = 77;
  EXPECT_CODE(BRAID_FAILED_PRECONDITION,
              braid_compression_stats(BRAID_COMPRESSION_STATS_BY_METHOD, nullptr, 0, &count));
  EXPECT_TRUE(Contains(braid_last_error(), "init")) << braid_last_error();
  EXPECT_EQ(count, 77u);  // untouched on failure
  // Argument checks come first, initialized or not.
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_compression_stats(BRAID_COMPRESSION_STATS_BY_METHOD, nullptr, 0, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "count is NULL")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_compression_stats(BRAID_COMPRESSION_STATS_BY_TENSOR, nullptr, 3, &count));
  EXPECT_TRUE(Contains(braid_last_error(), "out is NULL")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_compression_stats(2, nullptr, 0, &count));
  EXPECT_TRUE(Contains(braid_last_error(), "unknown kind 2")) << braid_last_error();
  braid_compression_stat st;
  std::memset(&st, 0, sizeof(st));  // struct_size 0: not initialised
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_compression_stats(BRAID_COMPRESSION_STATS_BY_METHOD, &st, 1, &count));
  EXPECT_TRUE(Contains(braid_last_error(), "struct_size is 0")) << braid_last_error();

  braid_compression_stat a = BRAID_COMPRESSION_STAT_INIT, b;
  std::memset(&b, 0xff, sizeof(b));
  braid_compression_stat_init(&b);
  EXPECT_EQ(a.struct_size, sizeof(braid_compression_stat));
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);
  braid_compression_stat_init(nullptr);  // ignored
}

// --- a world of one --------------------------------------------------------------------

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    UseWorldOfOne();
    ASSERT_EQ(braid_init(), BRAID_OK) << braid_last_error();
  }
  void TearDown() override { EXPECT_EQ(braid_finalize(), BRAID_OK) << braid_last_error(); }
};

TEST_F(CApiTest, WorldOfOne) {
  EXPECT_EQ(braid_is_initialized(), 1);
  EXPECT_CODE(BRAID_OK, braid_init());  // again: OK
  int rank = -1, size = -1, local_rank = -1, local_size = -1;
  EXPECT_CODE(BRAID_OK, braid_rank(&rank));
  EXPECT_CODE(BRAID_OK, braid_size(&size));
  EXPECT_CODE(BRAID_OK, braid_local_rank(&local_rank));
  EXPECT_CODE(BRAID_OK, braid_local_size(&local_size));
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  EXPECT_EQ(local_rank, 0);
  EXPECT_EQ(local_size, 1);
}

// braid_start_timeline / braid_stop_timeline: the file holds what ran between them.
TEST_F(CApiTest, TimelineStartsAndStops) {
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_start_timeline(nullptr));
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_start_timeline(""));
  const std::string path = "/tmp/braid-c-timeline-" + std::to_string(getpid()) + ".json";
  float in[3] = {1, 2, 3}, out[3] = {0, 0, 0};
  EXPECT_CODE(BRAID_OK, braid_start_timeline(path.c_str()));
  EXPECT_CODE(BRAID_OK, braid_allreduce("in.timeline", in, out, kShape3, 1, BRAID_FLOAT32,
                                        nullptr));
  EXPECT_CODE(BRAID_OK, braid_stop_timeline());
  EXPECT_CODE(BRAID_OK, braid_allreduce("after.timeline", in, out, kShape3, 1, BRAID_FLOAT32,
                                        nullptr));
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
  }
  std::remove(path.c_str());
  EXPECT_TRUE(Contains(text.c_str(), "\"in.timeline\"")) << text;
  EXPECT_FALSE(Contains(text.c_str(), "after.timeline")) << text;
}

TEST_F(CApiTest, BlockingCollectivesOnOneRank) {
  float in[3] = {1.5f, -2.0f, 3.0f}, out[3] = {0, 0, 0};
  EXPECT_CODE(BRAID_OK, braid_allreduce("avg", in, out, kShape3, 1, BRAID_FLOAT32, nullptr));
  EXPECT_EQ(std::vector<float>(out, out + 3), std::vector<float>(in, in + 3));
  int32_t iin[3] = {4, -5, 6}, iout[3] = {0, 0, 0};
  braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
  o.op = BRAID_MAX;
  // Two unnamed calls: distinct generated names.
  EXPECT_CODE(BRAID_OK, braid_allreduce(nullptr, iin, iout, kShape3, 1, BRAID_INT32, &o));
  EXPECT_CODE(BRAID_OK, braid_allreduce(nullptr, iin, iout, kShape3, 1, BRAID_INT32, &o));
  EXPECT_EQ(std::vector<int32_t>(iout, iout + 3), std::vector<int32_t>(iin, iin + 3));
  // In place, and a scalar.
  double scalar = 2.5;
  EXPECT_CODE(BRAID_OK, braid_allreduce("scalar", &scalar, &scalar, nullptr, 0, BRAID_FLOAT64,
                                        nullptr));
  EXPECT_EQ(scalar, 2.5);

  double b[2] = {7, 8};
  const int64_t shape2[1] = {2};
  EXPECT_CODE(BRAID_OK, braid_broadcast(nullptr, b, shape2, 1, BRAID_FLOAT64, nullptr));
  EXPECT_EQ(b[0], 7);
  EXPECT_EQ(b[1], 8);

  uint8_t g_in[4] = {1, 2, 3, 4}, g_out[4] = {0, 0, 0, 0};
  const int64_t g_shape[2] = {2, 2};
  int64_t first_dim = -1;
  EXPECT_CODE(BRAID_OK, braid_allgather("g", g_in, g_shape, 2, BRAID_UINT8, g_out,
                                        sizeof(g_out), &first_dim, nullptr));
  EXPECT_EQ(first_dim, 2);
  EXPECT_EQ(std::memcmp(g_in, g_out, 4), 0);
  EXPECT_CODE(BRAID_OK, braid_barrier());
  EXPECT_CODE(BRAID_OK, braid_barrier());
}

TEST_F(CApiTest, BadDtypeIsInvalidArgument) {
  float in[3] = {1, 2, 3}, out[3];
  for (int bad : {7, 42, -1}) {
    EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_allreduce("bad.dtype", in, out, kShape3, 1,
                                                        static_cast<braid_dtype>(bad), nullptr));
    EXPECT_TRUE(Contains(braid_last_error(), "dtype")) << braid_last_error();
    EXPECT_TRUE(Contains(braid_last_error(), "bad.dtype")) << braid_last_error();
  }
  braid_handle* h = nullptr;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_broadcast_async("bad.dtype", in, kShape3, 1,
                                                            static_cast<braid_dtype>(9),
                                                            nullptr, &h));
  EXPECT_EQ(h, nullptr);
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allgather("bad.dtype", in, kShape3, 1, static_cast<braid_dtype>(9), out,
                              sizeof(out), nullptr, nullptr));
}

TEST_F(CApiTest, BadReduceOpIsInvalidArgument) {
  float in[3] = {1, 2, 3}, out[3];
  braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
  o.op = static_cast<braid_reduce_op>(99);
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("bad.op", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_TRUE(Contains(braid_last_error(), "reduce op")) << braid_last_error();
  // Average (the default) is for floating point only.
  int32_t iin[3] = {1, 2, 3}, iout[3];
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("int.avg", iin, iout, kShape3, 1, BRAID_INT32, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "average")) << braid_last_error();
}

TEST_F(CApiTest, BadShapesAndBuffersAreInvalidArgument) {
  float in[3] = {1, 2, 3}, out[3];
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("s", in, out, kShape3, -1, BRAID_FLOAT32, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "ndim")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("s", in, out, nullptr, 1, BRAID_FLOAT32, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "shape")) << braid_last_error();
  const int64_t negative[2] = {3, -2};
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("s", in, out, negative, 2, BRAID_FLOAT32, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "negative")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("s", nullptr, out, kShape3, 1, BRAID_FLOAT32, nullptr));
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("s", in, nullptr, kShape3, 1, BRAID_FLOAT32, nullptr));
  // All-gather needs a first dimension.
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allgather("s", in, nullptr, 0, BRAID_FLOAT32, out, sizeof(out), nullptr,
                              nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "dimension")) << braid_last_error();
}

// Sizes that overflow or exceed common/limits.h, names and specs over their limits: each an
// INVALID_ARGUMENT naming the field, before anything is computed from it or sent anywhere;
// the runtime keeps working after them.
TEST_F(CApiTest, OverflowingSizesAndOverlongStringsAreInvalidArgument) {
  float in[3] = {1, 2, 3}, out[3];
  const int64_t overflow[2] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("big", in, out, overflow, 2, BRAID_FLOAT32, nullptr));
  EXPECT_STREQ(braid_last_error(),
               "'big': the product of shape overflows: more than 281474976710656 elements (the "
               "limit of a tensor is 2^48 bytes)");
  const int64_t bytes[1] = {int64_t{1} << 46};  // 2^46 doubles: 2^49 bytes
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("bytes", in, out, bytes, 1, BRAID_FLOAT64, nullptr));
  EXPECT_STREQ(braid_last_error(),
               "'bytes': shape: 70368744177664 elements of 8 bytes exceed the limit of a "
               "tensor, 2^48 bytes");
  std::vector<int64_t> dims(65, 1);
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allgather("dims", in, dims.data(), 65, BRAID_FLOAT32, out, sizeof(out),
                              nullptr, nullptr));
  EXPECT_STREQ(braid_last_error(), "'dims': ndim is 65, more than the limit of 64");
  const std::string name(2000, 'n');
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce(name.c_str(), in, out, kShape3, 1, BRAID_FLOAT32, nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "name is 2000 bytes long, more than the limit of 1024"))
      << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_broadcast("", in, kShape3, 1, BRAID_FLOAT32, nullptr));
  EXPECT_STREQ(braid_last_error(), "'': name is empty");
  // Names travel as UTF-8: a Latin-1 byte is refused, and quoted escaped.
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("g\x80", in, out, kShape3, 1, BRAID_FLOAT32, nullptr));
  EXPECT_STREQ(braid_last_error(),
               "'g\\x80': name is not valid UTF-8: byte 0x80 at offset 1 of 'g\\x80' (names "
               "travel as UTF-8 text)");
  const std::string spec = "fp4:" + std::string(1000, 'x');
  braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
  o.compression = spec.c_str();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("spec", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_STREQ(braid_last_error(),
               "allreduce 'spec': compression is 1004 bytes long, more than the limit of 256");
  // A plan (a JSON object of name patterns to specs) may be longer: it is resolved here, and
  // only the tensor's spec travels. Too long, or naming a bad spec, it is refused alike.
  std::string plan = "{";
  for (int i = 0; i < 40; ++i) plan += "\"layer" + std::to_string(i) + ".*\": \"fp16\", ";
  plan += "\"*\": \"none\"}";
  ASSERT_GT(plan.size(), 256u);
  o.compression = plan.c_str();
  EXPECT_CODE(BRAID_OK, braid_allreduce("plan.ok", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  const std::string bad_plan = "{\"*\": \"fp5\"}";
  o.compression = bad_plan.c_str();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("plan.bad", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_TRUE(Contains(braid_last_error(), "compression plan, key '*'")) << braid_last_error();
  const std::string huge_plan = "{\"*\": \"none\"" + std::string(70000, ' ') + "}";
  o.compression = huge_plan.c_str();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("plan.huge", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_TRUE(Contains(braid_last_error(), "more than the limit of 65536")) << braid_last_error();
  // Nothing is left behind: the same names work now.
  EXPECT_CODE(BRAID_OK, braid_allreduce("big", in, out, kShape3, 1, BRAID_FLOAT32, nullptr));
  EXPECT_EQ(out[2], 3.0f);
}

TEST_F(CApiTest, AsyncCallsNeedAName) {
  float in[3] = {1, 2, 3}, out[3];
  braid_handle* h = nullptr;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce_async(nullptr, in, out, kShape3, 1, BRAID_FLOAT32, nullptr, &h));
  EXPECT_TRUE(Contains(braid_last_error(), "name")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce_async("", in, out, kShape3, 1, BRAID_FLOAT32, nullptr, &h));
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_broadcast_async(nullptr, in, kShape3, 1, BRAID_FLOAT32, nullptr, &h));
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allgather_async(nullptr, in, kShape3, 1, BRAID_FLOAT32, out, sizeof(out),
                                    nullptr, nullptr, &h));
  EXPECT_EQ(h, nullptr);
}

// A caller compiled against an older header passes a smaller struct: the fields past its
// struct_size are not read (here they hold garbage that would crash or fail if they were).
TEST_F(CApiTest, OlderOptionsStructUsesDefaultsForMissingFields) {
  int32_t in[3] = {1, 2, 3}, out[3] = {0, 0, 0};
  braid_allreduce_opts o;
  std::memset(&o, 0, sizeof(o));
  o.struct_size = offsetof(braid_allreduce_opts, compression);  // {struct_size, op} only
  o.op = BRAID_SUM;
  o.compression = reinterpret_cast<const char*>(0x1);  // dereferencing it would crash
  o.process_set_id = 123456;  // not read (no such process set: reading it would fail the call)
  EXPECT_CODE(BRAID_OK, braid_allreduce("old.abi", in, out, kShape3, 1, BRAID_INT32, &o));
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[2], 3);

  // Only the prefix: op defaults to AVERAGE, which int32 rejects while float32 accepts.
  o.struct_size = sizeof(size_t);
  o.op = BRAID_SUM;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("old.abi", in, out, kShape3, 1, BRAID_INT32, &o));
  EXPECT_TRUE(Contains(braid_last_error(), "average")) << braid_last_error();
  float fin[3] = {1, 2, 3}, fout[3];
  EXPECT_CODE(BRAID_OK, braid_allreduce("old.abi", fin, fout, kShape3, 1, BRAID_FLOAT32, &o));

  braid_broadcast_opts b;
  std::memset(&b, 0, sizeof(b));
  b.struct_size = offsetof(braid_broadcast_opts, root_rank);
  b.root_rank = 77;  // not read: root 0
  EXPECT_CODE(BRAID_OK, braid_broadcast("old.abi.b", fin, kShape3, 1, BRAID_FLOAT32, &b));

  braid_allgather_opts g;
  g.struct_size = sizeof(size_t);
  g.process_set_id = 99;  // not read (no such process set: reading it would fail the call)
  EXPECT_CODE(BRAID_OK, braid_allgather("old.abi.g", fin, kShape3, 1, BRAID_FLOAT32, fout,
                                        sizeof(fout), nullptr, &g));
}

// The device fields: a struct from before them (struct_size up to process_set_id) never
// reads them; a device type this libbraid_c cannot use is FAILED_PRECONDITION saying why (no
// CUDA in this build, or CUDA not yet verified on a GPU), one it does not know or a CPU
// with a device id is INVALID_ARGUMENT; outputs untouched.
TEST_F(CApiTest, DeviceOptions) {
  float in[3] = {1, 2, 3}, out[3] = {-1, -1, -1};
  braid_allreduce_opts o;
  std::memset(&o, 0x7f, sizeof(o));  // garbage past the old struct's end
  o.struct_size = offsetof(braid_allreduce_opts, stream);
  o.op = BRAID_SUM;
  o.compression = nullptr;
  o.process_set_id = 0;
  EXPECT_CODE(BRAID_OK, braid_allreduce("dev.old", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_EQ(out[2], 3.0f);

  braid_allreduce_opts_init(&o);
  o.device_type = BRAID_DEVICE_CUDA;
  out[0] = -1;
  EXPECT_CODE(BRAID_FAILED_PRECONDITION,
              braid_allreduce("dev.cuda", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_TRUE(Contains(braid_last_error(), "cuda:0 tensors: ")) << braid_last_error();
  EXPECT_EQ(out[0], -1.0f);
  o.device_type = 7;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("dev.bad", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_TRUE(Contains(braid_last_error(), "unknown device type 7 (0: cpu, 1: cuda)"))
      << braid_last_error();
  o.device_type = BRAID_DEVICE_CPU;
  o.device_id = 3;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("dev.cpu3", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_TRUE(Contains(braid_last_error(), "no device cpu with id 3 (the cpu's id is 0)"))
      << braid_last_error();
  braid_broadcast_opts b = BRAID_BROADCAST_OPTS_INIT;
  b.device_type = BRAID_DEVICE_CUDA;
  EXPECT_CODE(BRAID_FAILED_PRECONDITION,
              braid_broadcast("dev.b", in, kShape3, 1, BRAID_FLOAT32, &b));
  EXPECT_EQ(out[0], -1.0f);
}

// Process sets on a world of one: set 0 is the world; no other set can exist (the only
// non-empty set of ranks is the world's), so adding one is ALREADY_EXISTS naming set 0, and
// every call naming another id is INVALID_ARGUMENT naming it, outputs untouched.
TEST_F(CApiTest, ProcessSetsOnOneRank) {
  int32_t n = -7, members[3] = {-7, -7, -7};
  EXPECT_CODE(BRAID_OK, braid_process_set_size(0, &n));
  EXPECT_EQ(n, 1);
  n = -7;
  EXPECT_CODE(BRAID_OK, braid_process_set_rank(0, &n));
  EXPECT_EQ(n, 0);
  n = -7;
  EXPECT_CODE(BRAID_OK, braid_process_set_ranks(0, members, 3, &n));
  EXPECT_EQ(n, 1);
  EXPECT_EQ(members[0], 0);
  EXPECT_EQ(members[1], -7);  // nothing past the set's size
  // Capacity too small: INVALID_ARGUMENT giving the size, nothing written.
  members[0] = -7;
  n = -7;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_ranks(0, members, 0, &n));
  EXPECT_STREQ(braid_last_error(),
               "braid_process_set_ranks: process set 0 has 1 ranks but capacity is 0");
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_ranks(0, members, -5, &n));
  EXPECT_EQ(n, -7);
  EXPECT_EQ(members[0], -7);

  // An id that names no set.
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_size(7, &n));
  EXPECT_STREQ(braid_last_error(),
               "braid_process_set_size: process set 7 does not exist (never added, or removed)");
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_rank(7, &n));
  EXPECT_TRUE(Contains(braid_last_error(), "process set 7 does not exist")) << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_process_set_ranks(-1, members, 3, &n));
  EXPECT_TRUE(Contains(braid_last_error(), "process set -1 does not exist"))
      << braid_last_error();
  EXPECT_EQ(n, -7);
  EXPECT_EQ(members[0], -7);

  // Adding: the world's ranks exist as set 0; bad ranks are refused before any peer is asked.
  const int32_t zero[1] = {0}, one[1] = {1}, twice[2] = {0, 0};
  int32_t id = -7;
  EXPECT_CODE(BRAID_ALREADY_EXISTS, braid_add_process_set(zero, 1, &id));
  EXPECT_TRUE(Contains(braid_last_error(), "already exists as process set 0"))
      << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_add_process_set(one, 1, &id));
  EXPECT_TRUE(Contains(braid_last_error(), "rank 1 is not a rank of a world of size 1"))
      << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_add_process_set(twice, 2, &id));
  EXPECT_STREQ(braid_last_error(),
               "braid_add_process_set: count is 2, more ranks than the world's 1");
  EXPECT_EQ(id, -7);

  // Removing: never set 0, nor a set that does not exist.
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_remove_process_set(0));
  EXPECT_TRUE(Contains(braid_last_error(), "process set 0 (the whole world) cannot be removed"))
      << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_remove_process_set(7));
  EXPECT_TRUE(Contains(braid_last_error(), "process set 7 does not exist")) << braid_last_error();

  // Collectives honour process_set_id: one naming no set fails from the call, naming the set
  // and the collective, outputs untouched; 0 is the world.
  float in[3] = {1, 2, 3}, out[3] = {-1, -1, -1};
  braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
  o.process_set_id = 123456;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("ps.none", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_TRUE(Contains(braid_last_error(), "'ps.none'")) << braid_last_error();
  EXPECT_TRUE(Contains(braid_last_error(), "process set 123456 does not exist"))
      << braid_last_error();
  EXPECT_EQ(out[0], -1.0f);
  braid_handle* h = nullptr;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce_async("ps.none", in, out, kShape3, 1, BRAID_FLOAT32, &o, &h));
  EXPECT_EQ(h, nullptr);
  braid_broadcast_opts b = BRAID_BROADCAST_OPTS_INIT;
  b.process_set_id = 7;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_broadcast("ps.none", in, kShape3, 1, BRAID_FLOAT32, &b));
  EXPECT_TRUE(Contains(braid_last_error(), "process set 7 does not exist")) << braid_last_error();
  braid_allgather_opts g = BRAID_ALLGATHER_OPTS_INIT;
  g.process_set_id = 7;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allgather(nullptr, in, kShape3, 1, BRAID_FLOAT32, out, sizeof(out), nullptr,
                              &g));
  EXPECT_TRUE(Contains(braid_last_error(), "process set 7 does not exist")) << braid_last_error();
  EXPECT_EQ(out[0], -1.0f);
  o.process_set_id = 0;
  o.op = BRAID_SUM;
  EXPECT_CODE(BRAID_OK, braid_allreduce("ps.none", in, out, kShape3, 1, BRAID_FLOAT32, &o));
  EXPECT_EQ(out[2], 3.0f);
  // The failed changes left the changes' order intact: another one still pairs.
  EXPECT_CODE(BRAID_ALREADY_EXISTS, braid_add_process_set(zero, 1, &id));
}

// A caller compiled against a newer header: unknown trailing fields must hold defaults (0).
TEST_F(CApiTest, NewerOptionsStructNeedsZeroUnknownFields) {
  struct Newer {
    braid_allreduce_opts known;
    int64_t future_field;
  } n;
  std::memset(&n, 0, sizeof(n));
  n.known.struct_size = sizeof(n);
  n.known.op = BRAID_SUM;
  float in[3] = {1, 2, 3}, out[3];
  EXPECT_CODE(BRAID_OK, braid_allreduce("new.abi", in, out, kShape3, 1, BRAID_FLOAT32,
                                        &n.known));
  n.future_field = 1;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_allreduce("new.abi", in, out, kShape3, 1,
                                                      BRAID_FLOAT32, &n.known));
  EXPECT_TRUE(Contains(braid_last_error(), "upgrade")) << braid_last_error();

  braid_allreduce_opts zero;
  std::memset(&zero, 0, sizeof(zero));  // struct_size 0: never initialised
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("new.abi", in, out, kShape3, 1, BRAID_FLOAT32, &zero));
  EXPECT_TRUE(Contains(braid_last_error(), "struct_size")) << braid_last_error();
  zero.struct_size = ~size_t{0};  // garbage: the tail it claims must not be read
  EXPECT_CODE(BRAID_INVALID_ARGUMENT,
              braid_allreduce("new.abi", in, out, kShape3, 1, BRAID_FLOAT32, &zero));
  EXPECT_TRUE(Contains(braid_last_error(), "uninitialised")) << braid_last_error();
}

TEST_F(CApiTest, DuplicateInFlightNameIsAlreadyExists) {
  // The first collective must still be in flight when the second is enqueued. A negotiation
  // round trip takes far longer than an enqueue, but the test does not rely on timing: it
  // retries until the overlap happened.
  std::vector<float> a(1 << 16, 1.0f), b(a.size()), c(a.size());
  const int64_t shape[1] = {static_cast<int64_t>(a.size())};
  bool seen = false;
  for (int attempt = 0; attempt < 50 && !seen; ++attempt) {
    braid_handle* h1 = nullptr;
    braid_handle* h2 = nullptr;
    ASSERT_EQ(braid_allreduce_async("dup", a.data(), b.data(), shape, 1, BRAID_FLOAT32,
                                    nullptr, &h1),
              BRAID_OK)
        << braid_last_error();
    int rc = braid_allreduce_async("dup", a.data(), c.data(), shape, 1, BRAID_FLOAT32,
                                   nullptr, &h2);
    if (rc == BRAID_ALREADY_EXISTS) {
      seen = true;
      EXPECT_EQ(h2, nullptr);
      EXPECT_TRUE(Contains(braid_last_error(), "'dup'")) << braid_last_error();
      EXPECT_TRUE(Contains(braid_last_error(), "in flight")) << braid_last_error();
    } else {
      EXPECT_EQ(rc, BRAID_OK) << braid_last_error();
    }
    EXPECT_CODE(BRAID_OK, braid_wait(h1, 30));
    if (h2 != nullptr) EXPECT_CODE(BRAID_OK, braid_wait(h2, 30));
    braid_handle_free(h1);
    braid_handle_free(h2);
  }
  EXPECT_TRUE(seen) << "the first 'dup' always completed before the second was enqueued";
  // Completed: the name is free again.
  EXPECT_CODE(BRAID_OK,
              braid_allreduce("dup", a.data(), b.data(), shape, 1, BRAID_FLOAT32, nullptr));
}

TEST_F(CApiTest, AllGatherOutputTooSmall) {
  const int32_t in[6] = {1, 2, 3, 4, 5, 6};
  const int64_t shape[2] = {3, 2};  // 24 bytes
  int32_t small[2] = {0, 0};
  int64_t first_dim = -1;
  // Blocking: INVALID_ARGUMENT naming the bytes needed; the first dim is still reported.
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_allgather("g.small", in, shape, 2, BRAID_INT32,
                                                      small, sizeof(small), &first_dim,
                                                      nullptr));
  EXPECT_TRUE(Contains(braid_last_error(), "24 bytes")) << braid_last_error();
  EXPECT_TRUE(Contains(braid_last_error(), "g.small")) << braid_last_error();
  EXPECT_EQ(first_dim, 3);
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_allgather("g.null", in, shape, 2, BRAID_INT32,
                                                      nullptr, 0, nullptr, nullptr));

  // Async, too small: the wait fails, the result is kept in the handle.
  braid_handle* h = nullptr;
  first_dim = -1;
  ASSERT_EQ(braid_allgather_async("g.small", in, shape, 2, BRAID_INT32, small, sizeof(small),
                                  &first_dim, nullptr, &h),
            BRAID_OK)
      << braid_last_error();
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_wait(h, 30));
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_wait(h, 30));  // same result again
  EXPECT_EQ(first_dim, 3);
  size_t needed = 0;
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_handle_copy_output(h, small, sizeof(small),
                                                               &needed));
  EXPECT_EQ(needed, 24u);
  int32_t big[6] = {0};
  EXPECT_CODE(BRAID_OK, braid_handle_copy_output(h, big, sizeof(big), &needed));
  EXPECT_EQ(std::vector<int32_t>(big, big + 6), std::vector<int32_t>(in, in + 6));
  braid_handle_free(h);

  // Async without an output: OK, read it from the handle.
  h = nullptr;
  ASSERT_EQ(braid_allgather_async("g.null", in, shape, 2, BRAID_INT32, nullptr, 0, nullptr,
                                  nullptr, &h),
            BRAID_OK)
      << braid_last_error();
  EXPECT_CODE(BRAID_OK, braid_wait(h, 30));
  std::memset(big, 0, sizeof(big));
  EXPECT_CODE(BRAID_OK, braid_handle_copy_output(h, big, sizeof(big), nullptr));
  EXPECT_EQ(big[5], 6);
  braid_handle_free(h);

  // Output large enough: the result is there, the handle keeps nothing.
  h = nullptr;
  std::memset(big, 0, sizeof(big));
  ASSERT_EQ(braid_allgather_async("g.fits", in, shape, 2, BRAID_INT32, big, sizeof(big),
                                  nullptr, nullptr, &h),
            BRAID_OK)
      << braid_last_error();
  EXPECT_CODE(BRAID_OK, braid_wait(h, 30));
  EXPECT_EQ(big[5], 6);
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_handle_copy_output(h, big, sizeof(big), nullptr));
  braid_handle_free(h);
}

TEST_F(CApiTest, WaitPollAndRepeatedWaits) {
  float in[3] = {1, 2, 3}, out[3];
  braid_handle* h = nullptr;
  ASSERT_EQ(braid_allreduce_async("w", in, out, kShape3, 1, BRAID_FLOAT32, nullptr, &h),
            BRAID_OK)
      << braid_last_error();
  int done = -1;
  EXPECT_CODE(BRAID_OK, braid_poll(h, &done));
  EXPECT_TRUE(done == 0 || done == 1);
  const int rc = braid_wait(h, 0);  // just checks
  if (rc == BRAID_DEADLINE_EXCEEDED) {
    EXPECT_TRUE(Contains(braid_last_error(), "still running")) << braid_last_error();
  } else {
    EXPECT_EQ(rc, BRAID_OK) << braid_last_error();
  }
  EXPECT_CODE(BRAID_INVALID_ARGUMENT, braid_wait(h, std::nan("")));
  EXPECT_CODE(BRAID_OK, braid_wait(h, -1));  // forever
  EXPECT_CODE(BRAID_OK, braid_wait(h, 0));
  EXPECT_CODE(BRAID_OK, braid_poll(h, &done));
  EXPECT_EQ(done, 1);
  EXPECT_EQ(out[2], 3.0f);
  braid_handle_free(h);
}

TEST_F(CApiTest, FreeingAPendingHandleIsAllowed) {
  static float in[3] = {1, 2, 3}, out[3];  // must outlive the collective
  braid_handle* h = nullptr;
  ASSERT_EQ(braid_allreduce_async("freed", in, out, kShape3, 1, BRAID_FLOAT32, nullptr, &h),
            BRAID_OK)
      << braid_last_error();
  braid_handle_free(h);
  // Collectives run in the order the coordinator agreed; "freed" was submitted first, so it
  // has completed once this barrier returns, and its name is free again.
  EXPECT_CODE(BRAID_OK, braid_barrier());
  EXPECT_CODE(BRAID_OK, braid_allreduce("freed", in, out, kShape3, 1, BRAID_FLOAT32, nullptr));
}

// Byte counters of a world of one: exact payloads, no transport (nothing leaves the rank),
// and the size prefix of the output array honoured for older and newer callers.
TEST_F(CApiTest, CompressionStatsOnOneRank) {
  constexpr int64_t kN = 1000;
  std::vector<float> in(kN, 1.5f), out(kN);
  const int64_t shape[1] = {kN};
  braid_allreduce_opts o = BRAID_ALLREDUCE_OPTS_INIT;
  o.compression = "fp16";
  EXPECT_CODE(BRAID_OK, braid_allreduce("w.fp16", in.data(), out.data(), shape, 1,
                                        BRAID_FLOAT32, &o));
  EXPECT_CODE(BRAID_OK, braid_allreduce("w.fp16", in.data(), out.data(), shape, 1,
                                        BRAID_FLOAT32, &o));  // a second step
  o.compression = nullptr;  // the job's default: none
  EXPECT_CODE(BRAID_OK, braid_allreduce("w.none", in.data(), out.data(), shape, 1,
                                        BRAID_FLOAT32, &o));

  braid_compression_stat st[3];
  for (auto& x : st) braid_compression_stat_init(&x);
  size_t count = 0;
  EXPECT_CODE(BRAID_OK, braid_compression_stats(BRAID_COMPRESSION_STATS_BY_METHOD, st, 3, &count));
  ASSERT_EQ(count, 2u);
  EXPECT_STREQ(st[0].method, "fp16");
  EXPECT_STREQ(st[0].name, "");
  EXPECT_EQ(st[0].tensors, 1u);
  EXPECT_EQ(st[0].reductions, 2u);
  EXPECT_EQ(st[0].uncompressed_bytes, 2u * 4 * kN);
  EXPECT_EQ(st[0].payload_bytes, 2u * 2 * kN);
  EXPECT_EQ(st[0].transport_bytes, 0u);
  EXPECT_EQ(st[0].reference_transport_bytes, 0u);  // 2(n-1)/n = 0 for n = 1
  EXPECT_STREQ(st[1].method, "none");
  EXPECT_EQ(st[1].payload_bytes, 4u * kN);
  EXPECT_EQ(st[1].uncompressed_bytes, 4u * kN);
  EXPECT_EQ(st[1].struct_size, sizeof(braid_compression_stat));

  // An older caller whose struct ends before payload_bytes: the array's stride is its
  // struct_size, and nothing at or past that offset is written.
  const size_t old_size = offsetof(braid_compression_stat, payload_bytes);
  std::vector<unsigned char> buf(2 * old_size + 16, 0xab);
  std::memcpy(buf.data(), &old_size, sizeof(old_size));
  EXPECT_CODE(BRAID_OK, braid_compression_stats(
                            BRAID_COMPRESSION_STATS_BY_TENSOR,
                            reinterpret_cast<braid_compression_stat*>(buf.data()), 2, &count));
  ASSERT_EQ(count, 2u);
  for (size_t i = 0; i < 2; ++i) {
    braid_compression_stat e;
    std::memset(&e, 0, sizeof(e));
    std::memcpy(&e, buf.data() + i * old_size, old_size);
    EXPECT_EQ(e.struct_size, old_size);
    EXPECT_STREQ(e.name, i == 0 ? "w.fp16" : "w.none");
    EXPECT_STREQ(e.method, i == 0 ? "fp16" : "none");
    EXPECT_EQ(e.uncompressed_bytes, (i == 0 ? 2u : 1u) * 4 * kN);
  }
  for (size_t i = 2 * old_size; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xab) << "byte " << i;

  // A newer caller with fields this library does not know: they read as zero.
  const size_t new_size = sizeof(braid_compression_stat) + 24;
  std::vector<unsigned char> big(new_size, 0xab);
  std::memcpy(big.data(), &new_size, sizeof(new_size));
  EXPECT_CODE(BRAID_OK, braid_compression_stats(
                            BRAID_COMPRESSION_STATS_BY_METHOD,
                            reinterpret_cast<braid_compression_stat*>(big.data()), 1, &count));
  braid_compression_stat e;
  std::memcpy(&e, big.data(), sizeof(e));
  EXPECT_EQ(e.struct_size, new_size);
  EXPECT_STREQ(e.method, "fp16");
  EXPECT_EQ(e.payload_bytes, 2u * 2 * kN);
  for (size_t i = sizeof(braid_compression_stat); i < new_size; ++i) {
    ASSERT_EQ(big[i], 0) << "byte " << i;
  }

  // A name longer than the field is truncated, still NUL-terminated.
  const std::string long_name(300, 'n');
  EXPECT_CODE(BRAID_OK, braid_allreduce(long_name.c_str(), in.data(), out.data(), shape, 1,
                                        BRAID_FLOAT32, nullptr));
  braid_compression_stat t[3];
  for (auto& x : t) braid_compression_stat_init(&x);
  EXPECT_CODE(BRAID_OK, braid_compression_stats(BRAID_COMPRESSION_STATS_BY_TENSOR, t, 3, &count));
  ASSERT_EQ(count, 3u);
  EXPECT_EQ(std::string(t[0].name), long_name.substr(0, sizeof(t[0].name) - 1));
}

TEST_F(CApiTest, FinalizeThenReinit) {
  float in[3] = {1, 2, 3}, out[3];
  braid_handle* h = nullptr;
  ASSERT_EQ(braid_allreduce_async("pending", in, out, kShape3, 1, BRAID_FLOAT32, nullptr, &h),
            BRAID_OK)
      << braid_last_error();
  EXPECT_CODE(BRAID_OK, braid_finalize());
  // Either it completed before the shutdown or the shutdown cancelled it.
  const int rc = braid_wait(h, 10);
  EXPECT_TRUE(rc == BRAID_OK || rc == BRAID_CANCELLED)
      << braid_error_name(rc) << ": " << braid_last_error();
  if (rc == BRAID_CANCELLED) {
    EXPECT_TRUE(Contains(braid_last_error(), "pending")) << braid_last_error();
  }
  braid_handle_free(h);
  EXPECT_EQ(braid_is_initialized(), 0);
  int v = 0;
  EXPECT_CODE(BRAID_FAILED_PRECONDITION, braid_rank(&v));
  EXPECT_TRUE(Contains(braid_last_error(), "shut down")) << braid_last_error();
  EXPECT_CODE(BRAID_OK, braid_finalize());  // twice: fine

  // A new job in the same process.
  ASSERT_EQ(braid_init(), BRAID_OK) << braid_last_error();
  EXPECT_CODE(BRAID_OK, braid_allreduce("after.reinit", in, out, kShape3, 1, BRAID_FLOAT32,
                                        nullptr));
  EXPECT_EQ(out[1], 2.0f);
}

}  // namespace
