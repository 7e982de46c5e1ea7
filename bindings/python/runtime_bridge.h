// The runtime as another extension module of the same process sees it: how the `braid`
// torch.distributed backend (braid/torch/process_group.so, built against PyTorch's C++ API) reaches
// the runtime that braid._braid holds, without linking a second copy of it.
//
// braid._braid exports one braid::bridge::Runtime as a PyCapsule named kCapsuleName
// (attribute `_runtime_bridge`). The interface carries only standard-library types and
// virtual calls, so the module that uses it needs neither the runtime's headers (Abseil,
// gRPC) nor its symbols: both modules are built by this project with one compiler and one
// C++ standard library. kVersion changes whenever this header does; a user checks it before
// anything else.
#ifndef BRAID_BINDINGS_PYTHON_RUNTIME_BRIDGE_H_
#define BRAID_BINDINGS_PYTHON_RUNTIME_BRIDGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid::bridge {

inline constexpr int kVersion = 2;
inline constexpr const char* kCapsuleName = "braid._braid.runtime_bridge";

// absl::StatusCode's value (0 = OK) and the runtime's message.
struct Status {
  int code = 0;
  std::string message;
  bool ok() const { return code == 0; }
};

// braid::CollectiveRequest's fields, with the enums as their wire codes (common/dtype.h).
// Buffers are host memory; the caller keeps them alive (and the input unmodified) until the
// operation completes.
struct Request {
  int collective = 0;
  std::string name;
  int dtype = 0;
  std::vector<int64_t> shape;
  const void* input = nullptr;
  void* output = nullptr;  // nullptr: the runtime allocates (Operation::output)
  size_t output_capacity = 0;
  int op = 0;
  int root_rank = 0;
  std::vector<int64_t> splits;
  std::string compression;  // "" = the job's default (BRAID_COMPRESSION)
  int process_set_id = 0;   // 0: the whole job (Note [Process sets] in control/process_sets.h)
};

// The name the job knows process set `process_set_id`'s tensor `name` by: braid's
// QualifiedName (control/process_sets.h), which this header cannot include (standard-library
// types only); a failure reported under a set's tensor takes this name.
inline std::string QualifiedName(int process_set_id, const std::string& name) {
  return process_set_id == 0 ? name : "ps" + std::to_string(process_set_id) + "/" + name;
}

// One enqueued collective (braid::Handle). Completes exactly once.
class Operation {
 public:
  virtual ~Operation() = default;
  // Waits up to `timeout_s` seconds; whether the operation has completed.
  virtual bool Wait(double timeout_s) = 0;
  // The final status (after Wait returned true).
  virtual Status status() const = 0;
  // The runtime-allocated result (all-gather, all-to-all, calls without an output buffer)
  // and its shape, after successful completion.
  virtual const std::vector<char>& output() const = 0;
  virtual std::vector<int64_t> output_shape() const = 0;
};

class Runtime {
 public:
  virtual int version() const = 0;
  virtual bool initialized() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Runtime::Enqueue. On OK, *op holds the operation.
  virtual Status Enqueue(Request request, std::unique_ptr<Operation>* op) = 0;
  // Runtime::ReportFailure: this rank refused its call of `name` before enqueueing it.
  virtual Status ReportFailure(const std::string& name, const Status& cause) = 0;

 protected:
  ~Runtime() = default;  // owned by braid._braid for the life of the process
};

}  // namespace braid::bridge

#endif  // BRAID_BINDINGS_PYTHON_RUNTIME_BRIDGE_H_
