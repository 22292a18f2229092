#pragma once
// Where the loop's batches come from (loop.cpp): the data order (course.hpp) and the dataset's
// `gather`, made on the loop's thread (workers = 0) or ahead of it by worker threads
// (DataSpec::workers) in a bounded queue. A batch is a pure function of (seed, epoch, indices),
// so the queue only saves time: a batch it guessed wrong (a resume, a budget's end) is made again.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "baton/data.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"
#include "train/course.hpp"

namespace baton::detail {

class DataParallel;

class Feed {
 public:
  /// `shard(take)`: this rank's (offset, size) of a global batch of `take` samples.
  Feed(const TrainingSpec& spec, const Course& course, std::function<std::pair<std::int64_t, std::int64_t>(std::int64_t)> shard,
       Time max_duration);
  ~Feed();
  Feed(const Feed&) = delete;
  Feed& operator=(const Feed&) = delete;

  /// The batch of `take` samples at `s.time` (this rank's `offset`, `size` of it). A dataset's
  /// error is raised (BatonException), naming the epoch and the position.
  Batch next(TrainState& s, std::int64_t take, std::int64_t offset, std::int64_t size);

 private:
  struct Job;
  void worker();
  void enqueue(const Timestamp& t);  // a job for the batch at t
  void top_up();                     // jobs for the batches after the last queued one
  torch::Tensor order(std::int64_t epoch);
  Batch made(Job& job);

  const Dataset& data_;
  const Course& course_;
  bool shuffle_;
  std::function<std::pair<std::int64_t, std::int64_t>(std::int64_t)> shard_;
  Time max_;
  std::size_t depth_;
  std::int64_t order_epoch_ = -1;
  torch::Tensor order_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // in the loop's order; front is the next batch
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace baton::detail
