#include "train/metrics_log.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <stdexcept>

#include "shardtrain/io/files.h"

namespace shardtrain::train {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char out[32];
  if (s >= 3600) {
    std::snprintf(out, sizeof(out), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(out, sizeof(out), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return out;
}

// One line, flushed to the file; throws std::runtime_error with the system's reason (a full disk: ENOSPC).
void write_line(std::FILE* f, const std::string& path, const std::string& line) {
  if (std::fputs(line.c_str(), f) < 0 || std::fputc('\n', f) == EOF || std::fflush(f) != 0) {
    throw std::runtime_error("cannot write '" + path + "': " + std::strerror(errno));
  }
}

std::FILE* open_csv(const std::string& path, const std::string& header, bool append) {
  const bool exists = io::path_exists(path);
  std::FILE* f = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  try {
    if (!append || !exists) write_line(f, path, header);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  return f;
}

std::string csv_number(double v) {
  if (!std::isfinite(v)) return "";
  char out[32];
  std::snprintf(out, sizeof(out), "%.6g", v);
  return out;
}

}  // namespace

template <class Write>
void MetricsLog::guarded(Sink sink, Write&& write) {
  try {
    write();
  } catch (const std::runtime_error& e) {
    static constexpr const char* kNames[] = {"metrics.csv", "eval.csv", "TensorBoard events"};
    logger_.warning(std::string("log.dir: ") + e.what() + "; training goes on without " +
                    kNames[static_cast<int>(sink)]);
    // Dropped: one warning, not one per interval.
    std::FILE*& file = sink == Sink::CSV ? csv_ : eval_csv_;
    if (sink == Sink::EVENTS) {
      events_.reset();
    } else if (file) {
      std::fclose(file);
      file = nullptr;
    }
    failed_[static_cast<int>(sink)] = true;
  }
}

MetricsLog::MetricsLog(const config::LogConfig& config, log::Logger logger, bool leader, int64_t total_steps,
                       int64_t start_step, std::vector<std::string> loss_names, int64_t samples_per_step)
    : config_(config),
      logger_(std::move(logger)),
      loss_names_(std::move(loss_names)),
      leader_(leader),
      total_(total_steps),
      start_(start_step),
      step_(start_step),
      samples_per_step_(samples_per_step),
      started_(now()) {
  if (!leader_) return;
  bar_ = config.progress == config::Progress::BAR ||
         (config.progress == config::Progress::AUTO && logger_.shows_status());
  if (config.dir.empty()) return;
  try {
    io::make_directories(config.dir);
  } catch (const std::runtime_error& e) {
    logger_.warning(std::string("log.dir: ") + e.what() + "; training goes on without metrics files");
    for (bool& failed : failed_) failed = true;
    return;
  }
  if (config.tensorboard) {
    guarded(Sink::EVENTS, [&] { events_ = std::make_unique<EventWriter>(config.dir); });
  }
  if (config.csv) {
    std::string header = "step,loss,lr,grad_norm,items_per_s,texts_per_s,images_per_s,tflops_per_rank,mfu,peak_memory_gib,"
                         "peak_memory_gib_by_rank";
    for (const auto& c : loss_names_) header += "," + c;
    guarded(Sink::CSV, [&] { csv_ = open_csv(config.dir + "/metrics.csv", header, /*append=*/start_step > 0); });
  }
}

MetricsLog::~MetricsLog() {
  if (csv_) std::fclose(csv_);
  if (eval_csv_) std::fclose(eval_csv_);
}

void MetricsLog::draw_bar() {
  const int64_t done = step_ - start_, todo = total_ - start_;
  const double elapsed = now() - started_;
  const double rate = done > 0 ? static_cast<double>(done) / elapsed : NAN;
  const double eta = done > 0 ? static_cast<double>(total_ - step_) / rate : NAN;
  constexpr int kWidth = 30;
  const int filled = todo > 0 ? static_cast<int>(kWidth * done / todo) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar += std::string(static_cast<size_t>(kWidth - filled), '.');
  // tqdm's order: bar, steps, percentage, elapsed<remaining, rates; then the loss and this rank's peak memory.
  char line[320];
  std::snprintf(line, sizeof(line), "[%s] %lld/%lld %3d%% %s<%s %.2f it/s", bar.c_str(),
                static_cast<long long>(step_), static_cast<long long>(total_),
                static_cast<int>(100 * step_ / std::max<int64_t>(1, total_)), duration_text(elapsed).c_str(),
                duration_text(eta).c_str(), std::isfinite(rate) ? rate : 0.0);
  std::string text = line;
  if (samples_per_step_ > 0 && std::isfinite(rate)) {
    std::snprintf(line, sizeof(line), " %.1f samples/s", rate * static_cast<double>(samples_per_step_));
    text += line;
  }
  std::snprintf(line, sizeof(line), " loss %.4f", last_loss_);
  text += line;
  if (last_peak_gib_ > 0) {
    std::snprintf(line, sizeof(line), " mem %.3g GiB", last_peak_gib_);
    text += line;
  }
  logger_.status(text);
}

void MetricsLog::step_done(int64_t step, double loss, double peak_gib) {
  step_ = step, last_loss_ = loss, last_peak_gib_ = peak_gib;
  if (leader_ && bar_) draw_bar();
}

std::string MetricsLog::line_of(const IntervalMetrics& m) const {
  char head[160];
  std::snprintf(head, sizeof(head), "step %lld/%lld  loss %.4f", static_cast<long long>(m.step),
                static_cast<long long>(total_), m.loss);
  std::string line = head;
  if (m.steps != config_.interval) {  // the last interval's, a rollback's or skipped steps': said
    line += " (the mean of " + std::to_string(m.steps) + (m.steps == 1 ? " step)" : " steps)");
  }
  std::snprintf(head, sizeof(head), "  lr %.3g  grad_norm %.3g", m.lr, m.grad_norm);
  line += head;
  for (const auto& [name, v] : m.parts) {
    char part[64];
    std::snprintf(part, sizeof(part), "  %s %.4f", name.c_str(), v);
    line += part;
  }
  if (std::isfinite(m.items_per_second)) {
    char tail[160];
    std::snprintf(tail, sizeof(tail), "  items/s %.1f  TFLOP/s/rank %.3g  MFU %.1f%%", m.items_per_second,
                  m.tflops_per_rank, 100 * m.mfu);
    line += tail;
  } else {
    line += "  (throughput after warm-up)";
  }
  double peak = 0;
  for (double p : m.peak_memory_gib) peak = std::max(peak, p);
  char mem[64];
  std::snprintf(mem, sizeof(mem), "  peak mem %.3g GiB", peak);  // 3 digits: small models too
  line += mem;
  if (m.peak_memory_gib.size() > 1 && m.peak_memory_gib.size() <= 8) {
    line += " (";
    for (size_t r = 0; r < m.peak_memory_gib.size(); ++r) {
      char one[24];
      std::snprintf(one, sizeof(one), "%s%.3g", r ? " " : "", m.peak_memory_gib[r]);
      line += one;
    }
    line += ")";
  }
  return line;
}

void MetricsLog::record(const IntervalMetrics& m) {
  if (!leader_) return;
  if (config_.progress != config::Progress::NONE) message(line_of(m));
  double peak = 0;
  for (double p : m.peak_memory_gib) peak = std::max(peak, p);
  if (csv_) {
    guarded(Sink::CSV, [&] {
      std::string row = std::to_string(m.step) + "," + csv_number(m.loss) + "," + csv_number(m.lr) + "," +
                        csv_number(m.grad_norm) + "," + csv_number(m.items_per_second) + "," +
                        csv_number(m.texts_per_second) + "," + csv_number(m.images_per_second) + "," +
                        csv_number(m.tflops_per_rank) + "," + csv_number(m.mfu) + "," + csv_number(peak) + ",";
      for (size_t r = 0; r < m.peak_memory_gib.size(); ++r) {  // "0.125;0.25": one column whatever the world size
        row += (r ? ";" : "") + csv_number(m.peak_memory_gib[r]);
      }
      for (const auto& c : loss_names_) {
        auto it = m.parts.find(c);
        row += "," + (it == m.parts.end() ? std::string() : csv_number(it->second));
      }
      write_line(csv_, config_.dir + "/metrics.csv", row);
    });
  }
  if (events_) {
    guarded(Sink::EVENTS, [&] {
      events_->add_scalar("train/loss", m.loss, m.step);
      for (const auto& [name, v] : m.parts) events_->add_scalar("train/loss_" + name, v, m.step);
      events_->add_scalar("train/lr", m.lr, m.step);
      events_->add_scalar("train/grad_norm", m.grad_norm, m.step);
      if (std::isfinite(m.items_per_second)) {
        events_->add_scalar("perf/items_per_second", m.items_per_second, m.step);
        events_->add_scalar("perf/tflops_per_rank", m.tflops_per_rank, m.step);
        events_->add_scalar("perf/mfu", m.mfu, m.step);
      }
      events_->add_scalar("memory/peak_gib", peak, m.step);
      events_->flush();
    });
  }
}

void MetricsLog::record_eval(int64_t step, const std::map<std::string, double>& values) {
  if (!leader_) return;
  std::string line = "eval step " + std::to_string(step);
  for (const auto& [name, v] : values) {
    char part[96];
    std::snprintf(part, sizeof(part), "  %s %.4g", name.c_str(), v);
    line += part;
  }
  message(line);
  if (!config_.dir.empty() && config_.csv && !failed_[static_cast<int>(Sink::EVAL_CSV)]) {
    guarded(Sink::EVAL_CSV, [&] {
      if (!eval_csv_) {
        std::string header = "step";
        eval_columns_.clear();
        for (const auto& [name, v] : values) header += "," + name, eval_columns_.push_back(name);
        eval_csv_ = open_csv(config_.dir + "/eval.csv", header, /*append=*/start_ > 0);
      }
      std::string row = std::to_string(step);
      for (const auto& c : eval_columns_) {
        auto it = values.find(c);
        row += "," + (it == values.end() ? std::string() : csv_number(it->second));
      }
      write_line(eval_csv_, config_.dir + "/eval.csv", row);
    });
  }
  if (events_) {
    guarded(Sink::EVENTS, [&] {
      for (const auto& [name, v] : values) events_->add_scalar("eval/" + name, v, step);
      events_->flush();
    });
  }
}

void MetricsLog::message(const std::string& line) {
  if (leader_) logger_.info(line);  // the sink keeps the bar below it
}

void MetricsLog::warning(const std::string& line) {
  if (leader_) logger_.warning(line);
}

void MetricsLog::finish() {
  if (leader_ && bar_) logger_.status("");
}

}  // namespace shardtrain::train
