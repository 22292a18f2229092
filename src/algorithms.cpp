// Training algorithms: pure transforms at the loop's event points (include/baton/algorithms.hpp).
#include "baton/algorithms.hpp"

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "baton/state.hpp"
#include "detail.hpp"
#include "params_reader.hpp"

namespace baton::algorithms {
namespace {

/// Class probabilities [B, C] from class indices [B] or probabilities [B, c <= C] (zero-padded).
torch::Tensor soft(const torch::Tensor& targets, std::int64_t classes, const char* who) {
  if (targets.is_floating_point() && targets.dim() == 2) {
    if (targets.size(1) >= classes) return targets;
    return torch::constant_pad_nd(targets, {0, classes - targets.size(1)}, 0);
  }
  if (targets.scalar_type() != torch::kLong || targets.dim() != 1)
    detail::raise(ErrorCode::shape_mismatch,
                  fmt::format("{}: needs int64 class labels [batch] or class probabilities [batch, classes]; got {}",
                              who, detail::shape_string(targets)));
  if (classes <= 0) detail::raise(ErrorCode::shape_mismatch, fmt::format("{}: the number of classes is unknown", who));
  return torch::one_hot(targets, classes).to(torch::kFloat);
}

void need_images(const torch::Tensor& x, const char* who) {
  if (x.dim() != 4)
    detail::raise(ErrorCode::shape_mismatch,
                  fmt::format("{}: needs image inputs [batch, channels, height, width]; got {}", who,
                              detail::shape_string(x)));
}

/// lambda ~ Beta(alpha, alpha) from the run's generator (two Gamma draws).
double beta(double alpha) {
  const auto g = at::_standard_gamma(torch::full({2}, alpha, torch::kDouble));
  const double a = g[0].item<double>(), b = g[1].item<double>();
  return a + b > 0 ? a / (a + b) : 0.5;
}

/// A before_loss hook that widens soft targets to the model's output (the data may not show
/// every class the model has).
torch::Tensor widen(const AlgorithmContext&, const torch::Tensor& output, torch::Tensor targets) {
  if (targets.is_floating_point() && targets.dim() == 2 && output.dim() == 2 && targets.size(1) < output.size(1))
    return torch::constant_pad_nd(targets, {0, output.size(1) - targets.size(1)}, 0);
  return targets;
}

/// Collects what is wrong with an algorithm's options (reported by TrainingSpec::validate).
struct Checks {
  std::vector<std::string> problems;
  void operator()(bool ok, std::string message) {
    if (!ok) problems.push_back(std::move(message));
  }
  Algorithm done(Algorithm a) const {
    a.invalid = fmt::format("{}", fmt::join(problems, "; "));
    return a;
  }
};

}  // namespace

Algorithm label_smoothing(LabelSmoothingOptions o) {
  Checks check;
  check(o.smoothing >= 0 && o.smoothing < 1, fmt::format("label_smoothing.smoothing: must be in [0, 1), got {}", o.smoothing));
  Algorithm a{.name = "label_smoothing", .identity = fmt::format("label_smoothing(smoothing={})", o.smoothing)};
  a.before_loss = [s = o.smoothing](const AlgorithmContext&, const torch::Tensor& output, torch::Tensor targets) {
    if (output.dim() != 2)
      detail::raise(ErrorCode::shape_mismatch,
                    fmt::format("label_smoothing: needs model output [batch, classes]; got {}", detail::shape_string(output)));
    const std::int64_t classes = output.size(1);
    return soft(targets, classes, "label_smoothing") * (1.0 - s) + s / static_cast<double>(classes);
  };
  return check.done(std::move(a));
}

Algorithm mixup(MixUpOptions o) {
  Checks check;
  check(o.alpha > 0, fmt::format("mixup.alpha: must be > 0, got {}", o.alpha));
  Algorithm a{.name = "mixup", .identity = fmt::format("mixup(alpha={})", o.alpha)};
  a.after_data = [alpha = o.alpha](const AlgorithmContext& ctx, Batch b) {
    const double lam = beta(alpha);
    const auto perm = torch::randperm(b.inputs.size(0), torch::kLong);
    const auto y = soft(b.targets, ctx.num_classes, "mixup");
    b.inputs = b.inputs * lam + b.inputs.index_select(0, perm) * (1.0 - lam);
    b.targets = y * lam + y.index_select(0, perm) * (1.0 - lam);
    return b;
  };
  a.before_loss = widen;
  return check.done(std::move(a));
}

Algorithm cutmix(CutMixOptions o) {
  Checks check;
  check(o.alpha > 0, fmt::format("cutmix.alpha: must be > 0, got {}", o.alpha));
  Algorithm a{.name = "cutmix", .identity = fmt::format("cutmix(alpha={})", o.alpha)};
  a.after_data = [alpha = o.alpha](const AlgorithmContext& ctx, Batch b) {
    need_images(b.inputs, "cutmix");
    const std::int64_t h = b.inputs.size(2), w = b.inputs.size(3);
    const double lam = beta(alpha);
    const auto perm = torch::randperm(b.inputs.size(0), torch::kLong);
    const auto centre = torch::rand({2}, torch::kDouble);
    const double ratio = std::sqrt(1.0 - lam);
    const auto cut_h = static_cast<std::int64_t>(std::llround(static_cast<double>(h) * ratio));
    const auto cut_w = static_cast<std::int64_t>(std::llround(static_cast<double>(w) * ratio));
    const auto cy = static_cast<std::int64_t>(centre[0].item<double>() * static_cast<double>(h));
    const auto cx = static_cast<std::int64_t>(centre[1].item<double>() * static_cast<double>(w));
    const std::int64_t y1 = std::clamp<std::int64_t>(cy - cut_h / 2, 0, h), y2 = std::clamp<std::int64_t>(cy + cut_h - cut_h / 2, 0, h);
    const std::int64_t x1 = std::clamp<std::int64_t>(cx - cut_w / 2, 0, w), x2 = std::clamp<std::int64_t>(cx + cut_w - cut_w / 2, 0, w);
    const auto y = soft(b.targets, ctx.num_classes, "cutmix");
    auto x = b.inputs.clone();
    if (y2 > y1 && x2 > x1) {
      using torch::indexing::Slice;
      x.index_put_({Slice(), Slice(), Slice(y1, y2), Slice(x1, x2)},
                   b.inputs.index_select(0, perm).index({Slice(), Slice(), Slice(y1, y2), Slice(x1, x2)}));
    }
    const double kept = 1.0 - static_cast<double>((y2 - y1) * (x2 - x1)) / static_cast<double>(h * w);
    b.inputs = std::move(x);
    b.targets = y * kept + y.index_select(0, perm) * (1.0 - kept);
    return b;
  };
  a.before_loss = widen;
  return check.done(std::move(a));
}

Algorithm cutout(CutOutOptions o) {
  Checks check;
  check(o.size > 0, fmt::format("cutout.size: must be > 0, got {}", o.size));
  Algorithm a{.name = "cutout", .identity = fmt::format("cutout(size={})", o.size)};
  a.after_data = [size = o.size](const AlgorithmContext&, Batch b) {
    need_images(b.inputs, "cutout");
    const std::int64_t n = b.inputs.size(0), h = b.inputs.size(2), w = b.inputs.size(3);
    const auto cy = torch::randint(h, {n, 1, 1}, torch::kLong), cx = torch::randint(w, {n, 1, 1}, torch::kLong);
    const auto rows = torch::arange(h, torch::kLong).view({1, h, 1}), cols = torch::arange(w, torch::kLong).view({1, 1, w});
    const std::int64_t lo = size / 2, hi = size - size / 2;  // [c - lo, c + hi)
    const auto hole = (rows >= cy - lo) & (rows < cy + hi) & (cols >= cx - lo) & (cols < cx + hi);  // [n, h, w]
    b.inputs = b.inputs.masked_fill(hole.unsqueeze(1), 0);
    return b;
  };
  return check.done(std::move(a));
}

Algorithm random_crop_flip(RandomCropFlipOptions o) {
  Checks check;
  check(o.padding >= 0, fmt::format("random_crop_flip.padding: must be >= 0, got {}", o.padding));
  check(o.flip >= 0 && o.flip <= 1, fmt::format("random_crop_flip.flip: must be in [0, 1], got {}", o.flip));
  Algorithm a{.name = "random_crop_flip",
              .identity = fmt::format("random_crop_flip(padding={}, flip={})", o.padding, o.flip)};
  a.after_data = [o](const AlgorithmContext&, Batch b) {
    need_images(b.inputs, "random_crop_flip");
    const std::int64_t n = b.inputs.size(0), h = b.inputs.size(2), w = b.inputs.size(3), p = o.padding;
    auto x = b.inputs;
    if (p > 0) {
      const auto padded = torch::constant_pad_nd(x, {p, p, p, p}, 0);
      const auto offsets = torch::randint(2 * p + 1, {n, 2}, torch::kLong);
      const auto off = offsets.accessor<std::int64_t, 2>();
      std::vector<torch::Tensor> crops;
      crops.reserve(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) crops.push_back(padded[i].narrow(1, off[i][0], h).narrow(2, off[i][1], w));
      x = torch::stack(crops);
    }
    if (o.flip > 0) {
      const auto flip = (torch::rand({n}, torch::kDouble) < o.flip).view({n, 1, 1, 1});
      x = torch::where(flip, x.flip({3}), x);
    }
    b.inputs = x.contiguous();
    return b;
  };
  return check.done(std::move(a));
}

Algorithm seq_length_warmup(SeqLengthWarmupOptions o) {
  Checks check;
  check(o.min_length >= 1, fmt::format("seq_length_warmup.min_length: must be >= 1, got {}", o.min_length));
  check(o.duration > 0 && o.duration <= 1, fmt::format("seq_length_warmup.duration: must be in (0, 1], got {}", o.duration));
  check(o.step >= 1, fmt::format("seq_length_warmup.step: must be >= 1, got {}", o.step));
  Algorithm a{.name = "seq_length_warmup",
              .identity = fmt::format("seq_length_warmup(min_length={}, duration={}, step={})", o.min_length, o.duration, o.step)};
  a.after_data = [o](const AlgorithmContext& ctx, Batch b) {
    if (b.inputs.dim() != 2)
      detail::raise(ErrorCode::shape_mismatch, fmt::format("seq_length_warmup needs token inputs [batch, positions], got {}",
                                                   detail::shape_string(b.inputs)));
    const std::int64_t T = b.inputs.size(1);
    const double ramp = std::min(1.0, ctx.stage_progress / o.duration);
    const auto grown = static_cast<std::int64_t>(static_cast<double>(o.min_length) + static_cast<double>(T - o.min_length) * ramp);
    const std::int64_t length = std::clamp<std::int64_t>(grown / o.step * o.step, std::min(o.min_length, T), T);
    if (length == T) return b;
    const bool sequence_targets = b.targets.dim() == 2 && b.targets.size(1) == T;
    b.inputs = b.inputs.narrow(1, 0, length).contiguous();
    if (sequence_targets) b.targets = b.targets.narrow(1, 0, length).contiguous();
    return b;
  };
  return check.done(std::move(a));
}

Algorithm progressive_resizing(ProgressiveResizingOptions o) {
  Checks check;
  check(o.initial_scale > 0 && o.initial_scale <= 1,
        fmt::format("progressive_resizing.initial_scale: must be in (0, 1], got {}", o.initial_scale));
  check(o.finetune_fraction >= 0 && o.finetune_fraction < 1,
        fmt::format("progressive_resizing.finetune_fraction: must be in [0, 1), got {}", o.finetune_fraction));
  check(o.size_increment >= 1, fmt::format("progressive_resizing.size_increment: must be >= 1, got {}", o.size_increment));
  Algorithm a{.name = "progressive_resizing",
              .identity = fmt::format("progressive_resizing(initial_scale={}, finetune_fraction={}, size_increment={})",
                                      o.initial_scale, o.finetune_fraction, o.size_increment)};
  a.after_data = [o](const AlgorithmContext& ctx, Batch b) {
    need_images(b.inputs, "progressive_resizing");
    const double ramp = std::min(1.0, ctx.stage_progress / (1.0 - o.finetune_fraction));
    const double scale = o.initial_scale + (1.0 - o.initial_scale) * ramp;
    auto side = [&](std::int64_t full) {
      const auto inc = o.size_increment;
      const auto s = static_cast<std::int64_t>(std::llround(static_cast<double>(full) * scale / static_cast<double>(inc))) * inc;
      return std::clamp<std::int64_t>(s, std::min(inc, full), full);
    };
    const std::int64_t h = side(b.inputs.size(2)), w = side(b.inputs.size(3));
    if (h == b.inputs.size(2) && w == b.inputs.size(3)) return b;
    namespace F = torch::nn::functional;
    b.inputs = F::interpolate(b.inputs, F::InterpolateFuncOptions()
                                            .size(std::vector<std::int64_t>{h, w})
                                            .mode(torch::kBilinear)
                                            .align_corners(false));
    return b;
  };
  return check.done(std::move(a));
}

Algorithm ema(EmaOptions o) {
  Checks check;
  check(o.decay >= 0 && o.decay < 1, fmt::format("ema.decay: must be in [0, 1), got {}", o.decay));
  Algorithm a{.name = "ema", .identity = fmt::format("ema(decay={})", o.decay)};
  a.batch_end = [d = o.decay](const AlgorithmContext&, const TrainState& s, Algorithm::Tensors& m) {
    torch::NoGradGuard no_grad;
    for (const auto& [name, p] : s.named_parameters()) {
      auto& e = m[name];
      if (!e.defined()) e = p.detach().clone();
      else e.mul_(d).add_(p.detach(), 1.0 - d);
    }
    for (const auto& [name, b] : s.named_buffers()) m[name] = b.detach().clone();
  };
  return check.done(std::move(a));
}

Algorithm swa(SwaOptions o) {
  Checks check;
  check(o.start >= 0 && o.start < 1, fmt::format("swa.start: must be in [0, 1), got {}", o.start));
  check(o.every >= 1, fmt::format("swa.every: must be >= 1, got {}", o.every));
  Algorithm a{.name = "swa", .identity = fmt::format("swa(start={}, every={}, apply_at_end={})", o.start, o.every, o.apply_at_end)};
  a.batch_end = [o](const AlgorithmContext& ctx, const TrainState& s, Algorithm::Tensors& m) {
    if (ctx.stage_progress < o.start) return;
    auto& count = m["#count"];
    if (!count.defined()) count = torch::zeros({}, torch::kLong);
    auto& seen = m["#seen"];  // steps since averaging began, for `every`
    if (!seen.defined()) seen = torch::zeros({}, torch::kLong);
    const std::int64_t k = seen.item<std::int64_t>();
    seen.fill_(k + 1);
    if (k % o.every != 0) return;
    torch::NoGradGuard no_grad;
    const double n = static_cast<double>(count.item<std::int64_t>());
    for (const auto& [name, p] : s.named_parameters()) {
      auto& avg = m[name];
      if (!avg.defined()) avg = p.detach().clone();
      else avg.add_(p.detach().sub(avg), 1.0 / (n + 1.0));  // running mean
    }
    for (const auto& [name, b] : s.named_buffers()) m[name] = b.detach().clone();
    count.fill_(static_cast<std::int64_t>(n) + 1);
  };
  if (o.apply_at_end)
    a.stage_end = [](const AlgorithmContext&, TrainState& s, Algorithm::Tensors& m) {
      if (m.find("#count") == m.end()) return;  // the stage ended before averaging began
      torch::NoGradGuard no_grad;
      for (const auto& [name, p] : s.named_parameters())
        if (auto it = m.find(name); it != m.end()) p.copy_(it->second);
    };
  return check.done(std::move(a));
}

Algorithm layer_freezing(std::vector<FreezeRule> rules) {
  Checks check;
  check(!rules.empty(), "layer_freezing: needs at least one rule (pattern and when)");
  for (const auto& r : rules) {
    check(!r.pattern.empty(), "layer_freezing: a rule has an empty pattern");
    check(r.at >= 0 && r.at <= 1, fmt::format("layer_freezing: \"{}\" at {}: must be a fraction in [0, 1]", r.pattern, r.at));
  }
  std::vector<std::string> described;
  for (const auto& r : rules) described.push_back(fmt::format("{} at {}", r.pattern, r.at));
  Algorithm a{.name = "layer_freezing", .identity = fmt::format("layer_freezing({})", fmt::join(described, ", "))};
  a.after_backward = [rules = std::move(rules)](const AlgorithmContext& ctx,
                                                 const std::vector<std::pair<std::string, torch::Tensor>>& params) {
    for (const auto& r : rules) {
      if (ctx.stage_progress < r.at) continue;
      for (const auto& [name, p] : params)
        if (detail::matches(r.pattern, name)) const_cast<torch::Tensor&>(p).mutable_grad().reset();
    }
  };
  return check.done(std::move(a));
}

Algorithm sam(SamOptions o) {
  Checks check;
  check(std::isfinite(o.rho) && o.rho > 0, fmt::format("sam.rho: must be a positive number, got {}", o.rho));
  Algorithm a{.name = "sam", .identity = fmt::format("sam(rho={}, adaptive={})", o.rho, o.adaptive)};
  a.gradient = [o](const AlgorithmContext&, const std::vector<torch::Tensor>& params, const GradientFn& gradient) {
    const GradientResult first = gradient();
    if (!first.usable) return first;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> saved;  // (parameter, its weights before the step up)
    {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> scaled;
      for (const auto& p : params)
        if (p.grad().defined()) scaled.push_back(o.adaptive ? p.abs() * p.grad() : p.grad());
      if (scaled.empty()) return first;
      const double scale = o.rho / (detail::global_norm(scaled) + 1e-12);
      for (const auto& p : params) {
        if (!p.grad().defined()) continue;
        saved.emplace_back(p, p.clone());
        const_cast<torch::Tensor&>(p).add_(o.adaptive ? p * p * p.grad() * scale : p.grad() * scale);
      }
    }
    const GradientResult second = gradient();
    torch::NoGradGuard no_grad;
    for (auto& [p, w] : saved) p.copy_(w);
    return GradientResult{first.loss, second.usable};
  };
  return check.done(std::move(a));
}

const std::vector<std::string>& default_order() {
  static const std::vector<std::string> order = {"random_crop_flip", "progressive_resizing", "seq_length_warmup", "cutout", "mixup", "cutmix",
                                                 "label_smoothing", "layer_freezing", "sam", "ema", "swa"};
  return order;
}

namespace {
using Reader = detail::ParamReader;
/// A whole number read from `r` (its key is an error otherwise).
std::int64_t whole(Reader& r, const std::string& name, const std::string& key, std::int64_t fallback) {
  const double v = r.number(key, static_cast<double>(fallback));
  if (v != std::floor(v)) r.problem(fmt::format("algorithms.{}.{}: expected a whole number, got {}", name, key, v));
  return static_cast<std::int64_t>(v);
}

/// layer_freezing = { "conv1.*" = 0.3, "conv2.*" = 0.6 }: pattern = fraction of the stage.
Algorithm freezing_from(Reader& r, const Params& params) {
  std::vector<FreezeRule> rules;
  for (const auto& [pattern, value] : params) {
    if (const auto* v = std::get_if<double>(&value)) rules.push_back({pattern, *v});
    else r.problem(fmt::format("algorithms.layer_freezing.{}: expected the fraction of the stage after which "
                               "\"{}\" freezes (a number in [0, 1])", pattern, pattern));
    r.seen(pattern);
  }
  return layer_freezing(std::move(rules));
}

/// Each built-in's options from its TOML keys (docs/config.md), by name.
using Maker = Algorithm (*)(Reader&, const Params&);
const std::map<std::string, Maker>& makers() {
  static const std::map<std::string, Maker> table = {
      {"label_smoothing", [](Reader& r, const Params&) { return label_smoothing({.smoothing = r.number("smoothing", 0.1)}); }},
      {"mixup", [](Reader& r, const Params&) { return mixup({.alpha = r.number("alpha", 0.2)}); }},
      {"cutmix", [](Reader& r, const Params&) { return cutmix({.alpha = r.number("alpha", 1.0)}); }},
      {"cutout", [](Reader& r, const Params&) { return cutout({.size = whole(r, "cutout", "size", 8)}); }},
      {"random_crop_flip",
       [](Reader& r, const Params&) {
         return random_crop_flip({.padding = whole(r, "random_crop_flip", "padding", 4), .flip = r.number("flip", 0.5)});
       }},
      {"progressive_resizing",
       [](Reader& r, const Params&) {
         return progressive_resizing({.initial_scale = r.number("initial_scale", 0.5),
                                      .finetune_fraction = r.number("finetune_fraction", 0.2),
                                      .size_increment = whole(r, "progressive_resizing", "size_increment", 4)});
       }},
      {"seq_length_warmup",
       [](Reader& r, const Params&) {
         return seq_length_warmup({.min_length = whole(r, "seq_length_warmup", "min_length", 8),
                                   .duration = r.number("duration", 0.3), .step = whole(r, "seq_length_warmup", "step", 8)});
       }},
      {"ema", [](Reader& r, const Params&) { return ema({.decay = r.number("decay", 0.999)}); }},
      {"swa",
       [](Reader& r, const Params&) {
         return swa({.start = r.number("start", 0.75), .every = whole(r, "swa", "every", 1),
                     .apply_at_end = r.flag("apply_at_end", true)});
       }},
      {"layer_freezing", freezing_from},
      {"sam", [](Reader& r, const Params&) { return sam({.rho = r.number("rho", 0.05), .adaptive = r.flag("adaptive", false)}); }},
  };
  return table;
}
}  // namespace

Expected<Algorithm> from_name(const std::string& name, const Params& params) {
  return detail::guard([&]() -> Expected<Algorithm> {
    const auto maker = makers().find(name);
    if (maker == makers().end())
      return fail(ErrorCode::invalid_argument,
                  fmt::format("algorithms: unknown algorithm \"{}\"{}; known: {}", name,
                              detail::did_you_mean(name, default_order()), fmt::join(default_order(), ", ")));
    Reader r(params, fmt::format("algorithms.{}", name));
    Algorithm out = maker->second(r, params);
    if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
    if (!out.invalid.empty()) return fail(ErrorCode::invalid_argument, out.invalid);
    return out;
  });
}

}  // namespace baton::algorithms
