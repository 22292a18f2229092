// The GPT's export against its torch.nn twin (examples/python/baton_gpt.py), run by Debian's
// Python (python3-torch, installed by scripts/common.sh): strict loading, logits within 1e-5.
#include <catch2/catch.hpp>

#include <fstream>

#include "baton/baton.hpp"
#include "baton/interop.hpp"
#include "baton/text.hpp"
#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;
using test::ok;

namespace {
/// Trains `options` a few steps (weights away from their initialization), exports them as `baton
/// export` does, and asks tests/python/check_gpt.py to load them strictly and compare logits on
/// `x`, texts of several lengths with padding after them.
test::Output check_in_python(const baton::models::GptOptions& o, const fs::path& dir) {
  std::vector<baton::text::Record> records;
  for (int i = 0; i < 60; ++i)
    records.push_back({"text " + std::to_string(i) + std::string(static_cast<std::size_t>(i % 7), 'z'), "en", i % 2 ? "a" : "b"});
  const auto data = o.classes > 0 ? ok(baton::text::classification(records, {.length = o.block_size, .classes = {"a", "b"}}))
                                  : ok(baton::text::lm_windows(records, {.block_size = o.block_size}));
  baton::TrainingSpec spec{.data = {.train = data, .batch_size = 8},
                           .loss = o.classes > 0 ? baton::loss::cross_entropy() : baton::loss::token_cross_entropy(),
                           .optimizer = baton::optim::adamw({.lr = 1e-2}),
                           .duration = baton::Time::batches(4)};
  auto state = ok(baton::fit(spec, ok(baton::init_state(baton::models::gpt(o), {.seed = 3, .max_duration = baton::Time::batches(4)}))));
  REQUIRE(baton::save_state_dict(ok(baton::state_dict(state)), dir / "weights.pt"));
  const auto x = ok(data.range(0, 5)).inputs;  // lm windows are lazy
  state.model.module->eval();
  torch::NoGradGuard no_grad;
  const auto logits = state.model.forward(x);
  REQUIRE(baton::save_state_dict(baton::StateDict{{"x", x.contiguous()}, {"logits", logits.contiguous()}}, dir / "io.pt"));
  std::ofstream(dir / "options.json") << fmt::format(
      R"({{"vocab": {}, "block_size": {}, "n_layer": {}, "n_head": {}, "n_embd": {}, "dropout": {}, "classes": {}, "pad": {}, "pool": "{}"}})",
      o.vocab, o.block_size, o.n_layer, o.n_head, o.n_embd, o.dropout, o.classes, o.pad, o.pool);
  const auto script = fs::path(BATON_SOURCE_DIR) / "tests" / "python" / "check_gpt.py";
  return test::shell(fmt::format("cd {} && /usr/bin/python3 {} weights.pt io.pt options.json", dir.string(), script.string()));
}
}  // namespace

TEST_CASE("gpt export: Python's torch.nn GPT loads it strictly and gives baton's logits (language model, classifier by last or mean)",
          "[text][gpt][interop]") {
  const auto probe = test::shell("/usr/bin/python3 -c 'import torch'");
  REQUIRE(probe.rc == 0);  // python3-torch: scripts/common.sh installs it
  test::TempDir dir;
  const baton::models::GptOptions lm{.block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32, .dropout = 0.1};
  const auto a = check_in_python(lm, dir.path);
  INFO(a.out);
  CHECK(a.rc == 0);
  CHECK_THAT(a.out, Catch::Contains("max abs difference"));
  auto classifier = lm;
  classifier.classes = 2;
  const auto b = check_in_python(classifier, dir.path);
  INFO(b.out);
  CHECK(b.rc == 0);
  CHECK_THAT(b.out, Catch::Contains("max abs difference"));
  classifier.pool = "mean";
  const auto c = check_in_python(classifier, dir.path);
  INFO(c.out);
  CHECK(c.rc == 0);
  CHECK_THAT(c.out, Catch::Contains("max abs difference"));
}
