#include "helpers.hpp"

TEST_CASE("eval computes loss, accuracy and top-k and changes nothing", "[eval]") {
  const auto data = test::blobs(300);
  auto s = test::ok(baton::fit(test::spec(data, baton::Time::epochs(1)), test::new_state()));
  const baton::TrainState before = s;
  torch::manual_seed(5);
  const auto global_next = torch::rand({3});
  torch::manual_seed(5);

  const baton::EvalSpec spec{.sets = {{"all", data}, {"head", data.head(50)}}, .batch_size = 64,
                              .metrics = {baton::metric::accuracy(), baton::metric::top_k_accuracy(1),
                                          baton::metric::top_k_accuracy(4), baton::metric::top_k_accuracy(9)}};
  auto m = baton::eval(spec, s);
  REQUIRE(m);
  CHECK(torch::rand({3}).equal(global_next));
  CHECK(baton::bitwise_equal(before, s));
  CHECK(before.rng.equal(s.rng));
  CHECK(s.model.module->is_training());

  // Against a direct computation in eval mode.
  s.model.module->eval();
  torch::NoGradGuard g;
  const auto out = s.model.forward(data.inputs);
  s.model.module->train();
  const double acc = out.argmax(1).eq(data.targets).to(torch::kDouble).mean().item<double>();
  const double loss = torch::nn::functional::cross_entropy(out, data.targets).item<double>();
  CHECK(m->at("all").at("accuracy") == Approx(acc).epsilon(1e-12));
  CHECK(m->at("all").at("loss") == Approx(loss).epsilon(1e-5));
  CHECK(m->at("all").at("top1_accuracy") == m->at("all").at("accuracy"));
  CHECK(m->at("all").at("top4_accuracy") == 1.0);  // 4 classes
  CHECK(m->at("all").at("top9_accuracy") == 1.0);  // k beyond the 4 classes: every class is in the top k
  CHECK(m->at("all").at("accuracy") > 0.8);
  CHECK(m->count("head") == 1);
}

TEST_CASE("eval errors name the set", "[eval][errors]") {
  const auto s = test::new_state();
  baton::Dataset broken{torch::zeros({3, 8}), torch::zeros({2}, torch::kLong), "broken"};
  auto m = baton::eval({.sets = {{"bad", broken}}}, s);
  REQUIRE_FALSE(m);
  CHECK_THAT(m.error().to_string(), Catch::Contains("eval set \"bad\""));
  auto z = baton::eval({.sets = {{"ok", test::blobs(10)}}, .batch_size = 0}, s);
  CHECK_FALSE(z);
}
