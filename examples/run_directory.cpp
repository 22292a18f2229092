// A C++ curriculum with a run directory, in one call: what `baton run` gives a TOML file
// (config, metrics.jsonl/csv, checkpoints, resume after a crash or Ctrl-C, final state, report).
//
//   run_directory RUN_DIR              a three-stage chain written in C++ (synthetic data)
//   run_directory RUN_DIR FILE.toml    a TOML curriculum through the same call
//
// Exit codes as `baton run`: 0 done, 1 failed, 3 interrupted (run it again to resume).
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <baton/baton.hpp>

using namespace baton::literals;

namespace {
baton::Expected<baton::RunResult> cpp_chain(const std::filesystem::path& dir) {
  auto train = baton::data::synthetic({.samples = 2000, .features = 16, .classes = 4, .seed = 3, .sample_seed = {}});
  auto test = baton::data::synthetic({.samples = 500, .features = 16, .classes = 4, .seed = 3, .sample_seed = 99});
  if (!train || !test) return tl::unexpected((train ? test : train).error());
  const baton::TrainingSpec warmup{
      .name = "warmup",
      .data = {.train = *train, .batch_size = 32},
      .optimizer = baton::optim::sgd({.lr = 0.05, .momentum = 0.9}),
      .schedule = baton::schedule::linear_warmup("20ba"_t, baton::schedule::constant()),
      .duration = "1ep"_t,
  };
  const auto main_stage = warmup.with_name("main")
                              .with_optimizer(baton::optim::adam({.lr = 2e-3}), baton::Carry::fresh)
                              .with_schedule(baton::schedule::cosine(), baton::Clock::stage)
                              .with_algorithms({baton::algorithms::ema({.decay = 0.99})})
                              .with_duration("2ep"_t);
  const auto finetune = main_stage.with_name("finetune")
                            .with_batch_size(64)
                            .with_lr(5e-4)
                            .with_algorithms({})
                            .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"test", *test}}}})
                            .with_duration("1ep"_t);
  auto state = baton::init_state(baton::models::mlp({16, 32, 4}), {.seed = 7, .max_duration = "4ep"_t});
  if (!state) return tl::unexpected(state.error());
  return baton::run({.dir = dir, .name = "cpp-chain", .checkpoint_every = "25ba"_t}, {warmup, main_stage, finetune},
                    std::move(*state));
}

baton::Expected<baton::RunResult> toml_curriculum(const std::filesystem::path& dir, const std::string& file) {
  return baton::load_curriculum(file).and_then([&](const baton::Curriculum& cur) {
    return cur.specs().and_then([&](const std::vector<baton::TrainingSpec>& specs) {
      return cur.init().and_then([&](baton::TrainState s) {
        auto options = cur.run_options();
        options.dir = dir;
        return baton::run(options, specs, std::move(s));
      });
    });
  });
}
}  // namespace

int main(int argc, char** argv) {
  baton::relaunch_with_thread_policy(argv);  // OpenMP's and OpenBLAS's idle threads sleep (runtime.hpp)
  if (argc < 2) {
    fmt::print(stderr, "usage: run_directory RUN_DIR [FILE.toml]\n");
    return 2;
  }
  if (auto rt = baton::configure_runtime(); !rt) fmt::print(stderr, "{}\n", rt.error().to_string());
  auto result = argc >= 3 ? toml_curriculum(argv[1], argv[2]) : cpp_chain(argv[1]);
  if (!result) {
    fmt::print(stderr, "run_directory: {}\n", result.error().to_string());
    return 1;
  }
  if (result->interrupted) {
    fmt::print(stderr, "interrupted at batch {}; checkpoint written to {}; run again to resume\n",
               result->state.time.batch, result->checkpoint.string());
    return 3;
  }
  fmt::print("\n{}params_sha256={}\n", result->summary(), baton::params_sha256(result->state));
  return 0;
}
