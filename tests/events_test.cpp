// Event points, algorithms, callbacks, loggers, in-fit evaluation and checkpoints.
#include <pty.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "helpers.hpp"

namespace fs = std::filesystem;
namespace algo = baton::algorithms;
namespace cb = baton::callbacks;
using baton::Event;

namespace {

using test::images;
using test::tiny_cnn;

baton::TrainState image_state(baton::Time max = baton::Time::epochs(4)) {
  auto s = baton::init_state(tiny_cnn(), {.seed = 5, .max_duration = max});
  REQUIRE(s.has_value());
  return std::move(*s);
}

baton::TrainingSpec image_spec(const baton::Dataset& d, baton::Time duration) {
  return baton::TrainingSpec{.name = "img",
                             .data = {.train = d, .batch_size = 16},
                             .optimizer = baton::optim::adam({.lr = 1e-2}),
                             .duration = duration};
}

baton::AlgorithmContext ctx_of(const baton::TrainingSpec& spec, const baton::Timestamp& t, double progress = 0,
                               std::int64_t classes = 3) {
  return baton::AlgorithmContext{spec, t, progress, classes};
}

using test::TempDir;

/// A callback recording the sequence of events.
baton::Callback recorder(std::shared_ptr<std::vector<Event>> out) {
  return {"recorder", [out](const baton::EventView& v) -> std::optional<std::string> {
            out->push_back(v.event);
            return std::nullopt;
          }};
}

}  // namespace

TEST_CASE("events fire in the documented order", "[events]") {
  const auto data = test::blobs(128);  // 4 batches of 32 an epoch: the 3 batches stay in epoch 0
  auto events = std::make_shared<std::vector<Event>>();
  auto spec = test::spec(data, baton::Time::batches(3))
                  .with_callbacks({recorder(events)})
                  .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"blobs", data}}}, .every = baton::Time::batches(2)});
  test::ok(baton::fit(spec, test::new_state()));
  const std::vector<Event> step = {Event::batch_start, Event::after_data, Event::before_forward, Event::after_forward,
                                   Event::after_loss, Event::after_backward, Event::before_optimizer_step, Event::batch_end};
  std::vector<Event> expected = {Event::fit_start, Event::epoch_start};
  for (int i = 0; i < 3; ++i) {
    expected.insert(expected.end(), step.begin(), step.end());
    if (i == 1) expected.insert(expected.end(), {Event::eval_start, Event::eval_end});  // every 2ba
  }
  expected.insert(expected.end(), {Event::eval_start, Event::eval_end, Event::fit_end});  // stage end
  REQUIRE(*events == expected);

  SECTION("an epoch boundary: epoch_end after batch_end, before the interval evaluation") {
    events->clear();
    const auto small = test::blobs(64);  // 2 batches an epoch
    auto spec2 = test::spec(small, baton::Time::batches(3))
                     .with_callbacks({recorder(events)})
                     .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"blobs", small}}}, .every = baton::Time::batches(2)});
    test::ok(baton::fit(spec2, test::new_state()));
    std::vector<Event> want = {Event::fit_start, Event::epoch_start};
    for (int i = 0; i < 3; ++i) {
      want.insert(want.end(), step.begin(), step.end());
      if (i == 1) want.insert(want.end(), {Event::epoch_end, Event::eval_start, Event::eval_end, Event::epoch_start});
    }
    want.insert(want.end(), {Event::eval_start, Event::eval_end, Event::fit_end});
    REQUIRE(*events == want);
  }
}

TEST_CASE("algorithms and callbacks keep split and resume invariance bit for bit", "[events][algorithms]") {
  const auto data = images(200);
  TempDir dir;
  auto spec = image_spec(data, baton::Time::epochs(3))
                  .with_algorithms({algo::random_crop_flip({.padding = 1}), algo::mixup({.alpha = 0.4}),
                                    algo::label_smoothing({.smoothing = 0.1}), algo::ema({.decay = 0.9})})
                  .with_callbacks({cb::early_stopping({.metric = "train/loss", .patience = 100})})
                  .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"train", data}}, .limit = 50},
                                                       .every = baton::Time::batches(7)});
  const auto whole = test::ok(baton::fit(spec, image_state()));
  REQUIRE(whole.algorithm_state.count("ema"));
  REQUIRE(whole.callback_state.at("early_stopping").count("best"));

  SECTION("in pieces") {
    auto s = image_state();
    for (std::int64_t piece : {5, 1, 11, 13, 100}) s = test::ok(baton::fit(spec, std::move(s), baton::Time::batches(piece)));
    test::require_same_bits(whole, s);
  }
  SECTION("through checkpoints, three resumes") {
    auto s = image_state();
    for (std::int64_t piece : {6, 13, 9}) {
      s = test::ok(baton::fit(spec, std::move(s), baton::Time::batches(piece)));
      const auto path = dir.path / "c.baton";
      REQUIRE(baton::save_checkpoint(s, path));
      s = test::ok(baton::load_checkpoint(path, tiny_cnn()));
    }
    s = test::ok(baton::fit(spec, std::move(s)));
    test::require_same_bits(whole, s);
  }
  SECTION("the algorithms did something") {
    const auto plain = test::ok(baton::fit(image_spec(data, baton::Time::epochs(3)), image_state()));
    REQUIRE_FALSE(baton::bitwise_equal(plain, whole));
  }
}

