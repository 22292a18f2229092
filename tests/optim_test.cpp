// baton's optimizers against torch::optim, bit for bit, over several steps.
#include "baton/testing.hpp"
#include "baton/text.hpp"
#include "helpers.hpp"

namespace {
template <class TorchOptim, class TorchOptions>
void compare(const baton::Optimizer& ours, TorchOptions theirs) {
  const auto data = test::blobs(64);
  auto factory = baton::models::mlp({8, 6, 4});
  auto state = baton::init_state(factory, {.seed = 9, .max_duration = baton::Time::epochs(10)});
  REQUIRE(state);
  baton::TrainState reference = *state;  // same initial weights
  auto params = reference.model.module->parameters();
  TorchOptim opt(params, theirs);
  const baton::TrainingSpec spec{.data = {.train = data, .batch_size = 16, .shuffle = false},
                                 .optimizer = ours};
  baton::TrainState s = std::move(*state);
  for (int step = 0; step < 8; ++step) {
    const baton::Batch batch{data.inputs.narrow(0, (step % 4) * 16, 16), data.targets.narrow(0, (step % 4) * 16, 16)};
    auto r = baton::train_step(spec, std::move(s), batch);
    REQUIRE(r);
    s = std::move(r->state);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(reference.model.forward(batch.inputs), batch.targets);
    loss.backward();
    opt.step();
    CHECK(r->loss == loss.template item<double>());
  }
  const auto a = s.named_parameters(), b = reference.named_parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].second.equal(b[i].second));
  }
}
}  // namespace

TEST_CASE("SGD matches torch::optim::SGD bit for bit", "[optim]") {
  using torch::optim::SGD;
  using torch::optim::SGDOptions;
  compare<SGD>(baton::optim::sgd({.lr = 0.1}), SGDOptions(0.1));
  compare<SGD>(baton::optim::sgd({.lr = 0.1, .momentum = 0.9}), SGDOptions(0.1).momentum(0.9));
  compare<SGD>(baton::optim::sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-3}),
               SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(1e-3));
  compare<SGD>(baton::optim::sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true}),
               SGDOptions(0.1).momentum(0.9).weight_decay(1e-2).nesterov(true));
}

TEST_CASE("Adam matches torch::optim::Adam bit for bit", "[optim]") {
  using torch::optim::Adam;
  using torch::optim::AdamOptions;
  compare<Adam>(baton::optim::adam({.lr = 1e-2}), AdamOptions(1e-2));
  compare<Adam>(baton::optim::adam({.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 1e-2}),
                AdamOptions(1e-2).betas({0.8, 0.99}).eps(1e-6).weight_decay(1e-2));
  compare<Adam>(baton::optim::adam({.lr = 1e-2, .amsgrad = true}), AdamOptions(1e-2).amsgrad(true));
}

TEST_CASE("optimizer options are validated with field names", "[optim]") {
  auto e = baton::optim::sgd({.lr = -1, .momentum = 1.5}).validate();
  REQUIRE_FALSE(e);
  CHECK_THAT(e.error().message, Catch::Contains("optimizer.lr") && Catch::Contains("optimizer.momentum"));
  CHECK_FALSE(baton::optim::sgd({.lr = 0.1, .nesterov = true}).validate());
  CHECK_FALSE(baton::optim::adam({.beta1 = 1.0}).validate());
  CHECK_FALSE(baton::optim::adam({.eps = 0}).validate());
  CHECK(baton::optim::adam({}).validate());
  CHECK(baton::optim::sgd({}).with_lr(0.5).lr() == 0.5);
}

TEST_CASE("keeping moments of another optimizer kind is an error that suggests fresh", "[optim][carry]") {
  const auto data = test::blobs(100);
  auto s = test::ok(baton::fit(test::spec(data, baton::Time::batches(2)), test::new_state()));
  auto adam_keep = test::spec(data, baton::Time::batches(2)).with_name("adam-stage").with_optimizer(baton::optim::adam(), baton::Carry::keep);
  auto r = baton::fit(adam_keep, s);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("Carry::fresh"));
  auto fresh = baton::fit(adam_keep.with_optimizer_carry(baton::Carry::fresh), s);
  REQUIRE(fresh);
  CHECK(fresh->optimizer.kind == "adam");
  CHECK(fresh->optimizer.params.begin()->second.step == 2);  // started from empty moments
}

