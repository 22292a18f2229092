// Data-parallel training on c10d (Gloo), loopback only: two ranks run as two threads of this
// process (each its own process group over a FileStore), or as processes under `baton launch`.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {

fs::path dist_dir(const std::string& name) { return test::temp_dir("dist-" + name); }

/// Runs `body(rank, group)` on `world` threads, each rank joined to its own Gloo group over a
/// fresh FileStore; returns each rank's result (or the error of its join). No Catch assertions
/// run off the main thread.
template <class R>
std::vector<baton::Expected<R>> on_ranks(int world, const std::function<baton::Expected<R>(int, std::shared_ptr<const baton::Distributed>)>& body,
                                         std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  static int counter = 0;
  const auto store = dist_dir(fmt::format("store{}", counter++)) / "store";
  std::vector<baton::Expected<R>> results(static_cast<std::size_t>(world),
                                          tl::unexpected(baton::Error{baton::ErrorCode::runtime, "not run", {}}));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto group = baton::Distributed::join(
          {.rank = r, .world_size = world, .store_file = store, .timeout = timeout});
      if (!group) {
        results[static_cast<std::size_t>(r)] = tl::unexpected(group.error());
        return;
      }
      results[static_cast<std::size_t>(r)] = body(r, *group);
    });
  for (auto& t : threads) t.join();
  fs::remove_all(store.parent_path());
  return results;
}

using test::ok;

/// Without Dropout: in-process ranks share LibTorch's global generator, so the tests that compare
/// against one process keep training free of random draws. BatchNorm is kept where buffers matter.
baton::ModelFactory bn_mlp() {
  return baton::model_factory([] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::Linear(8, 16), nn::BatchNorm1d(16), nn::ReLU(), nn::Linear(16, 4));
  });
}
baton::ModelFactory plain_mlp() {
  return baton::model_factory([] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::Linear(8, 32), nn::Tanh(), nn::Linear(32, 4));
  });
}

/// Built on the main thread only: init_state draws from LibTorch's global generator, which the
/// in-process ranks share (two threads building models at once would interleave their draws).
baton::TrainState state_of(const baton::ModelFactory& f, std::uint64_t seed = 3) {
  auto s = baton::init_state(f, {.seed = seed, .max_duration = baton::Time::epochs(10)});
  REQUIRE(s.has_value());
  return std::move(*s);
}

torch::Tensor flat_params(const baton::TrainState& s) {
  std::vector<torch::Tensor> parts;
  for (const auto& [name, p] : s.named_parameters()) parts.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(parts);
}

/// An algorithm that records what each step does: the sample ids of the batch (column 0 of the
/// inputs holds the id) and the parameters after the update.
struct Recorder {
  std::map<std::int64_t, std::vector<std::int64_t>> ids;   // global batch number -> this rank's ids
  std::vector<torch::Tensor> params;                        // after every step
  std::vector<torch::Tensor> buffers;                       // after every step, as float64
  baton::Algorithm algorithm() {
    baton::Algorithm a;
    a.name = "recorder";
    a.after_data = [this](const baton::AlgorithmContext& ctx, baton::Batch b) {
      auto& v = ids[ctx.time.batch];
      auto col = b.inputs.select(1, 0).round().to(torch::kLong);
      for (std::int64_t i = 0; i < col.size(0); ++i) v.push_back(col[i].item<std::int64_t>());
      return b;
    };
    a.batch_end = [this](const baton::AlgorithmContext&, const baton::TrainState& s, baton::Algorithm::Tensors&) {
      params.push_back(flat_params(s));
      std::vector<torch::Tensor> parts;
      for (const auto& [name, b] : s.named_buffers()) parts.push_back(b.detach().reshape({-1}).to(torch::kDouble));
      buffers.push_back(parts.empty() ? torch::zeros({0}, torch::kDouble) : torch::cat(parts));
    };
    return a;
  }
};

/// Blobs whose first input column is the sample's id (the rest as test::blobs).
baton::Dataset with_ids(std::int64_t n) {
  auto d = test::blobs(n, 11);
  auto x = d.inputs.clone();
  x.select(1, 0).copy_(torch::arange(n, torch::kFloat));
  return *baton::make_dataset(x, d.targets, "ids");
}

}  // namespace

