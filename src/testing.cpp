// baton::testing: checks for users' unit tests of their training code, built on the public API
// (fit, train_step, checkpoints, first_difference) plus the RNG scope fit uses.
#include "baton/testing.hpp"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <ostream>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "baton/checkpoint.hpp"
#include "baton/fit.hpp"
#include "detail.hpp"

namespace baton::testing {
namespace fs = std::filesystem;

std::ostream& operator<<(std::ostream& out, const Check& check) {
  return out << (check.passed ? "passed: " : "FAILED: ") << check.message;
}

namespace {
Check pass(std::string message) { return {true, std::move(message)}; }
Check failed(std::string message) { return {false, std::move(message)}; }

/// Runs a check, turning an exception (a copy of a state, a user's module) into a failed check.
template <class F>
Check guarded(const char* name, F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return failed(fmt::format("{}: LibTorch error: {}", name, detail::torch_message(e)));
  } catch (const std::exception& e) {
    return failed(fmt::format("{}: {}", name, e.what()));
  }
}

std::string error_text(const Error& e) { return e.to_string(); }

/// Fits `spec` from `s`, in budgets `cuts` first (none: one fit).
Expected<TrainState> fit_in_pieces(const TrainingSpec& spec, TrainState s, const std::vector<Time>& cuts) {
  for (const Time& cut : cuts) {
    auto next = fit(spec, std::move(s), cut);
    if (!next) return next;
    s = std::move(*next);
  }
  return fit(spec, std::move(s));
}

/// The output and loss of `batch` through a copy of the state's model, in training or evaluation
/// mode, drawing from the state's RNG as fit would (the graph is kept for a backward pass).
struct Forward {
  TrainState copy;
  torch::Tensor output, loss;
};
Forward forward(const TrainingSpec& spec, const TrainState& state, const Batch& batch, bool training) {
  Forward f{state, {}, {}};
  if (!spec.device.is_cpu()) f.copy.model.module->to(spec.device);
  f.copy.model.module->train(training);
  detail::GlobalRngScope rng(f.copy.rng);
  f.output = f.copy.model.forward(batch.inputs.to(spec.device));
  f.loss = spec.loss.fn(f.output, batch.targets.to(spec.device));
  return f;
}

bool frozen_by(const TrainingSpec& spec, const std::string& name) {
  return std::any_of(spec.freeze.begin(), spec.freeze.end(), [&](const auto& p) { return detail::matches(p, name); });
}

/// A private directory for a checkpoint file, removed with everything in it when done.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "baton-testing-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temporary directory");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};
}  // namespace

Batch first_batch(const TrainingSpec& spec, std::int64_t size) {
  const std::int64_t n = size > 0 ? size : std::max<std::int64_t>(spec.data.batch_size, 1);
  if (spec.data.train.size() == 0) return {};  // the checks then say the batch is empty
  auto b = spec.data.train.range(0, std::min(n, spec.data.train.size()));
  return b ? *b : Batch{};
}

