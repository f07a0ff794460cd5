// Linked into every RocksDB program built for WASI: what wasi-libc and our exception-less
// libc++abi leave to the program.
#include <cxxabi.h>
#include <stdio.h>
#include <stdlib.h>

#include <typeinfo>

// wasi-libc's pthread_create takes the default stack size from this variable (musl's; hidden,
// but a static link reaches it). wasi-libc has no pthread_setattr_default_np to set it.
extern "C" volatile size_t __default_stacksize;

namespace {

// wasi-libc gives a thread 128 KiB of stack; RocksDB's compaction and flush threads need
// more, and a wasm stack overflow is silent heap corruption, not a crash. 2 MiB runs
// db_bench and the tests here.
constexpr size_t kThreadStack = 2 << 20;

__attribute__((constructor)) void SetDefaultThreadStack() {
  if (__default_stacksize < kThreadStack) __default_stacksize = kThreadStack;
}

}  // namespace

// Built without wasm exception handling (stock wasmtime 36 cannot run it), a C++ `throw`
// cannot unwind: it ends the program, naming what was thrown.
extern "C" {
void* __cxa_allocate_exception(size_t size) noexcept {
  void* p = malloc(size);
  if (p == nullptr) abort();
  return p;
}

void __cxa_free_exception(void* p) noexcept { free(p); }

// (cxxabi.h declares these; on wasm a destructor returns its argument.)
void __cxa_throw(void* /*thrown*/, std::type_info* type, void* (* /*destructor*/)(void*)) {
  int status = 0;
  char* name = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
  fprintf(stderr, "terminate: C++ exception of type %s thrown (built without wasm exceptions)\n",
          status == 0 && name != nullptr ? name : type->name());
  fflush(stderr);
  abort();
}

}  // extern "C"