TEST_CASE("label smoothing: the loss equals the closed form", "[algorithms]") {
  const auto spec = image_spec(images(8), baton::Time::batches(1));
  const auto out = torch::tensor({{2.0, -1.0, 0.5}, {0.1, 0.2, 0.3}}, torch::kFloat);
  const auto y = torch::tensor({0, 2}, torch::kLong);
  const double s = 0.2;
  const auto a = algo::label_smoothing({.smoothing = s});
  REQUIRE(a.invalid.empty());
  const baton::Timestamp t{};
  const auto soft = a.before_loss(ctx_of(spec, t), out, y);
  const double loss = baton::loss::cross_entropy().fn(out, soft).item<double>();
  // (1 - s) * CE(hard) + s * mean over classes of -log softmax
  const auto logp = torch::log_softmax(out.to(torch::kDouble), 1);
  double expected = 0;
  for (int i = 0; i < 2; ++i) {
    const double hard = -logp[i][y[i].item<std::int64_t>()].item<double>();
    const double uniform = -logp[i].mean().item<double>();
    expected += ((1 - s) * hard + s * uniform) / 2;
  }
  REQUIRE(loss == Approx(expected).epsilon(1e-6));
  REQUIRE_FALSE(algo::label_smoothing({.smoothing = 1.5}).invalid.empty());
}

TEST_CASE("MixUp: the batch is the documented convex combination", "[algorithms]") {
  const std::int64_t n = 12;
  // Input i is the unit vector e_i: a mixed row shows lambda and its partner directly.
  const auto x = torch::eye(n).view({n, n});
  const auto y = torch::arange(n, torch::kLong) % 3;
  const auto spec = image_spec(images(8), baton::Time::batches(1));
  const baton::Timestamp t{};
  torch::manual_seed(11);
  const auto mixed = algo::mixup({.alpha = 0.4}).after_data(ctx_of(spec, t), baton::Batch{x, y});
  REQUIRE(mixed.targets.sizes() == std::vector<std::int64_t>{n, 3});
  double lam = -1;
  std::vector<bool> partner_seen(n, false);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto row = mixed.inputs[i];
    REQUIRE(row.sum().item<double>() == Approx(1.0));
    std::int64_t j = i;  // partner: the other non-zero entry (or i itself)
    for (std::int64_t k = 0; k < n; ++k)
      if (k != i && row[k].item<double>() > 0) j = k;
    partner_seen[static_cast<std::size_t>(j)] = true;
    const double li = j == i ? -1 : row[i].item<double>();
    if (li >= 0) {
      if (lam < 0) lam = li;
      REQUIRE(li == Approx(lam));
    }
    // targets = lam * onehot(y_i) + (1 - lam) * onehot(y_j)
    const double l = j == i ? 1.0 : lam;
    auto expect = torch::zeros({3});
    expect[y[i].item<std::int64_t>()] += l;
    expect[y[j].item<std::int64_t>()] += 1 - l;
    REQUIRE(torch::allclose(mixed.targets[i], expect, 1e-6, 1e-6));
  }
  REQUIRE(lam > 0);
  REQUIRE(lam < 1);
  for (bool seen : partner_seen) REQUIRE(seen);  // the partners form a permutation
}

TEST_CASE("CutMix, CutOut, crop/flip and progressive resizing do what they say", "[algorithms]") {
  const auto spec = image_spec(images(8), baton::Time::batches(1));
  const baton::Timestamp t{};
  const std::int64_t n = 6;
  auto x = torch::arange(n * 1 * 8 * 8, torch::kFloat).view({n, 1, 8, 8}) + 1;  // all distinct, non-zero
  const auto y = torch::tensor({0, 1, 2, 0, 1, 2}, torch::kLong);
  torch::manual_seed(3);

  SECTION("CutOut zeroes one clipped square per image, nothing else") {
    const auto out = algo::cutout({.size = 4}).after_data(ctx_of(spec, t), {x, y});
    for (std::int64_t i = 0; i < n; ++i) {
      const auto zero = out.inputs[i][0].eq(0);
      const auto rows = zero.any(1).nonzero().flatten(), cols = zero.any(0).nonzero().flatten();
      REQUIRE(rows.numel() >= 2);
      REQUIRE(rows.numel() <= 4);
      REQUIRE(cols.numel() >= 2);
      REQUIRE(cols.numel() <= 4);
      REQUIRE(zero.sum().item<std::int64_t>() == rows.numel() * cols.numel());  // a rectangle
      REQUIRE(torch::equal(out.inputs[i][0].masked_select(~zero), x[i][0].masked_select(~zero)));
    }
  }
  SECTION("CutMix pastes one box from a partner; targets weigh the box's area") {
    const auto out = algo::cutmix({.alpha = 1.0}).after_data(ctx_of(spec, t), {x, y});
    for (std::int64_t i = 0; i < n; ++i) {
      const auto changed = out.inputs[i][0].ne(x[i][0]);
      const double area = changed.sum().item<double>() / 64.0;
      // the changed pixels come from one other image: find it
      std::int64_t partner = i;
      for (std::int64_t j = 0; j < n; ++j)
        if (j != i && changed.any().item<bool>() &&
            torch::equal(out.inputs[i][0].masked_select(changed), x[j][0].masked_select(changed)))
          partner = j;
      if (area > 0) REQUIRE(partner != i);
      auto expect = torch::zeros({3});
      expect[y[i].item<std::int64_t>()] += 1 - area;
      expect[y[partner].item<std::int64_t>()] += area;
      REQUIRE(torch::allclose(out.targets[i], expect, 1e-6, 1e-6));
    }
  }
  SECTION("flip with probability 1 and no padding mirrors every image") {
    const auto out = algo::random_crop_flip({.padding = 0, .flip = 1.0}).after_data(ctx_of(spec, t), {x, y});
    REQUIRE(torch::equal(out.inputs, x.flip({3})));
  }
  SECTION("crop: every image is an 8x8 window of its zero-padded self") {
    const auto out = algo::random_crop_flip({.padding = 2, .flip = 0}).after_data(ctx_of(spec, t), {x, y});
    const auto padded = torch::constant_pad_nd(x, {2, 2, 2, 2}, 0);
    for (std::int64_t i = 0; i < n; ++i) {
      bool found = false;
      for (int oy = 0; oy <= 4 && !found; ++oy)
        for (int ox = 0; ox <= 4 && !found; ++ox)
          found = torch::equal(out.inputs[i], padded[i].narrow(1, oy, 8).narrow(2, ox, 8));
      REQUIRE(found);
    }
  }
  SECTION("progressive resizing follows the stage's course") {
    const auto a = algo::progressive_resizing({.initial_scale = 0.5, .finetune_fraction = 0.25, .size_increment = 2});
    auto side = [&](double progress) { return a.after_data(ctx_of(spec, t, progress), {x, y}).inputs.size(2); };
    REQUIRE(side(0.0) == 4);
    REQUIRE(side(0.375) == 6);  // halfway through the ramp: scale 0.75
    REQUIRE(side(0.75) == 8);
    REQUIRE(side(0.9) == 8);
  }
}

