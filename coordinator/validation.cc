#include "coordinator/validation.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/limits.h"

namespace braid::coordinator {
namespace {

std::string DtypeName(proto::DataType d) {
  int v = static_cast<int>(d);
  return IsValidDataType(v) ? std::string(DataTypeName(static_cast<DataType>(v)))
                            : absl::StrCat("dtype#", v);
}

std::string OpName(proto::ReduceOp o) {
  int v = static_cast<int>(o);
  return IsValidReduceOp(v) ? std::string(ReduceOpName(static_cast<ReduceOp>(v)))
                            : absl::StrCat("op#", v);
}

std::string TrailingShape(const proto::Request& r) {
  std::vector<std::string> dims{"?"};
  for (int i = 1; i < r.shape_size(); ++i) dims.push_back(absl::StrCat(r.shape(i)));
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Whether `b` agrees with `a` on every field FindMismatch compares for a's collective.
// Exact: when it says no, FindMismatch's per-field texts find the field and name the ranks.
bool Agrees(const proto::Request& a, const proto::Request& b) {
  const auto compression = [](const proto::Request& r) -> const std::string& {
    static const std::string kNone = "none";
    return r.compression().empty() ? kNone : r.compression();
  };
  if (a.collective() != b.collective() || a.dtype() != b.dtype() || a.device() != b.device() ||
      a.process_set_id() != b.process_set_id() || compression(a) != compression(b)) {
    return false;
  }
  const proto::Collective c = a.collective();
  if ((c == proto::ALLREDUCE || c == proto::REDUCESCATTER) && a.reduce_op() != b.reduce_op()) {
    return false;
  }
  if (a.shape_size() != b.shape_size()) return false;
  if (c == proto::ALLREDUCE || c == proto::BROADCAST || c == proto::REDUCESCATTER) {
    for (int i = 0; i < a.shape_size(); ++i) {
      if (a.shape(i) != b.shape(i)) return false;
    }
  }
  if (c == proto::ALLGATHER || c == proto::ALLTOALL) {
    for (int i = 1; i < a.shape_size(); ++i) {
      if (a.shape(i) != b.shape(i)) return false;
    }
  }
  return c != proto::BROADCAST || a.root_rank() == b.root_rank();
}

using Getter = std::string (*)(const proto::Request&);

// Each field's text as the mismatch errors show it.
std::string CollectiveText(const proto::Request& r) { return CollectiveName(r.collective()); }
std::string DtypeText(const proto::Request& r) { return DtypeName(r.dtype()); }
std::string DeviceText(const proto::Request& r) { return DeviceTypeName(r.device()); }
std::string ProcessSetText(const proto::Request& r) { return absl::StrCat(r.process_set_id()); }
std::string CompressionText(const proto::Request& r) {
  return r.compression().empty() ? std::string("none") : r.compression();
}
std::string OpText(const proto::Request& r) { return OpName(r.reduce_op()); }
std::string ShapeRankText(const proto::Request& r) { return absl::StrCat(r.shape_size()); }
std::string RootText(const proto::Request& r) { return absl::StrCat(r.root_rank()); }

// The first field on which the ranks' requests for `name` differ, as an error naming the
// field and each rank's value; nullopt when they all agree.
std::optional<proto::Response> FindMismatch(const std::string& name,
                                            const proto::Request& first,
                                            absl::Span<const RequestPtr> by_rank) {
  // The usual case, every rank sent the same: one cheap comparison per rank, no text.
  bool agree = true;
  for (const RequestPtr& r : by_rank) {
    agree = agree && (r == nullptr || r.get() == &first || Agrees(first, *r));
  }
  if (agree) return std::nullopt;
  auto differs = [&](const char* field, Getter get) -> std::optional<proto::Response> {
    std::map<int, std::string> values;
    bool diff = false;
    const std::string ref = get(first);
    for (int rank = 0; rank < static_cast<int>(by_rank.size()); ++rank) {
      if (by_rank[rank] == nullptr) continue;  // joined (Note [Join])
      values[rank] = get(*by_rank[rank]);
      diff = diff || values[rank] != ref;
    }
    if (!diff) return std::nullopt;
    return ErrorResponse(name, absl::StatusCode::kInvalidArgument,
                         MismatchMessage(name, field, values));
  };
  struct Check {
    const char* field;
    Getter get;
    bool applies;
  };
  const proto::Collective coll = first.collective();
  const bool reduces = coll == proto::ALLREDUCE || coll == proto::REDUCESCATTER;
  const bool whole_shape = reduces || coll == proto::BROADCAST;
  const bool gathers = coll == proto::ALLGATHER || coll == proto::ALLTOALL;
  // In the order they are reported: the first field that differs is the error.
  const Check checks[] = {
      {"collective", CollectiveText, true},
      {"dtype", DtypeText, true},
      {"device", DeviceText, true},
      {"process set", ProcessSetText, true},
      {"compression", CompressionText, true},
      {"reduce op", OpText, reduces},
      {"shape", ShapeString, whole_shape},
      {"rank of the shape", ShapeRankText, gathers},
      // Equal ranks of the shape: when the first is a scalar every one is, and the scalar
      // is reported by CheckAgreed.
      {"trailing shape", TrailingShape, gathers},
      {"root rank", RootText, coll == proto::BROADCAST},
  };
  for (const Check& c : checks) {
    if (!c.applies) continue;
    if (auto err = differs(c.field, c.get)) return err;
  }
  return std::nullopt;
}

// What is wrong with a request every rank agrees on, for a world of `world_size` whose set
// `members` runs it (null: every rank): a gathering collective of a scalar, a broadcast root
// outside the set, a reduce op the dtype does not take.
std::optional<proto::Response> CheckAgreed(const std::string& name, const proto::Request& first,
                                           int world_size, const std::vector<int>* members) {
  const proto::Collective coll = first.collective();
  auto invalid = [&](const std::string& why) {
    return ErrorResponse(name, absl::StatusCode::kInvalidArgument,
                         absl::StrCat("tensor '", name, "': ", why));
  };
  if ((coll == proto::ALLGATHER || coll == proto::ALLTOALL) && first.shape_size() == 0) {
    return invalid(absl::StrCat(CollectiveName(coll),
                                " needs at least one dimension, got a scalar"));
  }
  if (coll == proto::BROADCAST && (first.root_rank() < 0 || first.root_rank() >= world_size)) {
    return invalid(absl::StrCat("broadcast root rank ", first.root_rank(),
                                " is not a rank of a world of size ", world_size));
  }
  if (coll == proto::BROADCAST && members != nullptr &&
      !std::binary_search(members->begin(), members->end(), first.root_rank())) {
    return invalid(absl::StrCat("broadcast root rank ", first.root_rank(),
                                " is not in process set ", first.process_set_id(), " (ranks ",
                                absl::StrJoin(*members, ", "), ")"));
  }
  if (coll == proto::ALLREDUCE || coll == proto::REDUCESCATTER) {
    absl::Status s = CheckReduceOp(static_cast<DataType>(first.dtype()),
                                   static_cast<ReduceOp>(first.reduce_op()));
    if (!s.ok()) return invalid(std::string(s.message()));
  }
  return std::nullopt;
}

// The all-gather's per-rank first dimensions into `ok`, the gathered tensor's size checked
// for overflow (every rank's rows, then the row's size).
absl::Status AddFirstDims(const proto::Request& first, absl::Span<const RequestPtr> by_rank,
                          const std::vector<int>* members, proto::Response* ok) {
  std::vector<int64_t> dims;
  auto add = [&](int r) { dims.push_back(by_rank[r] != nullptr ? by_rank[r]->shape(0) : 0); };
  if (members == nullptr) {
    for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) add(r);
  } else {
    for (int r : *members) add(r);  // in the set's rank order
  }
  std::vector<int64_t> gathered(first.shape().begin(), first.shape().end());
  auto rows = CheckedSum("the ranks' first dimensions", dims, kMaxTensorBytes);
  if (!rows.ok()) return rows.status();
  gathered[0] = *rows;
  auto elements = ShapeElements("the gathered shape", gathered);
  if (!elements.ok()) return elements.status();
  absl::Status s = TensorBytes("the gathered tensor", *elements,
                               DataTypeSize(static_cast<DataType>(first.dtype())))
                       .status();
  if (!s.ok()) return s;
  for (int64_t d : dims) ok->add_first_dims(d);
  return absl::OkStatus();
}

}  // namespace

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat("rank", ranks.size() == 1 ? " " : "s ", absl::StrJoin(ranks, ", "));
}

