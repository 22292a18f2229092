// Data-parallel training on c10d (data_parallel.hpp).
#include "train/data_parallel.hpp"

#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail.hpp"

namespace baton::detail {
namespace {
void dist_check(Expected<void> r) {
  if (!r) throw BatonException(r.error());
}

/// Overwrites `tensors` with rank 0's: the tensors of one dtype flattened into one broadcast.
void broadcast_from_rank0(const Distributed& group, const std::vector<torch::Tensor>& tensors, const std::string& what) {
  if (tensors.empty()) return;
  torch::NoGradGuard no_grad;
  std::map<int, std::vector<torch::Tensor>> by_type;
  for (const auto& t : tensors) by_type[static_cast<int>(t.scalar_type())].push_back(t);
  std::vector<torch::Tensor> flats;
  for (const auto& [type, group_tensors] : by_type) {
    std::vector<torch::Tensor> parts;
    for (const auto& t : group_tensors) parts.push_back(t.reshape({-1}));
    flats.push_back(torch::cat(parts));
  }
  dist_check(group.broadcast(flats, 0, what));
  if (group.rank() == 0) return;
  std::size_t g = 0;
  for (const auto& [type, group_tensors] : by_type) {
    std::int64_t offset = 0;
    for (const auto& t : group_tensors) {
      const_cast<torch::Tensor&>(t).copy_(flats[g].narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
    ++g;
  }
}

std::vector<torch::Tensor> buffers_of(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& b : m.buffers()) out.push_back(b);
  return out;
}


/// Largest bucket of gradients in one all-reduce (PyTorch DDP's default, 25 MiB).
constexpr std::int64_t kBucketBytes = 25LL << 20;

}  // namespace

void DataParallel::start(TrainState& s, std::int64_t n, std::int64_t bs, std::uint64_t data_seed) {
  if (!group_) return;
  buffers_ = buffers_of(*s.model.module);
  const Distributed* dist = group_;
  auto here = torch::tensor(std::vector<std::int64_t>{s.time.batch, s.time.sample, n, bs, static_cast<std::int64_t>(data_seed)},
                            torch::kLong);
  auto rank0 = here.clone();
  dist_check(dist->broadcast({rank0}, 0, "the starting point"));
  if (!here.equal(rank0))
    raise(ErrorCode::invalid_argument,
          fmt::format("distributed: rank {} starts at batch {} (sample {}) with {} training samples, "
                      "global batch {} and data seed {}, rank 0 at batch {} (sample {}) with {}, {} and {}; "
                      "every rank must start from the same state (the same checkpoint) with the same spec",
                      dist->rank(), s.time.batch, s.time.sample, n, bs, here[4].item<std::int64_t>(),
                      rank0[0].item<std::int64_t>(), rank0[1].item<std::int64_t>(), rank0[2].item<std::int64_t>(),
                      rank0[3].item<std::int64_t>(), rank0[4].item<std::int64_t>()));
  std::vector<torch::Tensor> all = buffers_;
  for (const auto& p : s.model.module->parameters()) all.push_back(p);
  broadcast_from_rank0(*dist, all, "the initial weights and buffers");
}

std::pair<std::int64_t, std::int64_t> DataParallel::begin_step(std::int64_t take, std::int64_t batch, bool stop_requested) {
  if (!group_) return {0, take};
  const auto [at, size] = group_->shard(take);
  // Buffers (BatchNorm statistics) follow rank 0 before each forward, as DDP's default.
  broadcast_from_rank0(*group_, buffers_, fmt::format("buffers at batch {}", batch));
  weight_ = static_cast<double>(size) / static_cast<double>(take);
  stop_requested_ = stop_requested;
  what_ = fmt::format("gradients at batch {}", batch);
  return {at, size};
}

void DataParallel::finish() {
  if (group_) broadcast_from_rank0(*group_, buffers_, "the final buffers");
}

std::pair<double, bool> DataParallel::reduce(std::vector<Slot>& slots, double weighted_loss, bool non_finite) {
  if (!group_) return {weighted_loss, non_finite};
  torch::NoGradGuard no_grad;
  const std::size_t n = slots.size();
  auto meta = torch::zeros({static_cast<std::int64_t>(n) + 3}, torch::kDouble);
  double* m = meta.data_ptr<double>();
  m[0] = weighted_loss, m[1] = non_finite ? 1 : 0, m[2] = stop_requested_ ? 1 : 0;
  std::vector<torch::Tensor> buckets;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (std::size_t i = 0; i < n;) {
    const auto type = slots[i].param.scalar_type();
    std::int64_t bytes = 0;
    std::vector<torch::Tensor> parts;
    std::size_t j = i;
    for (; j < n && slots[j].param.scalar_type() == type; ++j) {
      const auto& p = slots[j].param;
      const std::int64_t size = p.numel() * static_cast<std::int64_t>(p.element_size());
      if (j > i && bytes + size > kBucketBytes) break;
      bytes += size;
      if (p.grad().defined()) {
        m[3 + j] = 1;
        parts.push_back(p.grad().reshape({-1}));
      } else {
        parts.push_back(torch::zeros({p.numel()}, p.options()));
      }
    }
    buckets.push_back(torch::cat(parts));
    ranges.emplace_back(i, j);
    i = j;
  }
  buckets.push_back(meta);
  dist_check(group_->all_reduce(buckets, Distributed::Op::sum, what_));
  for (std::size_t b = 0; b < ranges.size(); ++b) {
    std::int64_t offset = 0;
    for (std::size_t k = ranges[b].first; k < ranges[b].second; ++k) {
      auto& p = slots[k].param;
      if (m[3 + k] > 0) p.mutable_grad() = buckets[b].narrow(0, offset, p.numel()).view_as(p);
      else p.mutable_grad().reset();  // no rank has a gradient for it (unused): as in one process
      offset += p.numel();
    }
  }
  stop_agreed_ = m[2] > 0;
  return {m[0], m[1] > 0};
}

}  // namespace baton::detail