TEST_CASE("AdamW, RMSprop and Adagrad match torch::optim bit for bit", "[optim]") {
  using namespace torch::optim;
  compare<AdamW>(baton::optim::adamw({.lr = 1e-2}), AdamWOptions(1e-2));
  compare<AdamW>(baton::optim::adamw({.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true}),
                 AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true));
  compare<RMSprop>(baton::optim::rmsprop({.lr = 1e-2}), RMSpropOptions(1e-2));
  compare<RMSprop>(baton::optim::rmsprop({.lr = 1e-2, .alpha = 0.9, .weight_decay = 1e-2, .momentum = 0.5, .centered = true}),
                   RMSpropOptions(1e-2).alpha(0.9).weight_decay(1e-2).momentum(0.5).centered(true));
  compare<Adagrad>(baton::optim::adagrad({.lr = 0.1}), AdagradOptions(0.1));
  compare<Adagrad>(baton::optim::adagrad({.lr = 0.1, .lr_decay = 0.01, .weight_decay = 1e-2, .initial_accumulator_value = 0.1}),
                   AdagradOptions(0.1).lr_decay(0.01).weight_decay(1e-2).initial_accumulator_value(0.1));
}

TEST_CASE("the built-ins are update rules: a rule of yours around AdamW's keeps torch::optim's bits", "[optim][rules]") {
  using namespace torch::optim;
  const auto builtin = baton::optim::adamw({.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
  CHECK(builtin.rule.name == "adamw");
  CHECK(builtin.rule.slots == std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
  CHECK(baton::optim::sgd({.momentum = 0.9}).rule.slots == std::vector<std::string>{"momentum_buffer"});
  auto calls = std::make_shared<int>(0);
  baton::UpdateRule counted = builtin.rule;
  counted.name = "counted_adamw";
  counted.identity = "counted " + builtin.rule.identity;
  counted.update = [inner = builtin.rule.update, calls](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>& s,
                                                        std::int64_t step, double lr, double wd) {
    ++*calls;
    inner(p, g, s, step, lr, wd);
  };
  compare<AdamW>(baton::optim::rule(counted), AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true));
  CHECK(*calls == 8 * 4);  // 8 steps of the mlp's 4 parameters, all through the rule of yours
  // A built-in's bad options are the rule's problems, reported by validate as before.
  const auto bad = baton::optim::rmsprop({.alpha = 1.5, .eps = 0}).validate();
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("optimizer.alpha: must be in [0, 1), got 1.5; optimizer.eps: must be > 0"));
}

TEST_CASE("parameter groups by name pattern: their own lr and weight decay", "[optim][groups]") {
  const auto data = test::blobs(128);
  auto s = test::new_state();
  // bn_dropout_mlp: 0 = Linear(8,16), 1 = BatchNorm1d, 4 = Linear(16,4)
  auto sp = test::spec(data, baton::Time::epochs(1))
                .with_optimizer(baton::optim::sgd({.lr = 0.1, .weight_decay = 1e-2})
                                    .with_groups({{.patterns = {"0.*"}, .lr = 0.0},
                                                  {.patterns = {"*.bias", "1.*"}, .weight_decay = 0.0}}),
                                baton::Carry::fresh);
  auto trained = test::ok(baton::fit(sp, s));
  const auto before = s.named_parameters(), after = trained.named_parameters();
  for (std::size_t i = 0; i < before.size(); ++i) {
    INFO(before[i].first);
    const bool first_layer = before[i].first.rfind("0.", 0) == 0;
    CHECK(before[i].second.equal(after[i].second) == first_layer);  // lr 0: unchanged; others trained
  }
  auto typo = sp.with_optimizer(baton::optim::sgd({.lr = 0.1}).with_groups({{.patterns = {"backbone.*"}, .lr = 0.0}}),
                                baton::Carry::fresh);
  auto r = baton::fit(typo, s);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("backbone.*") && Catch::Contains("match no parameter") &&
                                    Catch::Contains("0.weight"));
}

