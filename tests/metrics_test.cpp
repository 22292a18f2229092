// Metrics as values (metrics.hpp): each built-in against a hand computation, the same bits for
// any eval batch size, errors that name the metric and the set, a user's metric in a few lines,
// and the TOML list with its checks. (Two ranks: distributed_test.cpp.)
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "helpers.hpp"
#include "process.hpp"

namespace {
namespace metric = baton::metric;

/// A model whose output is its input, exactly (a linear layer with identity weights): the data's
/// inputs are the logits or predictions the metrics see.
baton::TrainState identity_state(std::int64_t width) {
  auto s = baton::init_state(baton::model_factory([width] {
                               torch::nn::Linear l(width, width);
                               torch::NoGradGuard g;
                               l->weight.copy_(torch::eye(width));
                               l->bias.zero_();
                               return torch::nn::Sequential(l);
                             }),
                             {.seed = 1, .max_duration = baton::Time::epochs(1)});
  REQUIRE(s.has_value());
  return std::move(*s);
}

std::map<std::string, double> eval_one(const baton::TrainState& s, const baton::Dataset& d, std::vector<baton::Metric> m,
                                       std::int64_t batch = 256, baton::Loss loss = baton::loss::cross_entropy()) {
  auto r = baton::eval({.sets = {{"set", d}}, .loss = std::move(loss), .batch_size = batch, .metrics = std::move(m)}, s);
  if (!r) FAIL(r.error().to_string());
  return r->at("set");
}

std::vector<baton::Metric> all_class_metrics() {
  return {metric::accuracy(), metric::top_k_accuracy(2), metric::top_k_accuracy(3), metric::precision(), metric::recall(),
          metric::f1(), metric::balanced_accuracy(), metric::confusion_matrix()};
}
}  // namespace

TEST_CASE("class metrics equal a hand computation", "[metrics]") {
  // 6 samples, 4 classes; class 3 is never a target nor a prediction.
  //   targets      0 0 1 1 2 2
  //   predicted    0 1 1 1 0 2      (logit 5)
  //   second best  1 0 2 0 1 0      (logit 1)
  // Confusion (rows: target): [1 1 0 0] [0 2 0 0] [1 0 1 0] [0 0 0 0]
  // precision 1/2, 2/3, 1/1   recall 1/2, 2/2, 1/2   F1 = 2tp/(support + predicted): 2/4, 4/5, 2/3
  const std::vector<std::int64_t> target = {0, 0, 1, 1, 2, 2}, pred = {0, 1, 1, 1, 0, 2}, second = {1, 0, 2, 0, 1, 0};
  auto logits = torch::full({6, 4}, -1.0);
  logits.select(1, 3).fill_(-2.0);  // last everywhere: no ties
  for (int i = 0; i < 6; ++i) logits[i][pred[i]] = 5.0, logits[i][second[i]] = 1.0;
  const auto data = *baton::make_dataset(logits, torch::tensor(target, torch::kLong), "hand");
  const auto m = eval_one(identity_state(4), data, all_class_metrics());

  CHECK(m.at("accuracy") == Approx(4.0 / 6).epsilon(1e-15));
  CHECK(m.at("top2_accuracy") == Approx(5.0 / 6).epsilon(1e-15));  // sample 4 (target 2) has 0 and 1 on top
  CHECK(m.at("top3_accuracy") == 1.0);  // its third is class 2
  CHECK(m.at("precision/0") == Approx(0.5));
  CHECK(m.at("precision/1") == Approx(2.0 / 3));
  CHECK(m.at("precision/2") == Approx(1.0));
  CHECK(m.at("precision/3") == 0.0);  // 0/0 counts as 0 ...
  CHECK(m.at("precision") == Approx((0.5 + 2.0 / 3 + 1.0) / 3));  // ... and class 3 is not in the mean
  CHECK(m.at("recall/0") == Approx(0.5));
  CHECK(m.at("recall/1") == Approx(1.0));
  CHECK(m.at("recall/2") == Approx(0.5));
  CHECK(m.at("recall") == Approx(2.0 / 3));
  CHECK(m.at("f1/0") == Approx(0.5));
  CHECK(m.at("f1/1") == Approx(0.8));
  CHECK(m.at("f1/2") == Approx(2.0 / 3));
  CHECK(m.at("f1") == Approx((0.5 + 0.8 + 2.0 / 3) / 3));
  CHECK(m.at("balanced_accuracy") == Approx(2.0 / 3));
  const double cells[4][4] = {{1, 1, 0, 0}, {0, 2, 0, 0}, {1, 0, 1, 0}, {0, 0, 0, 0}};
  for (int t = 0; t < 4; ++t)
    for (int p = 0; p < 4; ++p) CHECK(m.at(fmt::format("confusion_matrix/{}/{}", t, p)) == cells[t][p]);
  CHECK(m.count("confusion_matrix") == 0);  // details only
  CHECK(m.size() == 1 /*loss*/ + 3 + 4 * 3 + 3 + 1 + 16);
}

