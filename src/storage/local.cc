// Storage in a local directory: object names map to files under the root.
// Writes go to a hidden temporary file beside the target (".tmp.<name>...",
// skipped by list()), are fsync'd and renamed into place.

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "cohort/core/fd.h"
#include "cohort/core/file.h"
#include "storage/detail/backends.h"

namespace fs = std::filesystem;

namespace cohort::storage::detail {
namespace {

constexpr size_t kCopyChunk = 1 << 20;

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw StorageError(fmt::format("{} {}: {}", what, path, std::strerror(err)),
                     err == ENOENT ? 404 : 0, false);
}

void writeAll(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Copies `from` into `toFd`, reporting the bytes copied so far.
void copyInto(const std::string& from, int toFd, const std::string& to,
              const std::function<void(int64_t)>& progress) {
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) fail("cannot open", from, errno);
  std::string buf(kCopyChunk, '\0');
  int64_t done = 0;
  while (true) {
    const ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot read", from, errno);
    }
    if (n == 0) break;
    writeAll(toFd, buf.data(), static_cast<size_t>(n), to);
    done += n;
    if (progress) progress(done);
  }
}

class LocalStorage final : public Storage {
 public:
  explicit LocalStorage(std::string root) : root_(std::move(root)) {
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  }

  std::string describe() const override { return root_; }

  int64_t size(const std::string& name) override {
    const std::string p = path(name);
    std::error_code ec;
    const auto s = fs::file_size(p, ec);
    if (ec) {
      throw StorageError(fmt::format("cannot stat {}: {}", p, ec.message()),
                         ec == std::errc::no_such_file_or_directory ? 404 : 0, false);
    }
    return static_cast<int64_t>(s);
  }

  bool exists(const std::string& name) override {
    std::error_code ec;
    return fs::is_regular_file(path(name), ec);
  }

  std::string readRange(const std::string& name, int64_t offset, int64_t length) override {
    const std::string p = path(name);
    UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) fail("cannot open", p, errno);
    std::string out(static_cast<size_t>(length), '\0');
    int64_t got = 0;
    while (got < length) {
      const ssize_t n = ::pread(fd.get(), out.data() + got, static_cast<size_t>(length - got),
                                static_cast<off_t>(offset + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("cannot read", p, errno);
      }
      if (n == 0) break;
      got += n;
    }
    if (got < length || (length == 0 && offset > size(name))) {
      throw StorageError(fmt::format("{}: {} bytes at offset {} requested, the file has {} bytes",
                                     p, length, offset, size(name)),
                         416, false);
    }
    return out;
  }

  void readToFile(const std::string& name, const std::string& localPath,
                  const std::function<void(int64_t)>& progress) override {
    UniqueFd out(::open(localPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (out.get() < 0) fail("cannot create", localPath, errno);
    copyInto(path(name), out.get(), localPath, progress);
  }

  void writeFromFile(const std::string& name, const std::string& localPath) override {
    const fs::path target(path(name));
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) {
      throw StorageError(fmt::format("cannot create directory {}: {}",
                                     target.parent_path().string(), ec.message()),
                         0, false);
    }
    const std::string tmp =
        (target.parent_path() / (".tmp." + target.filename().string() + "." +
                                 std::to_string(::getpid()) + "." + std::to_string(counter_++)))
            .string();
    try {
      UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (out.get() < 0) fail("cannot create", tmp, errno);
      copyInto(localPath, out.get(), tmp, {});
      if (::fsync(out.get()) != 0) fail("cannot sync", tmp, errno);
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      fail("cannot rename into", target.string(), err);
    }
    UniqueFd dir(::open(target.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() >= 0) ::fsync(dir.get());
  }

  void writeBytes(const std::string& name, const std::string& data) override {
    try {
      writeFileAtomic(path(name), data);
    } catch (const StorageError&) {
      throw;
    } catch (const IoError& e) {
      throw StorageError(e.what(), 0, false);
    }
  }

  std::vector<ObjectInfo> list(const std::string& prefix) override {
    std::vector<ObjectInfo> out;
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return out;
    // Only the directory the prefix reaches into needs walking.
    const size_t slash = prefix.rfind('/');
    const std::string dirPart = slash == std::string::npos ? "" : prefix.substr(0, slash);
    const fs::path start = dirPart.empty() ? fs::path(root_) : fs::path(root_) / dirPart;
    if (!fs::is_directory(start, ec)) return out;
    fs::recursive_directory_iterator it(start, ec), end;
    if (ec)
      throw StorageError(fmt::format("cannot list {}: {}", start.string(), ec.message()), 0, false);
    for (; it != end; it.increment(ec)) {
      if (ec) {
        throw StorageError(fmt::format("cannot list {}: {}", start.string(), ec.message()), 0,
                           false);
      }
      if (!it->is_regular_file(ec)) continue;
      if (it->path().filename().string().rfind(".tmp.", 0) == 0) continue;
      const std::string rel = it->path().lexically_relative(root_).generic_string();
      if (rel.compare(0, prefix.size(), prefix) != 0) continue;
      out.push_back({rel, static_cast<int64_t>(it->file_size(ec))});
    }
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.name < b.name; });
    return out;
  }

  void remove(const std::string& name) override {
    const std::string p = path(name);
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) fail("cannot delete", p, errno);
  }

 private:
  std::string path(const std::string& name) const {
    // Names are relative and stay under the root.
    const fs::path n(name);
    bool ok = !name.empty() && n.is_relative();
    for (const auto& part : n) ok = ok && part != "..";
    if (!ok) {
      throw StorageError(fmt::format("{}: invalid object name '{}'", root_, name), 0, false);
    }
    return root_ + "/" + name;
  }

  std::string root_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace

std::unique_ptr<Storage> openLocalStorage(const std::string& root) {
  return std::make_unique<LocalStorage>(root);
}

}  // namespace cohort::storage::detail
