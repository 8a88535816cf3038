// The neuron backend's PrivateUse1 hooks and device guard in C++: what torch's Python
// interfaces (torch._C._acc.PrivateUse1Hooks, torch._C._acc.DeviceGuard) cannot offer, a
// pinned-memory allocator and device-generic streams and events.
//
// Once neuron is PyTorch's accelerator, every request for pinned host memory goes to the
// accelerator's hooks: `torch.empty(..., pin_memory=True)`, `Tensor.pin_memory()`,
// `DataLoader(pin_memory=True)`, and DDP's reducer with find_unused_parameters or
// static_graph (its used-parameter map). Pinned memory here is 64-byte aligned host memory
// the runtime imports without a copy; `is_pinned()` answers for exactly the blocks this
// allocator handed out and has not freed.
//
// The device guard answers torch's device-generic stream API (`torch.accelerator.current_stream`,
// `torch.Stream(device="neuron")`, `torch.Event`, and the autograd engine, which runs each
// backward op on the stream its forward ran on) with the backend's own streams
// (torch_neuronx/runtime/streams.py). The current device and each device's current stream are
// per thread, kept here as a mirror of the Python side's (which tells this library of every
// change), so that reading them, which Dynamo does at every compiled call, enters no Python
// frame; changing them, creating streams and everything events do call back into Python
// (device/generic_streams.py) through one function.
//
// Built by torch_neuronx/device/native.py into a cache directory and loaded with ctypes;
// the C functions below are its whole interface.

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <atomic>
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

// -- the device guard ---------------------------------------------------------

// What the Python side does for the guard: one function, an operation code and its operands.
// Returns 0, or non-zero with a message written into `error` (at most `error_size` bytes).
using Callback = int (*)(int op, int64_t a, int64_t b, int64_t c, int64_t* out, double* out_double,
                         char* error, int error_size);

enum Op : int {
  kSetDevice = 1,    // a: device
  kSetStream = 2,    // a: device, b: stream id
  kNewStream = 3,    // a: device, b: priority; out: stream id
  kRecord = 4,       // a: event (0: a new one), b: device, c: stream id; out: event; out_double: timing flag
  kBlock = 5,        // a: event, b: device, c: stream id
  kQueryEvent = 6,   // a: event; out: 1 when complete
  kSyncEvent = 7,    // a: event
  kElapsed = 8,      // a: start event, b: end event; out_double: milliseconds
  kDestroyEvent = 9, // a: event
  kQueryStream = 10, // a: device, b: stream id; out: 1 when idle
  kSyncStream = 11,  // a: device, b: stream id
  kSyncDevice = 12,  // a: device
  kDeviceCount = 13, // out: the devices this process sees now (TORCH_NEURONX_VISIBLE_DEVICES)
};

constexpr int kMaxDevices = 64;
constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

std::atomic<Callback> callback{nullptr};

struct ThreadState {
  c10::DeviceIndex device = 0;
  std::array<c10::StreamId, kMaxDevices> streams{};  // 0: the default stream
};
thread_local ThreadState state;

int64_t call(int op, int64_t a, int64_t b = 0, int64_t c = 0, double* out_double = nullptr) {
  Callback fn = callback.load();
  TORCH_CHECK(fn != nullptr, "neuron: the device guard is not connected to the runtime (interpreter shutting down?)");
  int64_t out = 0;
  char error[1024] = {0};
  int status = fn(op, a, b, c, &out, out_double, error, sizeof(error) - 1);
  TORCH_CHECK(status == 0, error[0] ? error : "neuron: the runtime's stream operation failed");
  return out;
}

// A device index this guard can keep state for; whether the device exists is the runtime's to
// say where the guard calls it (reading the current stream must not call into Python).
void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "neuron:", static_cast<int>(index), " does not exist");
}

