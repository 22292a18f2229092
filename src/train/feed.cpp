// The loop's batches, made ahead by worker threads (feed.hpp).
#include "train/feed.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "detail.hpp"
#include "horizon.hpp"

extern "C" void omp_set_num_threads(int);  // libgomp, LibTorch's OpenMP runtime

namespace baton::detail {

struct Feed::Job {
  Timestamp at;  // the loop's time when it takes this batch
  std::int64_t take = 0;
  torch::Tensor indices;  // this rank's shard of the batch
  bool started = false, done = false;
  Expected<Batch> result = Batch{};
};

Feed::Feed(const TrainingSpec& spec, const Course& course, std::function<std::pair<std::int64_t, std::int64_t>(std::int64_t)> shard,
           Time max_duration)
    : data_(course.data), course_(course), shuffle_(spec.data.shuffle), shard_(std::move(shard)), max_(max_duration),
      depth_(static_cast<std::size_t>(spec.data.workers) * static_cast<std::size_t>(spec.data.prefetch)) {
  for (int k = 0; k < spec.data.workers; ++k) threads_.emplace_back([this] { worker(); });
}

Feed::~Feed() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();  // a worker finishes the batch it is making, then leaves
}

void Feed::worker() {
  // One intra-op thread per worker: the step's threads keep the cores they were given.
  at::internal::lazy_init_num_threads();
  omp_set_num_threads(1);
  // And the lowest priority (nice 19): a worker that preempts one of the step's OpenMP threads
  // stalls the whole team at its next barrier (on 2 cores, 2 workers at normal priority cost
  // the CNN an eighth of its speed). Not SCHED_IDLE: on a machine busy with other work a worker
  // would starve, and the loop with it.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (stop_) return true;
        for (auto& j : queue_)
          if (!j->started) return true;
        return false;
      });
      if (stop_) return;
      for (auto& j : queue_)
        if (!j->started) {
          job = j, job->started = true;
          break;
        }
    }
    auto result = data_.gather(job->indices, {course_.data_seed, job->at.epoch});
    {
      const std::lock_guard<std::mutex> lock(mu_);
      job->result = std::move(result);
      job->done = true;
    }
    cv_.notify_all();
  }
}

torch::Tensor Feed::order(std::int64_t epoch) {
  if (epoch != order_epoch_) order_ = data::epoch_order(course_.n, course_.data_seed, epoch, shuffle_), order_epoch_ = epoch;
  return order_;
}

void Feed::enqueue(const Timestamp& t) {
  auto job = std::make_shared<Job>();
  job->at = t;
  job->take = std::min(course_.batch_size, course_.n - t.sample_in_epoch);
  const auto [offset, size] = shard_(job->take);
  job->indices = order(t.epoch).narrow(0, t.sample_in_epoch + offset, size);
  queue_.push_back(std::move(job));
}

void Feed::top_up() {
  while (queue_.size() < depth_) {
    Timestamp t = queue_.back()->at;
    advance(t, queue_.back()->take);
    roll_epoch(t, course_.n, course_.batch_size, course_.drop_last);
    if (reached_max(t, max_) || course_.stage_end.reached(t, course_.n) || course_.limit.reached(t, course_.n)) return;
    enqueue(t);
  }
}

Batch Feed::made(Job& job) {
  if (!job.result)
    throw BatonException(job.result.error().with_context(
        fmt::format("the batch at epoch {}, sample {} of the epoch", job.at.epoch, job.at.sample_in_epoch)));
  return std::move(*job.result);
}

Batch Feed::next(TrainState& s, std::int64_t take, std::int64_t offset, std::int64_t size) {
  const Timestamp& t = s.time;
  if (threads_.empty()) {
    Job job;
    job.at = t;
    job.result = data_.gather(course_.indices(s, shuffle_, offset, size), {course_.data_seed, t.epoch});
    return made(job);
  }
  std::shared_ptr<Job> job;
  bool mine = false;  // no worker has started it: the loop makes it (waiting would gain nothing)
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto expected = [&] {
      const auto& j = *queue_.front();
      return j.at.epoch == t.epoch && j.at.sample_in_epoch == t.sample_in_epoch && j.take == take;
    };
    if (queue_.empty() || !expected()) {
      queue_.clear();  // guessed wrong (the first batch of a fit): workers finish their jobs unseen
      enqueue(t);
      (void)offset, (void)size;  // the job's shard is shard_(take), the same as the loop's
    }
    top_up();
    job = queue_.front();
    queue_.pop_front();
    mine = !job->started;
    job->started = true;
  }
  cv_.notify_all();
  if (mine) {
    job->result = data_.gather(job->indices, {course_.data_seed, job->at.epoch});
    return made(*job);
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return job->done; });
  lock.unlock();
  return made(*job);
}

}  // namespace baton::detail