TEST_CASE("EMA after k steps equals the closed form", "[algorithms]") {
  const auto data = test::blobs(96);
  const double d = 0.8;
  auto weights = std::make_shared<std::vector<torch::Tensor>>();
  baton::Callback capture{"capture", [weights](const baton::EventView& v) -> std::optional<std::string> {
                            if (v.event == Event::batch_end)
                              weights->push_back(v.state.named_parameters().front().second.detach().clone());
                            return std::nullopt;
                          }};
  const auto spec = test::spec(data, baton::Time::batches(5)).with_algorithms({algo::ema({.decay = d})}).with_callbacks({capture});
  const auto s = test::ok(baton::fit(spec, test::new_state()));
  REQUIRE(weights->size() == 5);
  auto expect = (*weights)[0].clone();
  for (std::size_t k = 1; k < weights->size(); ++k) expect.mul_(d).add_((*weights)[k], 1 - d);
  const std::string name = s.named_parameters().front().first;
  REQUIRE(torch::equal(s.algorithm_state.at("ema").at(name), expect));

  SECTION("eval with the EMA weights") {
    const auto plain = baton::eval({.sets = {{"d", data}}}, s);
    const auto with_ema = baton::eval({.sets = {{"d", data}}, .weights = "ema"}, s);
    REQUIRE(plain);
    REQUIRE(with_ema);
    auto manual = s;
    for (auto& [n, p] : manual.named_parameters()) p.detach().copy_(s.algorithm_state.at("ema").at(n));
    const auto expected = baton::eval({.sets = {{"d", data}}}, manual);
    REQUIRE(with_ema->at("d").at("loss") == expected->at("d").at("loss"));
    REQUIRE(with_ema->at("d").at("loss") != plain->at("d").at("loss"));
    const auto missing = baton::eval({.sets = {{"d", data}}, .weights = "swa"}, s);
    REQUIRE_FALSE(missing);
    REQUIRE_THAT(missing.error().message, Catch::Contains("weights \"swa\""));
  }
}

TEST_CASE("SWA averages the weights from its start and applies them at the stage's end", "[algorithms]") {
  const auto data = test::blobs(96);
  auto weights = std::make_shared<std::vector<torch::Tensor>>();
  baton::Callback capture{"capture", [weights](const baton::EventView& v) -> std::optional<std::string> {
                            if (v.event == Event::batch_end)
                              weights->push_back(v.state.named_parameters().front().second.detach().clone());
                            return std::nullopt;
                          }};
  // 8 batches; averaging from half the stage on (steps 5..8 begin at progress 0.5 .. 0.875), every 2nd.
  const auto spec = test::spec(data, baton::Time::batches(8))
                        .with_algorithms({algo::swa({.start = 0.5, .every = 2, .apply_at_end = true})})
                        .with_callbacks({capture});
  const auto s = test::ok(baton::fit(spec, test::new_state()));
  REQUIRE(weights->size() == 8);
  const auto mean = ((*weights)[4] + (*weights)[6]) / 2;  // steps 5 and 7
  REQUIRE(torch::allclose(s.named_parameters().front().second, mean, 1e-6, 1e-7));
  REQUIRE(s.algorithm_state.at("swa").at("#count").item<std::int64_t>() == 2);
}

TEST_CASE("layer freezing: frozen layers stop moving at their time", "[algorithms]") {
  const auto data = test::blobs(96);
  auto first = std::make_shared<std::vector<torch::Tensor>>();
  baton::Callback capture{"capture", [first](const baton::EventView& v) -> std::optional<std::string> {
                            if (v.event == Event::batch_end) first->push_back(v.state.named_parameters()[0].second.detach().clone());
                            return std::nullopt;
                          }};
  const auto spec = test::spec(data, baton::Time::batches(8))
                        .with_optimizer(baton::optim::adam({.lr = 1e-2, .weight_decay = 0.1}), baton::Carry::fresh)
                        .with_algorithms({algo::layer_freezing({{"0.*", 0.5}})})
                        .with_callbacks({capture});
  const auto s = test::ok(baton::fit(spec, test::new_state()));
  REQUIRE(first->size() == 8);
  for (std::size_t k = 1; k < 4; ++k) REQUIRE_FALSE(torch::equal((*first)[k], (*first)[k - 1]));  // before: trains
  for (std::size_t k = 4; k < 8; ++k) REQUIRE(torch::equal((*first)[k], (*first)[3]));            // from 0.5: frozen
}