TEST_CASE("process group options come from the launcher's environment, with clear errors", "[distributed]") {
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "5", 1);
  auto bad = baton::dist_options_from_env();
  REQUIRE_FALSE(bad.has_value());
  CHECK_THAT(bad.error().message, Catch::Contains("RANK=\"5\""));
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_PORT", "12345", 1);
  ::setenv("BATON_DIST_TIMEOUT", "7", 1);
  ::unsetenv("LOCAL_RANK");
  auto good = baton::dist_options_from_env();
  REQUIRE(good.has_value());
  CHECK(good->rank == 1);
  CHECK(good->local_rank == 1);
  CHECK(good->world_size == 2);
  CHECK(good->master_port == 12345);
  CHECK(good->timeout == std::chrono::seconds(7));
  ::setenv("MASTER_PORT", "http", 1);
  auto port = baton::dist_options_from_env();
  REQUIRE_FALSE(port.has_value());
  CHECK_THAT(port.error().message, Catch::Contains("MASTER_PORT"));
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_PORT", "BATON_DIST_TIMEOUT"}) ::unsetenv(v);
  auto missing = baton::dist_options_from_env();
  REQUIRE_FALSE(missing.has_value());
  CHECK_THAT(missing.error().message, Catch::Contains("WORLD_SIZE is not set"));
  CHECK_FALSE(baton::launched_distributed());
  auto wrong = baton::Distributed::join({.rank = 2, .world_size = 2});
  REQUIRE_FALSE(wrong.has_value());
  CHECK_THAT(wrong.error().message, Catch::Contains("rank 2 of world size 2"));
}

TEST_CASE("2 ranks: after every step the ranks' parameters and buffers are bitwise identical", "[distributed]") {
  const auto data = test::blobs(300);  // batch 40: the last global batch (20) is cut 10 + 10
  std::array<Recorder, 2> rec;
  const auto init = state_of(bn_mlp());  // (models are built on the main thread: see state_of)
  auto results = on_ranks<baton::TrainState>(2, [&](int r, std::shared_ptr<const baton::Distributed> g) {
    auto spec = test::spec(data, baton::Time::epochs(2)).with_batch_size(40).with_distributed(g).with_algorithms(
        {rec[static_cast<std::size_t>(r)].algorithm()});
    // Different initial weights on rank 1: fit must start every rank from rank 0's.
    baton::TrainState s = init;
    if (r == 1) {
      torch::NoGradGuard no_grad;
      for (auto& [name, p] : s.named_parameters()) p.add_(0.1);
    }
    return baton::fit(spec, std::move(s));
  });
  auto s0 = ok(results[0]), s1 = ok(results[1]);
  REQUIRE(rec[0].params.size() == 16);  // 8 batches per epoch
  REQUIRE(rec[1].params.size() == rec[0].params.size());
  for (std::size_t i = 0; i < rec[0].params.size(); ++i) {
    INFO("step " << i);
    REQUIRE(rec[0].params[i].equal(rec[1].params[i]));
    // Rank 1's own forward updated its BatchNorm statistics from its shard: rank 0's replace them
    // within the step, so evaluations and algorithms on any rank see the same state.
    REQUIRE(rec[0].buffers[i].equal(rec[1].buffers[i]));
  }
  CHECK_FALSE(rec[0].params.front().equal(rec[0].params.back()));  // it trained
  CHECK_FALSE(rec[0].buffers.front().equal(rec[0].buffers.back()));
  // The whole states (buffers, optimizer moments, time) end equal too. (Not the RNG state here:
  // in-process ranks share LibTorch's one global generator, which fit swaps in and out.)
  REQUIRE(baton::bitwise_equal(s0, s1));
  CHECK(s0.time.sample == 600);  // the timestamp counts global samples
}