struct NeuronGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device previous = getDevice();
    if (device.index() != state.device) {
      setDevice(device);
    }
    return previous;
  }

  c10::Device getDevice() const override { return c10::Device(kNeuron, state.device); }

  void setDevice(c10::Device device) const override {
    c10::DeviceIndex index = device.index() < 0 ? 0 : device.index();
    check_index(index);
    if (index != state.device) {
      call(kSetDevice, index);
      state.device = index;
    }
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    try {
      setDevice(device);
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    c10::DeviceIndex index = device.index() < 0 ? state.device : device.index();
    check_index(index);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), state.streams[index]);
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    c10::DeviceIndex index = device.index() < 0 ? state.device : device.index();
    check_index(index);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), 0);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override { return getNewStream(device, 0); }

  c10::Stream getNewStream(c10::Device device, int priority) const override {
    c10::DeviceIndex index = device.index() < 0 ? state.device : device.index();
    check_index(index);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), call(kNewStream, index, priority));
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    c10::DeviceIndex index = stream.device_index();
    check_index(index);
    c10::Stream previous(c10::Stream::UNSAFE, c10::Device(kNeuron, index), state.streams[index]);
    if (stream.id() != state.streams[index]) {
      call(kSetStream, index, stream.id());
      state.streams[index] = stream.id();
    }
    return previous;
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    Callback fn = callback.load();
    if (event != nullptr && fn != nullptr) {
      int64_t out = 0;
      char error[256] = {0};
      fn(kDestroyEvent, reinterpret_cast<int64_t>(event), 0, 0, &out, nullptr, error, sizeof(error) - 1);
    }
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "event device index ",
                static_cast<int>(device_index), " does not match the recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    double timing = flag == c10::EventFlag::BACKEND_DEFAULT ? 1.0 : 0.0;
    int64_t handle = call(kRecord, reinterpret_cast<int64_t>(*event), stream.device_index(), stream.id(), &timing);
    *event = reinterpret_cast<void*>(handle);
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr) {
      call(kBlock, reinterpret_cast<int64_t>(event), stream.device_index(), stream.id());
    }
  }

  bool queryEvent(void* event) const override {
    return event == nullptr || call(kQueryEvent, reinterpret_cast<int64_t>(event)) != 0;
  }

  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      call(kSyncEvent, reinterpret_cast<int64_t>(event));
    }
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "both events must be recorded before calculating elapsed time.");
    double milliseconds = 0.0;
    call(kElapsed, reinterpret_cast<int64_t>(start), reinterpret_cast<int64_t>(end), 0, &milliseconds);
    return milliseconds;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(call(kDeviceCount, 0));
    } catch (...) {
      return 1;
    }
  }

  bool queryStream(const c10::Stream& stream) const override {
    return call(kQueryStream, stream.device_index(), stream.id()) != 0;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    call(kSyncStream, stream.device_index(), stream.id());
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    call(kSyncDevice, device_index < 0 ? state.device : device_index);
  }
};

}  // namespace

// Connect the device guard to the runtime (`fn`) and make it torch's PrivateUse1 device guard.
// `fn` null disconnects it (at interpreter exit): from then on, what would call into Python
// raises, and destroying an event does nothing.
extern "C" void torch_neuronx_register_guard(Callback fn) {
  static NeuronGuard* guard = nullptr;
  callback.store(fn);
  if (guard == nullptr && fn != nullptr) {
    guard = new NeuronGuard();
    c10::impl::registerDeviceGuard(kNeuron, guard);
  }
}

// The Python side's changes of this thread's current device and stream (the mirror).
extern "C" void torch_neuronx_guard_set_device(int device) {
  if (device >= 0 && device < kMaxDevices) {
    state.device = static_cast<c10::DeviceIndex>(device);
  }
}

extern "C" void torch_neuronx_guard_set_stream(int device, int64_t stream_id) {
  if (device >= 0 && device < kMaxDevices) {
    state.streams[device] = stream_id;
  }
}

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
