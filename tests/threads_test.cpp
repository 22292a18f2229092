// "Pure" includes threads: fits, copies, loads and evaluations of different states in different
// threads give exactly the bits of the same calls made one after another, and evaluating one const
// state from several threads is safe and leaves it untouched (docs/threads.md).
#include <sstream>
#include <thread>

#include "helpers.hpp"

namespace {

constexpr int kThreads = 4;
constexpr int kRepetitions = 20;

/// Different work per thread: its own seed, data and length (4-7 batches of a Dropout model).
baton::TrainingSpec spec_for(int i) {
  return test::spec(test::blobs(200, 10 + static_cast<std::uint64_t>(i)), baton::Time::batches(4 + i));
}

/// Runs `work(i)` in kThreads threads at once, started together.
template <class F>
void in_threads(F work) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      work(i);
    });
  for (auto& t : threads) t.join();
}

std::string params_text(const baton::TrainState& s) {
  std::ostringstream out;
  for (const auto& [name, t] : s.named_parameters()) out << name << ' ' << t.sum().item<double>() << '\n';
  return out.str();
}

}  // namespace

TEST_CASE("fits of different states in 4 threads x 20 repetitions give the sequential bits, RNG included",
          "[threads][purity]") {
  std::vector<baton::TrainState> expected;
  for (int i = 0; i < kThreads; ++i) expected.push_back(test::ok(baton::fit(spec_for(i), test::new_state(100 + i))));
  // The runs differ from each other, so a swap of their results or RNG streams would show.
  REQUIRE_FALSE(expected[0].rng.equal(expected[1].rng));
  int mismatches = 0;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    std::vector<baton::Expected<baton::TrainState>> got(kThreads, tl::unexpected(baton::Error{}));
    const auto starts = [&] {
      std::vector<baton::TrainState> v;
      for (int i = 0; i < kThreads; ++i) v.push_back(test::new_state(100 + i));
      return v;
    }();
    in_threads([&](int i) { got[i] = baton::fit(spec_for(i), starts[i]); });
    for (int i = 0; i < kThreads; ++i) {
      if (!got[i]) FAIL(got[i].error().to_string());
      if (!baton::bitwise_equal(*got[i], expected[i]) || !got[i]->rng.equal(expected[i].rng)) ++mismatches;
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("copying, saving and loading states in other threads while fits run changes no fit's bits",
          "[threads][purity]") {
  test::TempDir tmp;
  const auto expected = test::ok(baton::fit(spec_for(0), test::new_state(7)));
  const auto other = test::new_state(8);
  const auto path = tmp.path / "other.baton";
  REQUIRE(baton::save_checkpoint(other, path));
  for (int rep = 0; rep < kRepetitions; ++rep) {
    baton::Expected<baton::TrainState> fitted = tl::unexpected(baton::Error{});
    std::atomic<bool> done{false};
    std::atomic<int> copies{0};
    std::atomic<bool> copies_equal{true};
    std::thread fitter([&] {
      fitted = baton::fit(spec_for(0), test::new_state(7));
      done = true;
    });
    std::thread copier([&] {
      while (!done) {
        baton::TrainState c = other;  // the factory runs: Linear's init draws random numbers
        auto loaded = baton::load_checkpoint(path, test::bn_dropout_mlp());
        if (!loaded || !baton::bitwise_equal(c, other) || !baton::bitwise_equal(*loaded, other)) copies_equal = false;
        copies.fetch_add(1);
      }
    });
    fitter.join();
    copier.join();
    if (!fitted) FAIL(fitted.error().to_string());
    INFO("repetition " << rep << ", " << copies.load() << " copies made during the fit");
    CHECK(copies_equal.load());
    test::require_same_bits(*fitted, expected);
  }
}

TEST_CASE("eval of one const state from 4 threads: the sequential metrics every time, the state untouched",
          "[threads][purity][eval]") {
  auto data = test::blobs(300, 21);
  // Trained a little, so BatchNorm's running statistics differ from their initial values.
  const baton::TrainState state = test::ok(baton::fit(test::spec(data, baton::Time::batches(3)), test::new_state(3)));
  const baton::TrainState before = state;
  const baton::EvalSpec spec{.sets = {{"blobs", data}}, .loss = baton::loss::cross_entropy(), .batch_size = 32};
  const auto expected = baton::eval(spec, state);
  REQUIRE(expected);
  int mismatches = 0;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    std::vector<baton::Expected<baton::Metrics>> got(kThreads, tl::unexpected(baton::Error{}));
    in_threads([&](int i) { got[i] = baton::eval(spec, state); });
    for (const auto& m : got) {
      if (!m) FAIL(m.error().to_string());
      if (*m != *expected) ++mismatches;
    }
  }
  CHECK(mismatches == 0);
  CHECK(state.model.module->is_training());
  test::require_same_bits(state, before);
  CHECK(params_text(state) == params_text(before));
}
