// A bare gRPC client of the coordinator for tests that play someone else: an outsider without
// the job secret, a process that claims another rank, a stale rank of an earlier job. Each
// call presents exactly the credentials it is given (none when `secret` is empty). Use it in
// forked children only: the test's own process must not start gRPC before it forks.
#ifndef BRAID_TESTS_TESTING_RAW_CLIENT_H_
#define BRAID_TESTS_TESTING_RAW_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "coordinator/admission.h"
#include "proto/braid.grpc.pb.h"

namespace braid::testing {

class RawClient {
 public:
  using Stream = grpc::ClientReaderWriter<proto::RequestList, proto::ResponseList>;

  explicit RawClient(const std::string& address,
                     std::shared_ptr<grpc::ChannelCredentials> credentials =
                         grpc::InsecureChannelCredentials())
      : stub_(proto::Coordinator::NewStub(grpc::CreateChannel(address, credentials))) {}

  grpc::Status Register(const std::string& secret, const proto::RegisterRequest& req,
                        proto::RegisterResponse* resp, int timeout_s = 10) {
    Context ctx(secret, "", timeout_s);
    return stub_->Register(&ctx.ctx, req, resp);
  }
  grpc::Status KeyValueSet(const std::string& secret, const std::string& key,
                           const std::string& value) {
    Context ctx(secret);
    proto::KeyValueSetRequest req;
    req.set_key(key);
    req.set_value(value);
    proto::KeyValueSetResponse resp;
    return stub_->KeyValueSet(&ctx.ctx, req, &resp);
  }
  grpc::Status KeyValueGet(const std::string& secret, const std::string& key,
                           proto::KeyValueGetResponse* resp) {
    Context ctx(secret);
    proto::KeyValueGetRequest req;
    req.set_key(key);
    return stub_->KeyValueGet(&ctx.ctx, req, resp);
  }
  grpc::Status Heartbeat(const std::string& secret, const std::string& token, int rank) {
    Context ctx(secret, token);
    proto::HeartbeatRequest req;
    req.set_rank(rank);
    proto::HeartbeatResponse resp;
    return stub_->Heartbeat(&ctx.ctx, req, &resp);
  }
  grpc::Status Status(const std::string& secret, proto::StatusResponse* resp) {
    Context ctx(secret);
    return stub_->Status(&ctx.ctx, proto::StatusRequest(), resp);
  }
  grpc::Status Shutdown(const std::string& secret) {
    Context ctx(secret);
    proto::ShutdownRequest req;
    req.set_reason("a test's impostor");
    proto::ShutdownResponse resp;
    return stub_->Shutdown(&ctx.ctx, req, &resp);
  }

  // A Negotiate stream, kept open by the caller, which writes its first message (the hello
  // naming its rank) when it likes.
  struct OpenStream {
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream;
  };
  std::unique_ptr<OpenStream> Negotiate(const std::string& secret, const std::string& token) {
    auto s = std::make_unique<OpenStream>();
    Credentials(&s->ctx, secret, token);
    s->stream = stub_->Negotiate(&s->ctx);
    return s;
  }
  // Opens a stream as `rank` and returns how the coordinator ended it (it must end it: a
  // refused stream is finished at once; the deadline is 10 s).
  grpc::Status NegotiateRefused(const std::string& secret, const std::string& token, int rank) {
    auto s = std::make_unique<OpenStream>();
    Credentials(&s->ctx, secret, token);
    s->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    s->stream = stub_->Negotiate(&s->ctx);
    proto::RequestList hello;
    hello.set_rank(rank);
    s->stream->Write(hello);
    proto::ResponseList msg;
    while (s->stream->Read(&msg)) {
    }
    return s->stream->Finish();
  }

 private:
  static void Credentials(grpc::ClientContext* ctx, const std::string& secret,
                          const std::string& token) {
    if (!secret.empty()) ctx->AddMetadata(coordinator::kJobSecretMetadata, secret);
    if (!token.empty()) ctx->AddMetadata(coordinator::kRankTokenMetadata, token);
  }
  struct Context {
    explicit Context(const std::string& secret, const std::string& token = "",
                     int timeout_s = 10) {
      Credentials(&ctx, secret, token);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
    }
    grpc::ClientContext ctx;
  };

  std::unique_ptr<proto::Coordinator::Stub> stub_;
};

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_RAW_CLIENT_H_
