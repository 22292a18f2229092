// Validation of a curriculum's stages against the models they train (Curriculum::validate and
// parse_curriculum): every stage built, its patterns and data tried on one instance of its model,
// a transfer that would take nothing, durations against the run's, evaluated weights that exist.
#include <list>
#include <set>

#include "baton/inference.hpp"
#include "baton/model.hpp"
#include "baton/text.hpp"
#include "detail.hpp"
#include "horizon.hpp"
#include "train/carry.hpp"
#include "internal.hpp"

namespace baton::detail {

namespace {
/// The parameters a stage's patterns (freeze, optimizer groups) are checked against: one instance of
/// each model the curriculum trains, built once (an instance costs its weights' initialisation).
/// Stages are seen in order: a stage with a model of its own changes the model of those after it.
class ModelsSeen {
 public:
  ModelsSeen(Expected<ModelFactory> base, std::uint64_t seed) : base_(std::move(base)), seed_(seed) {}
  /// The stage's model (its own if it builds one, else the one before), or null where none can be
  /// built (that problem is reported elsewhere). `before` gets the model before the stage.
  const Model* of(const TrainingSpec& spec, Problems& all, const Model** before = nullptr) {
    if (built_.empty() && base_) add(*base_, spec.name, all);
    const Model* previous = current();
    if (spec.model.kind != ModelCarry::Kind::keep && spec.model.factory) add(spec.model.factory, spec.name, all);
    if (before) *before = previous;
    return current();
  }

 private:
  const Model* current() const { return built_.empty() || !built_.back() ? nullptr : &*built_.back(); }
  void add(const ModelFactory& f, const std::string& stage, Problems& all) {
    auto m = detail::guard([&]() -> Expected<Model> { return detail::build_model(f, seed_, stage); });
    if (!m) all.list.push_back(fmt::format("{}: stage \"{}\": building the model failed: {}", all.source, stage, m.error().message));
    built_.push_back(m ? std::optional<Model>(std::move(*m)) : std::nullopt);
  }