TEST_CASE("balanced accuracy averages recall over the classes that occur", "[metrics]") {
  // 9 of class 0 right, 1 of class 1 wrong: accuracy 0.9, balanced (1 + 0) / 2.
  auto logits = torch::zeros({10, 2});
  logits.select(1, 0).fill_(1.0);
  auto targets = torch::zeros({10}, torch::kLong);
  targets[9] = 1;
  const auto m = eval_one(identity_state(2), *baton::make_dataset(logits, targets, "imbalanced"),
                          {metric::accuracy(), metric::balanced_accuracy()});
  CHECK(m.at("accuracy") == Approx(0.9));
  CHECK(m.at("balanced_accuracy") == Approx(0.5));
}

TEST_CASE("regression metrics equal a hand computation, R2 per output averaged", "[metrics]") {
  // targets 1 2 3 4, predictions 1.5 2 2 5: errors .5 0 -1 1
  // MAE 2.5/4, MSE 2.25/4, RMSE .75; SStot = 2.25+.25+.25+2.25 = 5, R2 = 1 - 2.25/5 = .55
  const auto data = *baton::make_dataset(torch::tensor({1.5, 2.0, 2.0, 5.0}, torch::kDouble).to(torch::kFloat).view({4, 1}),
                                         torch::tensor({1.0, 2.0, 3.0, 4.0}).to(torch::kFloat).view({4, 1}), "hand");
  const std::vector<baton::Metric> reg = {metric::mae(), metric::mse(), metric::rmse(), metric::r2()};
  auto m = eval_one(identity_state(1), data, reg, 256, baton::loss::mse());
  CHECK(m.at("mae") == Approx(0.625).epsilon(1e-15));
  CHECK(m.at("mse") == Approx(0.5625).epsilon(1e-15));
  CHECK(m.at("rmse") == Approx(0.75).epsilon(1e-15));
  CHECK(m.at("r2") == Approx(0.55).epsilon(1e-12));
  CHECK(m.at("loss") == Approx(0.5625).epsilon(1e-6));  // the same as the MSE loss

  // Two outputs: R2 of each, then their mean; a constant target predicted exactly counts 1.
  auto gen = at::detail::createCPUGenerator(5);
  auto y = torch::randn({50, 2}, gen);
  y.select(1, 1).fill_(3.0);
  auto yhat = y + 0.3 * torch::randn({50, 2}, gen);
  yhat.select(1, 1).fill_(3.0);
  m = eval_one(identity_state(2), *baton::make_dataset(yhat, y, "two"), reg, 7, baton::loss::mse());
  const auto y0 = y.select(1, 0).to(torch::kDouble), e0 = (yhat.select(1, 0).to(torch::kDouble) - y0);
  double res = 0, tot = 0, mean = y0.mean().item<double>(), abs_sum = 0, sq_sum = 0;
  for (int i = 0; i < 50; ++i) {
    res += std::pow(e0[i].item<double>(), 2);
    tot += std::pow(y0[i].item<double>() - mean, 2);
    abs_sum += std::abs(e0[i].item<double>());
    sq_sum += std::pow(e0[i].item<double>(), 2);
  }
  CHECK(m.at("r2") == Approx(((1 - res / tot) + 1.0) / 2).epsilon(1e-10));
  CHECK(m.at("mae") == Approx(abs_sum / 100).epsilon(1e-12));  // over all 100 elements
  CHECK(m.at("mse") == Approx(sq_sum / 100).epsilon(1e-12));
}