TEST_CASE("an algorithm of stage 2 applies to stage 2's data only", "[algorithms][stages]") {
  const auto a = test::blobs(128, 7, "a");
  auto b_inputs = test::blobs(64, 9, "b").inputs + 100.0;  // stage 2's data is recognisable
  const auto b = *baton::make_dataset(b_inputs, test::blobs(64, 9).targets, "b");
  auto seen = std::make_shared<std::vector<double>>();
  baton::Algorithm probe{.name = "probe"};
  probe.after_data = [seen](const baton::AlgorithmContext&, baton::Batch batch) {
    seen->push_back(batch.inputs.mean().item<double>());
    batch.inputs = batch.inputs - 100.0;  // a transform: stage 2 trains on shifted data
    return batch;
  };
  const auto s1 = test::spec(a, baton::Time::epochs(1)).with_name("one");
  const auto s2 = s1.with_name("two").with_train_data(b).with_algorithms({probe, algo::mixup({})});
  const auto s3 = s1.with_name("three");
  auto events = std::make_shared<std::vector<Event>>();
  auto state = test::ok(baton::fit(s1, test::new_state(1, baton::Time::epochs(6))));
  REQUIRE(seen->empty());
  state = test::ok(baton::fit(s2, std::move(state)));
  REQUIRE(seen->size() == 2);  // 64 samples / 32: every batch of stage 2 went through it
  for (double m : *seen) REQUIRE(m > 50);  // ... and they were stage 2's data
  const auto after2 = state;
  state = test::ok(baton::fit(s3, std::move(state)));
  REQUIRE(seen->size() == 2);  // stage 3: no trace
  // Stage 3 equals the same stage run on the state after stage 2 without any algorithm listed.
  const auto again = test::ok(baton::fit(s3.with_algorithms({}), after2));
  test::require_same_bits(state, again);
}

TEST_CASE("early stopping judges a stage by its own evaluations unless scope = run -- the reason names the best's batch",
          "[callbacks]") {
  const auto spec = test::spec(test::blobs(32), baton::Time::batches(1));
  const auto warmup = test::new_state();  // a stage that started at batch 0, evaluated at 0
  auto finetune = warmup;                 // the next stage: started at 10, evaluated at 12, 14, 16
  finetune.stage_start.batch = 10;
  auto feed = [&](baton::Callback c) {
    std::map<std::string, double> memory;
    std::vector<std::pair<const baton::TrainState*, double>> evals = {{&warmup, 0.1}};
    for (int k = 0; k < 3; ++k) evals.emplace_back(&finetune, 0.5 + 0.1 * k);
    for (std::size_t i = 0; i < evals.size(); ++i) {
      auto state = *evals[i].first;
      if (i > 0) state.time.batch = 10 + 2 * static_cast<std::int64_t>(i);
      const baton::Metrics m{{"val", {{"loss", evals[i].second}}}};
      baton::Scalars log;
      const baton::EventView v{Event::eval_end, spec, state, nullptr, &m, nullptr, &log, &memory};
      if (auto reason = c.on_event(v)) return std::pair<std::size_t, std::string>{i, *reason};
    }
    return std::pair<std::size_t, std::string>{evals.size(), ""};
  };
  // Per stage: fine-tune's first evaluation (0.5 at batch 12) is its best; two worse ones stop it.
  const auto [stage_at, stage_why] = feed(cb::early_stopping({.metric = "val/loss", .patience = 2}));
  CHECK(stage_at == 3);
  CHECK_THAT(stage_why, Catch::Contains("did not improve on 0.5 (the evaluation at batch 12, this stage's best)"));
  // Run-wide: warm-up's 0.1 stays the best; fine-tune's first two evaluations stop it.
  const auto [run_at, run_why] = feed(cb::early_stopping({.metric = "val/loss", .patience = 2, .scope = cb::Scope::run}));
  CHECK(run_at == 2);
  CHECK_THAT(run_why, Catch::Contains("did not improve on 0.1 (the evaluation at batch 0, the run's best)"));
}

TEST_CASE("early stopping stops at the right evaluation of a scripted sequence", "[callbacks]") {
  const auto data = test::blobs(32);
  const auto spec = test::spec(data, baton::Time::batches(1));
  const auto state = test::new_state();
  auto run = [&](baton::Callback c, const std::vector<double>& values) -> std::pair<std::size_t, std::string> {
    std::map<std::string, double> memory;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const baton::Metrics m{{"val", {{"loss", values[i]}}}};
      baton::Scalars log;
      const baton::EventView v{Event::eval_end, spec, state, nullptr, &m, nullptr, &log, &memory};
      if (auto reason = c.on_event(v)) return {i, *reason};
    }
    return {values.size(), ""};
  };
  // best 0.5 at index 2; 0.495 is not better by more than min_delta 0.01; 3 bad ones -> stop at 5
  const auto [at, why] = run(cb::early_stopping({.metric = "val/loss", .mode = cb::Mode::min, .patience = 3, .min_delta = 0.01}),
                             {1.0, 0.8, 0.5, 0.495, 0.6, 0.52, 0.1});
  REQUIRE(at == 5);
  REQUIRE_THAT(why, Catch::Contains("val/loss did not improve"));
  REQUIRE(run(cb::early_stopping({.metric = "val/loss", .patience = 3}), {1.0, 0.9, 0.8, 0.7}).first == 4);
  REQUIRE(run(cb::threshold_stop({.metric = "val/loss", .threshold = 0.55, .mode = cb::Mode::min}), {1.0, 0.6, 0.5, 0.4}).first == 2);
  REQUIRE_THAT(run(cb::early_stopping({.metric = "val/accuracy"}), {1.0}).second, Catch::Contains("val/loss"));

  SECTION("inside fit: the stage ends early with a reason, not an error") {
    // No later evaluation beats the first by min_delta 100, so the stop comes `patience`
    // evaluations after the first.
    const auto still = spec.with_duration(baton::Time::batches(20))
                           .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"val", data}}}, .every = baton::Time::batches(2)})
                           .with_callbacks({cb::early_stopping({.metric = "val/loss", .patience = 2, .min_delta = 100})});
    const auto s = test::ok(baton::fit(still, test::new_state(1, baton::Time::batches(100))));
    REQUIRE(s.time.batch == 6);  // evaluations at 2 (best), 4, 6 -> stop
    REQUIRE_THAT(s.history.back().stop_reason, Catch::Contains("early_stopping"));
    REQUIRE_FALSE(s.history.back().interrupted);
  }
}