  Expected<ModelFactory> base_;
  std::uint64_t seed_;
  std::list<std::optional<Model>> built_;  // in stage order, the last the current one (a list: pointers stay valid)
};

/// Why the stage's model cannot train on or be evaluated on its data, found by one forward pass
/// and the loss on the first two samples of each set, and the labels' range against the model's
/// outputs (a label the first samples do not hold would fail in the middle of training).
std::optional<std::string> data_problem(const TrainingSpec& spec, const Model& model) {
  std::vector<std::pair<std::string, const Dataset*>> sets = {{"training data", &spec.data.train}};
  if (spec.evaluation)
    for (const auto& [name, d] : spec.evaluation->spec.sets) sets.emplace_back(fmt::format("eval set \"{}\"", name), &d);
  torch::NoGradGuard no_grad;
  model.module->eval();  // this instance is validation's own: BatchNorm takes a batch of one
  for (const auto& [what, d] : sets) {
    const auto n = d->size();
    if (n == 0) continue;
    auto batch = d->range(0, std::min<std::int64_t>(2, n));
    if (!batch) return fmt::format("reading the {} failed: {}", what, batch.error().message);
    torch::Tensor out;
    auto forward = detail::guard([&]() -> Expected<void> {
      out = model.forward(batch->inputs);
      return {};
    });
    if (!forward)
      return fmt::format("the model cannot take the {} (\"{}\", each sample {}): {}", what, d->name,
                         detail::shape_string(batch->inputs[0]), forward.error().message);
    const auto& loss = what == "training data" ? spec.loss : spec.evaluation->spec.loss;
    auto scored = detail::guard([&]() -> Expected<void> {
      (void)loss.fn(out, batch->targets);
      return {};
    });
    if (!scored)
      return fmt::format("the model's output {} does not fit the {} (\"{}\") and the loss \"{}\": {}", detail::shape_string(out),
                         what, d->name, loss.name, scored.error().message);
    if (d->class_targets() && out.dim() == 2 && d->classes() > out.size(1))
      return fmt::format("the model gives {} class scores, but the labels of the {} (\"{}\") go up to {} ({} classes); make "
                         "the model's classes at least {} (e.g. [model] classes = {})",
                         out.size(1), what, d->name, d->classes() - 1, d->classes(), d->classes(), d->classes());
  }
  return std::nullopt;
}

/// A GPT that does not fit its data's SentencePiece tokenizer: too few token embeddings, or a
/// classifier that looks past another padding token than the one its inputs are padded with (a
/// silent error: it would read padding as text).
std::optional<std::string> tokenizer_problem(const Curriculum& cur, const TrainingSpec& spec) {
  if (!spec.data.train.origin.keys.count("tokenizer")) return std::nullopt;
  auto card = cur.model_card(spec.data.train.name, spec.name);
  if (!card || card->model != "gpt" || card->tokenizer_model.empty()) return std::nullopt;
  auto tokenizer = text::Tokenizer::from_model(card->tokenizer_model, card->tokenizer);
  if (!tokenizer) return tokenizer.error().message;
  auto option = [&](const char* key, std::int64_t fallback) {
    const auto it = card->options.find(key);
    const auto* v = it == card->options.end() ? nullptr : std::get_if<double>(&it->second);
    return v ? static_cast<std::int64_t>(*v) : fallback;
  };
  const models::GptOptions defaults;
  const auto vocab = option("vocab", defaults.vocab), pad = option("pad", defaults.pad), classes = option("classes", 0);
  if (vocab < tokenizer->vocab_size())
    return fmt::format("the model's vocab {} is smaller than the data's tokenizer ({}, {} tokens); set [model] vocab = {}", vocab,
                       tokenizer->identity(), tokenizer->vocab_size(), tokenizer->vocab_size());
  if (classes > 0 && pad != tokenizer->pad())
    return fmt::format("the classifier's pad {} is not the padding token of its data's tokenizer ({}: {}), so it would read "
                       "padding as text; set [model] pad = {}", pad, tokenizer->identity(), tokenizer->pad(), tokenizer->pad());
  return std::nullopt;
}

}  // namespace

/// Builds every stage and its evaluation plan, adding their problems.
void check_stages(const Curriculum& cur, Problems& all) {
  const auto& run = cur.run();
  std::set<std::string> algorithms_so_far;  // weights an evaluation may ask for (ema, swa)
  ModelsSeen models(cur.model(), run.seed);
  for (const auto& stage : cur.stages()) {
    auto plan = stage.eval();
    if (!plan) detail::add_unique(all.list, detail::problem_lines(plan.error()));
    auto spec = stage.build();
    if (!spec) {
      detail::add_unique(all.list, detail::problem_lines(spec.error()));
      continue;
    }
    const Model* before = nullptr;
    if (const auto* m = models.of(*spec, all, &before)) {
      // A transfer to a model of the stage's own that would take nothing: found now, not after
      // the stages before it trained.
      if (before && spec->model.kind == ModelCarry::Kind::transfer && spec->model.factory && !spec->model.source)
        if (const auto why = detail::transfer_took_nothing(*before->module, *m->module,
                                                           detail::transfer_weights(*before->module, *m->module, spec->model.fresh));
            !why.empty())
          all.add(stage.impl()->get("model"), fmt::format("stage \"{}\": model: {}", spec->name, why));
      for (auto problem : {detail::pattern_problem(*spec, *m->module), data_problem(*spec, *m), tokenizer_problem(cur, *spec)})
        if (problem) all.list.push_back(fmt::format("{}: stage \"{}\": {}", all.source, spec->name, *problem));
    }
    // A stage longer than the whole run can never be trained as written.
    const auto n = spec->data.train.size(), bs = spec->data.batch_size;
    auto batches = [&](Time t) { return detail::batches_in(t, run.max_duration, n, bs, spec->data.drop_last); };
    const double stage_b = batches(spec->duration), max_b = batches(run.max_duration);
    if (run.max_duration.value > 0 && stage_b > max_b)
      all.list.push_back(fmt::format("{}: stage \"{}\": duration {} ({:.0f} batches) exceeds the run's max_duration {} "
                                     "({:.0f} batches); raise run.max_duration or shorten the stage",
                                     all.source, spec->name, spec->duration.to_string(), stage_b,
                                     run.max_duration.to_string(), max_b));
    for (const auto& a : spec->algorithms) algorithms_so_far.insert(a.name);
    // Evaluating an algorithm's weights needs that algorithm in this stage or an earlier one.
    if (const auto& w = spec->evaluation ? spec->evaluation->spec.weights : std::string(); !w.empty() && !algorithms_so_far.count(w))
      all.list.push_back(fmt::format("{}: stage \"{}\": eval.weights = \"{}\", but neither this stage nor an earlier one "
                                     "has the algorithm \"{}\" that keeps them; add it (algorithms = {{ {} = {{}} }}) or "
                                     "evaluate the model's own weights",
                                     all.source, spec->name, w, w, w));
  }
}

}  // namespace baton::detail
