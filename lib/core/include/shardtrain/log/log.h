// Console output of the library: every line a run prints goes through a Logger to one Sink. Library code never
// prints itself; the command line installs the console sink, a program embedding shardtrain installs its own (or
// none: a Logger without a sink is silent).
//
//   log::Logger log(log::console_sink(), world.rank(), {log::Level::INFO});
//   log.info("training ...");          // rank 0 only (the default), at INFO and above
//   log.info_every_rank("rank 1: ..."); // from each rank
//   log.status("[####    ] 12/100");    // a transient line (a progress bar), redrawn in place; "" removes it
//
// Lines are not prefixed with the rank here: `shardtrain launch` prefixes every worker's line with "[rankN]: ".
#pragma once

#include <memory>
#include <string>

namespace shardtrain::log {

enum class Level { DEBUG, INFO, WARNING, ERROR };

class Sink {
 public:
  virtual ~Sink() = default;
  virtual void line(Level level, const std::string& text) = 0;
  // A transient line shown below the others until the next status or line; "" removes it.
  virtual void status(const std::string& text) = 0;
  // Whether status lines reach a person (a terminal, or a launcher that draws them on one): log.progress: auto
  // draws a progress bar only then.
  virtual bool shows_status() const { return false; }
};

// stdout for DEBUG and INFO lines, stderr for WARNING and ERROR; the status line on stderr, erased before each line
// (carriage return and erase-line) so that lines scroll above it. Lines are flushed as they are written. Shows
// status lines when stderr is a terminal.
std::shared_ptr<Sink> console_sink();

struct LoggerOptions {
  Level level = Level::INFO;  // lines below it are dropped
  bool every_rank = false;    // info() and friends print on every rank, not on rank 0 alone
};

class Logger {
 public:
  Logger() = default;  // silent
  Logger(std::shared_ptr<Sink> sink, int rank, LoggerOptions options = {});

  void debug(const std::string& text) const { write(Level::DEBUG, text, false); }
  void info(const std::string& text) const { write(Level::INFO, text, false); }
  void warning(const std::string& text) const { write(Level::WARNING, text, false); }
  void error(const std::string& text) const { write(Level::ERROR, text, false); }
  void info_every_rank(const std::string& text) const { write(Level::INFO, text, true); }
  void warning_every_rank(const std::string& text) const { write(Level::WARNING, text, true); }
  // Rank 0's transient status line (progress); nothing on other ranks.
  void status(const std::string& text) const;

  bool writes(Level level) const;  // this rank writes lines of `level`
  bool shows_status() const;       // this rank's status lines reach a person
  int rank() const { return rank_; }

 private:
  void write(Level level, const std::string& text, bool every_rank) const;

  std::shared_ptr<Sink> sink_;
  int rank_ = 0;
  LoggerOptions options_;
};

}  // namespace shardtrain::log