TEST_CASE("metrics give the same bits for every eval batch size", "[metrics]") {
  auto gen = at::detail::createCPUGenerator(9);
  const auto classes = *baton::make_dataset(torch::randn({1001, 10}, gen), torch::randint(0, 10, {1001}, gen, torch::kLong), "c");
  const auto values = *baton::make_dataset(torch::randn({1001, 3}, gen), torch::randn({1001, 3}, gen), "v");
  const std::vector<baton::Metric> reg = {metric::mae(), metric::mse(), metric::rmse(), metric::r2()};
  const auto c1 = eval_one(identity_state(10), classes, all_class_metrics(), 1001);
  const auto v1 = eval_one(identity_state(3), values, reg, 1001, baton::loss::mse());
  for (const std::int64_t b : {1, 7, 64, 500}) {
    INFO("batch size " << b);
    auto c = eval_one(identity_state(10), classes, all_class_metrics(), b);
    auto v = eval_one(identity_state(3), values, reg, b, baton::loss::mse());
    c.erase("loss"), v.erase("loss");  // the loss is a mean per batch, weighted: equal up to rounding only
    for (const auto& [k, x] : c) CHECK(x == c1.at(k));
    for (const auto& [k, x] : v) CHECK(x == v1.at(k));
    CHECK(c.size() + 1 == c1.size());
  }
}

TEST_CASE("a metric that does not fit the targets, or breaks its contract, is an error naming it and the set", "[metrics][errors]") {
  const auto s = identity_state(4), s8 = identity_state(8);  // blobs: 8 features, 4 classes
  const auto regression = *baton::make_dataset(torch::randn({10, 4}), torch::randn({10, 4}), "r");
  auto r = baton::eval({.sets = {{"val", regression}}, .loss = baton::loss::mse(), .metrics = {metric::f1()}}, s);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("eval set \"val\"") && Catch::Contains("metric \"f1\"") &&
                                    Catch::Contains("int64 class targets"));
  r = baton::eval({.sets = {{"val", test::blobs(10)}}, .metrics = {metric::r2()}}, s8);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("metric \"r2\"") && Catch::Contains("floating targets"));

  baton::Metric rows{"rows", baton::MetricTargets::any,
                     [](const torch::Tensor& out, const torch::Tensor&) { return out.sum().to(torch::kDouble).reshape({1}); },
                     [](const torch::Tensor& sums, std::int64_t) { return std::map<std::string, double>{{"", sums[0].item<double>()}}; }};
  r = baton::eval({.sets = {{"val", test::blobs(10)}}, .batch_size = 4, .metrics = {rows}}, s8);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().to_string(), Catch::Contains("metric \"rows\"") && Catch::Contains("one row per sample"));

  rows.name = "a/b";
  r = baton::eval({.sets = {{"val", test::blobs(10)}}, .metrics = {rows}}, s8);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("without '/'"));
  CHECK_FALSE(metric::builtin("top0_accuracy"));
  CHECK(metric::builtin("top12_accuracy")->name == "top12_accuracy");
}

namespace {
/// A user's metric in a few lines: the share of samples whose largest logit is below `margin`.
baton::Metric unsure(double margin) {
  return {"unsure", baton::MetricTargets::classes,
          [margin](const torch::Tensor& out, const torch::Tensor&) { return std::get<0>(out.max(1)).lt(margin).sum().reshape({1}); },
          [](const torch::Tensor& sums, std::int64_t n) {
            return std::map<std::string, double>{{"", sums[0].item<double>() / static_cast<double>(n)}};
          }};
}

const char* kToml = R"(
[run]
name = "metrics"
max_duration = "1ep"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.train]
kind = "synthetic"
samples = 200
[datasets.val]
kind = "synthetic"
samples = 100
sample_seed = 5
[[stages]]
name = "only"
duration = "1ep"
batch_size = 50
eval = { sets = ["val"], metrics = ["accuracy", "f1", "confusion_matrix", "unsure"] }
keep_best = { metric = "val/unsure", mode = "min" }
)";
}  // namespace

