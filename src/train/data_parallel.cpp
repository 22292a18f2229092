// Data-parallel training on c10d (data_parallel.hpp).
#include "train/data_parallel.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail.hpp"

namespace baton::detail {
namespace {
void dist_check(Expected<void> r) {
  if (!r) throw BatonException(r.error());
}

}  // namespace

Packed::Packed(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::map<int, std::vector<torch::Tensor>> by_type;
  for (const auto& t : tensors) by_type[static_cast<int>(t.scalar_type())].push_back(t);
  for (auto& [type, group_tensors] : by_type) {
    std::vector<torch::Tensor> parts;
    for (const auto& t : group_tensors) parts.push_back(t.reshape({-1}));
    flats.push_back(torch::cat(parts));
    groups.push_back(std::move(group_tensors));
  }
}

void Packed::unpack() const {
  torch::NoGradGuard no_grad;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::int64_t offset = 0;
    for (const auto& t : groups[g]) {
      const_cast<torch::Tensor&>(t).copy_(flats[g].narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

namespace {
/// Overwrites `tensors` with rank 0's.
void broadcast_from_rank0(const Distributed& group, const std::vector<torch::Tensor>& tensors, const std::string& what) {
  if (tensors.empty()) return;
  const Packed packed(tensors);
  dist_check(group.broadcast(packed.flats, 0, what));
  if (group.rank() != 0) packed.unpack();
}

std::vector<torch::Tensor> buffers_of(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& b : m.buffers()) out.push_back(b);
  return out;
}


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
  weight_ = static_cast<double>(size) / static_cast<double>(take);
  stop_requested_ = stop_requested;
  what_ = fmt::format("gradients and buffers at batch {}", batch);
  return {at, size};
}

double DataParallel::sum(double local) const {
  if (!group_) return local;
  auto t = torch::tensor(std::vector<double>{local}, torch::kDouble);
  dist_check(group_->all_reduce({t}, Distributed::Op::sum, what_ + " (the loss's terms)"));
  return t[0].item<double>();
}

void DataParallel::plan_buckets(const std::vector<Slot>& slots) {
  // Planned from the model's first parameters, whose gradients backward produces last: the
  // bucket that can only go out after backward is kept small (kLastBucketBytes), the others hold
  // up to kBucketBytes; one dtype per bucket. They go out in the order backward fills them.
  std::vector<Bucket> planned;
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const auto& p = slots[k].param;
    const std::int64_t size = p.numel() * static_cast<std::int64_t>(p.element_size());
    const std::int64_t cap = planned.size() <= 1 ? kLastBucketBytes : kBucketBytes;
    if (planned.empty() || planned.back().type != p.scalar_type() ||
        (!planned.back().members.empty() && planned.back().bytes + size > cap))
      planned.push_back(Bucket{p.scalar_type()});
    planned.back().members.push_back(k);
    planned.back().bytes += size;
  }
  buckets_.assign(planned.rbegin(), planned.rend());
  bucket_of_.assign(slots.size(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::reverse(buckets_[b].members.begin(), buckets_[b].members.end());
    for (const std::size_t k : buckets_[b].members) bucket_of_[k] = b;
  }
}

void DataParallel::arm(std::vector<Slot>& slots, double weighted_loss) {
  if (!group_) return;
  begin(slots, weighted_loss, false);  // the loss is known before backward: it goes out first, hidden by it
  hooks_.clear();
  for (std::size_t k = 0; k < slots.size(); ++k) {
    if (!slots[k].param.requires_grad()) {  // backward gives it nothing: its place is ready now
      ++buckets_[bucket_of_[k]].ready;
      hooks_.push_back(kNoHook);
      continue;
    }
    hooks_.push_back(slots[k].param.register_hook([this, k](const torch::Tensor& g) { on_gradient(k, g); }));
  }
}

void DataParallel::on_gradient(std::size_t k, const torch::Tensor& g) {
  // The gradient this backward adds, plus what earlier microbatches accumulated.
  const auto& held = (*slots_)[k].param.grad();
  grads_[k] = held.defined() ? held + g : g;
  ++buckets_[bucket_of_[k]].ready;
  // Buckets go out in order, so that every rank issues the same collectives in the same order.
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].members.size()) launch(next_++);
}

void DataParallel::launch(std::size_t b) {
  torch::NoGradGuard no_grad;
  Bucket& bucket = buckets_[b];
  std::vector<torch::Tensor> parts;
  // After the gradients, one element per member: 1 where this rank has a gradient for it. The
  // sum is positive where some rank has one (exact enough in any float type: only > 0 matters).
  std::vector<float> has_grad;
  for (const std::size_t k : bucket.members) {
    const auto& p = (*slots_)[k].param;
    torch::Tensor g = grads_[k].defined() ? grads_[k] : p.grad();  // not armed: after backward
    has_grad.push_back(g.defined() ? 1.0F : 0.0F);
    parts.push_back(g.defined() ? g.reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  }
  parts.push_back(torch::tensor(has_grad).to(bucket.type));
  bucket.flat = torch::cat(parts);
  bucket.launched = true;
  if (auto ok = group_->start_all_reduce(bucket.flat, Distributed::Op::sum, what_); !ok && !failed_) failed_ = ok.error();
}

void DataParallel::disarm() {
  if (!slots_) return;
  for (std::size_t k = 0; k < hooks_.size(); ++k)
    if (hooks_[k] != kNoHook) (*slots_)[k].param.remove_hook(hooks_[k]);
  hooks_.clear();
}

DataParallel::~DataParallel() {
  try {
    disarm();
  } catch (...) {  // unwinding: the state is not returned
  }
}

void DataParallel::begin(std::vector<Slot>& slots, double weighted_loss, bool non_finite) {
  if (bucket_of_.size() != slots.size()) plan_buckets(slots);
  slots_ = &slots;
  grads_.assign(slots.size(), torch::Tensor());
  for (auto& b : buckets_) b.ready = 0, b.launched = false;
  next_ = 0;
  meta_ = torch::tensor(std::vector<double>{weighted_loss, non_finite ? 1.0 : 0.0, stop_requested_ ? 1.0 : 0.0},
                        torch::kDouble);
  if (auto ok = group_->start_all_reduce(meta_, Distributed::Op::sum, what_); !ok && !failed_) failed_ = ok.error();
  // The buffers (BatchNorm statistics) follow rank 0's, as DDP's default, but without a wait of
  // their own: the step's forwards are done, so they go out now, hidden by backward, and `reduce`
  // installs them. Every rank's state is then rank 0's at each step's end (evaluation and
  // algorithms read equal buffers), and the next forward starts from them.
  sent_buffers_ = Packed(buffers_);
  for (const auto& flat : sent_buffers_.flats)
    if (auto ok = group_->start_broadcast(flat, 0, what_); !ok && !failed_) failed_ = ok.error();
}

std::pair<double, bool> DataParallel::reduce(std::vector<Slot>& slots, double weighted_loss, bool non_finite) {
  if (!group_) return {weighted_loss, non_finite};
  torch::NoGradGuard no_grad;
  disarm();
  // Not armed this step (no backward here: an empty shard or a non-finite loss): the loss and
  // flags first, as an armed rank sent them, then every bucket below.
  if (slots_ != &slots) begin(slots, weighted_loss, non_finite);
  while (next_ < buckets_.size()) launch(next_++);  // the rest (unused parameters, ...)
  auto done = group_->finish_all_reduces(what_);
  if (failed_) throw BatonException(*std::exchange(failed_, std::nullopt));
  dist_check(std::move(done));
  if (rank() != 0) sent_buffers_.unpack();
  sent_buffers_ = {};
  for (const Bucket& bucket : buckets_) {
    std::int64_t offset = 0;
    const auto members = static_cast<std::int64_t>(bucket.members.size());
    const auto flags = bucket.flat.narrow(0, bucket.flat.numel() - members, members).to(torch::kFloat);
    const float* has_grad = flags.data_ptr<float>();
    for (std::size_t i = 0; i < bucket.members.size(); ++i) {
      auto& p = slots[bucket.members[i]].param;
      if (has_grad[i] > 0) p.mutable_grad() = bucket.flat.narrow(0, offset, p.numel()).view_as(p);
      else p.mutable_grad().reset();  // no rank has a gradient for it (unused): as in one process
      offset += p.numel();
    }
  }
  slots_ = nullptr;
  grads_.clear();
  const double* m = meta_.data_ptr<double>();
  stop_agreed_ = m[2] > 0;
  return {m[0], m[1] > 0};
}

}  // namespace baton::detail