TEST_CASE("optimizers are built by name, with errors that list valid names and keys", "[optim][names]") {
  auto sgd = baton::optim::from_name("sgd", {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}});
  REQUIRE(sgd);
  CHECK(sgd->kind() == "sgd");
  CHECK_THAT(sgd->rule.identity, Catch::Contains("nesterov=true"));
  for (const auto& name : baton::optim::names()) CHECK(baton::optim::from_name(name, {{"lr", 0.01}}));
  auto unknown = baton::optim::from_name("adamm", {});
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().message, Catch::Contains("unknown optimizer \"adamm\"") && Catch::Contains("did you mean") &&
                                          Catch::Contains("rmsprop"));
  auto key = baton::optim::from_name("adam", {{"betas1", 0.9}});
  REQUIRE_FALSE(key);
  CHECK_THAT(key.error().message, Catch::Contains("unknown key \"betas1\"") && Catch::Contains("beta1"));
  auto negative = baton::optim::from_name("sgd", {{"lr", -0.1}});
  REQUIRE_FALSE(negative);
  CHECK_THAT(negative.error().message, Catch::Contains("optimizer.lr") && Catch::Contains("-0.1"));
  auto type = baton::optim::from_name("sgd", {{"nesterov", 1.0}});
  REQUIRE_FALSE(type);
  CHECK_THAT(type.error().message, Catch::Contains("optimizer.nesterov: expected true or false"));
}

TEST_CASE("parameter groups by module type: AdamW without decay on biases, LayerNorm and embeddings of a GPT", "[optim][gpt]") {
  std::vector<baton::text::Record> records;
  for (int i = 0; i < 80; ++i) records.push_back({"some text number " + std::to_string(i), "en", "t"});
  const auto data = test::ok(baton::text::lm_windows(records, {.block_size = 16}));
  const baton::models::GptOptions o{.block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
  auto s = test::ok(baton::init_state(baton::models::gpt(o), {.seed = 3, .max_duration = baton::Time::batches(3)}));
  // lr 0 on the group: its parameters must come out unchanged, and only they.
  baton::TrainingSpec spec{.data = {.train = data, .batch_size = 4},
                           .loss = baton::loss::token_cross_entropy(),
                           .optimizer = baton::optim::adamw({.lr = 1e-2}).with_groups(
                               {{.patterns = {"*.bias"}, .modules = {"LayerNorm", "Embedding"}, .lr = 0.0}}),
                           .duration = baton::Time::batches(3)};
  const auto before = s.model.module->named_parameters();
  std::map<std::string, torch::Tensor> start;
  for (const auto& p : before) start[p.key()] = p.value().clone();
  const auto after = test::ok(baton::fit(spec, s));
  std::size_t in_group = 0;
  for (const auto& p : after.model.module->named_parameters()) {
    const auto& n = p.key();
    const bool group = n.ends_with(".bias") || n.find("ln_") != std::string::npos || n == "wte.weight" || n == "wpe.weight";
    INFO(n);
    CHECK(p.value().equal(start.at(n)) == group);
    in_group += group;
  }
  CHECK(in_group == 12);  // wte, wpe; ln_1, ln_2 and ln_f weight and bias; the 4 Linear biases

  auto typo = spec;
  typo.optimizer = baton::optim::adamw({}).with_groups({{.modules = {"LayerNrom"}, .weight_decay = 0.0}});
  const auto r = baton::fit(typo, s);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("modules LayerNrom match no parameter") &&
                                    Catch::Contains("modules holding parameters: Embedding, LayerNorm, Linear"));
}

namespace {
/// Trains `ours` by train_step for 6 batches beside a copy of the same model whose parameters
/// `reference(step, params, grads)` updates; the weights must agree to float rounding.
void against_equations(const baton::Optimizer& ours,
                       const std::function<void(std::int64_t, std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&)>& reference) {
  const auto data = test::blobs(64);
  auto s = test::ok(baton::init_state(baton::models::mlp({8, 6, 4}), {.seed = 9, .max_duration = baton::Time::epochs(10)}));
  const baton::TrainState init = s;
  baton::TrainState ref = s;
  const baton::TrainingSpec spec{.data = {.train = data, .batch_size = 16, .shuffle = false}, .optimizer = ours};
  for (std::int64_t step = 1; step <= 6; ++step) {
    const baton::Batch batch{data.inputs.narrow(0, (step % 4) * 16, 16), data.targets.narrow(0, (step % 4) * 16, 16)};
    s = test::ok(baton::train_step(spec, std::move(s), batch)).state;
    auto params = ref.model.module->parameters();
    for (auto& p : params) p.mutable_grad().reset();
    torch::nn::functional::cross_entropy(ref.model.forward(batch.inputs), batch.targets).backward();
    std::vector<torch::Tensor> grads, values;
    for (auto& p : params) grads.push_back(p.grad().clone()), values.push_back(p.detach().clone());
    reference(step, values, grads);
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(values[i]);
  }
  const auto a = s.named_parameters(), b = ref.named_parameters();
  double moved = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first << ": max difference " << (a[i].second - b[i].second).abs().max().item<double>());
    CHECK(torch::allclose(a[i].second, b[i].second, 1e-5, 1e-6));
    moved = std::max(moved, (a[i].second - init.named_parameters()[i].second).abs().max().item<double>());
  }
  CHECK(moved > 1e-3);  // it trained
}
}  // namespace

