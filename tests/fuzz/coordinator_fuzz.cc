// libFuzzer target: the coordinator's handlers (coordinator/service.h) and, through them, its
// request validation (the negotiation table, the rendezvous, the admission of callers) driven
// by arbitrary bytes. The input is a script of up to 64 calls: registrations, streams opened
// and fed, heartbeats, key-value calls, status requests, clock steps with the monitor's
// inspection, cancellations and shutdown; the messages in them are either parsed from raw
// bytes (anything protobuf accepts) or built from a few bytes so that they reach deep into
// the negotiation (matching names, shapes, cache ids). What must hold, whatever the input:
//   - no crash, no undefined behaviour, no leak (the fuzz build has ASan and UBSan);
//   - every call that waits (Register, KeyValueGet, Status) is answered exactly once, at the
//     latest when the service shuts down;
//   - each stream receives its responses in strictly increasing bucket order.
// Built with clang's -fsanitize=fuzzer in build-fuzz (scripts/sanitize_test.sh); the normal
// build links it with replay_main.cc, which runs the seed corpus (tests/fuzz/corpus) as a
// unit test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/service.h"
#include "glog/logging.h"

namespace braid::coordinator {
namespace {

constexpr char kSecret[] = "the-secret";

// Reads the script. Hand-rolled rather than clang's FuzzedDataProvider: the replay build is
// compiled by gcc, which does not ship that header.
class Script {
 public:
  Script(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ == end_; }
  uint8_t Byte() { return p_ == end_ ? 0 : *p_++; }
  // An integer in [lo, hi] (hi - lo < 2^16).
  int Int(int lo, int hi) {
    const unsigned span = static_cast<unsigned>(hi - lo) + 1;
    unsigned v = Byte();
    if (span > 256) v = (v << 8) | Byte();
    return lo + static_cast<int>(v % span);
  }
  bool Bool() { return Byte() & 1; }
  std::string Bytes(size_t max) {
    const size_t want = Int(0, static_cast<int>(max));  // before end_ - p_: it moves p_
    const size_t n = std::min<size_t>(want, end_ - p_);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "coordinator_fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

class Sink : public StreamSink {
 public:
  void Send(const proto::ResponseList& msg) override {
    if (closed_) return;
    for (const proto::Response& r : msg.responses()) {
      if (r.bucket_id() == 0) continue;  // not a bucket: an error about a rank that left
      Check(r.bucket_id() > last_bucket_, "buckets in increasing order on every stream");
      last_bucket_ = r.bucket_id();
    }
  }
  void Close() override { closed_ = true; }

 private:
  bool closed_ = false;
  int64_t last_bucket_ = -1;
};

class Driver {
 public:
  explicit Driver(Script& in) : in_(in) {
    ServiceOptions o;
    o.job_secret = kSecret;
    o.world_size = in_.Int(0, 3);  // 0: the first registration's
    o.single_job = in_.Bool();
    o.register_timeout = absl::Seconds(5);
    o.kv_limits.max_keys = 4;
    o.kv_limits.max_key_bytes = 8;
    o.kv_limits.max_value_bytes = 16;
    o.clock = [this] { return now_; };
    service_ = std::make_unique<CoordinatorService>(o);
  }

  void Run() {
    for (int op = 0; op < 64 && !in_.done(); ++op) Step(in_.Int(0, 12));
    service_->BeginShutdown();
    for (const auto& [id, n] : answered_) Check(n == 1, "every waiting call answered once");
  }

 private:
  Caller Who() {
    Caller c{"fuzz", in_.Bool() ? kSecret : in_.Bytes(4), ""};
    const int rank = in_.Int(-1, 3);
    if (tokens_.count(rank) != 0 && in_.Bool()) {
      c.rank_token = tokens_[rank];
    } else {
      c.rank_token = in_.Bytes(4);
    }
    return c;
  }
  int64_t Call() {
    const int64_t id = service_->NewCallId();
    answered_[id] = 0;
    return id;
  }
  template <typename T>
  auto Done(int64_t id) {
    return [this, id](const T&) { ++answered_[id]; };
  }

  // A request list built from a few bytes: small names, dtypes, shapes and cache ids, so that
  // the ranks' lists meet in the negotiation table.
  proto::RequestList Requests() {
    proto::RequestList l;
    if (in_.Bool()) {
      l.ParseFromString(in_.Bytes(96));  // anything protobuf accepts
      return l;
    }
    l.set_rank(in_.Int(-1, 3));
    l.set_shutdown(in_.Int(0, 7) == 0);
    for (int n = in_.Int(0, 3); n > 0; --n) {
      proto::Request* r = l.add_requests();
      r->set_name(std::string(1, static_cast<char>('a' + in_.Int(0, 3))));
      r->set_collective(static_cast<proto::Collective>(in_.Int(0, 6)));
      r->set_dtype(static_cast<proto::DataType>(in_.Int(0, 7)));
      for (int d = in_.Int(0, 3); d > 0; --d) r->add_shape(in_.Int(-2, 1 << 12));
      r->set_reduce_op(static_cast<proto::ReduceOp>(in_.Int(0, 5)));
      r->set_root_rank(in_.Int(-1, 3));
      r->set_process_set_id(in_.Int(0, 1));
      r->set_compression(in_.Bool() ? "none" : in_.Bytes(6));
    }
    for (int n = in_.Int(0, 2); n > 0; --n) l.add_cached_ids(in_.Int(-1, 6));
    return l;
  }

  void Register() {
    proto::RegisterRequest req;
    if (in_.Bool()) {
      req.ParseFromString(in_.Bytes(64));
    } else {
      req.set_rank(in_.Int(-1, 3));
      req.set_size(in_.Int(0, 3));
      req.set_local_rank(in_.Int(-1, 3));
      req.set_local_size(in_.Int(0, 3));
      req.set_host(in_.Bool() ? "h" : "g");
      req.set_pid(in_.Int(0, 3));
      req.set_transport_address(in_.Bytes(4));
      if (in_.Bool()) req.mutable_settings()->ParseFromString(in_.Bytes(16));
    }
    const int64_t id = Call();
    service_->Register(id, Who(), req, [this, id](absl::StatusOr<proto::RegisterResponse> r) {
      ++answered_[id];
      if (r.ok()) tokens_[r->rank()] = r->rank_token();
    });
  }

  void Step(int op) {
    switch (op) {
      case 0: return Register();
      case 1: {
        auto sink = std::make_shared<Sink>();
        auto key = service_->OpenStream(Who(), Requests(), sink);
        if (key.ok()) keys_.push_back(*key);
        sinks_.push_back(sink);  // alive as long as its key, as the server's reactor keeps it
        return;
      }
      case 2:
      case 3:
        if (!keys_.empty()) service_->OnRequests(keys_[in_.Int(0, 255) % keys_.size()], Requests());
        return;
      case 4:
        if (!keys_.empty()) service_->OnStreamEnd(keys_[in_.Int(0, 255) % keys_.size()]);
        return;
      case 5: {
        proto::HeartbeatRequest hb;
        if (!hb.ParseFromString(in_.Bytes(32))) hb.set_rank(in_.Int(-1, 3));
        service_->Heartbeat(Who(), hb).IgnoreError();
        return;
      }
      case 6: {
        proto::KeyValueSetRequest set;
        set.set_key(in_.Bytes(10));
        set.set_value(in_.Bytes(20));
        service_->KeyValueSet(Who(), set).IgnoreError();
        return;
      }
      case 7: {
        proto::KeyValueGetRequest get;
        get.set_key(in_.Bytes(10));
        get.set_timeout_ms(in_.Int(-1, 10000));
        const int64_t id = Call();
        service_->KeyValueGet(id, Who(), get, Done<absl::StatusOr<proto::KeyValueGetResponse>>(id));
        return;
      }
      case 8: {
        proto::StatusRequest req;
        if (!req.ParseFromString(in_.Bytes(16))) req.set_wait_for_end_ms(in_.Int(0, 10000));
        const int64_t id = Call();
        service_->Status(id, Who(), req, Done<absl::StatusOr<proto::StatusResponse>>(id));
        return;
      }
      case 9:
        now_ += absl::Milliseconds(in_.Int(0, 30000));
        service_->Inspect();
        return;
      case 10:
        if (!answered_.empty()) service_->Cancel(in_.Int(0, static_cast<int>(answered_.size())));
        return;
      case 11: {
        proto::ShutdownRequest req;
        service_->RequestShutdown(Who(), req).IgnoreError();
        return;
      }
      default:
        if (in_.Int(0, 7) == 0) service_->BeginShutdown();
        return;
    }
  }

  Script& in_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<CoordinatorService> service_;
  std::map<int64_t, int> answered_;     // call id -> times answered
  std::map<int, std::string> tokens_;   // rank -> its latest token
  std::vector<StreamKey> keys_;
  std::vector<std::shared_ptr<Sink>> sinks_;
};

}  // namespace
}  // namespace braid::coordinator

// Refusals and aborted jobs are the fuzzer's daily bread: their log lines would drown its own.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = google::GLOG_ERROR;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  braid::coordinator::Script in(data, size);
  braid::coordinator::Driver(in).Run();
  return 0;
}
