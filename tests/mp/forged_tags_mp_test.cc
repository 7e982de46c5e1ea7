// The data plane admits only the job's own messages (Note [Who may join] in
// coordinator/admission.h, Note [Tag layout] in transport/tag.h). Two ranks connect over UCX
// with the tags the runtime uses (KeyedDataPlaneTags, runtime/registration.h); an attacker
// process that learned both ranks' UCX worker addresses, but not the job secret, sends
// correctly laid-out messages (the size and tag layout of the ranks' all-reduce messages) for
// the job's next 100 collective sequence numbers, before the ranks start them: once with the
// pair field of an unkeyed layout (the source rank), once keyed with a wrong secret. The ranks
// then run those 100 all-reduces and every element must be exact, and every forged message
// must have been dropped and counted (TransportStats::stray_messages_dropped) once its
// sequence number's all-reduce completed. The same attack on a job whose tags are not keyed
// must corrupt results: without that, this test could not fail. A third run interleaves the
// negotiation fast path's votes (runtime/fast_loop.cc: a small all-gather over the same data
// plane, between the all-reduces) and holds them to the same rule.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/secret.h"
#include "common/store.h"
#include "gtest/gtest.h"
#include "runtime/registration.h"
#include "tests/testing/exact_job.h"
#include "tests/testing/fork_ranks.h"
#include "transport/tag.h"
#include "transport/ucx_communicator.h"

