#include "coordinator/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "coordinator/admission.h"

namespace braid::coordinator {
namespace {

absl::StatusOr<std::string> ReadPublicFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream data;
  if (!(in && data << in.rdbuf())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  }
  return data.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate and its private key (BRAID_TLS_CERT and BRAID_TLS_KEY)");
  }
  auto cert = ReadPublicFile("TLS certificate (BRAID_TLS_CERT)", cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadPrivateFile("TLS private key (BRAID_TLS_KEY)", key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  auto ca = ReadPublicFile("TLS certificate authority (BRAID_TLS_CA)", ca_file);
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = *ca;
  return grpc::SslCredentials(o);
}

void AddCallCredentials(grpc::ClientContext* ctx, const std::string& job_secret,
                        const std::string& rank_token) {
  ctx->AddMetadata(kJobSecretMetadata, job_secret);
  if (!rank_token.empty()) ctx->AddMetadata(kRankTokenMetadata, rank_token);
}

}  // namespace braid::coordinator
