#pragma once
// Callbacks and loggers as the loop calls them, with what is attached resolved once so that
// nothing attached costs nothing (a test of an empty vector per event point).

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "baton/events.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"
#include "detail.hpp"

namespace baton::detail {

struct Hooks {
  const TrainingSpec& spec;
  TrainState& s;
  bool any_callbacks = !spec.callbacks.empty();
  bool any_loggers = !spec.loggers.empty();
  bool any_before_loss = std::any_of(spec.algorithms.begin(), spec.algorithms.end(), [](const Algorithm& a) { return bool(a.before_loss); });
  bool any_after_backward = std::any_of(spec.algorithms.begin(), spec.algorithms.end(), [](const Algorithm& a) { return bool(a.after_backward); });
  std::optional<std::string> stop_reason{};  // the first callback's request to stop
  const BatchSpan* span = nullptr;           // the batch in progress (EventView::span), if any

  /// Fires `e` at every callback (in order) and sends what they log to the loggers.
  void fire(Event e, const StepInfo* step = nullptr, const Metrics* metrics = nullptr, const std::string* path = nullptr) {
    if (!any_callbacks) return;
    Scalars log;
    for (const auto& cb : spec.callbacks) {
      auto reason = with_memory(s.callback_state, cb.name, [&](std::map<std::string, double>& memory) {
        return cb.on_event(EventView{e, spec, s, step, metrics, path, &log, &memory, span});
      });
      if (reason && cb.observer)  // an observer is left out of run fingerprints: it must not steer
        detail::raise(ErrorCode::invalid_spec,
                      fmt::format("callback \"{}\" says it only observes (Callback::observer) but asked to stop the "
                                  "stage ({}); set observer = false and give it an identity", cb.name, *reason));
      if (reason && !stop_reason) stop_reason = fmt::format("{}: {}", cb.name, *reason);
    }
    if (!log.values.empty()) send(log.values);
  }
  void send(const std::map<std::string, double>& values) {
    for (const auto& l : spec.loggers) l->log(spec.name, s.time, values);
  }
};

/// What one step produced.
struct StepOutput {
  double loss;
  double grad_norm;
  bool non_finite = false;  // the loss or a gradient was not finite: no update was applied
  std::string what{};       // which one, for the message
  bool overflow = false;    // loss scaling: the gradients overflowed, no update (the scale backed off)
};

}  // namespace baton::detail
