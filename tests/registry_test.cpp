// A user's optimizer, schedule, algorithm and callback, registered by name and named in TOML.
#include <fmt/format.h>

#include "baton/algorithms.hpp"
#include "baton/hparams.hpp"
#include "helpers.hpp"

namespace {
/// The registry a user's program makes: the built-ins and one of each kind of its own.
baton::Registry mine(int* callback_events) {
  auto registry = baton::Registry::builtin();
  registry.optimizers["heavy_ball"] = {{"lr", "beta"}, [](const baton::Params& p) -> baton::Expected<baton::Optimizer> {
    const double beta = p.count("beta") ? std::get<double>(p.at("beta")) : 0.9;
    if (!(beta >= 0 && beta < 1)) return baton::fail(baton::ErrorCode::invalid_argument, fmt::format("beta must be in [0, 1), got {}", beta));
    return test::heavy_ball(p.count("lr") ? std::get<double>(p.at("lr")) : 0.05, beta);
  }, "heavy ball momentum: lr, beta"};
  registry.schedules["halve"] = {{"every"}, [](const baton::Params& p) -> baton::Expected<baton::Schedule> {
    return baton::schedule::step(*baton::Time::parse(std::get<std::string>(p.at("every"))), 0.5);
  }};
  registry.algorithms["count_steps"] = {{}, [](const baton::Params&) -> baton::Expected<baton::Algorithm> {
    baton::Algorithm a{.name = "count_steps", .identity = "count_steps v1"};
    a.batch_end = [](const baton::AlgorithmContext&, const baton::TrainState&, baton::Algorithm::Tensors& m) {
      m["n"] = m.count("n") ? m["n"] + 1 : torch::ones({}, torch::kLong);
    };
    return a;
  }};
  registry.callbacks["tally"] = {{}, [callback_events](const baton::Params&) -> baton::Expected<baton::Callback> {
    return baton::Callback{.name = "tally", .on_event = [callback_events](const baton::EventView& e) -> std::optional<std::string> {
      if (e.event == baton::Event::batch_end) ++*callback_events;
      return std::nullopt;
    }, .observer = true};
  }};
  return registry;
}

}  // namespace

