#include "parallel/detail/unit_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <new>

namespace cohort::parallel::detail {

namespace {

class UnitAllocator final : public c10::Allocator {
 public:
  static UnitAllocator& instance() {
    static UnitAllocator* a = new UnitAllocator();  // outlives every tensor
    return *a;
  }

  c10::DataPtr allocate(size_t n) const override {
    const size_t bytes = std::max<size_t>(n, 1);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto it = cache_.find(bytes);
      if (it != cache_.end()) {
        p = it->second;
        cache_.erase(it);
      }
    }
    if (p == nullptr) {
      p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
    }
    return {p, new Block{p, bytes}, &UnitAllocator::free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  struct Block {
    void* p;
    size_t bytes;
  };
  // Kept mapped for the next unit of the same size: the current, the next
  // (prefetched) and the previous (in flight) of parameters and gradients.
  static constexpr size_t kKeepPerSize = 4;

  static void free(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    UnitAllocator& a = instance();
    {
      std::lock_guard<std::mutex> g(a.mutex_);
      if (a.cache_.count(b->bytes) < kKeepPerSize) {
        a.cache_.emplace(b->bytes, b->p);
        delete b;
        return;
      }
    }
    ::munmap(b->p, b->bytes);
    delete b;
  }

  mutable std::mutex mutex_;
  mutable std::multimap<size_t, void*> cache_;
};

}  // namespace

at::Tensor unitBuffer(int64_t n, const at::TensorOptions& options) {
  if (!options.device().is_cpu()) return torch::empty({n}, options);
  const size_t bytes = static_cast<size_t>(n) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, &UnitAllocator::instance(), /*resizable=*/true);
  return torch::empty({0}, options).set_(storage, 0, {n}, {1});
}

}  // namespace cohort::parallel::detail