proto::Response ErrorResponse(const std::string& name, absl::StatusCode code, std::string message) {
  proto::Response resp;
  resp.set_type(proto::Response::ERROR);
  resp.add_names(name);
  resp.set_error_code(static_cast<int>(code));
  resp.set_error_message(std::move(message));
  return resp;
}

absl::Status ValidateRequest(int rank, const proto::Request& req) {
  const std::string what = absl::StrCat("rank ", rank, "'s request for tensor '",
                                        Truncated(req.name(), 64), "': ");
  auto bad = [&](const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat(what, s.message()));
  };
  if (absl::Status s = CheckName("the name", req.name()); !s.ok()) return bad(s);
  if (!proto::Collective_IsValid(req.collective())) {
    return bad(absl::InvalidArgumentError(absl::StrCat("unknown collective ", req.collective())));
  }
  if (!IsValidDataType(req.dtype())) {
    return bad(absl::InvalidArgumentError(absl::StrCat("unknown dtype ", req.dtype())));
  }
  if (!proto::Device_IsValid(req.device())) {
    return bad(absl::InvalidArgumentError(absl::StrCat("unknown device ", req.device())));
  }
  if (req.device_id() < 0 || (req.device() == proto::CPU && req.device_id() != 0)) {
    return bad(absl::InvalidArgumentError(absl::StrCat(
        "device id ", req.device_id(), " of a ", DeviceTypeName(req.device()), " tensor")));
  }
  if ((req.collective() == proto::ALLREDUCE || req.collective() == proto::REDUCESCATTER) &&
      !IsValidReduceOp(req.reduce_op())) {
    return bad(absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", req.reduce_op())));
  }
  auto elements = ShapeElements("the shape", req.shape());
  if (!elements.ok()) return bad(elements.status());
  auto bytes = TensorBytes("the shape", *elements,
                           DataTypeSize(static_cast<DataType>(req.dtype())));
  if (!bytes.ok()) return bad(bytes.status());
  if (req.compression().size() > kMaxCompressionSpecBytes) {
    return bad(absl::InvalidArgumentError(absl::StrCat(
        "the compression spec is ", req.compression().size(),
        " bytes long, more than the limit of ", kMaxCompressionSpecBytes)));
  }
  if (req.compression_pattern().size() > kMaxCompressionPatternBytes) {
    return bad(absl::InvalidArgumentError(absl::StrCat(
        "the compression pattern is ", req.compression_pattern().size(),
        " bytes long, more than the limit of ", kMaxCompressionPatternBytes)));
  }
  return absl::OkStatus();
}

