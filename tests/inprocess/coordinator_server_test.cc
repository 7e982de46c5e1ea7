// The coordinator's gRPC server and client in one process: a real server on 127.0.0.1 port
// 0, ranks as threads using the real client (coordinator/client.h), and bare calls that
// present other credentials. In one process so that the sanitizers (scripts/sanitize_test.sh)
// see both sides of every call: the server's callback reactors, the client's reader and
// heartbeat threads, and the admission of every call (Note [Who may join]).
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/secret.h"
#include "coordinator/client.h"
#include "coordinator/server.h"
#include "gtest/gtest.h"
#include "tests/testing/raw_client.h"

namespace braid::coordinator {
namespace {

constexpr grpc::StatusCode kDenied = grpc::StatusCode::PERMISSION_DENIED;

std::unique_ptr<CoordinatorServer> Start(const std::string& secret, int size,
                                         const std::string& cert = "",
                                         const std::string& key = "") {
  ServerOptions o;
  o.world_size = size;
  o.job_secret = secret;
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  o.monitor_period = absl::Milliseconds(20);
  auto s = StartCoordinator(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// One rank as a thread: registers, negotiates `tensors` all-reduces, says goodbye.
struct Rank {
  absl::Mutex mu;
  std::vector<std::string> done;  // names of the responses received, in order
  absl::Status closed = absl::UnknownError("open");
  std::string token;

  void Run(const std::string& address, const std::string& secret, int rank, int size,
           int tensors) {
    ClientOptions o;
    o.address = address;
    o.job_secret = secret;
    o.connect_timeout = absl::Seconds(10);
    auto client = ConnectCoordinator(o);
    ASSERT_TRUE(client.ok()) << client.status();
    proto::RegisterRequest req;
    req.set_rank(rank);
    req.set_size(size);
    req.set_host("inprocess");
    req.set_pid(1000 + rank);
    auto reg = (*client)->Register(req, absl::Seconds(10));
    ASSERT_TRUE(reg.ok()) << reg.status();
    token = reg->rank_token();
    ASSERT_TRUE((*client)
                    ->StartNegotiation(
                        rank,
                        [this](const proto::ResponseList& m) {
                          absl::MutexLock lock(&mu);
                          for (const auto& r : m.responses()) done.push_back(r.names(0));
                        },
                        [this](const absl::Status& s) {
                          absl::MutexLock lock(&mu);
                          closed = s;
                        })
                    .ok());
    for (int t = 0; t < tensors; ++t) {
      proto::RequestList l;
      l.set_rank(rank);
      proto::Request* r = l.add_requests();
      r->set_name(absl::StrCat("t", t));
      r->set_dtype(proto::FLOAT32);
      r->add_shape(8);
      r->set_compression("none");
      ASSERT_TRUE((*client)->Send(l).ok());
    }
    {
      absl::MutexLock lock(&mu);
      auto all = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
        return static_cast<int>(done.size()) == tensors;
      };
      EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(20)));
    }
    (*client)->Close(absl::Seconds(5));
  }
};

TEST(CoordinatorServerTest, RanksAsThreadsNegotiateOverGrpc) {
  const std::string secret = RandomSecret();
  auto server = Start(secret, 3);
  ASSERT_NE(server, nullptr);
  std::vector<Rank> ranks(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { ranks[r].Run(server->address(), secret, r, 3, 20); });
  }
  for (auto& t : threads) t.join();
  for (Rank& r : ranks) {
    absl::MutexLock lock(&r.mu);
    EXPECT_EQ(r.done, ranks[0].done);  // the same order on every rank
    EXPECT_EQ(r.done.size(), 20u);
    EXPECT_TRUE(r.closed.ok()) << r.closed;
  }
  EXPECT_NE(ranks[0].token, ranks[1].token);
  testing::RawClient raw(server->address());
  proto::StatusResponse st;
  ASSERT_TRUE(raw.Status(secret, &st).ok());
  EXPECT_EQ(st.phase(), proto::JOB_ENDED);
  EXPECT_EQ(st.job_state(), "ended");
  EXPECT_EQ(st.register_rpcs(), 3);
  EXPECT_EQ(st.tensors_negotiated(), 20);
}

