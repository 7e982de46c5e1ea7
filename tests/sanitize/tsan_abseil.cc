// ThreadSanitizer's view of Debian's Abseil synchronization, linked into the executables of
// the TSan build only (scripts/sanitize_test.sh).
//
// Note [TSan and Debian's Abseil]
// Debian's libabsl_synchronization.so is built without ThreadSanitizer, so TSan sees neither
// absl::Mutex's locking (it is spin loops and futexes, not the pthread calls TSan intercepts)
// nor Notification's atomic flag: every access guarded by one looks like a race. braid's
// code, its tests and gRPC 1.51 (whose gpr_mu is an absl::Mutex) all synchronize through
// them. So this file defines the public entry points of absl::Mutex, absl::CondVar and
// absl::Notification in the executable itself: the executable's definitions take precedence
// over the library's for every caller, the library's own calls included (they go through its
// PLT). Each forwards to the library's function (dlsym RTLD_NEXT) and tells TSan the
// happens-before edges the call implies: taking a mutex acquires it, releasing it releases
// it, and a wait (Await, CondVar::Wait) releases then acquires. One more edge: absl::Mutex
// evaluates a waiter's Condition in whichever thread holds the mutex inside the library (an
// unlocking thread, or another waiter woken inside its own Await), so Condition::Eval is
// wrapped too: it acquires and then releases the mutex of the call the evaluating thread is
// in (each wrapper notes it in a thread-local). What remains invisible is
// synchronization inside uninstrumented libraries that uses bare atomics (some of gRPC's
// queues); the TSan suite is chosen so that braid's code hands nothing across threads that
// way.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

template <typename Fn>
Fn Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_abseil: %s not found: %s\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// The mutex whose library call this thread is in: a Condition evaluated now is evaluated
// under it.
thread_local const void* t_mutex = nullptr;
class InCall {
 public:
  explicit InCall(const void* mu) : saved_(t_mutex) { t_mutex = mu; }
  ~InCall() { t_mutex = saved_; }

 private:
  const void* saved_;
};

// The address of a Notification's flag, which its inline HasBeenNotified() reads with an
// acquire load (TSan syncs an atomic acquire with a release at the same address).
const void* Flag(const absl::Notification* n) {
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}

}  // namespace

#define BRAID_REAL(type, name) static const auto real = Real<type>(name)

namespace absl {
ABSL_NAMESPACE_BEGIN

using Cond = const Condition*;

void Mutex::Lock() {
  BRAID_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  InCall in(this);
  real(this);
  Acquire(this);
}
void Mutex::Unlock() {
  BRAID_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Release(this);
  InCall in(this);
  real(this);
}
bool Mutex::TryLock() {
  BRAID_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  InCall in(this);
  const bool got = real(this);
  if (got) Acquire(this);
  return got;
}
void Mutex::ReaderLock() {
  BRAID_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  InCall in(this);
  real(this);
  Acquire(this);
}
void Mutex::ReaderUnlock() {
  BRAID_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(this);
  InCall in(this);
  real(this);
}
bool Mutex::ReaderTryLock() {
  BRAID_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  InCall in(this);
  const bool got = real(this);
  if (got) Acquire(this);
  return got;
}

void Mutex::LockWhen(const Condition& c) {
  BRAID_REAL(void (*)(Mutex*, Cond), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  InCall in(this);
  real(this, &c);
  Acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& c, Duration d) {
  BRAID_REAL(bool (*)(Mutex*, Cond, Duration),
             "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  InCall in(this);
  const bool r = real(this, &c, d);
  Acquire(this);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& c, Time t) {
  BRAID_REAL(bool (*)(Mutex*, Cond, Time),
             "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  InCall in(this);
  const bool r = real(this, &c, t);
  Acquire(this);
  return r;
}
void Mutex::ReaderLockWhen(const Condition& c) {
  BRAID_REAL(void (*)(Mutex*, Cond), "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  InCall in(this);
  real(this, &c);
  Acquire(this);
}

void Mutex::Await(const Condition& c) {
  BRAID_REAL(void (*)(Mutex*, Cond), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Release(this);
  InCall in(this);
  real(this, &c);
  Acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& c, Duration d) {
  BRAID_REAL(bool (*)(Mutex*, Cond, Duration),
             "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  InCall in(this);
  const bool r = real(this, &c, d);
  Acquire(this);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& c, Time t) {
  BRAID_REAL(bool (*)(Mutex*, Cond, Time),
             "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  InCall in(this);
  const bool r = real(this, &c, t);
  Acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  BRAID_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  InCall in(mu);
  real(this, mu);
  Acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration d) {
  BRAID_REAL(bool (*)(CondVar*, Mutex*, Duration),
             "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  InCall in(mu);
  const bool r = real(this, mu, d);
  Acquire(mu);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time t) {
  BRAID_REAL(bool (*)(CondVar*, Mutex*, Time),
             "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  InCall in(mu);
  const bool r = real(this, mu, t);
  Acquire(mu);
  return r;
}

bool Condition::Eval() const {
  BRAID_REAL(bool (*)(const Condition*), "_ZNK4absl7debian39Condition4EvalEv");
  if (t_mutex != nullptr) Acquire(t_mutex);
  const bool r = real(this);
  if (t_mutex != nullptr) Release(t_mutex);
  return r;
}

void Notification::Notify() {
  BRAID_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  Release(this);
  Release(Flag(this));
  real(this);
}
void Notification::WaitForNotification() const {
  BRAID_REAL(void (*)(const Notification*),
             "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  Acquire(this);
}
bool Notification::WaitForNotificationWithTimeout(Duration d) const {
  BRAID_REAL(bool (*)(const Notification*, Duration),
             "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(this, d);
  if (r) Acquire(this);
  return r;
}
bool Notification::WaitForNotificationWithDeadline(Time t) const {
  BRAID_REAL(bool (*)(const Notification*, Time),
             "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool r = real(this, t);
  if (r) Acquire(this);
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
