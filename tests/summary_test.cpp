// Model summary (summary.hpp): shapes, parameters and FLOPs against hand counts; the state is
// not changed; other models and bad shapes.
#include <torch/torch.h>

#include "baton/summary.hpp"
#include "helpers.hpp"

namespace {
struct TwoHeads : torch::nn::Module {
  torch::nn::Linear body{nullptr}, head{nullptr};
  TwoHeads() {
    body = register_module("body", torch::nn::Linear(6, 5));
    head = register_module("head", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return head(torch::relu(body(x))); }
};
}  // namespace

TEST_CASE("summarize: a Sequential's modules, output shapes, parameters and FLOPs by hand", "[summary]") {
  auto state = test::ok(baton::init_state(baton::models::small_cnn({.channels1 = 4, .channels2 = 8, .hidden = 16}), {.seed = 3}));
  const auto hash = baton::params_sha256(state);
  state.model.module->train();
  baton::TrainingSpec frozen;
  frozen.name = "head-only";
  frozen.freeze = {"0.*", "1.*"};
  const auto s = baton::summarize(state, {1, 28, 28}, {frozen});
  if (!s) FAIL(s.error().to_string());
  REQUIRE(s->rows.size() == 12);  // conv bn relu pool, conv bn relu pool, flatten, linear relu linear
  CHECK(s->rows[0].type == "Conv2d");
  CHECK(s->rows[0].output == std::vector<std::int64_t>{4, 28, 28});
  CHECK(s->rows[0].params == 1 * 4 * 9);                            // no bias
  CHECK(*s->rows[0].flops == 2.0 * 1 * 9 * 4 * 28 * 28);           // a multiply-add per weight per position
  CHECK(s->rows[1].type == "BatchNorm2d");
  CHECK(s->rows[1].params == 8);
  CHECK(*s->rows[1].flops == 2.0 * 4 * 28 * 28);
  CHECK(s->rows[3].output == std::vector<std::int64_t>{4, 14, 14});
  CHECK(s->rows[4].params == 4 * 8 * 9);
  CHECK(*s->rows[4].flops == 2.0 * 4 * 9 * 8 * 14 * 14);
  CHECK(s->rows[8].type == "Flatten");
  CHECK(s->rows[8].output == std::vector<std::int64_t>{8 * 7 * 7});
  CHECK(s->rows[9].params == 392 * 16 + 16);
  CHECK(*s->rows[9].flops == 2.0 * 392 * 16 + 16);
  CHECK(s->output == std::vector<std::int64_t>{10});
  std::int64_t params = 0;
  double flops = 0;
  for (const auto& r : s->rows) params += r.params, flops += r.flops.value_or(0);
  std::int64_t numel = 0;
  for (const auto& p : state.model.module->parameters()) numel += p.numel();
  CHECK(s->params == numel);
  CHECK(params == numel);
  REQUIRE(s->flops);
  CHECK(*s->flops == flops);
  // 4 bytes per parameter and per float buffer element, 8 per batch-norm counter.
  CHECK(s->megabytes > numel * 4 / 1e6);
  REQUIRE(s->stages.size() == 1);
  CHECK(s->stages[0].frozen == 36 + 8);
  CHECK(s->stages[0].trainable == numel - 44);
  CHECK_THAT(s->to_string(), Catch::Contains("stage \"head-only\": ") && Catch::Contains("Conv2d") &&
                                 Catch::Contains("input [1, 28, 28] -> output [10]"));
  // The state is as it was: weights, and its training mode.
  CHECK(baton::params_sha256(state) == hash);
  CHECK(state.model.module->is_training());
}

TEST_CASE("summarize: a stage with a model of its own counts that model's parameters, and those after it too", "[summary]") {
  const auto five = baton::models::small_cnn({.channels1 = 4, .channels2 = 8, .hidden = 16, .classes = 5});
  const auto ten = baton::models::small_cnn({.channels1 = 4, .channels2 = 8, .hidden = 16, .classes = 10});
  const auto state = test::ok(baton::init_state(five, {.seed = 3}));
  baton::TrainingSpec pre, head, more;
  pre.name = "pretrain";
  head.name = "ten-way";
  head.model = baton::ModelCarry::transfer(ten);
  more.name = "more";
  const auto s = test::ok(baton::summarize(state, {1, 28, 28}, {pre, head, more}));
  REQUIRE(s.stages.size() == 3);
  CHECK(s.stages[0].trainable == s.params);
  CHECK(s.stages[1].trainable == s.params + 5 * 16 + 5);  // 5 more outputs: 5 rows of 16 weights and 5 biases
  CHECK(s.stages[2].trainable == s.stages[1].trainable);
}

TEST_CASE("summarize: another model gets its children and output, no FLOPs, and a wrong shape names the module", "[summary]") {
  auto state = test::ok(baton::init_state(baton::model_factory([] { return std::make_shared<TwoHeads>(); }), {.seed = 1}));
  const auto s = baton::summarize(state, {6});
  if (!s) FAIL(s.error().to_string());
  REQUIRE(s->rows.size() == 2);
  CHECK(s->rows[0].name == "body");
  CHECK(s->rows[0].params == 35);
  CHECK(s->rows[0].output.empty());
  CHECK_FALSE(s->flops);
  CHECK(s->output == std::vector<std::int64_t>{3});
  CHECK_THAT(s->to_string(), Catch::Contains("FLOPs not known"));

  auto mlp = test::ok(baton::init_state(baton::models::mlp({10, 4}), {.seed = 1}));
  const auto bad = baton::summarize(mlp, {3});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == baton::ErrorCode::shape_mismatch);
  CHECK_THAT(bad.error().to_string(), Catch::Contains("module 1 (Linear)") && Catch::Contains("[1, 3]"));
}
