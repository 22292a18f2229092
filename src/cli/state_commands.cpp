// The commands on a saved state: eval, inspect, export.
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "baton/checkpoint.hpp"
#include "baton/eval.hpp"
#include "baton/inference.hpp"
#include "baton/interop.hpp"
#include "baton/text.hpp"
#include "commands.hpp"
#include "io.hpp"

namespace baton::cli {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string first_line(const fs::path& file) {
  std::string first;
  if (std::ifstream in(file); in) std::getline(in, first);
  return first;
}

/// What a C++ run (baton::run) wrote for the tools, tools.toml beside its config.toml (a record
/// of its settings by baton::describe, not a curriculum), as a curriculum: its model and the
/// datasets a baton loader made. What it cannot rebuild is an error saying what to do.
Expected<Curriculum> cxx_run_config(const fs::path& record, const Registry& registry) {
  const fs::path tools = record.parent_path() / "tools.toml";
  const auto instead = "or pass --config with a curriculum whose [model] and [datasets] are the run's, or evaluate and "
                       "export from C++ (baton::eval, save_for_inference); `baton export STATE OUT` (the weights only) "
                       "needs neither";
  std::ifstream in(tools);
  if (!in)
    return fail(ErrorCode::invalid_argument,
                fmt::format("{}: is the record of a C++ run (baton::run) and {} is missing (a run of an older baton): "
                            "run it again to write it, {}", record.string(), tools.string(), instead));
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  if (text.find("\n[model]\n") == std::string::npos)
    return fail(ErrorCode::invalid_argument,
                fmt::format("{}: the C++ run's model is not named for the tools: its factory is neither a built-in "
                            "(baton::models::mlp, small_cnn) nor named. Name it in the C++ run with "
                            "baton::models::named(\"my_net\", params, factory) and run the command with your program on "
                            "baton::cli::main whose registry builds \"my_net\" from those params, {}",
                            tools.string(), instead));
  if (text.find("\n[[stages]]\n") == std::string::npos)
    return fail(ErrorCode::invalid_argument,
                fmt::format("{}: none of the C++ run's datasets can be rebuilt by name (they were not made by a baton "
                            "loader: data::fashion_mnist, idx_images, csv, synthetic, image_folder, shards, and their "
                            "slice / hold_out parts), {}", tools.string(), instead));
  auto cur = parse_curriculum(text, tools.string(), {}, registry);
  if (!cur)
    return tl::unexpected(cur.error().with_context(fmt::format(
        "{} (the C++ run's model and datasets; a model of your own: run the command with your program on "
        "baton::cli::main, whose registry names it)", tools.string())));
  return cur;
}

/// The curriculum a state was trained with: `config`, or the config.toml of the run directory
/// that holds the state (beside final.baton, one level above checkpoints/), or for a C++ run,
/// its tools.toml.
Expected<Curriculum> run_config(const std::string& state_path, std::string config, const Registry& registry) {
  if (config.empty()) {
    const fs::path dir = fs::path(state_path).parent_path();
    std::error_code ec;
    config = (dir.filename() == "checkpoints" && !fs::exists(dir / "config.toml", ec) ? dir.parent_path() : dir) / "config.toml";
  }
  // A C++ run's config.toml is baton::describe's record of its settings (its first line says so).
  if (first_line(config).find("(baton::describe)") != std::string::npos) return cxx_run_config(config, registry);
  auto cur = load_curriculum(config, {}, registry);
  if (!cur) return tl::unexpected(cur.error().with_context("--config (the run's config.toml)"));
  return cur;
}

/// The stage a state was written in ("" when its header cannot be read: load_checkpoint says why).
std::string stage_of(const std::string& state_path) {
  auto info = read_checkpoint_info(state_path);
  return info ? info->stage : std::string();
}

/// A state with the model of the stage that wrote it (a stage may have built one of its own).
Expected<TrainState> saved_state(const Curriculum& cur, const std::string& state_path) {
  return cur.model(stage_of(state_path)).and_then([&](const ModelFactory& f) { return load_checkpoint(state_path, f); });
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
  if (!ds)
    return report(ds.error().with_context(fmt::format(
        "--data {} (of a C++ run: the datasets its tools.toml names, those a baton loader made)", data)));
  std::vector<Metric> metrics;
  const auto info = read_checkpoint_info(state_path);
  const std::string written_in = info ? info->stage : std::string();
  auto specs = cur->specs();
  if (metric_names.empty()) {
    // The curriculum's: those of the stage the state was written in, else of the last stage that
    // evaluates (what the run itself reported).
    if (!specs) return report(specs.error());
    const TrainingSpec* pick = nullptr;
    for (const auto& s : *specs)
      if (s.evaluation && (!pick || pick->name != written_in)) pick = &s;
    if (pick) metrics = pick->evaluation->spec.metrics;
  }
  // The loss of the stage the state was written in (else the last one's): a language model's
  // token_cross_entropy, not the default cross-entropy of classes.
  Loss loss = EvalSpec{}.loss;
  if (specs && !specs->empty()) {
    const TrainingSpec* stage = &specs->back();
    for (const auto& s : *specs)
      if (s.name == written_in) stage = &s;
    loss = stage->evaluation ? stage->evaluation->spec.loss : stage->loss;
  }
  for (const auto& name : metric_names) {
    if (auto it = registry.metrics.find(name); it != registry.metrics.end()) metrics.push_back(it->second);
    else if (name == "bits_per_byte") {
      auto m = text::bits_per_byte({{data, *ds}});
      if (!m) return report(m.error().with_context("--metric"));
      metrics.push_back(std::move(*m));
    } else if (auto m = metric::builtin(name)) metrics.push_back(std::move(*m));
    else return report(m.error().with_context("--metric"));
  }
  auto m = baton::eval({.sets = {{data, *ds}}, .loss = loss, .metrics = metrics}, *state);
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
namespace {
/// The card of `--inference`: from the model of the state's stage and the dataset's inputs, with where the
/// weights came from.
Expected<ModelCard> card_for(const ExportArgs& a, const Curriculum& cur) {
  std::string data = a.data;
  if (data.empty()) {  // the dataset the last stage trains on
    if (cur.stages().empty()) return fail(ErrorCode::invalid_spec, "the config has no stages; name the dataset with --data");
    auto spec = cur.stages().back().build();
    if (!spec) return tl::unexpected(spec.error());
    data = spec->data.train.name;
  }
  auto info = read_checkpoint_info(a.state);
  if (!info) return tl::unexpected(info.error());
  auto card = cur.model_card(data, info->stage);
  if (!card) return tl::unexpected(card.error().with_context("--data " + data));
  card->weights = a.weights;
  if (!a.classes.empty()) card->classes = a.classes;
  card->origin = fmt::format("{} (run \"{}\", stage \"{}\", {}; params_sha256 {})", a.state, info->meta.run_name, info->stage,
                             info->time.to_string(), info->params_sha256);
  return card;
}

std::string csv_cell(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}
}  // namespace

int export_weights(const ExportArgs& a, const Registry& registry) {
  if (a.inference) {
    auto cur = run_config(a.state, a.config, registry);
    if (!cur) return report(cur.error());
    auto state = saved_state(*cur, a.state);
    if (!state) return report(state.error());
    auto card = card_for(a, *cur);
    if (!card) return report(card.error());
    if (auto ok = save_for_inference(*state, *card, a.out); !ok) return report(ok.error());
    const bool language_model = card->input == InputKind::tokens && card->classes.empty();
    fmt::print("{}: inference artifact: model \"{}\", {} [{}]{}, {} class names{}; {}: baton {} {} {} "
               "(Python's torch.load reads it as the state_dict)\n",
               a.out, card->model, card->input == InputKind::image ? "images" : card->input == InputKind::tokens ? "tokens" : "features",
               fmt::join(card->input_shape, ", "), card->tokenizer.empty() ? "" : " (" + card->tokenizer + ")",
               card->classes.size(), a.weights.empty() ? "" : ", the " + a.weights + " weights",
               language_model ? "generate text with" : "classify with", language_model ? "generate" : "predict", a.out,
               language_model ? "--prompt TEXT" : "INPUT");
    return exit_ok;
  }
  if (!a.data.empty() || !a.classes.empty())
    return report(Error{ErrorCode::invalid_argument, "--data and --classes describe an inference artifact: add --inference", {}});
  // The weights need no model: straight from the checkpoint (so from any run directory).
  auto tensors = checkpoint_state_dict(a.state, a.weights);
  if (!tensors) return report(tensors.error());
  if (auto ok = save_state_dict(*tensors, a.out); !ok) return report(ok.error());
  std::int64_t elements = 0;
  for (const auto& [name, t] : *tensors) elements += t.numel();
  fmt::print("{}: {} tensors ({} values{}) by their names in the module tree; in Python: "
             "model.load_state_dict(torch.load(\"{}\"))\n",
             a.out, tensors->size(), elements, a.weights.empty() ? "" : ", the " + a.weights + " weights", a.out);
  return exit_ok;
}

int predict(const PredictArgs& a, const Registry& registry) {
  // The card's model from this program's registry (a program with models of its own names them).
  auto predictor = load_for_inference(a.artifact, registry);
  if (!predictor) return report(predictor.error());
  const ModelCard* card = &predictor->card();
  auto inputs = read_inputs(a.input, *card);
  if (!inputs) return report(inputs.error());
  auto out = predictor->predict(inputs->inputs, a.batch_size);
  if (!out) return report(out.error().with_context(a.input));
  const auto classes = out->classes.accessor<std::int64_t, 1>();
  const auto probs = out->probabilities.accessor<float, 2>();
  // The columns --help promises, always: `name` is empty when the artifact has no class names.
  std::string text = "input,class,name,probability\n";
  for (std::int64_t i = 0; i < classes.size(0); ++i) {
    const auto k = classes[i];
    const auto at = static_cast<std::size_t>(k);
    const std::string name = (at < card->classes.size() ? csv_cell(card->classes[at]) : "") + ",";
    text += fmt::format("{},{},{}{:.6f}\n", csv_cell(inputs->ids[static_cast<std::size_t>(i)]), k, name, probs[i][k]);
  }
  if (a.out.empty()) {
    fmt::print("{}", text);
    return exit_ok;
  }
  if (auto ok = detail::write_file_atomic(a.out, text, "predictions"); !ok) return report(ok.error());
  fmt::print("{}: {} predictions of {} (model \"{}\")\n", a.out, classes.size(0), a.input, card->model);
  return exit_ok;
}


int generate(const GenerateArgs& a, const Registry& registry) {
  // A checkpoint: its run's curriculum describes the model (the card export --inference writes).
  Expected<Predictor> predictor = tl::unexpected(Error{});
  if (read_checkpoint_info(a.source)) {
    auto cur = run_config(a.source, a.config, registry);
    if (!cur) return report(cur.error());
    auto state = saved_state(*cur, a.source);
    if (!state) return report(state.error());
    ExportArgs from;
    from.state = a.source;
    auto card = card_for(from, *cur);
    if (!card) return report(card.error());
    predictor = baton::predictor(*state, *card);
  } else {
    predictor = load_for_inference(a.source, registry);
  }
  if (!predictor) return report(predictor.error());
  for (std::int64_t i = 0; i < a.samples; ++i) {
    auto options = a.options;
    options.seed = a.options.seed + static_cast<std::uint64_t>(i);  // sample i: seed + i
    auto text = predictor->generate(a.prompt, options);
    if (!text) return report(text.error());
    if (a.samples > 1) fmt::print("--- sample {} (seed {})\n", i + 1, options.seed);
    fmt::print("{}{}\n", a.prompt, *text);
  }
  return exit_ok;
}
}  // namespace baton::cli