std::string ShapeString(const proto::Request& r) {
  return absl::StrCat("[", absl::StrJoin(r.shape(), ", "), "]");
}

std::string MismatchMessage(const std::string& name, const std::string& field,
                            const std::map<int, std::string>& value_by_rank) {
  // Group ranks by value, in order of each value's lowest rank.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, value] : value_by_rank) {
    // A named copy: C++17 lambdas cannot capture a structured binding (clang refuses).
    const std::string& v = value;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&v](const auto& g) { return g.first == v; });
    if (it == groups.end()) groups.push_back({value, {rank}});
    else it->second.push_back(rank);
  }
  std::vector<std::string> parts;
  for (const auto& [value, ranks] : groups) {
    parts.push_back(absl::StrCat(value, " on rank", ranks.size() > 1 ? "s " : " ",
                                 absl::StrJoin(ranks, ", ")));
  }
  return absl::StrCat("tensor '", name, "': ", field, " differs across ranks: ",
                      absl::StrJoin(parts, "; "));
}

proto::Response ValidateTensor(const std::string& name, const proto::Request& first,
                               absl::Span<const RequestPtr> by_rank,
                               const std::vector<int>* members) {
  if (auto err = FindMismatch(name, first, by_rank)) return *err;
  const int world_size = static_cast<int>(by_rank.size());
  if (auto err = CheckAgreed(name, first, world_size, members)) return *err;
  proto::Response ok;
  ok.set_type(proto::Response::OK);
  ok.add_names(name);
  ok.set_collective(first.collective());
  ok.set_dtype(first.dtype());
  ok.set_reduce_op(first.reduce_op());
  ok.set_root_rank(first.root_rank());
  ok.set_process_set_id(first.process_set_id());
  ok.set_compression(first.compression());
  ok.set_device(first.device());
  if (first.device() != proto::CPU) {  // each rank's (-1: none of its own, Note [Join])
    for (const RequestPtr& r : by_rank) ok.add_device_ids(r == nullptr ? -1 : r->device_id());
  }
  if (first.collective() == proto::ALLGATHER) {
    if (absl::Status s = AddFirstDims(first, by_rank, members, &ok); !s.ok()) {
      return ErrorResponse(name, absl::StatusCode::kInvalidArgument,
                           absl::StrCat("tensor '", name, "': allgather: ", s.message()));
    }
  }
  // ValidateRequest checked every shape as it arrived.
  ok.add_tensor_sizes(*ShapeElements("the shape", first.shape()));
  return ok;
}

}  // namespace braid::coordinator