TEST_CASE("2 ranks: a parameter no backward reaches keeps no gradient, a NaN on one rank skips the step on both",
          "[distributed]") {
  // The flags that travel in the gradient buckets (which parameters have a gradient) and in the
  // step's early all-reduce (a non-finite loss) must reach every rank.
  const auto data = test::blobs(320);  // batch 40: 8 steps per epoch, 20 samples per rank
  const auto factory = baton::model_factory([] {
    namespace nn = torch::nn;
    nn::Sequential seq(nn::Linear(8, 32), nn::Tanh(), nn::Linear(32, 4));
    seq->register_parameter("unused", torch::ones({3}));
    return seq;
  });
  const auto init = state_of(factory);
  auto poison = [](int rank) {
    baton::Algorithm a;
    a.name = "poison";
    a.after_data = [rank](const baton::AlgorithmContext& ctx, baton::Batch b) {
      if (rank == 1 && ctx.time.batch == 3) b.inputs = b.inputs.clone().fill_(std::nan(""));
      return b;
    };
    return a;
  };
  auto results = on_ranks<baton::TrainState>(2, [&](int r, std::shared_ptr<const baton::Distributed> g) {
    const auto spec = test::spec(data, baton::Time::epochs(1))
                          .with_batch_size(40)
                          .with_optimizer(baton::optim::sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1}),
                                          baton::Carry::fresh)
                          .with_non_finite(baton::NonFinite::skip)
                          .with_algorithms({poison(r)})
                          .with_distributed(g);
    return baton::fit(spec, init);
  });
  const auto s0 = ok(results[0]), s1 = ok(results[1]);
  REQUIRE(baton::bitwise_equal(s0, s1));
  CHECK(s0.history.back().skipped_batches == 1);  // rank 0's own loss was finite: it learned from rank 1
  CHECK(s1.history.back().skipped_batches == 1);
  CHECK(s0.time.batch == 8);
  std::map<std::string, torch::Tensor> before;
  for (const auto& [name, p] : init.named_parameters()) before[name] = p;
  REQUIRE(before.count("unused") == 1);
  for (const auto& [name, p] : s0.named_parameters()) {
    INFO(name);
    // A zero gradient would have let weight decay shrink it; no gradient leaves it alone.
    if (name == "unused") CHECK(p.equal(torch::ones({3})));
    else CHECK_FALSE(p.equal(before.at(name)));
  }
}

TEST_CASE("2 ranks x batch 64 equal 1 rank x batch 128 within float tolerance after 50 steps", "[distributed]") {
  const auto data = test::blobs(3001);  // 24 batches per epoch; the last has 57 samples: 29 + 28
  struct Case {
    std::string name;
    baton::Optimizer opt;
    std::int64_t grad_accum;
    std::optional<double> clip;
  };
  for (const auto& c : {Case{"sgd momentum, grad accumulation 2, clip 0.5", baton::optim::sgd({.lr = 0.05, .momentum = 0.9}), 2, 0.5},
                        Case{"adam", baton::optim::adam({.lr = 0.003}), 1, std::nullopt},
                        Case{"a user's update rule (heavy ball, a scalar slot)", test::heavy_ball(0.02), 1, 1.0}}) {
    SECTION(c.name) {
      const auto spec = test::spec(data, baton::Time::batches(50))
                            .with_batch_size(128)
                            .with_optimizer(c.opt, baton::Carry::fresh)
                            .with_grad_accum(c.grad_accum)
                            .with_clip_grad_norm(c.clip);
      const auto one = test::ok(baton::fit(spec, state_of(plain_mlp())));
      const auto init = state_of(plain_mlp());
      auto results = on_ranks<baton::TrainState>(2, [&](int, std::shared_ptr<const baton::Distributed> g) {
        return baton::fit(spec.with_distributed(g), init);
      });
      auto two = ok(results[0]);
      REQUIRE(baton::bitwise_equal(two, ok(results[1])));
      CHECK(two.time.batch == 50);
      CHECK(two.time.sample == one.time.sample);
      const auto a = flat_params(one), b = flat_params(two);
      const double diff = (a - b).abs().max().item<double>();
      const double moved = (a - flat_params(state_of(plain_mlp()))).abs().max().item<double>();
      INFO("max |1 rank - 2 ranks| = " << diff << ", max weight change " << moved);
      CHECK(diff < 1e-5);  // measured: ~1e-7 (float summation order)
      CHECK(moved > 1e-2);  // trained far more than the tolerance
      CHECK(two.history.back().last_loss == Approx(one.history.back().last_loss).epsilon(1e-4));
    }
  }
}

