#pragma once

// Files that are either complete or absent.

#include <cstddef>
#include <string>

namespace cohort {

// Writes `size` bytes to `path` atomically: a temporary file in the same
// directory, fsync, rename over `path`, fsync of the directory. A crash leaves
// either the old file or the new one, never a torn one. Creates missing
// parent directories. Throws IoError naming the path and the system error.
void writeFileAtomic(const std::string& path, const void* data, size_t size);
inline void writeFileAtomic(const std::string& path, const std::string& text) {
  writeFileAtomic(path, text.data(), text.size());
}

// The whole of a (small) file. Throws IoError naming the path when it
// cannot be read.
std::string readFile(const std::string& path);

// The last `lines` lines of a text file, each indented by two spaces, for
// an error message ("" when it cannot be read).
std::string tailOfFile(const std::string& path, int lines);

// The same for a file written piece by piece (a stream no copy of which is
// held): a temporary file in the path's directory (created), appended to,
// and put in place by commit() as above. Destroyed without commit(), the
// temporary file goes. Throws IoError naming the path.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, dir_, tmp_;
  int fd_ = -1;
};

}  // namespace cohort
