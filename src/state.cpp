// TrainState as a value: deep copies, init_state, built-in models.
#include <algorithm>
#include <bit>
#include <cmath>
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "baton/model.hpp"
#include "baton/state.hpp"
#include "detail.hpp"
#include "horizon.hpp"

namespace baton {
namespace detail {
void to_device(TrainState& s, const c10::Device& device) {
  s.model.module->to(device);
  // What algorithms keep beside the weights (EMA's and SWA's averages, keep_best's copy) is
  // updated with the parameters or copied into them: it goes along. A checkpoint holds it on the
  // CPU, so a resumed state brings it from there.
  for (auto& [name, tensors] : s.algorithm_state)
    for (auto& [key, t] : tensors)
      if (t.defined() && t.device() != device) t = t.to(device);
}


torch::Tensor seeded_rng_state(std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

namespace {
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ULL);
  return splitmix64(x);
}

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

Named collect(const torch::OrderedDict<std::string, torch::Tensor>& d) {
  Named out;
  out.reserve(d.size());
  for (const auto& item : d) out.emplace_back(item.key(), item.value());
  return out;
}

/// Copies every tensor of `src` into the matching one of `dst` as an independent clone.
void copy_tensors(const Named& src, const Named& dst, std::string_view what) {
  if (src.size() != dst.size())
    raise(ErrorCode::invalid_argument,
          fmt::format("the model factory built {} {} but the state has {}: a factory must build the "
                      "same architecture every time",
                      dst.size(), what, src.size()));
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i].first != dst[i].first || src[i].second.sizes() != dst[i].second.sizes())
      raise(ErrorCode::invalid_argument,
            fmt::format("the model factory built {} \"{}\" {} where the state has \"{}\" {}: a factory "
                        "must build the same architecture every time",
                        what, dst[i].first, shape_string(dst[i].second), src[i].first,
                        shape_string(src[i].second)));
    if (!src[i].second.defined()) continue;
    dst[i].second.set_data(src[i].second.detach().clone());
  }
}
}  // namespace
}  // namespace detail

TrainState::TrainState(const TrainState& o)
    : factory(o.factory),
      optimizer(o.optimizer),
      time(o.time),
      rng(o.rng.defined() ? o.rng.clone() : o.rng),
      seed(o.seed),
      max_duration(o.max_duration),
      history(o.history),
      stage(o.stage),
      stage_start(o.stage_start),
      algorithm_state(o.algorithm_state),
      callback_state(o.callback_state),
      loss_scale(o.loss_scale),
      order_cache(o.order_cache) {
  for (auto& [name, ps] : optimizer.params)
    for (auto& t : ps.slots)
      if (t.defined()) t = t.clone();
  for (auto& [algorithm, tensors] : algorithm_state)
    for (auto& [name, t] : tensors)
      if (t.defined()) t = t.clone();
  if (o.model.module) {
    // The factory may draw from the global generator to initialize: keep the caller's intact.
    detail::GlobalRngScope scope(detail::seeded_rng_state(0));
    model = factory();
    detail::copy_tensors(o.named_parameters(), named_parameters(), "parameters");
    detail::copy_tensors(o.named_buffers(), named_buffers(), "buffers");
    model.module->train(o.model.module->is_training());
  }
}

TrainState& TrainState::operator=(const TrainState& o) {
  if (this != &o) *this = TrainState(o);
  return *this;
}

bool TrainState::finished() const { return detail::reached_max(time, max_duration); }

std::vector<std::pair<std::string, torch::Tensor>> TrainState::named_parameters() const {
  if (!model.module) return {};
  return detail::collect(model.module->named_parameters());
}

std::vector<std::pair<std::string, torch::Tensor>> TrainState::named_buffers() const {
  if (!model.module) return {};
  return detail::collect(model.module->named_buffers());
}

