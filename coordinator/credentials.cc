#include "coordinator/credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
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

// OpenSSL's objects, freed on every path out.
struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// OpenSSL's reason for the last failure, and its queue emptied (it is per thread).
std::string OpenSslReason() {
  const unsigned long e = ERR_peek_last_error();
  const char* reason = e != 0 ? ERR_reason_error_string(e) : nullptr;
  ERR_clear_error();
  return reason != nullptr ? std::string(reason) : "not PEM";
}

// gRPC reads the certificate and key only when the server starts, and then fails as if the
// port could not be bound: so they are read here first, with OpenSSL (which gRPC links), and
// a file that holds no PEM certificate or key, or a key that is not the certificate's, is
// named as such.
absl::Status CheckKeyPair(const std::string& cert_file, const std::string& cert_pem,
                          const std::string& key_file, const std::string& key_pem) {
  Bio cert_bio = MemoryBio(cert_pem);
  std::unique_ptr<X509, X509Deleter> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS certificate (BRAID_TLS_CERT): '", cert_file,
                     "' holds no PEM certificate (", OpenSslReason(), ")"));
  }
  Bio key_bio = MemoryBio(key_pem);
  // No passphrase callback: an encrypted key fails here rather than prompting.
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(PEM_read_bio_PrivateKey(
      key_bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS private key (BRAID_TLS_KEY): '", key_file,
                     "' holds no unencrypted PEM private key (", OpenSslReason(), ")"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("TLS private key (BRAID_TLS_KEY) '", key_file,
                     "' does not match the certificate (BRAID_TLS_CERT) '", cert_file,
                     "': it is another certificate's key"));
  }
  return absl::OkStatus();
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
  if (absl::Status s = CheckKeyPair(cert_file, *cert, key_file, *key); !s.ok()) return s;
  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  auto ca = ReadPublicFile("TLS certificate authority (BRAID_TLS_CA)", ca_file);
  if (!ca.ok()) return ca.status();
  // gRPC would only fail to connect, as if the coordinator were unreachable.
  Bio bio = MemoryBio(*ca);
  if (std::unique_ptr<X509, X509Deleter>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) ==
      nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS certificate authority (BRAID_TLS_CA): '", ca_file,
                     "' holds no PEM certificate (", OpenSslReason(), ")"));
  }
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