TEST_CASE("2 ranks: token cross-entropy weighs each rank by its real tokens, as one process does", "[distributed][text]") {
  // Samples with 1 to 16 real tokens (the rest padding, -100): whatever the ranks' halves of a
  // global batch, they hold different numbers of real tokens. A mean of per-rank means would
  // weigh a padded rank's tokens more than one process does.
  const std::int64_t n = 256, T = 16;
  const auto inputs = (torch::arange(n * T, torch::kLong) * 7919).remainder(258).view({n, T});
  auto targets = inputs.roll(-1, 1).clone();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto real = 1 + (i * 37 + i / 7) % T;
    targets[i].narrow(0, real, T - real).fill_(-100);
  }
  const auto data = ok(baton::make_dataset(inputs, targets, "padded tokens"));
  const auto gpt = baton::models::gpt({.block_size = T, .n_layer = 1, .n_head = 2, .n_embd = 16});
  const baton::TrainingSpec spec{.data = {.train = data, .batch_size = 32},
                                 .loss = baton::loss::token_cross_entropy(),
                                 .optimizer = baton::optim::sgd({.lr = 0.5}),
                                 .duration = baton::Time::batches(16)};
  const auto one = ok(baton::fit(spec, state_of(gpt)));
  const auto init = state_of(gpt);
  auto results = on_ranks<baton::TrainState>(2, [&](int, std::shared_ptr<const baton::Distributed> g) {
    return baton::fit(spec.with_distributed(g), init);
  });
  const auto two = ok(results[0]);
  REQUIRE(baton::bitwise_equal(two, ok(results[1])));
  const auto a = flat_params(one), b = flat_params(two);
  const double diff = (a - b).abs().max().item<double>();
  const double moved = (a - flat_params(init)).abs().max().item<double>();
  INFO("max |1 rank - 2 ranks| = " << diff << ", max weight change " << moved);
  CHECK(diff < 1e-5);  // measured: 2.3e-6 (float summation order)
  CHECK(moved > 1e-2);
  CHECK(two.history.back().last_loss == Approx(one.history.back().last_loss).epsilon(1e-4));

  // The same loss without its token count (each rank's mean weighted by its samples) misses one
  // process by far more than the tolerance: what the check above would catch.
  auto per_rank_mean = spec;
  per_rank_mean.loss.units = nullptr;
  auto unweighted = on_ranks<baton::TrainState>(2, [&](int, std::shared_ptr<const baton::Distributed> g) {
    return baton::fit(per_rank_mean.with_distributed(g), init);
  });
  const double wrong = (a - flat_params(ok(unweighted[0]))).abs().max().item<double>();
  INFO("max |1 rank - 2 ranks weighted by samples| = " << wrong);
  CHECK(wrong > 1e-4);
}

TEST_CASE("2 ranks: SAM equals a two-pass data-parallel SAM loop written by hand, bit for bit", "[distributed][sam]") {
  // Each pass's gradient is the global batch's: both passes all-reduce (the step up the gradient
  // uses the global gradient's norm). By hand: each rank's shard, its loss weighted by its share,
  // one all-reduce per pass, torch::optim::SGD.
  const auto data = test::blobs(256);
  const double rho = 0.05;
  const baton::TrainingSpec spec{.data = {.train = data, .batch_size = 32, .shuffle = false},
                                 .optimizer = baton::optim::sgd({.lr = 0.1, .momentum = 0.9}),
                                 .algorithms = {baton::algorithms::sam({.rho = rho})},
                                 .duration = baton::Time::batches(8)};
  const auto init = state_of(plain_mlp());
  using Pair = std::pair<baton::TrainState, baton::TrainState>;
  auto results = on_ranks<Pair>(2, [&](int, std::shared_ptr<const baton::Distributed> g) -> baton::Expected<Pair> {
    auto ours = baton::fit(spec.with_distributed(g), init);
    if (!ours) return tl::unexpected(ours.error());
    baton::TrainState ref = init;
    auto params = ref.model.module->parameters();
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto [at, size] = g->shard(32);
    const double weight = static_cast<double>(size) / 32.0;
    auto gradient = [&](const torch::Tensor& x, const torch::Tensor& y) {
      for (auto& p : params) p.mutable_grad().reset();
      auto loss = torch::nn::functional::cross_entropy(ref.model.forward(x), y);
      (loss * weight).backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : params) grads.push_back(p.grad());
      return g->all_reduce(grads, baton::Distributed::Op::sum, "by hand");
    };
    for (std::int64_t step = 0; step < 8; ++step) {
      const auto x = data.inputs.narrow(0, step * 32 + at, size), y = data.targets.narrow(0, step * 32 + at, size);
      if (auto ok = gradient(x, y); !ok) return tl::unexpected(ok.error());
      std::vector<torch::Tensor> saved, norms;
      {
        torch::NoGradGuard no_grad;
        for (auto& p : params) norms.push_back(p.grad().norm(2));
        const double scale = rho / (torch::stack(norms).norm(2).item<double>() + 1e-12);
        for (auto& p : params) saved.push_back(p.clone()), p.add_(p.grad() * scale);
      }
      if (auto ok = gradient(x, y); !ok) return tl::unexpected(ok.error());
      {
        torch::NoGradGuard no_grad;
        for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
      }
      opt.step();
    }
    return Pair{std::move(*ours), std::move(ref)};
  });
  const auto r0 = ok(results[0]), r1 = ok(results[1]);
  REQUIRE(baton::bitwise_equal(r0.first, r1.first));
  CHECK(r0.first.time.batch == 8);
  const auto ours = r0.first.named_parameters(), hand = r0.second.named_parameters(), start = init.named_parameters();
  REQUIRE(ours.size() == hand.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    INFO(ours[i].first);
    CHECK(ours[i].second.equal(hand[i].second));
    CHECK_FALSE(ours[i].second.equal(start[i].second));
  }
}