Check overfits_one_batch(const TrainingSpec& spec, const TrainState& state, const Batch& batch, OverfitOptions o) {
  return guarded("overfits_one_batch", [&] {
    TrainState s = state;
    const std::int64_t room = s.time.batch + o.steps;
    if (s.max_duration.unit != TimeUnit::batch || s.max_duration.value < static_cast<double>(room))
      s.max_duration = Time::batches(room);
    double first = NAN, lowest = INFINITY, first_lr = NAN, last_lr = NAN;
    std::int64_t lowest_at = 0;
    for (std::int64_t step = 1; step <= o.steps; ++step) {
      auto r = train_step(spec, std::move(s), batch);
      if (!r) return failed(fmt::format("overfits_one_batch: step {} failed: {}", step, error_text(r.error())));
      if (step == 1) first = r->loss, first_lr = r->lr;
      last_lr = r->lr;
      if (r->loss < lowest) lowest = r->loss, lowest_at = step;
      s = std::move(r->state);
      if (r->loss < o.below)
        return pass(fmt::format("overfits_one_batch: the loss of one batch of {} fell from {:.4g} to {:.4g} (below {}) "
                                "in {} steps", batch.inputs.size(0), first, r->loss, o.below, step));
    }
    return failed(fmt::format(
        "overfits_one_batch: in {} steps on one batch of {} the loss went from {:.4g} to at best {:.4g} (step {}), "
        "never below {}. A model that learns can memorise one batch: check that the loss matches the outputs, that "
        "the graph is not detached and parameters get gradients (gradients_flow), that the model is not frozen, and "
        "the learning rate: the schedule gave {} (base {}{})",
        o.steps, batch.inputs.size(0), first, lowest, lowest_at, o.below,
        first_lr == last_lr ? fmt::format("{:.4g} at every step", first_lr)
                            : fmt::format("{:.4g} at step 1 and {:.4g} at step {}", first_lr, last_lr, o.steps),
        spec.optimizer.lr(), spec.schedule.name.empty() ? "" : ", schedule " + spec.schedule.name));
  });
}

Check gradients_flow(const TrainingSpec& spec, const TrainState& state, const Batch& batch) {
  return guarded("gradients_flow", [&] {
    Forward f = forward(spec, state, batch, true);
    if (!f.loss.requires_grad())
      return failed(fmt::format("gradients_flow: the loss ({}) is not connected to any parameter: the output was "
                                "detached (.detach(), NoGradGuard, a copy through data_ptr or item()), or the loss "
                                "ignores it",
                                spec.loss.name));
    f.copy.model.module->zero_grad();
    f.loss.backward();
    std::vector<std::string> none, zero, non_finite, off;
    std::size_t checked = 0;
    for (const auto& item : f.copy.model.module->named_parameters()) {
      const auto& name = item.key();
      const auto& p = item.value();
      if (frozen_by(spec, name)) continue;
      ++checked;
      if (!p.requires_grad()) off.push_back(name);
      else if (!p.grad().defined()) none.push_back(name);
      else if (!torch::isfinite(p.grad()).all().item<bool>()) non_finite.push_back(name);
      else if (p.grad().eq(0).all().item<bool>()) zero.push_back(name);
    }
    std::vector<std::string> problems;
    if (!off.empty())
      problems.push_back(fmt::format("requires_grad is off (frozen in the model, not by the spec's freeze, so the "
                                     "optimizer keeps moments for weights that never change): {}", fmt::join(off, ", ")));
    if (!none.empty())
      problems.push_back(fmt::format("no gradient (not on the loss's graph: a detached branch, a layer the forward "
                                     "skips or whose output is unused): {}", fmt::join(none, ", ")));
    if (!zero.empty())
      problems.push_back(fmt::format("a gradient of exactly zero (dead ReLUs, a multiplication by 0, a masked-out "
                                     "path): {}", fmt::join(zero, ", ")));
    if (!non_finite.empty())
      problems.push_back(fmt::format("a NaN or infinite gradient: {}", fmt::join(non_finite, ", ")));
    if (problems.empty())
      return pass(fmt::format("gradients_flow: all {} trained parameters get finite, non-zero gradients", checked));
    return failed(fmt::format("gradients_flow: of {} trained parameters, {}", checked, fmt::join(problems, "; ")));
  });
}

Check deterministic(const TrainingSpec& spec, const TrainState& state, std::optional<Time> budget) {
  return guarded("deterministic", [&] {
    auto once = [&]() -> Expected<TrainState> { return budget ? fit(spec, state, *budget) : fit(spec, state); };
    auto a = once();
    if (!a) return failed("deterministic: the first fit failed: " + error_text(a.error()));
    auto b = once();
    if (!b) return failed("deterministic: the second fit failed: " + error_text(b.error()));
    const std::string what = budget ? fmt::format("two fits of {} from the same state", budget->to_string())
                                    : std::string("two fits of the stage from the same state");
    if (auto d = first_difference(*a, *b))
      return failed(fmt::format("deterministic: {} differ: {}. Causes: randomness outside the state's RNG (a generator "
                                "or counter of the model's own, a clock), a kernel that is not deterministic, state "
                                "shared between the fits",
                                what, *d));
    return pass(fmt::format("deterministic: {} give the same bits ({} batches)", what, a->time.batch - state.time.batch));
  });
}