TEST_CASE("non-finite loss: error, skip or stop, as the spec says", "[events][non_finite]") {
  const auto data = test::blobs(96);
  // A loss that is NaN on the batch where the first target is... a counter: the 3rd call.
  auto calls = std::make_shared<int>(0);
  baton::Loss poisoned{"poisoned", [calls](const torch::Tensor& out, const torch::Tensor& y) {
                         auto l = torch::nn::functional::cross_entropy(out, y);
                         return ++*calls == 3 ? l * std::nan("") : l;
                       }};
  auto spec = test::spec(data, baton::Time::batches(5)).with_loss(poisoned);
  SECTION("error (the default)") {
    auto r = baton::fit(spec, test::new_state());
    REQUIRE_FALSE(r);
    REQUIRE(r.error().code == baton::ErrorCode::non_finite);
    REQUIRE_THAT(r.error().message, Catch::Contains("at batch 2"));
  }
  SECTION("skip: the batch is consumed, nothing applied") {
    const auto s = test::ok(baton::fit(spec.with_non_finite(baton::NonFinite::skip), test::new_state()));
    REQUIRE(s.time.batch == 5);
    REQUIRE(s.history.back().skipped_batches == 1);
    REQUIRE(std::isfinite(s.history.back().last_loss));
  }
  SECTION("stop: the state before the bad step, with a reason") {
    const auto s = test::ok(baton::fit(spec.with_non_finite(baton::NonFinite::stop), test::new_state()));
    REQUIRE(s.time.batch == 2);
    REQUIRE_THAT(s.history.back().stop_reason, Catch::Contains("non-finite"));
  }
}

TEST_CASE("checkpoints from the spec: intervals, stage end, interruption -- resuming each is bit-exact", "[events][checkpoint]") {
  const auto data = test::blobs(100);
  TempDir dir;
  const auto spec = test::spec(data, baton::Time::epochs(2))
                        .with_algorithms({algo::ema({.decay = 0.9})})
                        .with_checkpoints({.dir = dir.path, .every = baton::Time::batches(3), .keep = 0,
                                           .meta = {.run_name = "t"}});
  const auto whole = test::ok(baton::fit(spec.with_checkpoints({}), test::new_state()));
  const auto done = test::ok(baton::fit(spec, test::new_state()));  // 4 batches per epoch: 8 in all
  test::require_same_bits(whole, done);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names == std::vector<std::string>{"ckpt-0000000003.baton", "ckpt-0000000006.baton", "ckpt-0000000008-end.baton"});
  for (const auto& name : names) {
    INFO(name);
    auto s = test::ok(baton::load_checkpoint(dir.path / name, test::bn_dropout_mlp()));
    const auto info = baton::read_checkpoint_info(dir.path / name);
    REQUIRE(info->meta.extra.at("stage_done") == (name.find("-end") != std::string::npos ? "1" : "0"));
    if (s.time.batch < 8) s = test::ok(baton::fit(spec.with_checkpoints({}), std::move(s)));
    test::require_same_bits(whole, s);
  }
  SECTION("keep: only the newest interval checkpoints stay") {
    TempDir d2;
    test::ok(baton::fit(spec.with_checkpoints({.dir = d2.path, .every = baton::Time::batches(1), .keep = 2}), test::new_state()));
    std::vector<std::string> kept;
    for (const auto& e : fs::directory_iterator(d2.path)) kept.push_back(e.path().filename().string());
    std::sort(kept.begin(), kept.end());
    REQUIRE(kept == std::vector<std::string>{"ckpt-0000000006.baton", "ckpt-0000000007.baton", "ckpt-0000000008-end.baton"});
  }
  SECTION("an interval on the stage's last batch writes nothing, even without a stage-end checkpoint") {
    // There the state is not yet the stage's end (EMA's stage end, evaluation follow): a resume
    // from it could not reproduce that end (a run directory writes its own stage-end file).
    TempDir d4;
    test::ok(baton::fit(spec.with_checkpoints({.dir = d4.path, .every = baton::Time::batches(4), .at_stage_end = false}),
                        test::new_state()));
    std::vector<std::string> written;
    for (const auto& e : fs::directory_iterator(d4.path)) written.push_back(e.path().filename().string());
    REQUIRE(written == std::vector<std::string>{"ckpt-0000000004.baton"});
  }
  SECTION("on interruption") {
    TempDir d3;
    auto flag = std::make_shared<std::atomic<bool>>(false);
    baton::Callback trip{"trip", [flag](const baton::EventView& v) -> std::optional<std::string> {
                           if (v.event == Event::batch_end && v.state.time.batch == 5) flag->store(true);
                           return std::nullopt;
                         }};
    auto s = spec.with_checkpoints({.dir = d3.path});
    s.stop = flag;
    s.callbacks = {trip};
    const auto stopped = test::ok(baton::fit(s, test::new_state()));
    REQUIRE(stopped.history.back().interrupted);
    REQUIRE(fs::exists(d3.path / "ckpt-0000000005.baton"));
    auto resumed = test::ok(baton::load_checkpoint(d3.path / "ckpt-0000000005.baton", test::bn_dropout_mlp()));
    resumed = test::ok(baton::fit(spec.with_checkpoints({}), std::move(resumed)));
    // The stopped fit had one more callback, which kept nothing: no trace of it in the state.
    test::require_same_bits(whole, resumed);
  }
}

