// Lazy datasets built from others: a subset (slice, hold-out), relabelled classes (map_labels), a
// per-sample transform, and materialize (data.hpp).
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <torch/torch.h>

#include "baton/data.hpp"
#include "data_internal.hpp"
#include "detail.hpp"

namespace baton {
namespace {

/// In-memory tensors seen as a source (so that a transform can wrap them).
class TensorSource final : public Source {
 public:
  TensorSource(torch::Tensor inputs, torch::Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {}
  std::int64_t size() const override { return inputs_.size(0); }
  Expected<Batch> batch(const torch::Tensor& indices, const SampleContext&) const override {
    return Batch{inputs_.index_select(0, indices), targets_.index_select(0, indices)};
  }
  std::vector<std::int64_t> input_shape() const override { return {inputs_.sizes().begin() + 1, inputs_.sizes().end()}; }
  std::int64_t classes() const override { return classes_; }
  std::string identity() const override {
    return fmt::format("tensors sha256 {} {}", detail::tensor_digest(inputs_).substr(0, 16),
                       detail::tensor_digest(targets_).substr(0, 16));
  }
  void set_classes(std::int64_t c) { classes_ = c; }

 private:
  torch::Tensor inputs_, targets_;
  std::int64_t classes_ = 0;
};

class SubsetSource final : public Source, public detail::ClassNames {
 public:
  SubsetSource(std::shared_ptr<const Source> base, torch::Tensor indices)
      : base_(std::move(base)), indices_(std::move(indices)) {}
  std::int64_t size() const override { return indices_.size(0); }
  Expected<Batch> batch(const torch::Tensor& indices, const SampleContext& context) const override {
    return base_->batch(indices_.index_select(0, indices), context);
  }
  std::vector<std::int64_t> input_shape() const override { return base_->input_shape(); }
  std::int64_t classes() const override { return base_->classes(); }
  std::string identity() const override {
    auto base = base_->identity();
    return base.empty() ? base : fmt::format("{}, samples {}", base, detail::tensor_digest(indices_).substr(0, 16));
  }
  std::vector<std::string> class_names() const override { return detail::class_names(base_); }

 private:
  std::shared_ptr<const Source> base_;
  torch::Tensor indices_;  // int64, into base_
};

/// Class targets relabelled through a map, as each batch is made.
class RelabelSource final : public Source {
 public:
  RelabelSource(std::shared_ptr<const Source> base, std::vector<std::int64_t> map, std::int64_t classes)
      : base_(std::move(base)), map_(std::move(map)), table_(torch::tensor(map_, torch::kLong)), classes_(classes) {}
  std::int64_t size() const override { return base_->size(); }
  Expected<Batch> batch(const torch::Tensor& indices, const SampleContext& context) const override {
    auto b = base_->batch(indices, context);
    if (!b) return b;
    const auto& y = b->targets;
    if (y.scalar_type() != torch::kLong || y.dim() != 1)
      return fail(ErrorCode::data, "label_map: the source's targets are not class indices");
    if (y.numel() > 0 && (y.min().item<std::int64_t>() < 0 || y.max().item<std::int64_t>() >= table_.size(0)))
      return fail(ErrorCode::data, fmt::format("label_map: a label outside the map's {} classes in this batch", table_.size(0)));
    return Batch{std::move(b->inputs), table_.index_select(0, y)};
  }
  std::vector<std::int64_t> input_shape() const override { return base_->input_shape(); }
  std::int64_t classes() const override { return classes_; }
  std::string identity() const override {
    auto base = base_->identity();
    return base.empty() ? base : fmt::format("{}, label_map [{}]", base, fmt::join(map_, ", "));
  }