TEST_CASE("Lion follows its published update equations", "[optim][rules]") {
  // Chen et al. 2023, Algorithm 2: c = b1 m + (1 - b1) g; p -= lr (sign(c) + wd p); m = b2 m + (1 - b2) g.
  const double lr = 3e-3, b1 = 0.9, b2 = 0.99, wd = 0.1;
  std::vector<torch::Tensor> m;
  against_equations(baton::optim::lion({.lr = lr, .beta1 = b1, .beta2 = b2, .weight_decay = wd}),
                    [&](std::int64_t, std::vector<torch::Tensor>& p, const std::vector<torch::Tensor>& g) {
                      if (m.empty()) for (const auto& t : p) m.push_back(torch::zeros_like(t));
                      for (std::size_t i = 0; i < p.size(); ++i) {
                        const auto c = b1 * m[i] + (1 - b1) * g[i];
                        p[i] = p[i] - lr * (torch::sign(c) + wd * p[i]);
                        m[i] = b2 * m[i] + (1 - b2) * g[i];
                      }
                    });
  CHECK(baton::optim::lion().kind() == "lion");
  CHECK(baton::optim::slot_count(baton::optim::lion()) == 1);
}

TEST_CASE("LAMB follows its published update equations", "[optim][rules]") {
  // You et al. 2020, Algorithm 2: Adam's bias-corrected m / (sqrt(v) + eps) plus wd p, scaled by
  // the trust ratio ||p|| / ||r|| per parameter tensor.
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-6, wd = 0.01;
  std::vector<torch::Tensor> m, v;
  against_equations(baton::optim::lamb({.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd}),
                    [&](std::int64_t t, std::vector<torch::Tensor>& p, const std::vector<torch::Tensor>& g) {
                      if (m.empty()) for (const auto& x : p) m.push_back(torch::zeros_like(x)), v.push_back(torch::zeros_like(x));
                      for (std::size_t i = 0; i < p.size(); ++i) {
                        m[i] = b1 * m[i] + (1 - b1) * g[i];
                        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
                        const auto m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
                        const auto r = m_hat / (torch::sqrt(v_hat) + eps) + wd * p[i];
                        const double pn = p[i].norm().item<double>(), rn = r.norm().item<double>();
                        p[i] = p[i] - lr * (pn > 0 && rn > 0 ? pn / rn : 1.0) * r;
                      }
                    });
}