TEST_CASE("resume a 2-rank run on 1 rank and on 2 ranks: every global batch holds the same sample ids", "[distributed]") {
  const auto data = with_ids(500);  // batch 64: 8 batches per epoch, the last of 52 (26 + 26)
  const auto dir = dist_dir("resume");
  auto spec = test::spec(data, baton::Time::batches(30)).with_batch_size(64);
  // The reference: one process, 30 steps.
  Recorder ref;
  test::ok(baton::fit(spec.with_algorithms({ref.algorithm()}), state_of(plain_mlp())));
  REQUIRE(ref.ids.size() == 30);

  // 2 ranks for 11 steps (into the second epoch); rank 0 writes a checkpoint at the end.
  std::array<Recorder, 2> first;
  const auto ckpt_spec = spec.with_checkpoints({.dir = dir, .every = baton::Time::batches(11), .at_stage_end = false});
  const auto init = state_of(plain_mlp());
  auto r1 = on_ranks<baton::TrainState>(2, [&](int r, std::shared_ptr<const baton::Distributed> g) {
    return baton::fit(ckpt_spec.with_distributed(g).with_algorithms({first[static_cast<std::size_t>(r)].algorithm()}), init,
                      baton::Time::batches(11));
  });
  ok(r1[0]), ok(r1[1]);
  const auto ckpt = dir / "ckpt-0000000011.baton";
  REQUIRE(fs::exists(ckpt));

  // Resume on 1 rank and on 2 ranks, to batch 30.
  Recorder single;
  auto loaded = baton::load_checkpoint(ckpt, plain_mlp());
  REQUIRE(loaded.has_value());
  const auto rest = spec;  // the rest of the stage
  const auto one = test::ok(baton::fit(rest.with_algorithms({single.algorithm()}), *loaded));
  std::array<Recorder, 2> second;
  auto r2 = on_ranks<baton::TrainState>(2, [&](int r, std::shared_ptr<const baton::Distributed> g) {
    return baton::fit(rest.with_distributed(g).with_algorithms({second[static_cast<std::size_t>(r)].algorithm()}), *loaded);
  });
  const auto two = ok(r2[0]);
  CHECK(one.time.batch == 30);
  CHECK(two.time.batch == 30);
  CHECK(two.time.sample == one.time.sample);

  auto sorted = [](std::vector<std::int64_t> v) { return std::sort(v.begin(), v.end()), v; };
  for (std::int64_t b = 0; b < 30; ++b) {
    INFO("global batch " << b);
    const auto& expected = ref.ids.at(b);
    if (b < 11) {
      // Each rank's shard is a contiguous piece of the global batch, rank 0's first.
      std::vector<std::int64_t> joined = first[0].ids.at(b);
      joined.insert(joined.end(), first[1].ids.at(b).begin(), first[1].ids.at(b).end());
      CHECK(joined == expected);
      CHECK(first[0].ids.at(b).size() == (expected.size() + 1) / 2);
    } else {
      CHECK(single.ids.at(b) == expected);
      std::vector<std::int64_t> joined = second[0].ids.at(b);
      joined.insert(joined.end(), second[1].ids.at(b).begin(), second[1].ids.at(b).end());
      CHECK(joined == expected);
    }
    CHECK(sorted(expected).size() == std::set<std::int64_t>(expected.begin(), expected.end()).size());
  }
  fs::remove_all(dir);
}