TEST_CASE("a user's optimizer, schedule, algorithm and callback are named in TOML like the built-ins", "[hparams][registry]") {
  int events = 0;
  const auto registry = mine(&events);
  auto cur = baton::parse_curriculum(test::mlp_curriculum(R"(
optimizer = { name = "heavy_ball", lr = 0.02, beta = 0.8, groups = [{ patterns = ["*.bias"], lr = 0.01 }] }
schedule = { name = "halve", every = "4ba", warmup = "2ba" }
algorithms = { count_steps = {}, ema = { decay = 0.9 } }
callbacks = { tally = {} }
)"), "mine.toml", {}, registry);
  REQUIRE(cur);
  const auto spec = test::ok(cur->stages()[0].build());
  CHECK(spec.optimizer.kind() == "heavy_ball");
  CHECK(spec.optimizer.lr() == 0.02);
  REQUIRE(spec.optimizer.groups.size() == 1);
  REQUIRE(spec.algorithms.size() == 2);
  CHECK(spec.algorithms[0].name == "ema");  // the built-ins first, in their order
  CHECK(spec.algorithms[1].name == "count_steps");
  const auto s = test::ok(baton::fit(spec, test::ok(cur->init())));
  CHECK(s.optimizer.kind == "heavy_ball");
  CHECK(s.algorithm_state.at("count_steps").at("n").item<std::int64_t>() == 10);
  CHECK(events == 10);
  // The 10th step is at 9 batches: 7 into "halve" after the 2-batch warm-up, so halved once.
  CHECK(s.history.back().last_lr == Approx(0.02 * 0.5));
  // The same file without the registry is an error that names the place and what is known.
  auto plain = baton::parse_curriculum(test::mlp_curriculum(R"(optimizer = { name = "heavy_ball" })"), "plain.toml");
  REQUIRE(plain);
  auto checked = plain->validate();
  REQUIRE_FALSE(checked);
  CHECK_THAT(checked.error().message, Catch::Contains("plain.toml:") && Catch::Contains("unknown optimizer \"heavy_ball\""));
}

TEST_CASE("names of the registry's own: did-you-mean over both, unknown keys and their errors at the file's place", "[hparams][registry]") {
  int events = 0;
  const auto registry = mine(&events);
  auto problems = [&](const std::string& keys) {
    auto cur = baton::parse_curriculum(test::mlp_curriculum(keys), "bad.toml", {}, registry);
    if (!cur) return cur.error().message;
    auto spec = cur->stages()[0].build();
    return spec ? std::string("no error") : spec.error().message;
  };
  CHECK_THAT(problems(R"(optimizer = { name = "heavy_bal" })"),
             Catch::Contains("unknown optimizer \"heavy_bal\" (did you mean \"heavy_ball\"?)") && Catch::Contains("adamw"));
  CHECK_THAT(problems(R"(optimizer = { name = "lamm" })"), Catch::Contains("did you mean \"lamb\"?"));
  CHECK_THAT(problems(R"(optimizer = { name = "heavy_ball", betta = 0.5 })"),
             Catch::Contains("optimizer \"heavy_ball\": unknown key \"betta\" (did you mean \"beta\"?)"));
  CHECK_THAT(problems(R"(optimizer = { name = "heavy_ball", beta = 1.5 })"),
             Catch::Contains("bad.toml:") && Catch::Contains("optimizer \"heavy_ball\": beta must be in [0, 1), got 1.5"));
  CHECK_THAT(problems(R"(schedule = { name = "halv", every = "2ba" })"), Catch::Contains("(did you mean \"halve\"?)"));
  CHECK_THAT(problems(R"(algorithms = { count_step = {} })"), Catch::Contains("(did you mean \"count_steps\"?)"));
  CHECK_THAT(problems(R"(callbacks = { taly = {} })"), Catch::Contains("(did you mean \"tally\"?)"));
}

TEST_CASE("optimizer.chain names gradient transforms in TOML: the bits of the same chain in C++, yours by the registry", "[hparams][registry][chain]") {
  auto registry = baton::Registry::builtin();
  registry.transforms["halve"] = {{}, [](const baton::Params&) -> baton::Expected<baton::GradientTransform> {
    baton::GradientTransform t{.name = "halve", .identity = "halve v1"};
    t.apply = [](const std::vector<torch::Tensor>&, std::vector<torch::Tensor>& grads) { for (auto& g : grads) g.mul_(0.5); };
    return t;
  }};
  const auto cur = test::ok(baton::parse_curriculum(test::mlp_curriculum(R"(
optimizer = { name = "sgd", lr = 0.05, momentum = 0.9, chain = [{ name = "add_decayed_weights", rate = 0.01 }, { name = "clip_by_value", limit = 0.5 }, { name = "halve" }] }
)"), "chain.toml", {}, registry));
  const auto spec = test::ok(cur.stages()[0].build());
  REQUIRE(spec.optimizer.transforms.size() == 3);
  CHECK(spec.optimizer.transforms[0].identity == "add_decayed_weights(0.01)");
  CHECK(spec.optimizer.transforms[2].identity == "halve v1");
  // The same chain written in C++: the same weights after the same training.
  auto cxx = spec;
  cxx.optimizer = baton::optim::chain({baton::optim::add_decayed_weights(0.01), baton::optim::clip_by_value(0.5)},
                                      baton::optim::sgd({.lr = 0.05, .momentum = 0.9}));
  cxx.optimizer.transforms.push_back(spec.optimizer.transforms[2]);
  const auto a = test::ok(baton::fit(spec, test::ok(cur.init())));
  const auto b = test::ok(baton::fit(cxx, test::ok(cur.init())));
  test::require_same_bits(a, b);
  const auto plain = test::ok(baton::fit(spec.with_optimizer(baton::optim::sgd({.lr = 0.05, .momentum = 0.9}), baton::Carry::fresh),
                                         test::ok(cur.init())));
  CHECK_FALSE(plain.named_parameters()[0].second.equal(a.named_parameters()[0].second));  // the chain did something

  // Bad entries: an unknown transform (did you mean), an unknown key, a bad value, an entry without a name.
  for (const auto& [keys, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"(optimizer = { name = "sgd", chain = [{ name = "clip_by_valeu" }] })", "did you mean \"clip_by_value\""},
           {R"(optimizer = { name = "sgd", chain = [{ name = "clip_by_value", max = 1.0 }] })", "unknown key \"max\""},
           {R"(optimizer = { name = "sgd", chain = [{ name = "clip_by_global_norm", max_norm = -1.0 }] })", "max_norm must be a finite number > 0"},
           {R"(optimizer = { name = "sgd", chain = [{ limit = 1.0 }] })", "each entry is a table with a name"},
           {R"(optimizer = { name = "sgd", chain = { name = "halve" } })", "expected an array of tables"}}) {
    INFO(keys);
    const auto bad = baton::parse_curriculum(test::mlp_curriculum(keys + "\n"), "bad.toml", {}, registry);
    REQUIRE(bad);
    const auto built = bad->stages()[0].build();
    REQUIRE_FALSE(built);
    CHECK_THAT(built.error().to_string(), Catch::Contains(expected) && Catch::Contains("bad.toml:"));
  }
}
