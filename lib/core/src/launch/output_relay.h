// The launcher's output (private to the launch layer): every worker line prefixed with its rank, and rank 0's
// progress line drawn in place at the bottom of the launcher's terminal. See launch/launch.h [Note: progress through
// the launcher].
#pragma once

#include <cstddef>
#include <string>

namespace shardtrain::launch {

// Writes all of `size` bytes to `fd` (retrying short writes and EINTR; gives up on other errors: output is best
// effort). Async-signal-safe: a forked child may call it before exec.
void write_all(int fd, const char* data, size_t size);
inline void write_all(int fd, const std::string& text) { write_all(fd, text.data(), text.size()); }

// The one status line (rank 0's progress) at the bottom of the launcher's terminal. Every other line is printed
// above it: erased, the line, drawn again. Off a terminal it draws nothing.
class StatusLine {
 public:
  StatusLine();
  bool terminal() const { return terminal_; }
  void set(const std::string& text);  // "" removes it
  void clear();                       // erased from the screen, kept to draw again
  void draw();                        // clipped to the terminal's width
  void forget();                      // the job is over: the last status stays on its line, output goes below it

 private:
  bool terminal_;
  bool shown_ = false;
  std::string text_;
};

// One worker stream's bytes to whole lines, each prefixed with the rank. A status line (kStatusLineMarker first)
// goes to the StatusLine on a terminal; elsewhere it is an ordinary line.
class LineRelay {
 public:
  LineRelay(int rank, int out_fd, StatusLine& status);
  void feed(const char* data, size_t size);
  void flush();  // the last line, without its newline

 private:
  void emit(const std::string& line);

  std::string prefix_;
  int out_fd_;
  StatusLine* status_;
  std::string pending_;
};

// Reads what is available on fd into relay; returns false at end of file.
bool pump(int fd, LineRelay& relay);

}  // namespace shardtrain::launch