namespace braid {
namespace {

using testing::AwaitFile;
using testing::RankExit;
using testing::RunRanks;
using testing::RunRanksOptions;
using testing::Touch;

constexpr int kSteps = 100;       // all-reduces, sequence numbers 0..99
constexpr size_t kN = 256;        // floats per all-reduce: 1 KiB, one message per rank
constexpr char kSecret[] = "the job's secret, which the attacker does not have";
// Forged messages to each rank: 2 pair fields x kSteps sequence numbers x 2 slots.
constexpr int kForgedPerRank = 2 * kSteps * 2;

struct RankResult {
  int wrong = -1;    // elements not exact, over all all-reduces
  int failed = -1;   // all-reduces that returned an error
  long dropped = -1; // TransportStats::stray_messages_dropped after the all-reduces
  long received = -1;  // TransportStats::messages_received
};

// The fast path's vote on one step: a few 64-bit words per rank (runtime/fast_path.h), here
// values that name the rank, the step and the word.
constexpr size_t kVoteWords = 4;
uint64_t VoteWord(int rank, int step, size_t i) {
  return (uint64_t{1} << 40) * (rank + 1) + 1000 * static_cast<uint64_t>(step) + i;
}

// A rank: connects through the store, waits for the attack, runs the all-reduces (with
// `votes`, every odd step a vote's all-gather instead) and counts wrong elements, failed
// calls and dropped messages. Exit code 0; the counts go to DIR/result.RANK.
int Rank(int rank, const std::string& dir, bool keyed, bool votes) {
  transport::UcxOptions uo;
  uo.rank = rank;
  uo.size = 2;
  uo.timeout = absl::Seconds(20);
  if (keyed) uo.pair_tag = KeyedDataPlaneTags(kSecret);
  auto worker = transport::OpenUcxWorker(uo);
  if (!worker.ok()) return 2;
  FileStore store(dir + "/store");
  const transport::PeerAddress& self = (*worker)->self();
  for (const auto& [k, v] : {std::pair<std::string, std::string>{"host", self.host},
                             {"pid", absl::StrCat(self.pid)}, {"addr", self.address}}) {
    if (!store.Set(absl::StrCat(k, "/", rank), v).ok()) return 2;
  }
  std::vector<transport::PeerAddress> peers(2);
  for (int r = 0; r < 2; ++r) {
    auto host = store.Get(absl::StrCat("host/", r), absl::Seconds(30));
    auto pid = store.Get(absl::StrCat("pid/", r), absl::Seconds(30));
    auto addr = store.Get(absl::StrCat("addr/", r), absl::Seconds(30));
    if (!host.ok() || !pid.ok() || !addr.ok()) return 2;
    peers[r] = {*host, std::stoll(*pid), *addr};
  }
  auto comm = transport::ConnectUcx(*std::move(worker), std::move(peers));
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 2;
  }
  if (!AwaitFile(dir + "/sent", absl::Seconds(60))) {
    std::fprintf(stderr, "rank %d: the attacker never finished sending\n", rank);
    return 2;
  }
  int wrong = 0, failed = 0;
  std::vector<float> in(kN), out(kN);
  for (int step = 0; step < kSteps; ++step) {
    if (votes && step % 2 == 1) {
      std::vector<uint64_t> mine(kVoteWords), all(2 * kVoteWords);
      for (size_t i = 0; i < kVoteWords; ++i) mine[i] = VoteWord(rank, step, i);
      const std::vector<size_t> bytes(2, kVoteWords * sizeof(uint64_t));
      if (!(*comm)->AllGather(mine.data(), bytes[0], all.data(), bytes).ok()) {
        ++failed;
        continue;
      }
      for (int r = 0; r < 2; ++r) {
        for (size_t i = 0; i < kVoteWords; ++i) {
          wrong += all[r * kVoteWords + i] != VoteWord(r, step, i);
        }
      }
      continue;
    }
    for (size_t i = 0; i < kN; ++i) in[i] = static_cast<float>((rank + 1) * ((i + step) % 97));
    if (!(*comm)->AllReduce(in.data(), out.data(), kN, DataType::kFloat32, ReduceOp::kSum).ok()) {
      ++failed;
      continue;
    }
    for (size_t i = 0; i < kN; ++i) wrong += out[i] != static_cast<float>(3 * ((i + step) % 97));
  }
  const transport::TransportStats stats = (*comm)->stats();
  testing::WriteFile(absl::StrCat(dir, "/result.", rank),
                     absl::StrCat(wrong, " ", failed, " ", stats.stray_messages_dropped, " ",
                                  stats.messages_received),
                     0644);
  (*comm)->Barrier().IgnoreError();  // sequence number 100: not forged
  return 0;
}

// The attacker: its own UCX worker, endpoints to the leaked addresses, and 2 x 100 x 2
// forged messages to each rank (two pair fields, 100 sequence numbers, slots 0 and 1: a
// 2-rank all-reduce below the ring threshold is one exchange in slot 1), all delivered before
// the ranks begin.
int Attacker(const std::string& dir) {
  FileStore store(dir + "/store");
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return 2;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucp_context_h context = nullptr;
  const ucs_status_t init = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (init != UCS_OK) return 2;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (ucp_worker_create(context, &wp, &worker) != UCS_OK) return 2;
  std::string address[2];
  ucp_ep_h ep[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    auto a = store.Get(absl::StrCat("addr/", r), absl::Seconds(60));  // the leak
    if (!a.ok()) {
      std::fprintf(stderr, "attacker: %s\n", a.status().ToString().c_str());
      return 2;
    }
    address[r] = *a;
    ucp_ep_params_t e{};
    e.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    e.address = reinterpret_cast<const ucp_address_t*>(address[r].data());
    if (ucp_ep_create(worker, &e, &ep[r]) != UCS_OK) return 2;
  }
  const std::string wrong_key = DataPlaneTagKey("a guess at the job's secret");
  std::vector<float> garbage(kN, 1.0e6f);
  std::vector<void*> pending;
  for (int dst = 0; dst < 2; ++dst) {
    const int src = 1 - dst;  // the only peer a rank of two receives from
    for (uint32_t pair : {static_cast<uint32_t>(src), KeyedPairTag(wrong_key, src, dst)}) {
      for (uint32_t seq = 0; seq < kSteps; ++seq) {
        for (uint32_t slot = 0; slot < 2; ++slot) {
          ucp_request_param_t p{};
          p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
          p.datatype = ucp_dt_make_contig(1);
          void* r = ucp_tag_send_nbx(ep[dst], garbage.data(), kN * sizeof(float),
                                     transport::EncodeUcxTag(pair, transport::Tag{seq, slot}), &p);
          if (UCS_PTR_IS_ERR(r)) return 2;
          if (r != nullptr) pending.push_back(r);
        }
      }
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!pending.empty()) {
    if (absl::Now() > deadline) {
      std::fprintf(stderr, "attacker: %zu sends still in flight after 30 s\n", pending.size());
      return 2;
    }
    ucp_worker_progress(worker);
    for (auto it = pending.begin(); it != pending.end();) {
      if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(*it);
      it = pending.erase(it);
    }
  }
  Touch(dir + "/sent");
  // Keep the endpoints until the ranks are done, progressing, as a live attacker would.
  while (!(testing::FileExists(dir + "/result.0") && testing::FileExists(dir + "/result.1")) &&
         absl::Now() < deadline + absl::Seconds(60)) {
    ucp_worker_progress(worker);
    absl::SleepFor(absl::Milliseconds(1));
  }
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  return 0;
}

// Runs the attack on a job with keyed tags or not (with `votes`, fast-path votes between the
// all-reduces); what each rank counted.
std::vector<RankResult> Attack(bool keyed, bool votes = false) {
  const std::string dir = testing::MakeTempDir("braid_forged_");
  testing::ScopedEnv tls("UCX_TLS", "sm");
  testing::ScopedEnv devices("UCX_NET_DEVICES", "lo");
  // Room in each rank's shared-memory receive queue for every forged message, so the attacker
  // delivers them all before the ranks start (they do not progress UCX while they wait).
  testing::ScopedEnv posix("UCX_POSIX_FIFO_SIZE", "4096");
  testing::ScopedEnv sysv("UCX_SYSV_FIFO_SIZE", "4096");
  RunRanksOptions o;
  o.ranks = 3;
  o.deadline = absl::Seconds(120);
  auto exits = RunRanks(o, [&](int p) { return p < 2 ? Rank(p, dir, keyed, votes) : Attacker(dir); });
  for (const RankExit& e : exits) {
    EXPECT_FALSE(e.timed_out) << "process " << e.rank << " hung";
    EXPECT_EQ(e.exit_code, 0) << (e.rank < 2 ? "rank " : "the attacker ") << e.rank;
  }
  std::vector<RankResult> results;
  for (int r = 0; r < 2; ++r) {
    RankResult rr;
    FILE* f = std::fopen(absl::StrCat(dir, "/result.", r).c_str(), "r");
    if (f != nullptr) {
      if (std::fscanf(f, "%d %d %ld %ld", &rr.wrong, &rr.failed, &rr.dropped, &rr.received) !=
          4) {
        rr = RankResult{};
      }
      std::fclose(f);
    }
    results.push_back(rr);
  }
  return results;
}

TEST(ForgedTagsTest, WrongKeyTagsForTheNext100SequenceNumbersChangeNoResult) {
  const std::vector<RankResult> results = Attack(/*keyed=*/true);
  for (size_t r = 0; r < results.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(results[r].wrong, 0);
    EXPECT_EQ(results[r].failed, 0);
    // Every forged message reached the rank (they all precede the job's in its queue) and
    // was dropped once its all-reduce completed; the rank received only its peer's 100.
    EXPECT_EQ(results[r].dropped, kForgedPerRank);
    EXPECT_EQ(results[r].received, kSteps);
  }
}

// The fast path agrees on cached tensors by an all-gather of votes over the same data plane:
// forged messages under a vote's sequence number are dropped like the others, and no vote
// changes.
TEST(ForgedTagsTest, FastPathVotesAreKeyedAndTheirStrayMessagesDropped) {
  const std::vector<RankResult> results = Attack(/*keyed=*/true, /*votes=*/true);
  for (size_t r = 0; r < results.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(results[r].wrong, 0);
    EXPECT_EQ(results[r].failed, 0);
    EXPECT_EQ(results[r].dropped, kForgedPerRank);
    EXPECT_EQ(results[r].received, kSteps);  // one message from the peer per collective
  }
}

// The control: the same messages reach a job whose tags carry the plain source rank.
TEST(ForgedTagsTest, WithoutKeyedTagsTheSameAttackCorruptsResults) {
  int corrupted = 0;
  for (const RankResult& r : Attack(/*keyed=*/false)) {
    ASSERT_GE(r.wrong, 0) << "a rank wrote no result";
    std::printf("unkeyed job: %d wrong elements, %d failed all-reduces on a rank\n", r.wrong,
                r.failed);
    corrupted += r.wrong + r.failed;
  }
  EXPECT_GT(corrupted, 0) << "the attack did not reach an unkeyed job: this test proves nothing";
}

}  // namespace
}  // namespace braid