TEST(CoordinatorServerTest, CallsWithoutTheSecretOrTheRanksTokenAreRefused) {
  const std::string secret = RandomSecret();
  auto server = Start(secret, 1);
  ASSERT_NE(server, nullptr);
  testing::RawClient raw(server->address());
  // A job of one, registered and negotiating through the bare client.
  proto::RegisterRequest req;
  req.set_rank(0);
  req.set_size(1);
  proto::RegisterResponse reg;
  ASSERT_TRUE(raw.Register(secret, req, &reg).ok());
  auto stream = raw.Negotiate(secret, reg.rank_token());
  proto::RequestList hello;
  hello.set_rank(0);
  ASSERT_TRUE(stream->stream->Write(hello));
  // The secret without the rank's token: no stream, no heartbeat for it.
  grpc::Status st = raw.NegotiateRefused(secret, "", 0);
  EXPECT_EQ(st.error_code(), kDenied);
  EXPECT_EQ(st.error_message(), "negotiation stream for rank 0 refused: no rank token (a "
                                "stream or heartbeat speaks only for the rank that registered it)");
  EXPECT_EQ(raw.Heartbeat(secret, RandomSecret(), 0).error_code(), kDenied);
  EXPECT_TRUE(raw.Heartbeat(secret, reg.rank_token(), 0).ok());
  proto::StatusResponse s;
  ASSERT_TRUE(raw.Status(secret, &s).ok());
  EXPECT_EQ(s.ranks(0).state(), "negotiating");
  EXPECT_TRUE(s.abort_message().empty());
  // The key-value store answers the job's callers, within its bounds.
  EXPECT_TRUE(raw.KeyValueSet(secret, "k", "v").ok());
  EXPECT_EQ(raw.KeyValueSet(secret, "big", std::string(64 * 1024 + 1, 'x')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Last, as they spend 127.0.0.1's refusal budget (Note [Refusal budget]); past it the
  // refusals are unchecked, with the same code.
  for (const std::string& wrong : {std::string(), std::string("wrong")}) {
    proto::RegisterResponse r;
    EXPECT_EQ(raw.Register(wrong, req, &r).error_code(), kDenied);
    EXPECT_EQ(raw.KeyValueSet(wrong, "k", "v").error_code(), kDenied);
    proto::KeyValueGetResponse g;
    EXPECT_EQ(raw.KeyValueGet(wrong, "k", &g).error_code(), kDenied);
    EXPECT_EQ(raw.NegotiateRefused(wrong, reg.rank_token(), 0).error_code(), kDenied);
    EXPECT_EQ(raw.Heartbeat(wrong, reg.rank_token(), 0).error_code(), kDenied);
    proto::StatusResponse s;
    grpc::Status st = raw.Status(wrong, &s);
    EXPECT_EQ(st.error_code(), kDenied);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "the coordinator refused Status"));
    EXPECT_EQ(raw.Shutdown(wrong).error_code(), kDenied);
  }
  // The budget is spent (20 more wrong guesses keep it so, however slow this machine): even
  // the secret is not checked from this address now.
  for (int i = 0; i < 20; ++i) raw.Status("wrong", &s);
  grpc::Status spent = raw.Status(secret, &s);
  EXPECT_EQ(spent.error_code(), kDenied);
  EXPECT_TRUE(absl::StartsWith(spent.error_message(),
                               "the coordinator refused Status: too many calls with a wrong job "
                               "secret from ipv4:127.0.0.1 (at most 10 a second per address)"))
      << spent.error_message();
  // A rank's heartbeat, which carries its token, still goes through.
  EXPECT_TRUE(raw.Heartbeat(secret, reg.rank_token(), 0).ok());
  stream->ctx.TryCancel();
}

TEST(CoordinatorServerTest, NoServerWithoutASecretOrWithAWeakOne) {
  ServerOptions o;
  auto s = StartCoordinator(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  o.job_secret = "x";  // Note [Secret strength]
  s = StartCoordinator(o);
  EXPECT_TRUE(absl::StartsWith(s.status().message(),
                               "the coordinator's job secret: the secret is too weak: a secret "
                               "must hold at least 128 bits"))
      << s.status();
}

TEST(CoordinatorServerTest, OverTlsOnlyClientsThatTrustTheCertificateGetIn) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/braid_tls_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string cert = dir + "/c.pem", key = dir + "/k.pem";
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=braid-test -addext subjectAltName=IP:127.0.0.1 -keyout ", key, " -out ",
      cert, " >/dev/null 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  chmod(key.c_str(), 0644);
  ServerOptions o;
  o.job_secret = RandomSecret();
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  EXPECT_TRUE(absl::StrContains(StartCoordinator(o).status().message(), "has mode 0644"));
  chmod(key.c_str(), 0600);
  const std::string secret = RandomSecret();
  auto server = Start(secret, 1, cert, key);
  ASSERT_NE(server, nullptr);
  ClientOptions co;
  co.address = server->address();
  co.job_secret = secret;
  co.connect_timeout = absl::Seconds(2);
  auto plain = ConnectCoordinator(co);
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable);
  co.tls_ca_file = cert;
  co.connect_timeout = absl::Seconds(10);
  auto client = ConnectCoordinator(co);
  ASSERT_TRUE(client.ok()) << client.status();
  proto::RegisterRequest req;
  req.set_rank(0);
  req.set_size(1);
  auto reg = (*client)->Register(req, absl::Seconds(10));
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->rank_token().size(), 64u);
}

