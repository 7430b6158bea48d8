// data/formats/table_files.h's Arrow IPC copies of Parquet files: Arrow's Parquet reader read sequentially (a record
// batch of 64Ki rows at a time, so the copy needs no more memory than a batch), Arrow's IPC file writer into an
// io::AtomicFile.
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <arrow/ipc/writer.h>
#include <arrow/type.h>
#include <arrow/util/key_value_metadata.h>
#include <parquet/arrow/reader.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "data/formats/arrow/columns.h"
#include "data/formats/table_files.h"
#include "shardtrain/io/checksum.h"
#include "shardtrain/io/files.h"

namespace shardtrain::data {
namespace {

constexpr const char* kCopySourceKey = "shardtrain.source";  // the schema metadata's key for the source's identity

// Arrow's output stream over an AtomicFile: the copy appears whole (written, synced, renamed) or not at all.
class AtomicFileStream : public arrow::io::OutputStream {
 public:
  explicit AtomicFileStream(io::AtomicFile& file) : file_(file) {}
  arrow::Status Write(const void* data, int64_t bytes) override {
    try {
      file_.write(data, static_cast<size_t>(bytes));
    } catch (const std::runtime_error& e) {  // a full disk
      return arrow::Status::IOError(e.what());
    }
    position_ += bytes;
    return arrow::Status::OK();
  }
  arrow::Result<int64_t> Tell() const override { return position_; }
  arrow::Status Close() override {
    closed_ = true;
    return arrow::Status::OK();
  }
  bool closed() const override { return closed_; }

 private:
  io::AtomicFile& file_;
  int64_t position_ = 0;
  bool closed_ = false;
};

// The source identity a copy records (io::file_identity's), or "" when `copy` is no whole Arrow IPC file with one.
std::string recorded_source(const std::string& copy) {
  auto file = arrow::io::ReadableFile::Open(copy);
  if (!file.ok()) return "";
  auto reader = arrow::ipc::RecordBatchFileReader::Open(*file);
  if (!reader.ok()) return "";
  const auto& metadata = (*reader)->schema()->metadata();
  const int at = metadata ? metadata->FindKey(kCopySourceKey) : -1;
  return at < 0 ? "" : metadata->value(at);
}

// The identity's path: what precedes its size and time.
std::string identity_path(const std::string& identity) {
  const size_t time = identity.rfind(' ');
  const size_t size = time == std::string::npos || time == 0 ? std::string::npos : identity.rfind(' ', time - 1);
  return size == std::string::npos ? identity : identity.substr(0, size);
}

void write_copy(const std::string& path, const std::string& identity, const std::string& copy) {
  auto input = arrow_value(arrow::io::ReadableFile::Open(path), path + ": cannot be opened");
  auto reader = arrow_value(parquet::arrow::OpenFile(input, arrow::system_memory_pool()),
                            path + ": not a Parquet file, or a damaged one");
  auto batches = arrow_value(reader->GetRecordBatchReader(), path + ": cannot be read");
  const auto metadata = batches->schema()->metadata() ? batches->schema()->metadata()->Copy()
                                                      : std::make_shared<arrow::KeyValueMetadata>();
  metadata->Append(kCopySourceKey, identity);
  const auto schema = batches->schema()->WithMetadata(metadata);
  io::AtomicFile file(copy);
  AtomicFileStream stream(file);
  auto writer = arrow_value(arrow::ipc::MakeFileWriter(&stream, schema), copy + ": cannot be written");
  for (;;) {
    auto batch = arrow_value(batches->Next(), path + ": cannot be read");
    if (!batch) break;
    arrow_check(writer->WriteRecordBatch(*batch), copy + ": cannot be written");
  }
  arrow_check(writer->Close(), copy + ": cannot be written");
  file.commit();
}

}  // namespace

std::string parquet_arrow_copy(const std::string& path, const std::string& cache_dir) {
  const std::string identity = io::file_identity(path);
  std::string stem = path.substr(path.find_last_of('/') + 1);
  stem = stem.substr(0, stem.rfind(".parquet"));
  const std::string dir = cache_dir + "/tables";
  const std::string copy = dir + "/" + stem + "-" + io::to_hex(io::checksum_bytes(identity)) + ".arrow";
  try {
    if (recorded_source(copy) == identity) return copy;
    io::make_directories(dir);
    io::FileLock lock(copy + ".lock");
    // One process copies; the others wait for it (the lock goes with its holder however that ends), then read
    // what it wrote. A copy takes about a second for each 300 MB it holds.
    while (!lock.try_lock()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (recorded_source(copy) == identity) return copy;
    write_copy(path, identity, copy);
  } catch (const std::exception& e) {  // Arrow's reader may throw parquet::ParquetException
    const std::string what = e.what();
    throw std::runtime_error(what.rfind(path, 0) == 0 || what.rfind(copy, 0) == 0
                                 ? what
                                 : path + ": no Arrow copy in " + dir + ": " + what);
  }
  return copy;
}

std::vector<TableCopy> table_copies(const std::string& cache_dir) {
  const std::string dir = cache_dir + "/tables";
  std::vector<TableCopy> out;
  if (!io::is_directory(dir)) return out;
  for (const std::string& name : io::list_directory(dir)) {
    if (name.size() < 6 || name.compare(name.size() - 6, 6, ".arrow") != 0) continue;
    TableCopy c;
    c.path = dir + "/" + name;
    c.bytes = io::file_size(c.path);
    const std::string identity = recorded_source(c.path);
    c.whole = !identity.empty();
    if (c.whole) {
      c.source = identity_path(identity);
      try {
        c.current = io::file_identity(c.source) == identity;
      } catch (const std::runtime_error&) {  // the source is gone
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace shardtrain::data