TEST_CASE("2 ranks reading packed shards with workers cut the global batches of one process in memory", "[distributed][data_scale]") {
  const auto data = with_ids(500);
  const auto dir = dist_dir("shards");
  REQUIRE(baton::data::pack(data, dir / "ids", {.records_per_shard = 128, .pixels = {}}).has_value());
  auto shards = baton::data::shards(dir / "ids");
  REQUIRE(shards.has_value());
  auto spec = test::spec(data, baton::Time::batches(12)).with_batch_size(64);
  Recorder ref;
  test::ok(baton::fit(spec.with_algorithms({ref.algorithm()}), state_of(plain_mlp())));
  auto lazy = spec.with_train_data(*shards);
  auto d = lazy.data;
  d.workers = 2, d.prefetch = 3;
  lazy = lazy.with_data(d);
  std::array<Recorder, 2> ranks;
  const auto init = state_of(plain_mlp());
  auto r = on_ranks<baton::TrainState>(2, [&](int k, std::shared_ptr<const baton::Distributed> g) {
    return baton::fit(lazy.with_distributed(g).with_algorithms({ranks[static_cast<std::size_t>(k)].algorithm()}), init);
  });
  ok(r[0]), ok(r[1]);
  REQUIRE(ref.ids.size() == 12);
  for (std::int64_t b = 0; b < 12; ++b) {
    INFO("global batch " << b);
    std::vector<std::int64_t> joined = ranks[0].ids.at(b);
    joined.insert(joined.end(), ranks[1].ids.at(b).begin(), ranks[1].ids.at(b).end());
    CHECK(joined == ref.ids.at(b));
  }
  fs::remove_all(dir);
}