 private:
  std::shared_ptr<const Source> base_;
  std::vector<std::int64_t> map_;
  torch::Tensor table_;
  std::int64_t classes_;
};

/// The generator of sample `index` in epoch `epoch` of a fit with data seed `seed`.
at::Generator sample_generator(const SampleContext& c, std::int64_t index) {
  std::uint64_t x = c.seed ^ 0x7472616E73666F72ULL;  // "transfor"
  x = detail::splitmix64(x) ^ static_cast<std::uint64_t>(c.epoch);
  x = detail::splitmix64(x) ^ static_cast<std::uint64_t>(index);
  return at::make_generator<at::CPUGeneratorImpl>(detail::splitmix64(x));
}

class TransformSource final : public Source, public detail::ClassNames {
 public:
  TransformSource(std::shared_ptr<const Source> base, data::SampleTransform fn, std::string what)
      : base_(std::move(base)), fn_(std::move(fn)), what_(std::move(what)) {}
  std::int64_t size() const override { return base_->size(); }
  Expected<Batch> batch(const torch::Tensor& indices, const SampleContext& context) const override {
    auto b = base_->batch(indices, context);
    if (!b) return b;
    const auto idx = indices.contiguous();
    const auto* ip = idx.data_ptr<std::int64_t>();
    std::vector<torch::Tensor> out;
    out.reserve(static_cast<std::size_t>(idx.size(0)));
    for (std::int64_t i = 0; i < idx.size(0); ++i) {
      auto gen = sample_generator(context, ip[i]);
      torch::Tensor x;
      std::string why;
      try {
        x = fn_(b->inputs[i], gen);
      } catch (const c10::Error& e) {
        why = detail::torch_message(e);
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (!why.empty())
        return fail(ErrorCode::data, fmt::format("transform \"{}\" failed on sample {}: {}", what_, ip[i], why));
      if (!x.defined() || (!out.empty() && x.sizes() != out.front().sizes()))
        return fail(ErrorCode::shape_mismatch,
                    fmt::format("transform \"{}\" returned {} for sample {}; the batch's first sample gave {}", what_,
                                detail::shape_string(x), ip[i], out.empty() ? "-" : detail::shape_string(out.front())));
      out.push_back(std::move(x));
    }
    return Batch{torch::stack(out), b->targets};
  }
  std::vector<std::int64_t> input_shape() const override {
    // Known only by running the transform: once, on sample 0, in evaluation's context.
    auto b = batch(torch::zeros({1}, torch::kLong), {});
    if (!b) return base_->input_shape();
    return {b->inputs.sizes().begin() + 1, b->inputs.sizes().end()};
  }
  std::int64_t classes() const override { return base_->classes(); }
  std::vector<std::string> class_names() const override { return detail::class_names(base_); }
  /// The transform is the caller's function: its name (`what`) stands for it.
  std::string identity() const override {
    auto base = base_->identity();
    return base.empty() ? base : fmt::format("{}, transform \"{}\"", base, what_);
  }

 private:
  std::shared_ptr<const Source> base_;
  data::SampleTransform fn_;
  std::string what_;
};
}  // namespace

std::vector<std::string> detail::class_names(const std::shared_ptr<const Source>& source) {
  const auto* named = dynamic_cast<const ClassNames*>(source.get());
  return named ? named->class_names() : std::vector<std::string>{};
}

std::shared_ptr<const Source> detail::relabelled(std::shared_ptr<const Source> base, std::vector<std::int64_t> map,
                                                 std::int64_t classes) {
  return std::make_shared<RelabelSource>(std::move(base), std::move(map), classes);
}

std::shared_ptr<const Source> detail::subset(std::shared_ptr<const Source> base, torch::Tensor indices) {
  return std::make_shared<SubsetSource>(std::move(base), std::move(indices));
}

namespace data {

Dataset transform(const Dataset& dataset, SampleTransform fn, const std::string& what) {
  std::shared_ptr<const Source> base = dataset.source;
  if (!base) {
    auto t = std::make_shared<TensorSource>(dataset.inputs, dataset.targets);
    t->set_classes(dataset.classes());
    base = std::move(t);
  }
  return make_dataset(std::make_shared<TransformSource>(std::move(base), std::move(fn), what),
                      fmt::format("{}+{}", dataset.name, what));
}

Expected<Dataset> materialize(const Dataset& dataset) {
  if (!dataset.lazy()) return dataset;
  if (auto ok = dataset.validate(); !ok) return tl::unexpected(ok.error());
  auto b = dataset.range(0, dataset.size());
  if (!b) return tl::unexpected(b.error());
  auto out = make_dataset(std::move(b->inputs), std::move(b->targets), dataset.name);
  if (out) out->origin = dataset.origin;  // the same samples
  return out;
}

}  // namespace data
}  // namespace baton
