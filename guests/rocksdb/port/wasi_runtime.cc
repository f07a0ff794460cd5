// Linked into every RocksDB program built for WASI: what wasi-libc and our exception-less
// libc++abi leave to the program.
#include <cxxabi.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

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

// Destructors of one thread's `thread_local` objects, newest first.
struct ThreadDtor {
  void (*dtor)(void*);
  void* obj;
  ThreadDtor* next;
};

pthread_key_t dtor_key;
pthread_once_t dtor_once = PTHREAD_ONCE_INIT;

void RunThreadDtors(void* head) {
  // A destructor may register more (a thread_local first touched in a destructor).
  for (auto* d = static_cast<ThreadDtor*>(head); d != nullptr;) {
    d->dtor(d->obj);
    ThreadDtor* next = d->next;
    free(d);
    d = next;
    if (d == nullptr) {
      d = static_cast<ThreadDtor*>(pthread_getspecific(dtor_key));
      pthread_setspecific(dtor_key, nullptr);
    }
  }
}

void MakeDtorKey() {
  if (pthread_key_create(&dtor_key, RunThreadDtors) != 0) abort();
}

}  // namespace

// libc++abi provides __cxa_thread_atexit only on Linux and Fuchsia: here a thread's
// `thread_local` destructors run from a pthread key's destructor when the thread exits (the
// main thread's are left to process exit, as musl does for its own keys).
extern "C" int __cxa_thread_atexit(void (*dtor)(void*), void* obj, void* /*dso*/) {
  pthread_once(&dtor_once, MakeDtorKey);
  auto* d = static_cast<ThreadDtor*>(malloc(sizeof(ThreadDtor)));
  if (d == nullptr) return -1;
  *d = {dtor, obj, static_cast<ThreadDtor*>(pthread_getspecific(dtor_key))};
  pthread_setspecific(dtor_key, d);
  return 0;
}

// wasi-libc's mmap emulation has no msync (RocksDB calls it only for mmap writes, which it
// does not use unless asked).
extern "C" int msync(void* /*addr*/, size_t /*len*/, int /*flags*/) {
  errno = ENOSYS;
  return -1;
}

// Built without wasm exception handling (stock wasmtime 36 cannot run it), a C++ `throw`
// cannot unwind: it ends the program, naming what was thrown.
extern "C" {
void* __cxa_allocate_exception(size_t size) noexcept {
  void* p = malloc(size);
  if (p == nullptr) abort();
  return p;
}

void __cxa_free_exception(void* p) noexcept { free(p); }

// std::make_exception_ptr: an exception object that could be rethrown; not here either.
__cxxabiv1::__cxa_exception* __cxa_init_primary_exception(void* /*object*/, std::type_info* type,
                                              void* (* /*destructor*/)(void*)) noexcept {
  fprintf(stderr, "terminate: std::make_exception_ptr of %s (built without wasm exceptions)\n",
          type->name());
  fflush(stderr);
  abort();
}

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
