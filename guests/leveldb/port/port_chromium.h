// Valet's LevelDB port: single-threaded, for wasm32-wasi (no threads) and for the native
// build that the comparison report runs against it.
//
// LevelDB's `port/port.h` includes `port/port_chromium.h` when LEVELDB_PLATFORM_CHROMIUM is
// defined; our build puts this directory first on the include path, so this header is the
// port and LevelDB's source stays untouched. Everything runs on the guest's one thread:
// background compactions run inline (see valet_env.cc), so a mutex is bookkeeping only and a
// condition variable is never waited on.

#ifndef VALET_LEVELDB_PORT_H_
#define VALET_LEVELDB_PORT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "port/thread_annotations.h"

namespace leveldb {
namespace port {

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
static const bool kLittleEndian = false;
#else
static const bool kLittleEndian = true;
#endif

class CondVar;

// A mutex with one thread: Lock and Unlock only track the state. LevelDB re-takes its
// mutex in a background job that our Env runs inline while the caller holds it, so the
// lock must not check for recursion either.
class LOCKABLE Mutex {
 public:
  Mutex() = default;
  ~Mutex() = default;

  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() EXCLUSIVE_LOCK_FUNCTION() {}
  void Unlock() UNLOCK_FUNCTION() {}
  void AssertHeld() ASSERT_EXCLUSIVE_LOCK() {}
};

// With one thread, nobody could ever signal a waiter: waiting is a bug, reported loudly
// instead of hanging.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) { (void)mu; }
  ~CondVar() = default;

  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait() {
    std::fputs("leveldb port: CondVar::Wait with a single thread would never return\n",
               stderr);
    std::abort();
  }
  void Signal() {}
  void SignalAll() {}
};

// No Snappy: blocks are stored uncompressed.
inline bool Snappy_Compress(const char* input, size_t length, std::string* output) {
  (void)input;
  (void)length;
  (void)output;
  return false;
}

inline bool Snappy_GetUncompressedLength(const char* input, size_t length,
                                         size_t* result) {
  (void)input;
  (void)length;
  (void)result;
  return false;
}

inline bool Snappy_Uncompress(const char* input, size_t length, char* output) {
  (void)input;
  (void)length;
  (void)output;
  return false;
}

inline bool GetHeapProfile(void (*func)(void*, const char*, int), void* arg) {
  (void)func;
  (void)arg;
  return false;
}

// No hardware crc32c: 0 tells LevelDB to use its portable code.
inline uint32_t AcceleratedCRC32C(uint32_t crc, const char* buf, size_t size) {
  (void)crc;
  (void)buf;
  (void)size;
  return 0;
}

}  // namespace port
}  // namespace leveldb

#endif  // VALET_LEVELDB_PORT_H_