Expected<TrainState> init_state(const ModelFactory& factory, const InitOptions& options) {
  if (!factory) return fail(ErrorCode::invalid_argument, "init_state: no model factory given");
  if (options.max_duration.unit == TimeUnit::duration)
    return fail(ErrorCode::invalid_argument,
                fmt::format("init_state: max_duration \"{}\" is a fraction of itself; give it in ep, ba or sp",
                            options.max_duration.to_string()));
  if (auto ok = options.max_duration.check(); !ok)
    return fail(ErrorCode::invalid_argument, fmt::format("init_state: max_duration: {}", ok.error().message));
  if (options.max_duration.unit == TimeUnit::epoch && options.max_duration.value != std::floor(options.max_duration.value))
    return fail(ErrorCode::invalid_argument,
                fmt::format("init_state: max_duration \"{}\": the run's max duration counts whole epochs (its epoch "
                            "counter); end a run inside an epoch with ba or sp, or give a stage that duration",
                            options.max_duration.to_string()));
  if (options.max_duration.value <= 0)
    return fail(ErrorCode::invalid_argument,
                fmt::format("init_state: max_duration must be more than zero, got \"{}\"",
                            options.max_duration.to_string()));
  return detail::guard([&]() -> Expected<TrainState> {
    TrainState s;
    s.factory = factory;
    {
      detail::GlobalRngScope scope(detail::seeded_rng_state(detail::derive_seed(options.seed, 1)));
      s.model = factory();
    }
    if (!s.model.module || !s.model.forward)
      return fail(ErrorCode::invalid_argument, "init_state: the model factory returned no module or no forward");
    // Copies of the state call the factory again: a factory that builds another architecture on
    // another call is refused here, as an Error, rather than making a later copy throw.
    {
      detail::GlobalRngScope scope(detail::seeded_rng_state(0));
      const Model again = factory();
      if (!again.module)
        return fail(ErrorCode::invalid_argument, "init_state: the model factory returned no module on its second call");
      TrainState probe;
      probe.model = again;
      detail::copy_tensors(s.named_parameters(), probe.named_parameters(), "parameters");  // raises on a mismatch
      detail::copy_tensors(s.named_buffers(), probe.named_buffers(), "buffers");
    }
    s.model.module->train(true);
    s.rng = detail::seeded_rng_state(detail::derive_seed(options.seed, 2));
    s.seed = options.seed;
    s.max_duration = options.max_duration;
    return s;
  });
}

namespace {
/// Doubles as a resume must reproduce them: the same bits, except that any NaN equals any NaN
/// (a checkpoint stores NaN as "nan", not its sign and payload).
bool same_double(double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y);
}

bool same_record(const StageRecord& x, const StageRecord& y) {
  const auto transfer = [](const std::optional<TransferReport>& t) {
    return t ? std::optional(std::tie(t->copied, t->skipped, t->initialized)) : std::nullopt;
  };
  return x.name == y.name && x.start == y.start && x.end == y.end && same_double(x.last_loss, y.last_loss) &&
         same_double(x.last_lr, y.last_lr) && same_double(x.last_grad_norm, y.last_grad_norm) &&
         transfer(x.transfer) == transfer(y.transfer) && x.interrupted == y.interrupted &&
         x.stop_reason == y.stop_reason && x.skipped_batches == y.skipped_batches && x.restored_best == y.restored_best;
}

/// Which callback's memory differs first (by name), or nothing.
std::optional<std::string> callback_state_difference(const std::map<std::string, std::map<std::string, double>>& x,
                                                     const std::map<std::string, std::map<std::string, double>>& y) {
  for (auto i = x.begin(), j = y.begin(); i != x.end() || j != y.end();) {
    if (j == y.end() || (i != x.end() && i->first < j->first))
      return fmt::format("callback state \"{}\": only in the first state", i->first);
    if (i == x.end() || j->first < i->first) return fmt::format("callback state \"{}\": only in the second state", j->first);
    const bool same = i->second.size() == j->second.size() &&
                      std::equal(i->second.begin(), i->second.end(), j->second.begin(), [](const auto& k, const auto& l) {
                        return k.first == l.first && same_double(k.second, l.second);
                      });
    if (!same) return fmt::format("callback state \"{}\": other values", i->first);
    ++i, ++j;
  }
  return std::nullopt;
}
}  // namespace

