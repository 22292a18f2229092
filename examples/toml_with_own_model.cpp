// A TOML curriculum trained with a model of your own, in a few lines of C++.
//
//   toml_with_own_model examples/fashion_mnist.toml [--set path=value]...
//
// The file's [model] is replaced by `Net` below; everything else (data, stages, optimizers,
// schedules, carry-over) comes from the file.
#include <iostream>

#include <fmt/format.h>
#include <torch/torch.h>

#include <baton/baton.hpp>

namespace {
struct NetImpl : torch::nn::Module {
  NetImpl()
      : features(register_module("features", torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 256),
                                                                     torch::nn::ReLU()))),
        head(register_module("head", torch::nn::Linear(256, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(features->forward(x)); }
  torch::nn::Sequential features;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);
}  // namespace

int main(int argc, char** argv) {
  baton::relaunch_with_thread_policy(argv);  // OpenMP's and OpenBLAS's idle threads sleep (runtime.hpp)
  if (argc < 2) {
    std::cerr << "usage: toml_with_own_model FILE.toml [--set path=value]... [--quick]\n";
    return 2;
  }
  std::vector<std::string> sets;
  for (int i = 2; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--set") sets.emplace_back(argv[i + 1]);
  auto runtime = baton::configure_runtime();
  if (!runtime) { std::cerr << runtime.error() << '\n'; return 2; }

  auto file = baton::load_curriculum(argv[1], sets);
  if (!file) { std::cerr << file.error() << '\n'; return 2; }
  const auto cur = file->with_model(baton::model_factory([] { return Net(); }));

  // Each stage: build its spec from the file, fit, evaluate; the first error stops the chain.
  auto state = cur.init();
  for (const auto& stage : cur.stages()) {
    state = state.and_then([&](baton::TrainState s) {
      return stage.build().and_then([&](const baton::TrainingSpec& spec) { return baton::fit(spec, std::move(s)); });
    });
    if (!state) break;
    if (auto plan = stage.eval(); plan && !plan->spec.sets.empty())
      if (auto m = baton::eval(plan->spec, *state))
        for (const auto& [set, values] : *m) fmt::print("stage {}: {} accuracy {:.4f}\n", stage.name(), set, values.at("accuracy"));
  }
  if (!state) { std::cerr << state.error() << '\n'; return 1; }
  fmt::print("trained to epoch {}, params_sha256 {}\n", state->time.epoch, baton::params_sha256(*state));
  return 0;
}