TEST_CASE("TOML names metrics, the registry's own included, and checks watched metrics and unknown names", "[metrics][hparams]") {
  auto registry = baton::Registry::builtin();
  registry.metrics["unsure"] = unsure(0.5);
  auto cur = baton::parse_curriculum(kToml, "m.toml", {}, registry);
  REQUIRE(cur);
  REQUIRE(cur->validate());
  auto spec = cur->stages()[0].build();
  REQUIRE(spec);
  auto state = test::ok(cur->init());
  auto m = baton::eval(spec->evaluation->spec, state);
  REQUIRE(m);
  CHECK(m->at("val").count("unsure") == 1);
  CHECK(m->at("val").count("f1/3") == 1);
  CHECK(m->at("val").count("confusion_matrix/3/3") == 1);
  CHECK(m->at("val").count("top5_accuracy") == 0);  // a list replaces the defaults

  // A detail may be watched; the confusion matrix (details only) and unknown names may not.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"stage.only.keep_best.metric=\"val/f1/2\"", ""},
      {"stage.only.keep_best.metric=\"val/confusion_matrix\"", "is not one this stage's evaluation gives"},
      {"stage.only.keep_best.metric=\"val/top5_accuracy\"", "is not one this stage's evaluation gives"},
      {"stage.only.eval.metrics=[\"acuracy\"]", "unknown metric \"acuracy\" (did you mean \"accuracy\"?)"},
      {"stage.only.eval.metrics=[\"f1\", \"f1\"]", "\"f1\" is listed twice"},
      {"stage.only.eval.top_k=[5]", "top_k: replaced by metrics"},
  };
  for (const auto& [set, message] : cases) {
    INFO(set);
    auto c = baton::parse_curriculum(kToml, "m.toml", {set}, registry);
    REQUIRE(c);
    auto ok = c->validate();
    if (message.empty()) {
      CHECK(ok);
    } else {
      REQUIRE_FALSE(ok);
      CHECK_THAT(ok.error().to_string(), Catch::Contains(message) && Catch::Contains("m.toml"));
    }
  }
  // Without the registry entry the name is unknown.
  auto plain = baton::parse_curriculum(kToml, "m.toml");
  REQUIRE(plain);
  auto v = plain->validate();
  REQUIRE_FALSE(v);
  CHECK_THAT(v.error().to_string(), Catch::Contains("unknown metric \"unsure\""));
}

namespace {
/// The regression metrics of one column, two passes in long double: the mean first, then the
/// sums about it (scikit-learn's way, with more bits). A constant target: R2 1 when predicted
/// exactly, else 0 (scikit-learn's force_finite).
struct TwoPass {
  double r2, mse, mae;
};
TwoPass two_pass(const torch::Tensor& target, const torch::Tensor& predicted) {
  const auto y = target.to(torch::kDouble).contiguous(), p = predicted.to(torch::kDouble).contiguous();
  const auto n = y.numel();
  const double *yv = y.data_ptr<double>(), *pv = p.data_ptr<double>();
  long double sum = 0, tot = 0, res = 0, abs = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += yv[i];
  const long double mean = sum / n;
  for (std::int64_t i = 0; i < n; ++i) {
    const long double d = yv[i] - mean, e = static_cast<long double>(pv[i]) - yv[i];
    tot += d * d, res += e * e, abs += std::fabs(e);
  }
  const double r2 = tot != 0 ? static_cast<double>(1 - res / tot) : (res == 0 ? 1.0 : 0.0);
  return {r2, static_cast<double>(res / n), static_cast<double>(abs / n)};
}

/// scikit-learn's r2_score, mean_squared_error and mean_absolute_error of each column of the
/// data and of all columns (multioutput="uniform_average"), read back as {"r2/0": ..., "r2": ...}.
std::map<std::string, double> sklearn_metrics(const torch::Tensor& y, const torch::Tensor& p) {
  test::TempDir dir;
  std::ofstream csv(dir.path / "data.csv");
  const auto yd = y.to(torch::kDouble), pd = p.to(torch::kDouble);
  for (std::int64_t i = 0; i < y.size(0); ++i)
    for (std::int64_t j = 0; j < y.size(1); ++j)  // %.17g: the float64 values exactly
      csv << fmt::format("{:.17g},{:.17g}{}", yd[i][j].item<double>(), pd[i][j].item<double>(), j + 1 < y.size(1) ? "," : "\n");
  csv.close();
  const auto py = test::python(dir.path, R"(
import numpy as np
from sklearn.metrics import r2_score, mean_squared_error, mean_absolute_error
d = np.loadtxt("data.csv", delimiter=",", ndmin=2)
y, p = d[:, 0::2], d[:, 1::2]
for name, f in (("r2", r2_score), ("mse", mean_squared_error), ("mae", mean_absolute_error)):
    for j in range(y.shape[1]):
        print(f"{name}/{j} {f(y[:, j], p[:, j])!r}")
    print(f"{name} {f(y, p)!r}")
)", "", test::kSklearn);
  REQUIRE(py.rc == 0);
  std::map<std::string, double> out;
  std::istringstream in(py.out);
  for (std::string key, value; in >> key >> value;) out[key] = std::stod(value);
  return out;
}
}  // namespace

