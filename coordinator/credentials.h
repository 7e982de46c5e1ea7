// How a coordinator's calls are secured on the wire (Note [Who may join] in admission.h):
// TLS through gRPC's SSL credentials, and the job secret and rank token a client adds to
// every call's metadata. The one place, with server.cc, that knows gRPC's credential types;
// braidctl uses it too.
#ifndef BRAID_COORDINATOR_CREDENTIALS_H_
#define BRAID_COORDINATOR_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace braid::coordinator {

// The server's side: plaintext when both paths are empty, else TLS with this PEM certificate
// (chain) and PEM private key. The key file must be private to this user (mode 0600, as for
// secrets, common/secret.h). InvalidArgument names a missing, unreadable or too open file,
// one path without the other, a file that holds no PEM certificate or (unencrypted) key, or a
// key that is not the certificate's.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file);

// A client's side: plaintext when `ca_file` is empty, else TLS trusting only the PEM
// certificates in `ca_file` (the coordinator's certificate, or the authority that signed it;
// its name or address must match what the client dials). InvalidArgument for an unreadable
// file, or one that holds no PEM certificate.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file);

// Adds the job secret and, when not empty, the rank token to a call's metadata.
void AddCallCredentials(grpc::ClientContext* ctx, const std::string& job_secret,
                        const std::string& rank_token = "");

}  // namespace braid::coordinator

#endif  // BRAID_COORDINATOR_CREDENTIALS_H_
