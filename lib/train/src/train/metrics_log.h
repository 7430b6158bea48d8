// Where the loop's numbers go (private to the train layer), on rank 0: through the run's Logger a progress bar
// with ETA on a terminal (the sink's status line) and plain lines otherwise; metrics.csv and eval.csv, and
// TensorBoard events, all under log.dir. A file that cannot be written (a full disk, a directory that cannot be
// made) is dropped with one warning giving the system's reason; training goes on.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/config/config.h"
#include "shardtrain/log/log.h"
#include "train/event_writer.h"

namespace shardtrain::train {

struct IntervalMetrics {
  int64_t step = 0;                      // optimizer steps done
  int64_t steps = 0;                     // the steps the interval's means cover (log.interval but at the end)
  double loss = 0;                       // mean over the interval and the ranks
  std::map<std::string, double> parts;   // each loss, mean over the steps that had it
  double lr = 0, grad_norm = 0;
  double items_per_second = 0, texts_per_second = 0, images_per_second = 0;  // whole job; NaN during warm-up
  double tflops_per_rank = 0, mfu = 0;                                       // NaN during warm-up
  std::vector<double> peak_memory_gib;   // per rank, since the start
};

class MetricsLog {
 public:
  // `leader`: this rank writes; the others do nothing. start_step > 0 after a resume. `loss_names`: the task's
  // losses, metrics.csv's last columns. `samples_per_step`: over all ranks (the bar's samples/s).
  MetricsLog(const config::LogConfig& config, log::Logger logger, bool leader, int64_t total_steps,
             int64_t start_step, std::vector<std::string> loss_names, int64_t samples_per_step = 0);
  ~MetricsLog();

  // Every step: moves the bar. `peak_gib`: this rank's peak memory so far.
  void step_done(int64_t step, double loss, double peak_gib = 0);
  void record(const IntervalMetrics& m);      // every log interval
  void record_eval(int64_t step, const std::map<std::string, double>& values);
  void message(const std::string& line);      // a line of its own (above the bar)
  void warning(const std::string& line);      // the same at warning level
  void finish();

 private:
  enum class Sink { CSV, EVAL_CSV, EVENTS };
  // Runs `write`; a std::runtime_error from it drops `sink` with a warning instead of ending the run.
  template <class Write>
  void guarded(Sink sink, Write&& write);
  std::string line_of(const IntervalMetrics& m) const;
  void draw_bar();

  config::LogConfig config_;
  log::Logger logger_;
  std::vector<std::string> loss_names_;
  bool leader_, bar_ = false;
  int64_t total_, start_, step_ = 0;
  double last_loss_ = 0, last_peak_gib_ = 0;
  int64_t samples_per_step_ = 0;
  double started_ = 0;  // seconds
  std::unique_ptr<EventWriter> events_;
  std::FILE* csv_ = nullptr;
  std::FILE* eval_csv_ = nullptr;
  std::vector<std::string> eval_columns_;
  bool failed_[3] = {false, false, false};  // by Sink: dropped after a failure
};

}  // namespace shardtrain::train