TEST_CASE("ranks that start from different states fail with an error naming both positions, no hang", "[distributed]") {
  const auto data = test::blobs(200);
  const auto spec = test::spec(data, baton::Time::batches(3)).with_batch_size(20);
  const auto init = state_of(plain_mlp());
  const auto ahead = test::ok(baton::fit(spec, init, baton::Time::batches(1)));
  const auto t0 = std::chrono::steady_clock::now();
  auto results = on_ranks<baton::TrainState>(2, [&](int r, std::shared_ptr<const baton::Distributed> g) {
    return baton::fit(spec.with_distributed(g), r == 0 ? init : ahead);
  });
  REQUIRE_FALSE(results[1].has_value());
  CHECK_THAT(results[1].error().message, Catch::Contains("rank 1 starts at batch 1") && Catch::Contains("rank 0 at batch 0") &&
                                             Catch::Contains("the same checkpoint"));
  // Rank 0 learns that its peer left at its next collective, long before the 30 s timeout.
  REQUIRE_FALSE(results[0].has_value());
  CHECK_THAT(results[0].error().message, Catch::Contains("distributed: rank 0 of 2"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(25));
}

TEST_CASE("a rank that hangs makes the other fail with an error when the timeout expires", "[distributed]") {
  const auto data = test::blobs(200);
  const auto spec = test::spec(data, baton::Time::batches(5)).with_batch_size(20);
  const auto init = state_of(plain_mlp());
  const auto t0 = std::chrono::steady_clock::now();
  auto results = on_ranks<double>(
      2,
      [&](int r, std::shared_ptr<const baton::Distributed> g) -> baton::Expected<double> {
        if (r == 1) {  // joined, then silent for longer than the timeout
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return 0.0;
        }
        auto s = baton::fit(spec.with_distributed(g), init);
        if (s) return 0.0;
        return tl::unexpected(s.error());
      },
      std::chrono::seconds(2));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_FALSE(results[0].has_value());
  CHECK_THAT(results[0].error().message, Catch::Contains("rank 0 of 2") && Catch::Contains("timeout, 2 s"));
  CHECK(waited < 15);
}

TEST_CASE("evaluation across 2 ranks equals one process's metrics, every kind of metric, an empty shard too", "[distributed]") {
  const auto test_set = test::blobs(301, 5, "test");  // 151 + 150 samples
  const auto state = state_of(bn_mlp());
  // A float target of the output's shape for the regression metrics (the same model's logits).
  torch::manual_seed(3);
  const auto values = baton::Dataset{test_set.inputs, torch::randn({301, 4}), "values"};
  namespace metric = baton::metric;
  const std::vector<baton::Metric> class_metrics = {metric::accuracy(), metric::top_k_accuracy(2), metric::f1(),
                                                    metric::balanced_accuracy(), metric::confusion_matrix()};
  // "one": a set of 1 sample leaves rank 1 an empty shard; its statistics take their shape from rank 0.
  const baton::EvalSpec spec{.sets = {{"test", test_set}, {"one", test_set.head(1)}}, .batch_size = 64,
                             .metrics = class_metrics};
  const baton::EvalSpec regression{.sets = {{"values", values}, {"one_value", values.head(1)}},
                                   .loss = baton::loss::mse(), .batch_size = 64,
                                   .metrics = {metric::mae(), metric::mse(), metric::rmse(), metric::r2()}};
  for (const auto* e : {&spec, &regression}) {
    const auto one = baton::eval(*e, state);
    REQUIRE(one.has_value());
    auto results = on_ranks<baton::Metrics>(2, [&](int, std::shared_ptr<const baton::Distributed> g) {
      baton::EvalSpec s = *e;
      s.distributed = g;
      return baton::eval(s, state);
    });
    for (int r = 0; r < 2; ++r) {
      const auto m = ok(results[static_cast<std::size_t>(r)]);
      REQUIRE(m.size() == one->size());
      for (const auto& [set, vs] : *one) {
        REQUIRE(m.at(set).size() == vs.size());
        for (const auto& [k, v] : vs) {
          INFO("rank " << r << ": " << set << "/" << k);
          // Counts are exact; float values differ in rounding only.
          if (e == &spec && k != "loss") CHECK(m.at(set).at(k) == v);
          else CHECK(m.at(set).at(k) == Approx(v).epsilon(1e-6));  // a shard cut into other batches: float32 outputs differ in the last bits
        }
      }
    }
    if (e == &spec) CHECK(one->at("test").count("confusion_matrix/3/3") == 1);
  }
}

namespace {
struct Proc {
  int rc;
  std::string out;  // stdout and stderr
  double seconds;
};

Proc timed_shell(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = test::shell(cmd);
  return {r.rc, std::move(r.out), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

const char* kDistToml = R"(
[run]
name = "dist"
seed = 4
max_duration = "30ep"
checkpoint_every = "100ba"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.train]
kind = "synthetic"
samples = 200
[defaults]
batch_size = 10
optimizer = { name = "sgd", lr = 0.01, momentum = 0.9 }
[[stages]]
name = "main"
duration = "30ep"
)";
}  // namespace

TEST_CASE("kill one rank: the other stops with the error within the timeout, the launcher names it, a re-run resumes",
          "[distributed][launch]") {
  const auto dir = dist_dir("kill");
  std::ofstream(dir / "c.toml") << kDistToml;
  const auto run_dir = dir / "run";
  const std::string run = fmt::format("{} run {} --run-dir {}", BATON_EXE, (dir / "c.toml").string(), run_dir.string());
  // Rank 1 is killed with SIGKILL as soon as the first checkpoint exists: in the middle of training.
  const auto first_ckpt = run_dir / "checkpoints" / "ckpt-0000000100.baton";
  const std::string script = fmt::format(
      "if [ \"$RANK\" = 1 ]; then (while [ ! -e {} ]; do sleep 0.02; done; kill -9 $$) & fi; exec {}", first_ckpt.string(), run);
  // A timeout of 60 s, so that "well within it" holds with room under ASan on a busy machine
  // (the kill went 21.5 s with a 20 s bound there once, without waiting for the timeout).
  const auto killed = timed_shell(fmt::format("BATON_DIST_TIMEOUT=60 {} launch -n 2 --grace 120 -- sh -c '{}'", BATON_EXE, script));
  INFO(killed.out);
  CHECK(killed.rc == 1);
  CHECK_THAT(killed.out, Catch::Contains("baton launch: rank 1 failed (killed by signal 9"));
  // Rank 0 stopped by itself, with an error that says what happened, well within the timeout.
  CHECK_THAT(killed.out, Catch::Contains("distributed: rank 0 of 2: the ") && Catch::Contains("Another rank has died"));
  CHECK_THAT(killed.out, Catch::Contains("rank 0: exit code 1"));
  CHECK_FALSE(killed.out.find("remaining rank") != std::string::npos);  // no SIGTERM was needed
  CHECK(killed.seconds < 45);  // rank 0 did not wait for the 60 s timeout
  REQUIRE_FALSE(fs::is_empty(run_dir / "checkpoints"));
  CHECK_FALSE(fs::exists(run_dir / "final.baton"));

  // Running again resumes from the last checkpoint and finishes; only rank 0 wrote files.
  const auto again = timed_shell(run + " --nproc 2");
  INFO(again.out);
  CHECK(again.rc == 0);
  CHECK_THAT(again.out, Catch::Contains("resuming from " + (run_dir / "checkpoints").string()));
  CHECK(fs::exists(run_dir / "final.baton"));
  CHECK_FALSE(fs::exists(run_dir / "rank-1"));
  fs::remove_all(dir);
}

TEST_CASE("the launcher killed (SIGKILL) or hung up (SIGHUP): its ranks stop with a checkpoint, the lock is released, a re-run resumes",
          "[distributed][launch]") {
  const auto dir = dist_dir("launcher");
  // 2000 batches: the signal, sent once batch 100 is checkpointed, lands well inside training.
  std::string toml = kDistToml;
  for (auto at = toml.find("30ep"); at != std::string::npos; at = toml.find("30ep")) toml.replace(at, 4, "100ep");
  std::ofstream(dir / "c.toml") << toml;
  const auto run_dir = dir / "run";
  const std::string run = fmt::format("{} run {} --run-dir {} --nproc 2", BATON_EXE, (dir / "c.toml").string(), run_dir.string());
  const auto first_ckpt = run_dir / "checkpoints" / "ckpt-0000000100.baton";
  // The launcher in the background, signalled once the first interval checkpoint exists; the
  // output ends when every process writing to it (the ranks too) has ended.
  auto signal_launcher = [&](const char* sig) {
    return timed_shell(fmt::format("( {} & L=$!; while [ ! -e {} ]; do sleep 0.02; done; kill -{} $L; wait $L; echo \"launcher: $?\" )",
                             run, first_ckpt.string(), sig));
  };
  auto lock_free = [&] {
    const int fd = ::open((run_dir / ".lock").c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);
    return free;
  };

  SECTION("SIGKILL") {
    const auto killed = signal_launcher("KILL");
    INFO(killed.out);
    CHECK_THAT(killed.out, Catch::Contains("launcher: 137"));
    // Rank 0 got SIGTERM when its parent died: it finished its batch and wrote a checkpoint.
    CHECK_THAT(killed.out, Catch::Contains("interrupted at epoch") && Catch::Contains("checkpoint written to"));
    CHECK(killed.seconds < 60);
  }
  SECTION("SIGHUP: forwarded as SIGTERM; every rank stops with exit 3, and so does the launcher") {
    const auto hung_up = signal_launcher("HUP");
    INFO(hung_up.out);
    CHECK_THAT(hung_up.out, Catch::Contains("launcher: 3"));
    CHECK_THAT(hung_up.out, Catch::Contains("interrupted at epoch") && Catch::Contains("checkpoint written to"));
  }
  CHECK(lock_free());
  CHECK_FALSE(fs::exists(run_dir / "final.baton"));
  const auto again = timed_shell(run);
  INFO(again.out);
  CHECK(again.rc == 0);
  CHECK_THAT(again.out, Catch::Contains("resuming from " + (run_dir / "checkpoints").string()));
  CHECK(fs::exists(run_dir / "final.baton"));
  fs::remove_all(dir);
}

TEST_CASE("baton run --nproc 2 on a run directory another run holds: exit 2 (invalid input), as one process gives",
          "[distributed][launch]") {
  const auto dir = dist_dir("busy");
  std::ofstream(dir / "c.toml") << kDistToml;
  const auto run_dir = (dir / "run").string();
  // Long enough to be training still when the second command comes (it is stopped below).
  auto holder = test::spawn(BATON_EXE, {"run", (dir / "c.toml").string(), "--run-dir", run_dir, "--set",
                                        "run.max_duration=\"3000ep\"", "--set", "stage.main.duration=\"3000ep\""});
  std::string log;
  REQUIRE(test::read_until(holder, "[main] epoch", log));  // training: it holds the directory
  const auto busy = timed_shell(fmt::format("{} run {} --run-dir {} --nproc 2", BATON_EXE, (dir / "c.toml").string(), run_dir));
  INFO(busy.out);
  CHECK(busy.rc == 2);
  CHECK_THAT(busy.out, Catch::Contains("in use by another baton run"));
  ::kill(holder.pid, SIGTERM);
  CHECK(test::finish(holder, log) == 3);
  fs::remove_all(dir);
}