TEST_CASE("Adafactor follows its published update equations, with factored moments that checkpoint and resume", "[optim][rules]") {
  // Shazeer & Stern 2018, Algorithm 4 (factored second moment, written with sums as in the paper)
  // with update clipping (section 6, d) and relative step sizes (section 8): beta2 = 1 - t^-0.8,
  // rho = min(lr, 1/sqrt(t)), alpha = max(eps2, RMS(p)) rho, p -= alpha U / max(1, RMS(U) / d).
  const double lr = 1e-2, eps1 = 1e-30, eps2 = 1e-3, d = 1.0, wd = 0.05;
  std::vector<torch::Tensor> R, C, V;
  auto rms = [](const torch::Tensor& t) { return std::sqrt(t.square().mean().item<double>()); };
  against_equations(baton::optim::adafactor({.lr = lr, .weight_decay = wd}),
                    [&](std::int64_t t, std::vector<torch::Tensor>& p, const std::vector<torch::Tensor>& g) {
                      if (V.empty())
                        for (const auto& x : p) {
                          V.push_back(torch::zeros_like(x));
                          R.push_back(x.dim() == 2 ? torch::zeros({x.size(0)}) : torch::Tensor());
                          C.push_back(x.dim() == 2 ? torch::zeros({x.size(1)}) : torch::Tensor());
                        }
                      const double beta2 = 1 - std::pow(static_cast<double>(t), -0.8);
                      const double rho = std::min(lr, 1 / std::sqrt(static_cast<double>(t)));
                      for (std::size_t i = 0; i < p.size(); ++i) {
                        const auto sq = g[i] * g[i] + eps1;
                        torch::Tensor v;
                        if (p[i].dim() == 2) {
                          R[i] = beta2 * R[i] + (1 - beta2) * sq.sum(1);  // (G^2 + eps1) 1_m
                          C[i] = beta2 * C[i] + (1 - beta2) * sq.sum(0);  // 1_n^T (G^2 + eps1)
                          v = torch::outer(R[i], C[i]) / R[i].sum();
                        } else {
                          V[i] = beta2 * V[i] + (1 - beta2) * sq;
                          v = V[i];
                        }
                        const auto u = g[i] / torch::sqrt(v);
                        const auto u_hat = u / std::max(1.0, rms(u) / d);
                        const double alpha = std::max(eps2, rms(p[i])) * rho;
                        p[i] = p[i] * (1 - lr * wd) - alpha * u_hat;
                      }
                    });
  // A [n, m] weight keeps n + m numbers; a 4-d kernel factors its last two dimensions.
  const auto data = test::blobs(300);
  const auto spec = test::spec(data, baton::Time::epochs(2)).with_optimizer(baton::optim::adafactor({.lr = 0.05}), baton::Carry::fresh);
  const auto whole = test::ok(baton::fit(spec, test::new_state()));
  const auto& slots = whole.optimizer.params.at("0.weight").slots;
  REQUIRE(slots.size() == 2);
  const auto weight = whole.named_parameters().at(0).second;
  REQUIRE(weight.dim() == 2);
  CHECK(slots[0].sizes() == torch::IntArrayRef{weight.size(0)});
  CHECK(slots[1].sizes() == torch::IntArrayRef{weight.size(1)});
  const auto conv = baton::optim::update(baton::optim::adafactor(), torch::randn({4, 3, 5, 5}), torch::randn({4, 3, 5, 5}), {}, 1e-2, 0);
  CHECK(conv.state.slots.at(0).sizes() == torch::IntArrayRef{4, 3, 5});
  CHECK(conv.state.slots.at(1).sizes() == torch::IntArrayRef{4, 3, 5});
  // Split, checkpointed and resumed: the bits of one fit.
  const test::TempDir dir;
  auto half = test::ok(baton::fit(spec, test::new_state(), baton::Time::batches(9)));
  REQUIRE(baton::save_checkpoint(half, dir.path / "c.baton"));
  test::require_same_bits(whole, test::ok(baton::fit(spec, test::ok(baton::load_checkpoint(dir.path / "c.baton", test::bn_dropout_mlp())))));
  // Named in TOML's way, with its keys checked.
  const auto named = test::ok(baton::optim::from_name("adafactor", {{"lr", 0.01}, {"relative_step", false}, {"decay_rate", -0.5}}));
  CHECK_THAT(named.rule.identity, Catch::Contains("decay_rate=-0.5") && Catch::Contains("relative_step=false"));
  const auto bad = baton::optim::from_name("adafactor", {{"decay_rate", 0.5}});
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("optimizer.decay_rate: must be < 0"));
}

TEST_CASE("an update rule of your own trains, splits, checkpoints and resumes as a built-in does", "[optim][rules]") {
  const auto data = test::blobs(300);
  const auto spec = test::spec(data, baton::Time::epochs(3)).with_optimizer(test::heavy_ball(), baton::Carry::fresh);
  const auto whole = test::ok(baton::fit(spec, test::new_state()));
  const auto& slots = whole.optimizer.params.at("0.weight").slots;
  REQUIRE(slots.size() == 2);
  CHECK(slots[1].dim() == 0);  // a slot of its own shape
  CHECK(slots[1].item<double>() > 0);
  CHECK(whole.optimizer.kind == "heavy_ball");

  const test::TempDir dir;
  auto half = test::ok(baton::fit(spec, test::new_state(), baton::Time::batches(13)));
  REQUIRE(baton::save_checkpoint(half, dir.path / "c.baton"));
  auto loaded = test::ok(baton::load_checkpoint(dir.path / "c.baton", test::bn_dropout_mlp()));
  test::require_same_bits(whole, test::ok(baton::fit(spec, std::move(loaded))));

  // Its moments continue only under its own name; it says what is wrong with it, by field.
  auto other = baton::fit(spec.with_name("next").with_optimizer(baton::optim::adam(), baton::Carry::keep), half);
  REQUIRE_FALSE(other);
  CHECK_THAT(other.error().message, Catch::Contains("heavy_ball moments") && Catch::Contains("fresh"));
  baton::UpdateRule nameless{.name = "mine"};
  auto bad = baton::optim::rule(nameless).validate();
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("identity") && Catch::Contains("update function"));
  CHECK_FALSE(baton::optim::lion({.beta2 = 1.5}).validate());
}

