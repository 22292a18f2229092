// Signal handling for fits and runs (signals.hpp).
#include "train/signals.hpp"

#include <pthread.h>
#include <unistd.h>

namespace baton::detail {
namespace {
std::atomic<bool> g_stop{false};  // set by the first signal
std::atomic<int> g_signals{0};    // how many arrived
std::atomic<int> g_depth{0};      // active scopes
}  // namespace

namespace {
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void hold_stop_signals() {
  const auto set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void release_stop_signals() {
  const auto set = stop_signals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

extern "C" void baton_on_signal(int sig) {
  if (g_signals.fetch_add(1) >= 1) ::_exit(128 + sig);  // the second one: leave now
  g_stop.store(true);
}

SignalScope::SignalScope(bool active) : active_(active) {
  if (!active_) return;
  outermost_ = g_depth.fetch_add(1) == 0;
  if (!outermost_) return;
  g_signals = 0;
  g_stop = false;
  struct sigaction sa {};
  sa.sa_handler = baton_on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
  // Signals held since the program started (hold_stop_signals) arrive now, at the handler.
  const auto set = stop_signals();
  pthread_sigmask(SIG_UNBLOCK, &set, &old_mask_);
}

SignalScope::~SignalScope() {
  if (!active_) return;
  g_depth.fetch_sub(1);
  if (!outermost_) return;
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

bool SignalScope::raised() const { return active_ && g_stop.load(); }

std::shared_ptr<const std::atomic<bool>> SignalScope::flag() {
  return std::shared_ptr<const std::atomic<bool>>(std::shared_ptr<void>(), &g_stop);
}

}  // namespace baton::detail
