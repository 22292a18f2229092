// The built-in metrics (include/baton/metrics.hpp). Class metrics count exactly (int64); the
// regression ones give one float64 row per sample, which evaluation adds in sample order.
#include "baton/metrics.hpp"

#include <cmath>
#include <span>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <torch/torch.h>

#include "suggest.hpp"

namespace baton::metric {
namespace {

using Values = std::map<std::string, double>;

/// Counts of (target, predicted) pairs, [C, C], rows the targets.
torch::Tensor confusion(const torch::Tensor& out, const torch::Tensor& y) {
  const auto c = out.size(1);
  const auto cells = (y * c + out.argmax(1)).to(torch::kCPU);
  return torch::bincount(cells, {}, c * c).view({c, c});
}

/// Per-class values and their mean over the classes `counted` keeps, from a confusion matrix.
Values per_class(const torch::Tensor& m, const std::function<double(double tp, double support, double predicted)>& value,
                 const std::function<bool(double support, double predicted)>& counted) {
  const auto c = m.size(0);
  const auto support = m.sum(1), predicted = m.sum(0);
  Values v;
  double total = 0;
  std::int64_t classes = 0;
  for (std::int64_t k = 0; k < c; ++k) {
    const double tp = m[k][k].item<double>(), s = support[k].item<double>(), p = predicted[k].item<double>();
    const double x = value(tp, s, p);
    v[std::to_string(k)] = x;
    if (counted(s, p)) total += x, ++classes;
  }
  v[""] = classes == 0 ? 0.0 : total / static_cast<double>(classes);
  return v;
}

double ratio(double a, double b) { return b == 0 ? 0.0 : a / b; }
bool in_targets_or_predictions(double s, double p) { return s > 0 || p > 0; }

Metric confusion_based(std::string name, std::function<Values(const torch::Tensor&)> finish, bool scalar = true) {
  return {std::move(name), MetricTargets::classes, confusion,
          [finish = std::move(finish)](const torch::Tensor& sums, std::int64_t) { return finish(sums); }, scalar};
}

/// The error of each sample's elements, [B, K] in float64.
torch::Tensor errors(const torch::Tensor& out, const torch::Tensor& y) {
  return (out.to(torch::kDouble) - y.to(torch::kDouble)).reshape({y.size(0), -1});
}

/// Per sample: the sum over its elements of `f(error)`, and the number of elements.
Metric per_element(std::string name, torch::Tensor (*f)(const torch::Tensor&), double (*finish)(double mean)) {
  return {std::move(name), MetricTargets::values,
          [f](const torch::Tensor& out, const torch::Tensor& y) {
            const auto e = errors(out, y);
            return torch::stack({f(e).sum(1), torch::full({e.size(0)}, static_cast<double>(e.size(1)), e.options())}, 1);
          },
          [finish](const torch::Tensor& sums, std::int64_t) {
            return Values{{"", finish(ratio(sums[0].item<double>(), sums[1].item<double>()))}};
          }};
}

torch::Tensor absolute(const torch::Tensor& e) { return e.abs(); }
torch::Tensor squared(const torch::Tensor& e) { return e.square(); }
double same(double x) { return x; }
double root(double x) { return std::sqrt(x); }

/// R2's statistics, per output element j of k: [count | shift_j | S_j | Q_j | R_j], where
/// shift_j is the first sample's target, S_j and Q_j the sums of (target - shift_j) and its square,
/// and R_j the sum of squared errors. One pass of plain sums of targets and their squares loses
/// the spread of targets far from zero (and leaves a constant target a rounding residue to divide
/// by); deviations from a sample of the same column keep it: SStot = Q - S^2/n is then at worst
/// n + 1 times worse conditioned than the two-pass sum (scikit-learn's), and exactly 0 for a
/// constant target.
torch::Tensor r2_rows(const torch::Tensor& out, const torch::Tensor& y) {
  const auto e = errors(out, y);
  const auto t = y.to(torch::kDouble).reshape({y.size(0), -1});
  const auto zeros = torch::zeros_like(t);
  return torch::cat({torch::ones({t.size(0), 1}, t.options()), t, zeros, zeros, e.square()}, 1);
}

/// Joins R2's statistics of later samples into earlier ones: the later sums move to the earlier
/// shift (Chan, Golub and LeVeque's update for shifted sums).
void r2_merge(std::span<double> a, std::span<const double> b) {
  const std::size_t k = (a.size() - 1) / 4;
  double *shift = &a[1], *s = &a[1 + k], *q = &a[1 + 2 * k], *res = &a[1 + 3 * k];
  const double nb = b[0], *shift_b = &b[1], *s_b = &b[1 + k], *q_b = &b[1 + 2 * k], *res_b = &b[1 + 3 * k];
  for (std::size_t j = 0; j < k; ++j) {
    const double d = shift_b[j] - shift[j];
    q[j] += q_b[j] + d * (2 * s_b[j] + nb * d);  // before s[j] changes
    s[j] += s_b[j] + nb * d;
    res[j] += res_b[j];
  }
  a[0] += nb;
}

/// R2 of each output element, averaged; as scikit-learn's r2_score: a constant target gives 1
/// when predicted exactly, else 0.
Values r2_finish(const torch::Tensor& stats, std::int64_t) {
  const auto v = stats.contiguous();
  const double* a = v.data_ptr<double>();
  const auto k = (v.numel() - 1) / 4;
  const double n = a[0];
  double total = 0;
  for (std::int64_t j = 0; j < k; ++j) {
    const double s = a[1 + k + j], q = a[1 + 2 * k + j], res = a[1 + 3 * k + j];
    const double tot = q - s * s / n;
    total += tot > 0 ? 1 - res / tot : (res == 0 ? 1.0 : 0.0);
  }
  return {{"", k == 0 ? 0.0 : total / static_cast<double>(k)}};
}

/// Per sample: the nats of its real tokens' cross-entropy and how many there are ([B, 2], float64),
/// for logits [B, T, V] and targets [B, T] (-100: padding, not counted).
torch::Tensor token_nats(const torch::Tensor& out, const torch::Tensor& y) {
  TORCH_CHECK(out.dim() == 3 && y.dim() == 2 && out.size(0) == y.size(0) && out.size(1) == y.size(1),
              "needs logits [batch, positions, vocab] and token targets [batch, positions], got ", out.sizes(), " and ",
              y.sizes());
  const auto real = y.ne(-100);
  const auto picked = torch::log_softmax(out.to(torch::kDouble), 2).gather(2, y.clamp_min(0).unsqueeze(2)).squeeze(2);
  const auto nats = -(picked * real).sum(1);
  return torch::stack({nats, real.sum(1).to(torch::kDouble)}, 1);
}
Values per_token(const torch::Tensor& sums, double (*f)(double nats_per_token)) {
  const double tokens = sums[1].item<double>();
  return {{"", tokens > 0 ? f(sums[0].item<double>() / tokens) : 0.0}};
}
}  // namespace

Metric perplexity() {
  return {"perplexity", MetricTargets::any, token_nats,
          [](const torch::Tensor& sums, std::int64_t) { return per_token(sums, [](double m) { return std::exp(m); }); }};
}

Metric bits_per_token() {
  return {"bits_per_token", MetricTargets::any, token_nats,
          [](const torch::Tensor& sums, std::int64_t) { return per_token(sums, [](double m) { return m / std::log(2.0); }); }};
}

Metric bits_per_byte(const std::vector<double>& byte_lengths) {
  auto lengths = torch::tensor(byte_lengths, torch::kDouble);
  return {"bits_per_byte", MetricTargets::any,
          [lengths](const torch::Tensor& out, const torch::Tensor& y) {
            TORCH_CHECK(y.dim() == 2 && y.scalar_type() == torch::kLong, "needs token targets [batch, positions], got ", y.sizes());
            const auto real = y.ne(-100);
            const auto ids = y.clamp_min(0);
            TORCH_CHECK(ids.numel() == 0 || ids.max().item<std::int64_t>() < lengths.size(0), "token ", ids.max().item<std::int64_t>(),
                        " is beyond the tokenizer's ", lengths.size(0), " tokens: is it the data's tokenizer?");
            const auto bytes = (lengths.index_select(0, ids.flatten()).view(ids.sizes()) * real).sum(1);
            return torch::stack({token_nats(out, y).select(1, 0), bytes}, 1);
          },
          [](const torch::Tensor& sums, std::int64_t) {
            const double bytes = sums[1].item<double>();
            return Values{{"", bytes > 0 ? sums[0].item<double>() / std::log(2.0) / bytes : 0.0}};
          }};
}

Metric token_accuracy() {
  return {"token_accuracy", MetricTargets::any,
          [](const torch::Tensor& out, const torch::Tensor& y) {
            TORCH_CHECK(out.dim() == 3 && y.dim() == 2, "needs logits [batch, positions, vocab] and targets [batch, positions]");
            const auto real = y.ne(-100);
            return torch::stack({out.argmax(2).eq(y).logical_and(real).sum(), real.sum()}).to(torch::kLong);
          },
          [](const torch::Tensor& sums, std::int64_t) {
            return Values{{"", sums[1].item<double>() > 0 ? sums[0].item<double>() / sums[1].item<double>() : 0.0}};
          }};
}

Metric accuracy() {
  return {"accuracy", MetricTargets::classes,
          [](const torch::Tensor& out, const torch::Tensor& y) { return out.argmax(1).eq(y).sum().reshape({1}); },
          [](const torch::Tensor& sums, std::int64_t n) { return Values{{"", ratio(sums[0].item<double>(), n)}}; }};
}

Metric top_k_accuracy(std::int64_t k) {
  return {fmt::format("top{}_accuracy", k), MetricTargets::classes,
          [k](const torch::Tensor& out, const torch::Tensor& y) {
            if (k >= out.size(1)) return torch::full({1}, y.size(0), torch::kLong);  // every class is in the top k
            return std::get<1>(out.topk(k, 1)).eq(y.unsqueeze(1)).any(1).sum().reshape({1});
          },
          [](const torch::Tensor& sums, std::int64_t n) { return Values{{"", ratio(sums[0].item<double>(), n)}}; }};
}

Metric precision() {
  return confusion_based("precision", [](const torch::Tensor& m) {
    return per_class(m, [](double tp, double, double p) { return ratio(tp, p); }, in_targets_or_predictions);
  });
}

Metric recall() {
  return confusion_based("recall", [](const torch::Tensor& m) {
    return per_class(m, [](double tp, double s, double) { return ratio(tp, s); }, in_targets_or_predictions);
  });
}

Metric f1() {
  return confusion_based("f1", [](const torch::Tensor& m) {
    return per_class(m, [](double tp, double s, double p) { return ratio(2 * tp, s + p); }, in_targets_or_predictions);
  });
}

Metric balanced_accuracy() {
  return confusion_based("balanced_accuracy", [](const torch::Tensor& m) {
    auto v = per_class(m, [](double tp, double s, double) { return ratio(tp, s); }, [](double s, double) { return s > 0; });
    return Values{{"", v.at("")}};
  });
}

Metric confusion_matrix() {
  return confusion_based("confusion_matrix", [](const torch::Tensor& m) {
    Values v;
    const auto c = m.size(0);
    for (std::int64_t t = 0; t < c; ++t)
      for (std::int64_t p = 0; p < c; ++p) v[fmt::format("{}/{}", t, p)] = m[t][p].item<double>();
    return v;
  }, /*scalar=*/false);
}

Metric mae() { return per_element("mae", absolute, same); }
Metric mse() { return per_element("mse", squared, same); }
Metric rmse() { return per_element("rmse", squared, root); }

Metric r2() {
  return {"r2", MetricTargets::values, r2_rows, r2_finish, /*scalar=*/true, r2_merge};
}

std::vector<Metric> defaults(MetricTargets targets) {
  if (targets == MetricTargets::classes) return {accuracy(), top_k_accuracy(5)};
  return {};
}

std::vector<std::string> builtin_names() {
  return {"accuracy", "top5_accuracy", "precision", "recall", "f1", "balanced_accuracy", "confusion_matrix",
          "mae", "mse", "rmse", "r2", "perplexity", "bits_per_token", "token_accuracy"};
}

Expected<Metric> builtin(const std::string& name) {
  static const std::map<std::string, Metric (*)()> named = {
      {"accuracy", accuracy}, {"precision", precision}, {"recall", recall}, {"f1", f1},
      {"balanced_accuracy", balanced_accuracy}, {"confusion_matrix", confusion_matrix},
      {"mae", mae}, {"mse", mse}, {"rmse", rmse}, {"r2", r2},
      {"perplexity", perplexity}, {"bits_per_token", bits_per_token}, {"token_accuracy", token_accuracy}};
  if (name == "bits_per_byte")
    return fail(ErrorCode::invalid_argument, "bits_per_byte depends on the tokenizer: metric::bits_per_byte(tokenizer.byte_lengths()) "
                                             "(a curriculum's eval takes it by name, from its sets' tokenizer)");
  if (auto it = named.find(name); it != named.end()) return it->second();
  // top<k>_accuracy
  constexpr std::string_view head = "top", tail = "_accuracy";
  if (name.size() > head.size() + tail.size() && name.starts_with(head) && name.ends_with(tail)) {
    const auto digits = name.substr(head.size(), name.size() - head.size() - tail.size());
    if (digits.size() <= 9 && digits.find_first_not_of("0123456789") == std::string::npos && digits[0] != '0')
      return top_k_accuracy(std::stoll(digits));
  }
  return fail(ErrorCode::invalid_argument, fmt::format("unknown metric \"{}\"{}; the built-in ones: {}, top<k>_accuracy",
                                                       name, detail::did_you_mean(name, builtin_names()),
                                                       fmt::join(builtin_names(), ", ")));
}

}  // namespace baton::metric