namespace {
/// Bit for bit but for the history (which records the spec's settings: its grad norm, its lr).
void same_training(baton::TrainState a, baton::TrainState b) {
  a.history.clear(), b.history.clear();
  INFO(baton::first_difference(a, b).value_or("equal"));
  CHECK(baton::bitwise_equal(a, b));
}
}  // namespace

TEST_CASE("chain: gradient transforms before the update, bit-equal to what they stand for", "[optim][chain]") {
  using torch::optim::SGD;
  using torch::optim::SGDOptions;
  namespace optim = baton::optim;
  // Coupled weight decay as a link equals torch::optim::SGD's own weight_decay.
  compare<SGD>(optim::chain({optim::add_decayed_weights(1e-2)}, optim::sgd({.lr = 0.1, .momentum = 0.9})),
               SGDOptions(0.1).momentum(0.9).weight_decay(1e-2));
  // Clipping as links equals the spec's clipping (one implementation), and does clip.
  const auto data = test::blobs(300);
  const auto base = test::spec(data, baton::Time::epochs(2));
  const auto by_spec = test::ok(baton::fit(base.with_clip_grad_norm(0.05).with_clip_grad_value(0.004), test::new_state()));
  const auto by_chain = test::ok(baton::fit(
      base.with_optimizer(optim::chain({optim::clip_by_global_norm(0.05), optim::clip_by_value(0.004)}, base.optimizer),
                          baton::Carry::fresh),
      test::new_state()));
  same_training(by_spec, by_chain);
  CHECK_FALSE(baton::bitwise_equal(by_chain, test::ok(baton::fit(base, test::new_state()))));
}

TEST_CASE("chain: a transform of your own sees every gradient at once and keeps splits and resumes exact", "[optim][chain]") {
  namespace optim = baton::optim;
  // Gradient centralization over all parameters, and a link that replaces tensors rather than
  // changing them in place.
  auto seen = std::make_shared<std::size_t>(0);
  baton::GradientTransform centre{.name = "centralize", .identity = "centralize v1"};
  centre.apply = [seen](const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& grads) {
    *seen = std::max(*seen, grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      REQUIRE(grads[i].sizes() == params[i].sizes());
      if (grads[i].dim() > 1) grads[i].sub_(grads[i].mean({1}, true));
    }
  };
  baton::GradientTransform halve{.name = "halve", .identity = "halve v1"};
  halve.apply = [](const std::vector<torch::Tensor>&, std::vector<torch::Tensor>& grads) {
    for (auto& g : grads) g = g * 0.5;
  };
  const auto data = test::blobs(300);
  const auto base = test::spec(data, baton::Time::epochs(2));
  const auto spec = base.with_optimizer(optim::chain({centre, halve}, optim::adam({.lr = 0.01})), baton::Carry::fresh);
  const auto state = test::new_state();
  CHECK(baton::testing::split_invariant(spec, state, {baton::Time::batches(5), baton::Time::samples(250)}));
  CHECK(baton::testing::resume_invariant(spec, state, baton::Time::batches(11)));
  CHECK(*seen == 6);  // every parameter of the MLP (2 Linear, 1 BatchNorm: weights and biases), in one call
  const auto with = test::ok(baton::fit(spec, state));
  CHECK_FALSE(baton::bitwise_equal(with, test::ok(baton::fit(spec.with_optimizer(optim::adam({.lr = 0.01}), baton::Carry::fresh), state))));
  // A halving link under plain SGD equals half the learning rate (both exact in binary).
  const auto halved = test::ok(baton::fit(base.with_optimizer(optim::chain({halve}, optim::sgd({.lr = 0.1})), baton::Carry::fresh), state));
  same_training(halved, test::ok(baton::fit(base.with_optimizer(optim::sgd({.lr = 0.05}), baton::Carry::fresh), state)));

  baton::GradientTransform nameless{.name = "mine"};
  const auto bad = optim::chain({nameless, optim::clip_by_global_norm(-1)}, optim::sgd()).validate();
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("optimizer.transforms[0]") && Catch::Contains("apply function") &&
                                      Catch::Contains("identity") &&
                                      Catch::Contains("clip_by_global_norm: max_norm must be a finite number > 0, got -1"));
}