Check split_invariant(const TrainingSpec& spec, const TrainState& state, const std::vector<Time>& cuts) {
  return guarded("split_invariant", [&] {
    auto whole = fit(spec, state);
    if (!whole) return failed("split_invariant: the uncut fit failed: " + error_text(whole.error()));
    auto pieces = fit_in_pieces(spec, state, cuts);
    if (!pieces) return failed("split_invariant: the cut fits failed: " + error_text(pieces.error()));
    std::vector<std::string> names;
    for (const auto& c : cuts) names.push_back(c.to_string());
    if (auto d = first_difference(*whole, *pieces))
      return failed(fmt::format("split_invariant: the stage cut after [{}] differs from the stage in one fit: {}. "
                                "Something that trains keeps state outside the TrainState between fits, or restarts "
                                "at each fit (a schedule, an algorithm or callback of your own)",
                                fmt::join(names, ", "), *d));
    return pass(fmt::format("split_invariant: the stage cut after [{}] equals the stage in one fit ({} batches)",
                            fmt::join(names, ", "), whole->time.batch - state.time.batch));
  });
}

Check resume_invariant(const TrainingSpec& spec, const TrainState& state, Time at) {
  return guarded("resume_invariant", [&] {
    auto whole = fit(spec, state);
    if (!whole) return failed("resume_invariant: the uninterrupted fit failed: " + error_text(whole.error()));
    auto part = fit(spec, state, at);
    if (!part) return failed("resume_invariant: the fit up to " + at.to_string() + " failed: " + error_text(part.error()));
    TempDir dir;
    const auto file = dir.path() / "resume.baton";
    if (auto ok = save_checkpoint(*part, file); !ok)
      return failed("resume_invariant: saving the checkpoint failed: " + error_text(ok.error()));
    auto loaded = load_checkpoint(file, state.factory);
    if (!loaded) return failed("resume_invariant: loading the checkpoint failed: " + error_text(loaded.error()));
    if (auto d = first_difference(*part, *loaded))
      return failed(fmt::format("resume_invariant: the state loaded from the checkpoint differs from the one saved: {}", *d));
    auto resumed = fit(spec, std::move(*loaded));
    if (!resumed) return failed("resume_invariant: the resumed fit failed: " + error_text(resumed.error()));
    if (auto d = first_difference(*whole, *resumed))
      return failed(fmt::format("resume_invariant: stopped after {} (batch {}), saved, loaded and finished, the stage "
                                "differs from the uninterrupted one: {}. Training state lives outside the TrainState "
                                "(a model member that is neither a parameter nor a buffer, a static in a loss, an "
                                "algorithm or callback of your own), so a checkpoint cannot carry it",
                                at.to_string(), part->time.batch, *d));
    return pass(fmt::format("resume_invariant: stopped after {} (batch {}), saved, loaded and finished, the stage "
                            "equals the uninterrupted one",
                            at.to_string(), part->time.batch));
  });
}