// A certificate and its key, made by the openssl tool in `dir` as NAME.crt and NAME.key.
void MakeKeyPair(const std::string& dir, const std::string& name) {
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=braid-test -keyout ", dir, "/", name, ".key -out ", dir, "/", name,
      ".crt >/dev/null 2>&1 && chmod 600 ", dir, "/", name, ".key");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// gRPC reads TLS files only as the server starts, and then fails as if the port could not be
// bound ("the port is in use"): each bad file is named for what it is instead.
TEST(CoordinatorServerTest, TlsFilesThatAreNoKeyPairAreNamedForWhatTheyAre) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/braid_tls_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  MakeKeyPair(dir, "a");
  MakeKeyPair(dir, "b");
  const std::string garbage = dir + "/garbage.pem";
  ASSERT_EQ(std::system(("echo 'not PEM at all' > " + garbage + " && chmod 600 " + garbage)
                            .c_str()),
            0);
  auto start = [&](const std::string& cert, const std::string& key) {
    ServerOptions o;
    o.job_secret = RandomSecret();
    o.tls_cert_file = cert;
    o.tls_key_file = key;
    return StartCoordinator(o).status();
  };
  absl::Status s = start(dir + "/a.crt", dir + "/b.key");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), absl::StrCat("TLS private key (BRAID_TLS_KEY) '", dir,
                                      "/b.key' does not match the certificate (BRAID_TLS_CERT) '",
                                      dir, "/a.crt': it is another certificate's key"));
  s = start(garbage, dir + "/a.key");
  EXPECT_TRUE(absl::StartsWith(s.message(), absl::StrCat("TLS certificate (BRAID_TLS_CERT): '",
                                                         garbage, "' holds no PEM certificate (")))
      << s;
  s = start(dir + "/a.crt", garbage);
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               absl::StrCat("TLS private key (BRAID_TLS_KEY): '", garbage,
                                            "' holds no unencrypted PEM private key (")))
      << s;
  EXPECT_TRUE(start(dir + "/a.crt", dir + "/a.key").ok());
  // A client's certificate authority that holds none: named, not "cannot reach".
  ClientOptions co;
  co.address = "127.0.0.1:1";
  co.job_secret = RandomSecret();
  co.tls_ca_file = garbage;
  co.connect_timeout = absl::Seconds(2);  // unfixed, it waited this long for nothing
  auto client = ConnectCoordinator(co);
  EXPECT_TRUE(absl::StartsWith(client.status().message(),
                               absl::StrCat("TLS certificate authority (BRAID_TLS_CA): '", garbage,
                                            "' holds no PEM certificate (")))
      << client.status();
}

// Whether this host can bind IPv6's loopback (a sandbox may have no IPv6).
bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// `--bind ::1` said "the port is in use": gRPC read "::1:0" as the address ::1:0 with no
// port. IPv6 addresses are bracketed, ranks reach "[::1]:PORT", and a bind that fails names
// bind()'s own error.
TEST(CoordinatorServerTest, BindsIpv6AndNamesWhyAnAddressCannotBeBound) {
  ServerOptions o;
  o.job_secret = RandomSecret();
  o.bind_address = "192.0.2.1";  // TEST-NET-1: never this host's
  EXPECT_EQ(StartCoordinator(o).status().message(),
            "coordinator cannot listen on 192.0.2.1:0: bind: Cannot assign requested address "
            "(the address is not one of this host's)");
  o.bind_address = "::1";
  auto server = StartCoordinator(o);
  if (!HasIpv6Loopback()) {
    EXPECT_TRUE(absl::StartsWith(server.status().message(),
                                 "coordinator cannot listen on [::1]:0: bind: "))
        << server.status();
    return;
  }
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->address(), absl::StrCat("[::1]:", (*server)->port()));
  ClientOptions co;
  co.address = (*server)->address();
  co.job_secret = o.job_secret;
  co.connect_timeout = absl::Seconds(10);
  auto client = ConnectCoordinator(co);
  ASSERT_TRUE(client.ok()) << client.status();
  proto::RegisterRequest req;
  req.set_rank(0);
  req.set_size(1);
  auto reg = (*client)->Register(req, absl::Seconds(10));
  ASSERT_TRUE(reg.ok()) << reg.status();
  // The same port again: in use, said so.
  o.port = (*server)->port();
  EXPECT_EQ(StartCoordinator(o).status().message(),
            absl::StrCat("coordinator cannot listen on [::1]:", o.port,
                         ": bind: Address already in use (the port is in use, maybe by another "
                         "job's coordinator)"));
}

}  // namespace
}  // namespace braid::coordinator
