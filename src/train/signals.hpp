#pragma once
// Ctrl-C (SIGINT) and SIGTERM for the length of a scope: the first signal asks the work to stop
// after the batch in flight; a second exits the process at once (status 128 + signal; files
// baton writes are atomic, so nothing is left half-written). Scopes nest (a run around its
// fits): the outermost installs the handlers and restores the previous ones when it ends.

#include <atomic>
#include <memory>

#include <signal.h>

namespace baton::detail {

/// Holds SIGINT and SIGTERM in this thread (blocks them: one that arrives stays pending, across an
/// exec too) until a handler takes over: SignalScope and the launcher unblock them once theirs
/// are installed, so a signal while a program starts is handled as one during the run, not a
/// death by signal. A program that holds them releases them when no handler will come.
void hold_stop_signals();
void release_stop_signals();

class SignalScope {
 public:
  explicit SignalScope(bool active);
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  ~SignalScope();
  /// A signal arrived since the outermost scope began.
  [[nodiscard]] bool raised() const;
  /// The flag the handler sets, for a spec's `stop` (valid for the program's life).
  static std::shared_ptr<const std::atomic<bool>> flag();

 private:
  bool active_;
  bool outermost_ = false;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  sigset_t old_mask_{};
};

}  // namespace baton::detail