Check no_leak(const Dataset& train, const Dataset& held_out) {
  return guarded("no_leak", [&] {
    if (train.size() == 0 || held_out.size() == 0) return pass("no_leak: one of the sets is empty");
    auto rows = [](const Dataset& d) {
      auto all = data::materialize(d);  // a lazy dataset: read once
      if (!all) detail::raise(all.error().code, all.error().message);
      return all->inputs.reshape({d.size(), -1}).contiguous().to(torch::kCPU);
    };
    const auto a = rows(train), b = rows(held_out);
    if (a.size(1) != b.size(1) || a.scalar_type() != b.scalar_type())
      return pass(fmt::format("no_leak: \"{}\" and \"{}\" have samples of other shapes or types: none can be equal",
                              train.name, held_out.name));
    const auto bytes = static_cast<std::size_t>(a.size(1)) * a.element_size();
    auto view = [&](const torch::Tensor& t, std::int64_t i) {
      return std::string_view(static_cast<const char*>(t.data_ptr()) + static_cast<std::size_t>(i) * bytes, bytes);
    };
    std::unordered_multimap<std::string_view, std::int64_t> seen;
    seen.reserve(static_cast<std::size_t>(a.size(0)));
    for (std::int64_t i = 0; i < a.size(0); ++i) seen.emplace(view(a, i), i);
    std::int64_t leaked = 0;
    std::vector<std::string> examples;
    for (std::int64_t j = 0; j < b.size(0); ++j)
      if (auto it = seen.find(view(b, j)); it != seen.end()) {
        ++leaked;
        if (examples.size() < 5) examples.push_back(fmt::format("{} = train {}", j, it->second));
      }
    if (leaked == 0)
      return pass(fmt::format("no_leak: none of the {} samples of \"{}\" is in \"{}\" ({} samples)", b.size(0),
                              held_out.name, train.name, a.size(0)));
    return failed(fmt::format("no_leak: {} of the {} samples of \"{}\" are exact copies of training samples of "
                              "\"{}\" (e.g. {}): metrics on it overstate how the model generalises",
                              leaked, b.size(0), held_out.name, train.name, fmt::join(examples, ", ")));
  });
}

Check no_leak(const TrainingSpec& spec) {
  if (!spec.evaluation || spec.evaluation->spec.sets.empty()) return pass("no_leak: the spec evaluates no set");
  std::vector<std::string> passed;
  for (const auto& [name, set] : spec.evaluation->spec.sets) {
    Check c = no_leak(spec.data.train, set);
    if (!c) return c;
    passed.push_back(name);
  }
  return pass(fmt::format("no_leak: no sample of {} is in the training data", fmt::join(passed, ", ")));
}

Check loss_at_init(const TrainingSpec& spec, const TrainState& state, const Batch& batch, LossAtInitOptions o) {
  return guarded("loss_at_init", [&] {
    auto not_classification = [&](const std::string& outputs) {
      return failed(fmt::format("loss_at_init: applies to classification (int64 targets [B], outputs [B, C]; or "
                                "tokens: targets [B, T], outputs [B, T, V]); got "
                                "{} targets {}{}",
                                c10::toString(batch.targets.scalar_type()), detail::shape_string(batch.targets), outputs));
    };
    const auto dims = batch.targets.dim();  // 1: classes; 2: a class (token) per position
    if (batch.targets.scalar_type() != torch::kLong || (dims != 1 && dims != 2)) return not_classification("");
    torch::NoGradGuard no_grad;
    Forward f = forward(spec, state, batch, false);
    if (f.output.dim() != dims + 1) return not_classification(" and outputs " + detail::shape_string(f.output));
    const auto classes = f.output.size(dims);
    const double expected = std::log(static_cast<double>(classes)), loss = f.loss.item<double>();
    const double off = std::abs(loss - expected) / expected;
    if (off <= o.tolerance)
      return pass(fmt::format("loss_at_init: {:.4g}, within {:.0f}% of ln({}) = {:.4g}", loss, o.tolerance * 100, classes, expected));
    return failed(fmt::format("loss_at_init: {:.4g}, {:.0f}% {} ln({}) = {:.4g} (tolerance {:.0f}%): {}", loss, off * 100,
                              loss > expected ? "above" : "below", classes, expected, o.tolerance * 100,
                              loss > expected ? "the untrained model is confidently wrong: logits too large at "
                                                "initialisation, a softmax or scale applied twice, or weights loaded "
                                                "from elsewhere"
                                              : "the untrained model already scores better than chance: check that the "
                                                "targets are not derivable from a trivial feature, or that the state is "
                                                "not already trained"));
  });
}

}  // namespace baton::testing
