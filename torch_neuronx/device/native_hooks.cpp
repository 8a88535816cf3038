// The neuron backend's PrivateUse1 hooks in C++: what torch's Python hook interface
// (torch._C._acc.PrivateUse1Hooks) cannot offer, a pinned-memory allocator.
//
// Once neuron is PyTorch's accelerator, every request for pinned host memory goes to the
// accelerator's hooks: `torch.empty(..., pin_memory=True)`, `Tensor.pin_memory()`,
// `DataLoader(pin_memory=True)`, and DDP's reducer with find_unused_parameters or
// static_graph (its used-parameter map). Pinned memory here is 64-byte aligned host memory
// the runtime imports without a copy; `is_pinned()` answers for exactly the blocks this
// allocator handed out and has not freed.
//
// Built by torch_neuronx/device/native.py into a cache directory and loaded with ctypes;
// the C functions below are its whole interface.

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace {

constexpr size_t kAlignment = 64;  // what IREE's local HAL imports without a copy

std::mutex pinned_mutex;
std::unordered_map<const void*, size_t> pinned_blocks;  // address -> bytes, while allocated
int64_t pinned_total = 0;

void free_pinned(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  {
    std::lock_guard<std::mutex> guard(pinned_mutex);
    auto found = pinned_blocks.find(ptr);
    if (found != pinned_blocks.end()) {
      pinned_total -= static_cast<int64_t>(found->second);
      pinned_blocks.erase(found);
    }
  }
  std::free(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
      ptr = std::aligned_alloc(kAlignment, rounded);
      TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "neuron: could not allocate ", nbytes,
                       " bytes of pinned host memory");
      std::lock_guard<std::mutex> guard(pinned_mutex);
      pinned_blocks.emplace(ptr, nbytes);
      pinned_total += static_cast<int64_t>(nbytes);
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator pinned_allocator;

struct NeuronHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }

  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> guard(pinned_mutex);
    return pinned_blocks.count(data) != 0;
  }

  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
};

}  // namespace

// 0 when the hooks are now torch's PrivateUse1 hooks; 1 when torch refused them (hooks were
// registered before, by another copy of this library or by Python).
extern "C" int torch_neuronx_register_hooks() {
  static NeuronHooks* hooks = nullptr;
  if (hooks != nullptr) {
    return 0;
  }
  auto* made = new NeuronHooks();
  try {
    at::RegisterPrivateUse1HooksInterface(made);
  } catch (...) {
    delete made;
    return 1;
  }
  hooks = made;
  return 0;
}

// The bytes of pinned host memory allocated now, and the number of blocks.
extern "C" int64_t torch_neuronx_pinned_bytes() {
  std::lock_guard<std::mutex> guard(pinned_mutex);
  return pinned_total;
}

extern "C" int64_t torch_neuronx_pinned_blocks() {
  std::lock_guard<std::mutex> guard(pinned_mutex);
  return static_cast<int64_t>(pinned_blocks.size());
}