namespace {
// An independent reader of TensorBoard's record format, for the test.
std::uint32_t crc32c_bitwise(const std::string& s) {
  std::uint32_t c = 0xFFFFFFFFU;
  for (unsigned char ch : s) {
    c ^= ch;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78U & (0U - (c & 1U)));
  }
  return ~c;
}
std::uint32_t unmask(std::uint32_t m) {
  const std::uint32_t r = m - 0xa282ead8U;
  return (r >> 17) | (r << 15);
}
std::uint64_t read_varint(const std::string& s, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<unsigned char>(s.at(at++));
    v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}
struct Field {
  int number;
  int wire;
  std::uint64_t varint = 0;
  std::string bytes{};
};
std::vector<Field> fields(const std::string& msg) {
  std::vector<Field> out;
  std::size_t at = 0;
  while (at < msg.size()) {
    const auto key = read_varint(msg, at);
    Field f{static_cast<int>(key >> 3), static_cast<int>(key & 7)};
    if (f.wire == 0) f.varint = read_varint(msg, at);
    else if (f.wire == 1) f.bytes = msg.substr(at, 8), at += 8;
    else if (f.wire == 5) f.bytes = msg.substr(at, 4), at += 4;
    else if (f.wire == 2) {
      const auto n = read_varint(msg, at);
      f.bytes = msg.substr(at, n), at += n;
    } else {
      FAIL("unexpected wire type " << f.wire);
    }
    out.push_back(std::move(f));
  }
  return out;
}
}  // namespace

TEST_CASE("TensorBoard files decode to the scalars written", "[loggers]") {
  TempDir dir;
  {
    auto tb = baton::loggers::tensorboard(dir.path);
    REQUIRE(tb);
    (*tb)->log("s", baton::Timestamp{.batch = 7}, {{"train/loss", 0.25}, {"train/lr", 0.125}});
    (*tb)->log("s", baton::Timestamp{.batch = 9}, {{"eval/test/accuracy", 0.875}});
    (*tb)->flush();
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir.path)) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  REQUIRE(files[0].filename().string().rfind("events.out.tfevents.", 0) == 0);
  std::ifstream in(files[0], std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  std::size_t at = 0;
  std::vector<std::tuple<std::int64_t, std::string, float>> scalars;
  int records = 0;
  std::string version;
  while (at < all.size()) {
    REQUIRE(at + 12 <= all.size());
    const std::string len_bytes = all.substr(at, 8);
    std::uint64_t len;
    std::uint32_t len_crc, data_crc;
    std::memcpy(&len, len_bytes.data(), 8);
    std::memcpy(&len_crc, all.data() + at + 8, 4);
    REQUIRE(unmask(len_crc) == crc32c_bitwise(len_bytes));
    const std::string data = all.substr(at + 12, len);
    std::memcpy(&data_crc, all.data() + at + 12 + len, 4);
    REQUIRE(unmask(data_crc) == crc32c_bitwise(data));
    REQUIRE(baton::crc32c(data.data(), data.size()) == crc32c_bitwise(data));
    at += 12 + len + 4;
    ++records;
    std::int64_t step = -1;
    double wall = 0;
    for (const auto& f : fields(data)) {
      if (f.number == 1 && f.wire == 1) std::memcpy(&wall, f.bytes.data(), 8);
      if (f.number == 2 && f.wire == 0) step = static_cast<std::int64_t>(f.varint);
      if (f.number == 3 && f.wire == 2) version = f.bytes;
      if (f.number == 5 && f.wire == 2)
        for (const auto& v : fields(f.bytes)) {
          REQUIRE(v.number == 1);
          std::string tag;
          float value = -1;
          for (const auto& g : fields(v.bytes)) {
            if (g.number == 1) tag = g.bytes;
            if (g.number == 2 && g.wire == 5) std::memcpy(&value, g.bytes.data(), 4);
          }
          scalars.emplace_back(step, tag, value);
        }
    }
    REQUIRE(wall > 1.6e9);  // seconds since 1970
  }
  REQUIRE(records == 3);
  REQUIRE(version == "brain.Event:2");
  REQUIRE(scalars.size() == 3);
  const std::vector<std::int64_t> steps = {7, 7, 9};
  const std::vector<std::string> tags = {"train/loss", "train/lr", "eval/test/accuracy"};
  const std::vector<float> values = {0.25f, 0.125f, 0.875f};
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(std::get<0>(scalars[i]) == steps[i]);
    CHECK(std::get<1>(scalars[i]) == tags[i]);
    CHECK(std::get<2>(scalars[i]) == values[i]);
  }
}

