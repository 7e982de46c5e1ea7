// Opening a shared library at run time, for the libraries braid uses only when a job needs
// them and must load without (cuBLAS, NCCL). Header-only.
#ifndef BRAID_COMMON_SHARED_LIBRARY_H_
#define BRAID_COMMON_SHARED_LIBRARY_H_

#include <dlfcn.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace braid {

// Opens the first of `names` (sonames, preferred first) that dlopen loads and `bind` accepts:
// bind(handle) binds the functions it needs (dlsym) and checks what it must (a version),
// returning an error that says what is missing. Returns the handle, never closed, or null
// with `*errors` saying why each name failed ("libx.so.1: cannot open ...; libx.so: lacks
// xFoo"). Not thread-safe by itself: callers open once (a function-local static).
template <typename Bind>
void* OpenFirstLibrary(absl::Span<const char* const> names, Bind bind, std::string* errors) {
  for (const char* name : names) {
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* err = dlerror();
      absl::StrAppend(errors, errors->empty() ? "" : "; ", err != nullptr ? err : name);
      continue;
    }
    const absl::Status bound = bind(lib);
    if (bound.ok()) return lib;
    absl::StrAppend(errors, errors->empty() ? "" : "; ", name, ": ", bound.message());
    dlclose(lib);
  }
  return nullptr;
}

// dlsym of `name` into `*fn`; false when the library lacks it.
template <typename Fn>
bool BindSymbol(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  return *fn != nullptr;
}

}  // namespace braid

#endif  // BRAID_COMMON_SHARED_LIBRARY_H_
