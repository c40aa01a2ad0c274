#pragma once

// TensorBoard event files, written without TensorFlow or protobuf.
//
// A file `<dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>` is
// a sequence of TFRecords, each holding one serialized tensorflow.Event:
//
//   uint64 length (little-endian)
//   uint32 masked CRC-32C of the 8 length bytes
//   byte   data[length]            the Event
//   uint32 masked CRC-32C of data
//
// (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8). The first Event
// carries file_version "brain.Event:2"; each scalar is an Event {wall_time,
// step, summary {value {tag, simple_value}}} — what TensorBoard's scalar
// dashboard reads, as tf.summary / tensorboardX write it. See
// docs/outputs.md ("TensorBoard").

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace cohort::monitor {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) if missing and a new event file in it,
  // then writes and flushes the file_version record. `<n>` counts the
  // writers this process opened, so two writers never share a file.
  // Throws IoError naming the directory or file and the system error.
  explicit TensorBoardWriter(const std::string& dir);
  // Flushes and closes; never throws (a failure is logged as a warning).
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one scalar at `step`, stamped with the current time or with
  // `wallTime` (Unix seconds). TensorBoard stores scalars as float32: the
  // value is rounded to it (beyond its range: +-inf). Records are buffered
  // in memory: call flush() after a batch of scalars so that TensorBoard sees
  // them while the run goes on. A tag's bytes that are not valid UTF-8
  // become U+FFFD (TensorBoard refuses a file with such a tag). Throws
  // IoError naming the file.
  void addScalar(const std::string& tag, int64_t step, double value);
  void addScalar(const std::string& tag, int64_t step, double value, double wallTime);

  // Hands the buffered records to the operating system (no fsync: an event
  // file is a view of a run, not a record to survive a power cut). Blocks
  // only on the write. Throws IoError naming the file.
  void flush();

  // The event file's path.
  const std::string& path() const { return path_; }

  // Every member function may be called from several threads: a mutex
  // keeps each record whole.

 private:
  void writeRecord(const std::string& event);  // with mutex_ held

  std::mutex mutex_;
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace cohort::monitor