TEST_CASE("regression metrics agree with scikit-learn to 1e-12: constant targets, large offsets, several outputs",
          "[metrics][sklearn]") {
  // 5 columns of 400 float32 targets and predictions:
  //   0 ordinary, 1 an offset of 1e6, 2 an offset of 1e3 with a spread of 1e-3,
  //   3 a constant predicted exactly (R2 1), 4 a constant predicted inexactly (R2 0).
  constexpr std::int64_t n = 400;
  auto gen = at::detail::createCPUGenerator(11);
  auto noise = [&](double scale) { return scale * torch::randn({n}, gen, torch::kDouble); };
  const auto y0 = noise(1.0), y1 = 1e6 + noise(4.0), y2 = 1e3 + noise(1e-3);
  // (1e6 + 0.3 as float32: one-pass sums of y and y^2 leave SStot a residue of +2.3, not 0.)
  const auto y3 = torch::full({n}, 1e6 + 0.5, torch::kDouble), y4 = torch::full({n}, 1e6 + 0.3, torch::kDouble);
  const auto y = torch::stack({y0, y1, y2, y3, y4}, 1).to(torch::kFloat);
  const auto p = torch::stack({y0 + noise(0.3), y1 + noise(3.0), y2 + noise(5e-4), y3, y4 + noise(0.5)}, 1).to(torch::kFloat);
  const std::vector<baton::Metric> reg = {metric::r2(), metric::mse(), metric::rmse(), metric::mae()};
  const auto sk = sklearn_metrics(y, p);
  REQUIRE(sk.size() == 3 * 6);
  auto check = [&](const std::map<std::string, double>& m, const std::string& suffix, const std::optional<TwoPass>& ref) {
    INFO("columns " << (suffix.empty() ? "all" : suffix.substr(1)));
    CHECK(m.at("r2") == Approx(sk.at("r2" + suffix)).margin(1e-12).epsilon(0));
    CHECK(m.at("mse") == Approx(sk.at("mse" + suffix)).epsilon(1e-12));
    CHECK(m.at("rmse") == Approx(std::sqrt(sk.at("mse" + suffix))).epsilon(1e-12));
    CHECK(m.at("mae") == Approx(sk.at("mae" + suffix)).epsilon(1e-12));
    if (!ref) return;
    CHECK(m.at("r2") == Approx(ref->r2).margin(1e-12).epsilon(0));
    CHECK(m.at("mse") == Approx(ref->mse).epsilon(1e-12));
    CHECK(m.at("mae") == Approx(ref->mae).epsilon(1e-12));
  };
  for (std::int64_t j = 0; j < 5; ++j) {
    const auto yj = y.select(1, j).reshape({n, 1}), pj = p.select(1, j).reshape({n, 1});
    const auto data = *baton::make_dataset(pj, yj, "column");
    const auto ref = two_pass(yj, pj);
    for (const std::int64_t b : {n, std::int64_t{7}}) {
      INFO("batch size " << b);
      const auto m = eval_one(identity_state(1), data, reg, b, baton::loss::mse());
      check(m, fmt::format("/{}", j), ref);
      if (j == 3) CHECK(m.at("r2") == 1.0);  // as documented: a constant target predicted exactly
      if (j == 4) CHECK(m.at("r2") == 0.0);  // and not exactly
    }
  }
  // All five as one output of 5 elements: each metric over every element, R2 averaged over columns.
  const auto all = *baton::make_dataset(p, y, "all");
  const auto m = eval_one(identity_state(5), all, reg, 64, baton::loss::mse());
  check(m, "", std::nullopt);
  for (const std::int64_t b : {1, 7, 400}) CHECK(eval_one(identity_state(5), all, reg, b, baton::loss::mse()).at("r2") == m.at("r2"));
}
