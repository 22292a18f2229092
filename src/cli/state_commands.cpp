// The commands on a saved state: eval, inspect, export.
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/checkpoint.hpp"
#include "baton/eval.hpp"
#include "baton/interop.hpp"
#include "commands.hpp"

namespace baton::cli {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

/// The curriculum a state was trained with: `config`, or the config.toml of the run directory
/// that holds the state (beside final.baton, one level above checkpoints/).
Expected<Curriculum> run_config(const std::string& state_path, std::string config, const Registry& registry) {
  if (config.empty()) {
    const fs::path dir = fs::path(state_path).parent_path();
    std::error_code ec;
    config = (dir.filename() == "checkpoints" && !fs::exists(dir / "config.toml", ec) ? dir.parent_path() : dir) / "config.toml";
  }
  auto cur = load_curriculum(config, {}, registry);
  if (!cur) return tl::unexpected(cur.error().with_context("--config (the run's config.toml)"));
  return cur;
}

Expected<TrainState> saved_state(const Curriculum& cur, const std::string& state_path) {
  return cur.model().and_then([&](const ModelFactory& f) { return load_checkpoint(state_path, f); });
}
}  // namespace

int exit_code_for(const Error& e) {
  switch (e.code) {
    case ErrorCode::non_finite:
    case ErrorCode::torch:
    case ErrorCode::runtime: return exit_training_failed;
    default: return exit_invalid_input;
  }
}

int report(const Error& e) {
  fmt::print(stderr, "baton: {}\n", e.to_string());
  return exit_code_for(e);
}

int evaluate(const std::string& state_path, const std::string& data, std::string config,
             const std::vector<std::string>& metric_names, const Registry& registry) {
  auto cur = run_config(state_path, config, registry);
  if (!cur) return report(cur.error());
  auto state = saved_state(*cur, state_path);
  if (!state) return report(state.error());
  auto ds = cur->dataset(data);
  if (!ds) return report(ds.error());
  std::vector<Metric> metrics;
  for (const auto& name : metric_names) {
    if (auto it = registry.metrics.find(name); it != registry.metrics.end()) metrics.push_back(it->second);
    else if (auto m = metric::builtin(name)) metrics.push_back(std::move(*m));
    else return report(m.error().with_context("--metric"));
  }
  auto m = baton::eval({.sets = {{data, *ds}}, .metrics = metrics}, *state);
  if (!m) return report(m.error());
  json j = {{"state", state_path}, {"data", data}};
  for (const auto& [k, v] : m->at(data)) j["metrics"][k] = v;
  fmt::print("{}\n", j.dump(2));
  return exit_ok;
}

int inspect(const std::string& path) {
  auto info = read_checkpoint_info(path);
  if (!info) return report(info.error());
  json j = {{"path", path},
            {"format_version", info->format_version},
            {"run", info->meta.run_name},
            {"stage", info->stage},
            {"stage_index", info->meta.stage_index},
            {"timestamp",
             {{"epoch", info->time.epoch}, {"batch", info->time.batch}, {"sample", info->time.sample},
              {"batch_in_epoch", info->time.batch_in_epoch}, {"sample_in_epoch", info->time.sample_in_epoch}}},
            {"seed", info->seed},
            {"max_duration", info->max_duration.to_string()},
            {"config_fingerprint", info->meta.config_fingerprint},
            {"params_sha256", info->params_sha256}};
  fmt::print("{}\n", j.dump(2));
  return exit_ok;
}
/// `baton run f.toml --nproc N`: the same command, N times, under the launcher.
int export_weights(const std::string& state_path, const std::string& out, const std::string& weights, std::string config,
                   const Registry& registry) {
  auto cur = run_config(state_path, config, registry);
  if (!cur) return report(cur.error());
  auto state = saved_state(*cur, state_path);
  if (!state) return report(state.error());
  auto tensors = state_dict(*state, weights);
  if (!tensors) return report(tensors.error());
  if (auto ok = save_state_dict(*tensors, out); !ok) return report(ok.error());
  std::int64_t elements = 0;
  for (const auto& [name, t] : *tensors) elements += t.numel();
  fmt::print("{}: {} tensors ({} values{}) by their names in the module tree; in Python: "
             "model.load_state_dict(torch.load(\"{}\"))\n",
             out, tensors->size(), elements, weights.empty() ? "" : ", the " + weights + " weights", out);
  return exit_ok;
}

}  // namespace baton::cli