TEST_CASE("JSONL and CSV loggers, and monitors through fit", "[loggers][callbacks]") {
  TempDir dir;
  const auto data = test::blobs(64);
  auto jl = baton::loggers::jsonl(dir.path / "m.jsonl");
  auto cs = baton::loggers::csv(dir.path / "m.csv");
  REQUIRE(jl);
  REQUIRE(cs);
  const auto spec = test::spec(data, baton::Time::batches(4))
                        .with_callbacks({cb::train_monitor({.every = 2}), cb::lr_monitor({.every = 2}), cb::throughput({.every = 2}),
                                         cb::memory_monitor({.every = 2}), cb::grad_norm_monitor({.every = 2}), cb::nan_monitor({})})
                        .with_loggers({*jl, *cs});
  test::ok(baton::fit(spec, test::new_state()));
  std::ifstream in(dir.path / "m.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  REQUIRE(lines.size() == 4);  // batches 2 and 4, a "system" and a "train" line each
  for (const auto& j : lines) {
    const std::vector<const char*> keys = j.at("event") == "system" ? std::vector<const char*>{"peak_rss_mb"}
                                          : std::vector<const char*>{"loss", "lr", "samples_per_s", "grad_norm"};
    REQUIRE((j.at("event") == "system" || j.at("event") == "train"));
    REQUIRE(j.at("stage") == "test");
    for (const char* k : keys) {
      INFO(k);
      REQUIRE(j.contains(k));
      REQUIRE(j.at(k).get<double>() > 0);
    }
    if (j.at("event") == "train") REQUIRE(j.at("lr").get<double>() == Approx(0.05));
  }
  REQUIRE(lines[3].at("batch") == 4);
  std::ifstream csv(dir.path / "m.csv");
  std::string header, row;
  std::getline(csv, header);
  REQUIRE(header == "event,stage,epoch,batch,sample,set,metric,value");
  std::getline(csv, row);
  REQUIRE_THAT(row, Catch::StartsWith("system,test,0,2,64,,peak_rss_mb,") || Catch::StartsWith("train,test,0,2,64,,"));

  SECTION("the NaN monitor stops on a non-finite weight") {
    baton::Algorithm poison{.name = "poison"};
    poison.after_backward = [](const baton::AlgorithmContext& c, const std::vector<std::pair<std::string, torch::Tensor>>& ps) {
      if (c.time.batch == 1) ps.front().second.mutable_grad().fill_(std::nan(""));
    };
    // skip would catch the gradient; "error" without clipping does not check gradients.
    const auto s = test::ok(baton::fit(test::spec(data, baton::Time::batches(4)).with_algorithms({poison}).with_callbacks({cb::nan_monitor({})}),
                                       test::new_state()));
    REQUIRE(s.time.batch == 2);
    REQUIRE_THAT(s.history.back().stop_reason, Catch::Contains("NaN or infinity after batch 2"));
  }
}

namespace {
std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  return out;
}
}  // namespace

TEST_CASE("the progress display and the console logger share one output", "[loggers][callbacks]") {
  const auto data = test::blobs(320);  // 10 batches an epoch
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  SECTION("plain lines at every 10% of the stage, eval lines in between") {
    auto display = std::make_shared<baton::Progress>(f, /*bar=*/false);
    const auto spec = test::spec(data, baton::Time::batches(10))
                          .with_callbacks({cb::progress(display)})
                          .with_loggers({baton::loggers::console(display)})
                          .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"val", data}}}, .every = baton::Time::batches(5)});
    test::ok(baton::fit(spec, test::new_state()));
    const auto text = read_all(f);
    INFO(text);
    for (int pct = 10; pct <= 100; pct += 10)
      CHECK_THAT(text, Catch::Contains(fmt::format("[test] epoch 0 batch {} ({}%):", pct / 10, pct)));
    CHECK_THAT(text, Catch::Contains("[test] epoch 0 batch 5: eval/val/accuracy="));
    CHECK(std::count(text.begin(), text.end(), '\n') == 10 + 2);  // 10 progress lines, 2 evaluations
    CHECK(text.find('\r') == std::string::npos);
  }
  SECTION("a bar redrawn in place, cleared before a line") {
    auto display = std::make_shared<baton::Progress>(f, /*bar=*/true);
    display->update("s", {}, 5, 10, 100, 0.5, 61);
    display->line("hello");
    display->finish_stage();
    const auto text = read_all(f);
    CHECK(text == "\r\033[K[s] epoch 0 [############............]  50%    100 sp/s loss 0.5000 ETA 1:01\r\033[Khello\n\n");
  }
  std::fclose(f);
  CHECK(baton::duration_text(3725) == "1:02:05");
}

TEST_CASE("the progress bar fits the terminal's width in a pseudo-terminal: 80 and 40 columns, no wrapped line",
          "[loggers][callbacks][pty]") {
  for (const unsigned short cols : {80, 40}) {
    INFO(cols << " columns");
    int master = -1, slave = -1;
    winsize ws{};
    ws.ws_col = cols, ws.ws_row = 24;
    REQUIRE(::openpty(&master, &slave, nullptr, nullptr, &ws) == 0);
    std::FILE* tty = ::fdopen(slave, "w");
    REQUIRE(tty != nullptr);
    {
      baton::Progress display(tty);  // a terminal: the bar
      baton::Timestamp t;
      t.epoch = 12;
      for (int done = 0; done <= 10; ++done)
        display.update("pretrain", t, done, 10, 123456.7, 0.123456, 3725);
      display.finish_stage();
    }
    std::fclose(tty);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    ::close(master);
    // Every redraw: "\r\033[K" then the line; its printable part stays below the last column.
    std::size_t lines = 0;
    for (std::size_t at = out.find("\033[K"); at != std::string::npos; at = out.find("\033[K", at + 1)) {
      const auto end = out.find_first_of("\r\n", at + 3);
      const auto line = out.substr(at + 3, (end == std::string::npos ? out.size() : end) - (at + 3));
      INFO(line);
      CHECK(line.size() < cols);
      CHECK_THAT(line, Catch::StartsWith("[pretrain] epoch 12"));
      ++lines;
    }
    CHECK(lines == 11);
    if (cols == 80) CHECK_THAT(out, Catch::Contains("] 100% 123457 sp/s loss 0.1235 ETA 1:02:05"));
  }
}

