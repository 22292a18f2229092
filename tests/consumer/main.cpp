#include <baton/baton.hpp>
#include <baton/testing.hpp>
#include <iostream>
#include <torch/torch.h>

int main() {
  using namespace baton::literals;
  auto x = torch::randn({64, 4});
  auto y = (x.sum(1) > 0).to(torch::kLong);
  auto data = baton::make_dataset(x, y, "toy");
  auto state = baton::init_state(baton::models::mlp({4, 8, 2}), {.seed = 1, .max_duration = "2ep"_t});
  if (!data || !state) return 1;
  const baton::TrainingSpec spec{.data = {.train = *data, .batch_size = 16}, .duration = "2ep"_t};
  // Two fits (one epoch each): the runtime note, if any, is printed once per process.
  auto done = baton::fit(spec, std::move(*state), "1ep"_t).and_then([&](baton::TrainState s) { return baton::fit(spec, std::move(s)); });
  if (!done) { std::cerr << done.error() << '\n'; return 1; }
  // The installed baton::testing links and runs.
  const auto check = baton::testing::gradients_flow(spec, *done, baton::testing::first_batch(spec));
  std::cout << check << '\n';
  if (!check) return 1;
  std::cout << "consumer ok: batch " << done->time.batch << '\n';
  return done->time.batch == 8 ? 0 : 1;
}
