// Apache Arrow's IPC format through Arrow's own reader: what Hugging Face `datasets` keeps its data in (the cache
// files load_dataset writes and save_to_disk's data-*.arrow, the streaming format) and what pyarrow writes as
// .arrow/.feather files (the file format, "ARROW1" ... footer). The file's bytes are read in place (every buffer a
// view of them); every record batch is validated whole when the table is opened.
#include <arrow/io/memory.h>
#include <arrow/ipc/reader.h>

#include <cstring>

#include "data/formats/arrow/columns.h"
#include "data/formats/table_files.h"

namespace shardtrain::data {
namespace {

// A stream's record batches, to its end-of-stream marker (a stream without one was cut short).
arrow::RecordBatchVector stream_batches(arrow::ipc::RecordBatchStreamReader& reader, arrow::io::BufferReader& in,
                                        std::string_view bytes, const std::string& name) {
  arrow::RecordBatchVector batches;
  for (;;) {
    const int64_t at = arrow_value(in.Tell(), name + ": cannot be read");
    std::shared_ptr<arrow::RecordBatch> batch;
    const arrow::Status read = reader.ReadNext(&batch);
    if (!read.ok()) {
      throw std::runtime_error(name + ": record batch " + std::to_string(batches.size()) +
                               " cannot be read (cut short or damaged): " + read.message());
    }
    if (batch) {
      batches.push_back(std::move(batch));
      continue;
    }
    // The marker: 0xFFFFFFFF then a zero length, or (before Arrow 0.15) the zero length alone.
    const int64_t end = arrow_value(in.Tell(), name + ": cannot be read");
    const std::string_view marker = bytes.substr(static_cast<size_t>(at), static_cast<size_t>(end - at));
    if (marker != std::string_view("\xff\xff\xff\xff\0\0\0\0", 8) && marker != std::string_view("\0\0\0\0", 4)) {
      throw std::runtime_error(name + ": cut short after " + std::to_string(batches.size()) +
                               " record batches: no end-of-stream marker");
    }
    return batches;
  }
}

}  // namespace

std::unique_ptr<ColumnTable> open_arrow_ipc(std::string_view bytes, std::string name) {
  const auto buffer = std::make_shared<arrow::Buffer>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                      static_cast<int64_t>(bytes.size()));
  const auto in = std::make_shared<arrow::io::BufferReader>(buffer);
  // A buffer at an offset its type cannot be read at (a damaged or hand-made file; pyarrow and datasets pad to 8
  // bytes) is copied to one it can: reading it in place would be undefined behaviour.
  auto options = arrow::ipc::IpcReadOptions::Defaults();
  options.ensure_alignment = arrow::ipc::Alignment::kDataTypeSpecificAlignment;
  const bool file_format = bytes.size() >= 6 && std::memcmp(bytes.data(), "ARROW1", 6) == 0;
  try {
    if (file_format) {
      const auto reader = arrow_value(arrow::ipc::RecordBatchFileReader::Open(in, options),
                                      name + ": not an Arrow IPC file, or a damaged one");
      arrow::RecordBatchVector batches;
      for (int b = 0; b < reader->num_record_batches(); ++b) {
        batches.push_back(arrow_value(reader->ReadRecordBatch(b),
                                      name + ": record batch " + std::to_string(b) + " cannot be read"));
      }
      return std::make_unique<ArrowColumns>(*reader->schema(), name, batches);
    }
    const auto reader = arrow_value(arrow::ipc::RecordBatchStreamReader::Open(in, options),
                                    name + ": not an Arrow IPC stream, or a damaged one");
    const arrow::RecordBatchVector batches = stream_batches(*reader, *in, bytes, name);
    return std::make_unique<ArrowColumns>(*reader->schema(), name, batches);
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {  // Arrow's own, thrown rather than returned
    throw std::runtime_error(name + ": cannot be read as Arrow IPC: " + e.what());
  }
}

}  // namespace shardtrain::data