TEST_CASE("algorithms and callbacks from TOML, with a defined order", "[hparams][algorithms]") {
  const std::string toml = R"(
[run]
name = "t"
max_duration = "2ep"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.train]
kind = "synthetic"
samples = 64
features = 8
classes = 4
[defaults]
algorithms = { ema = { decay = 0.9 }, label_smoothing = { smoothing = 0.1 }, mixup = { alpha = 0.3 } }
callbacks = { early_stopping = { metric = "train/accuracy", mode = "max", patience = 2 }, train_monitor = { every = "0.5ep" }, nan_monitor = { every = 4 } }
eval = { sets = ["train"], interval = "2ba" }
[[stages]]
name = "one"
duration = "1ep"
[[stages]]
name = "two"
duration = "1ep"
algorithms = { order = ["label_smoothing", "mixup"], mixup = {}, label_smoothing = {} }
on_non_finite = "skip"
[[stages]]
name = "three"
duration = "1ep"
algorithms = {}
)";
  auto cur = baton::parse_curriculum(toml, "t.toml");
  REQUIRE(cur);
  auto names = [](const baton::TrainingSpec& s) {
    std::vector<std::string> v;
    for (const auto& a : s.algorithms) v.push_back(a.name);
    return v;
  };
  const auto one = cur->stages()[0].build();
  REQUIRE(one);
  REQUIRE(names(*one) == std::vector<std::string>{"mixup", "label_smoothing", "ema"});  // the default order
  REQUIRE(one->callbacks.size() == 3);
  for (const auto& c : one->callbacks)
    if (c.name == "nan_monitor") CHECK(c.identity == "nan_monitor(every=4ba)");
  REQUIRE(one->evaluation.has_value());
  REQUIRE(one->evaluation->every->to_string() == "2ba");
  const auto two = cur->stages()[1].build();
  REQUIRE(two);
  REQUIRE(names(*two) == std::vector<std::string>{"label_smoothing", "mixup"});
  REQUIRE(two->on_non_finite == baton::NonFinite::skip);
  const auto three = cur->stages()[2].build();
  REQUIRE(three);
  REQUIRE(three->algorithms.empty());

  auto bad = [&](const std::string& replace, const std::string& with, const std::string& expect) {
    std::string t = toml;
    const auto at = t.find(replace);
    REQUIRE(at != std::string::npos);
    t.replace(at, replace.size(), with);
    auto c = baton::parse_curriculum(t, "t.toml");
    std::string message = c ? (c->stages()[0].build() ? "" : c->stages()[0].build().error().to_string()) : c.error().to_string();
    INFO(message);
    REQUIRE_THAT(message, Catch::Contains(expect));
  };
  bad("ema = { decay = 0.9 }", "emma = {}", "unknown algorithm \"emma\" (did you mean \"ema\"?)");
  bad("ema = { decay = 0.9 }", "ema = { decay = 2.0 }", "ema.decay: must be in [0, 1)");
  bad("ema = { decay = 0.9 }", "ema = { decy = 0.9 }", "unknown key \"decy\"");
  bad("patience = 2", "patience = 0", "patience: expected a whole number >= 1");
  bad("early_stopping = {", "early_stop = {", "unknown callback \"early_stop\"");
  bad("mode = \"max\"", "mode = \"up\"", "mode: expected \"max\" or \"min\"");
  bad("every = \"0.5ep\"", "every = \"0ep\"", "callbacks.train_monitor.every: must be more than zero, got \"0ep\"");
  bad("every = \"0.5ep\"", "every = \"1.5ba\"", "callbacks.train_monitor.every: ");
  bad("every = \"0.5ep\"", "every = \"1.5ba\"", "1.5ba");
  bad("every = \"0.5ep\"", "every = 0", "callbacks.train_monitor.every: expected a whole number of batches >= 1 or a time such as \"0.5ep\", got 0");
  bad("every = 4", "every = 2.5", "callbacks.nan_monitor.every: expected a whole number of batches >= 1 or a time such as \"0.5ep\", got 2.5");
}

TEST_CASE("a resumed run's TensorBoard file begins with the restart marker at the step after its checkpoint",
          "[loggers][resume]") {
  TempDir dir;
  {
    auto tb = baton::loggers::tensorboard(dir.path, 6);
    REQUIRE(tb);
    (*tb)->log("s", baton::Timestamp{.batch = 7}, {{"train/loss", 0.5}});
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir.path)) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  std::ifstream in(files[0], std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  // Records: [u64 length][u32 crc][data][u32 crc]; the second holds the marker.
  std::vector<std::string> records;
  for (std::size_t at = 0; at < all.size();) {
    std::uint64_t len = 0;
    std::memcpy(&len, all.data() + at, 8);
    records.push_back(all.substr(at + 12, len));
    at += 12 + len + 4;
  }
  REQUIRE(records.size() == 3);
  std::int64_t step = -1;
  std::uint64_t status = 0;
  for (const auto& f : fields(records[1])) {
    if (f.number == 2 && f.wire == 0) step = static_cast<std::int64_t>(f.varint);
    if (f.number == 6 && f.wire == 2)  // session_log
      for (const auto& g : fields(f.bytes))
        if (g.number == 1 && g.wire == 0) status = g.varint;
  }
  CHECK(step == 6);
  CHECK(status == 1);  // SessionLog.START: TensorBoard purges earlier files' events at step >= 6
  // Without a restart there is no marker.
  TempDir plain;
  REQUIRE(baton::loggers::tensorboard(plain.path));
  for (const auto& e : fs::directory_iterator(plain.path)) CHECK(fs::file_size(e.path()) < 60);
}