namespace {
/// How two tensors differ, or nothing when they hold the same bits.
std::optional<std::string> tensor_difference(const torch::Tensor& x, const torch::Tensor& y) {
  if (x.defined() != y.defined()) return std::string(x.defined() ? "only in the first state" : "only in the second state");
  if (!x.defined()) return std::nullopt;
  // Values, whatever the device: a GPU state against the one its checkpoint loads on the CPU.
  if (x.device() != y.device()) return tensor_difference(x.cpu(), y.cpu());
  if (torch::equal(x, y)) return std::nullopt;
  if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type())
    return fmt::format("{} {} against {} {}", c10::toString(x.scalar_type()), detail::shape_string(x),
                       c10::toString(y.scalar_type()), detail::shape_string(y));
  if (!x.is_floating_point()) return std::string("other values");
  const auto diff = (x.to(torch::kDouble) - y.to(torch::kDouble)).abs();
  return fmt::format("max |difference| {:.3g} ({} of {} elements differ)", diff.max().item<double>(),
                     diff.ne(0).sum().item<std::int64_t>(), x.numel());
}

std::optional<std::string> named_difference(const char* what, const std::vector<std::pair<std::string, torch::Tensor>>& x,
                                            const std::vector<std::pair<std::string, torch::Tensor>>& y) {
  if (x.size() != y.size()) return fmt::format("{} {} against {} {}", x.size(), what, y.size(), what);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i].first != y[i].first) return fmt::format("{} \"{}\" against \"{}\"", what, x[i].first, y[i].first);
    if (auto d = tensor_difference(x[i].second, y[i].second)) return fmt::format("{} \"{}\": {}", what, x[i].first, *d);
  }
  return std::nullopt;
}
}  // namespace

std::optional<std::string> first_difference(const TrainState& a, const TrainState& b) {
  if (auto d = named_difference("parameter", a.named_parameters(), b.named_parameters())) return d;
  if (auto d = named_difference("buffer", a.named_buffers(), b.named_buffers())) return d;
  if (!(a.time == b.time)) return fmt::format("time: {} against {}", a.time.to_string(), b.time.to_string());
  if (a.optimizer.kind != b.optimizer.kind) return fmt::format("optimizer kind: \"{}\" against \"{}\"", a.optimizer.kind, b.optimizer.kind);
  if (a.optimizer.params.size() != b.optimizer.params.size())
    return fmt::format("optimizer state: {} parameters against {}", a.optimizer.params.size(), b.optimizer.params.size());
  for (const auto& [name, pa] : a.optimizer.params) {
    auto it = b.optimizer.params.find(name);
    if (it == b.optimizer.params.end()) return fmt::format("optimizer state of \"{}\": only in the first state", name);
    if (it->second.step != pa.step) return fmt::format("optimizer steps of \"{}\": {} against {}", name, pa.step, it->second.step);
    if (it->second.slots.size() != pa.slots.size()) return fmt::format("optimizer slots of \"{}\": {} against {}", name, pa.slots.size(), it->second.slots.size());
    for (std::size_t i = 0; i < pa.slots.size(); ++i)
      if (auto d = tensor_difference(pa.slots[i], it->second.slots[i])) return fmt::format("optimizer slot {} of \"{}\": {}", i, name, *d);
  }
  if (auto d = tensor_difference(a.rng, b.rng)) return "the RNG state: " + *d;
  if (a.stage != b.stage) return fmt::format("stage: \"{}\" against \"{}\"", a.stage, b.stage);
  if (!(a.stage_start == b.stage_start)) return fmt::format("stage start: {} against {}", a.stage_start.to_string(), b.stage_start.to_string());
  if (a.seed != b.seed) return fmt::format("seed: {} against {}", a.seed, b.seed);
  if (!(a.max_duration == b.max_duration)) return fmt::format("max duration: {} against {}", a.max_duration.to_string(), b.max_duration.to_string());
  if (a.history.size() != b.history.size()) return fmt::format("history: {} records against {}", a.history.size(), b.history.size());
  for (std::size_t i = 0; i < a.history.size(); ++i)
    if (!same_record(a.history[i], b.history[i])) return fmt::format("history record {} (stage \"{}\")", i, a.history[i].name);
  if (a.algorithm_state.size() != b.algorithm_state.size())
    return fmt::format("algorithm state: {} algorithms against {}", a.algorithm_state.size(), b.algorithm_state.size());
  for (const auto& [algorithm, ta] : a.algorithm_state) {
    auto it = b.algorithm_state.find(algorithm);
    if (it == b.algorithm_state.end() || it->second.size() != ta.size())
      return fmt::format("algorithm state of \"{}\": other tensors", algorithm);
    for (const auto& [name, x] : ta) {
      auto jt = it->second.find(name);
      if (jt == it->second.end()) return fmt::format("algorithm state \"{}\" / \"{}\": only in the first state", algorithm, name);
      if (auto d = tensor_difference(x, jt->second)) return fmt::format("algorithm state \"{}\" / \"{}\": {}", algorithm, name, *d);
    }
  }
  if (auto d = callback_state_difference(a.callback_state, b.callback_state)) return d;
  if (a.loss_scale != b.loss_scale) {
    auto say = [](const std::optional<LossScaleState>& l) {
      return l ? fmt::format("scale {} after {} good steps, {} skipped", l->scale, l->growth_tracker, l->skipped)
               : std::string("none");
    };
    return fmt::format("loss scale: {} against {}", say(a.loss_scale), say(b.loss_scale));
  }
  return std::nullopt;
}

