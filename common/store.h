// Rendezvous key-value store, after gloo's and c10d's Store: ranks publish their data-plane
// addresses under agreed keys and wait for each other's. The gRPC coordinator implements
// the same interface over its KeyValue RPCs; FileStore serves tests and the benchmarks. It
// lives in common/ because it is no transport type: the coordinator serves it without
// linking the data plane.
#ifndef BRAID_COMMON_STORE_H_
#define BRAID_COMMON_STORE_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid {

class Store {
 public:
  virtual ~Store() = default;
  // Publishes `value` under `key`, replacing any earlier value.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists, then returns its value; DeadlineExceeded naming the key after
  // `timeout`.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Waits until every key exists; DeadlineExceeded naming the missing keys after `timeout`.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

// A Store over a directory that every rank can see (one host, or a shared file system).
// Set writes a temporary file and renames it into place, so readers never see half a value.
class FileStore : public Store {
 public:
  explicit FileStore(std::string directory);
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  std::string PathFor(const std::string& key) const;
  std::string directory_;
};

}  // namespace braid

#endif  // BRAID_COMMON_STORE_H_