bool bitwise_equal(const TrainState& a, const TrainState& b) { return !first_difference(a, b).has_value(); }

std::string TransferReport::to_string() const {
  return fmt::format("copied {} tensors, initialized {} ({}), skipped {} ({})", copied.size(), initialized.size(),
                     fmt::join(initialized, ", "), skipped.size(), fmt::join(skipped, ", "));
}

namespace models {
ModelFactory named(std::string name, Params params, ModelFactory factory) {
  return Named{std::move(name), std::move(params), std::move(factory)};
}

ModelFactory mlp(std::vector<std::int64_t> widths) {
  // The keys Registry::builtin's "mlp" reads (src/hparams/registry.cpp).
  const Params params = {{"widths", std::vector<double>(widths.begin(), widths.end())}};
  return named("mlp", params, model_factory([widths] {
    torch::nn::Sequential seq;
    seq->push_back(torch::nn::Flatten());
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      seq->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
      if (i + 2 < widths.size()) seq->push_back(torch::nn::ReLU());
    }
    return seq;
  }));
}

ModelFactory small_cnn(SmallCnnOptions o) {
  // The keys Registry::builtin's "small_cnn" reads (src/hparams/registry.cpp).
  auto whole = [](std::int64_t v) { return static_cast<double>(v); };
  const Params params = {{"channels1", whole(o.channels1)}, {"channels2", whole(o.channels2)}, {"hidden", whole(o.hidden)},
                         {"classes", whole(o.classes)},     {"in_channels", whole(o.in_channels)},
                         {"image_size", whole(o.image_size)}, {"dropout", o.dropout}};
  return named("small_cnn", params, model_factory([o] {
    namespace nn = torch::nn;
    const auto side = o.image_size / 4;
    nn::Sequential net(
        nn::Conv2d(nn::Conv2dOptions(o.in_channels, o.channels1, 3).padding(1).bias(false)),
        nn::BatchNorm2d(o.channels1), nn::ReLU(), nn::MaxPool2d(2),
        nn::Conv2d(nn::Conv2dOptions(o.channels1, o.channels2, 3).padding(1).bias(false)),
        nn::BatchNorm2d(o.channels2), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten());
    if (o.dropout > 0) net->push_back(nn::Dropout(o.dropout));
    net->push_back(nn::Linear(o.channels2 * side * side, o.hidden));
    net->push_back(nn::ReLU());
    if (o.dropout > 0) net->push_back(nn::Dropout(o.dropout));
    net->push_back(nn::Linear(o.hidden, o.classes));
    return net;
  }));
}
}  // namespace models

}  // namespace baton
